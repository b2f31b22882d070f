#include "core/model/state_dict.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/shape_text.h"

namespace lgpt {
namespace {

std::string Names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(kShown, names.size()));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kShown) absl::StrAppend(&text, " and ", names.size() - kShown, " more");
  return text;
}

}  // namespace

absl::Status CheckFinite(const TensorMap& tensors, const std::string& source) {
  constexpr int64_t kSlice = int64_t{1} << 22;  // elements checked at a time
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.is_floating_point()) continue;
    const at::Tensor flat = tensor.reshape({-1});
    for (int64_t begin = 0; begin < flat.numel(); begin += kSlice) {
      const at::Tensor slice = flat.narrow(0, begin, std::min(kSlice, flat.numel() - begin));
      if (at::isfinite(slice).all().item<bool>()) continue;
      const int64_t index =
          begin + at::logical_not(at::isfinite(slice)).nonzero()[0][0].item<int64_t>();
      const double value = flat[index].item<double>();
      return absl::DataLossError(absl::StrCat(source, ": tensor ", name, " holds ",
                                              std::isnan(value) ? "NaN" : "infinity",
                                              " at element ", index, " of ", flat.numel()));
    }
  }
  return absl::OkStatus();
}

TensorMap StateDict(const torch::nn::Module& module) {
  TensorMap tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    tensors[item.key()] = item.value();
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    tensors[item.key()] = item.value();
  }
  return tensors;
}

absl::Status LoadStateDict(torch::nn::Module& module, const TensorMap& tensors,
                           const std::string& source, bool allow_missing, bool adopt_storage) {
  const TensorMap targets = StateDict(module);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, target] : targets) {
    if (!tensors.count(name)) missing.push_back(name);
  }
  for (const auto& [name, tensor] : tensors) {
    if (!targets.count(name)) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unexpected tensors ", Names(unexpected)));
  }
  if (!missing.empty() && !allow_missing) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensors ", Names(missing)));
  }
  for (const auto& [name, tensor] : tensors) {
    const at::Tensor& target = targets.at(name);
    if (!tensor.sizes().equals(target.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", name, " has shape ",
                                                     ShapeText(tensor.sizes()), ", the model expects ",
                                                     ShapeText(target.sizes())));
    }
    if (!tensor.is_floating_point() && target.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor ", name, " is not floating point"));
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor target = targets.at(name);
    if (adopt_storage && tensor.scalar_type() == target.scalar_type() &&
        tensor.device() == target.device() && tensor.is_contiguous()) {
      target.set_data(tensor);  // every holder of the parameter sees the new storage
    } else {
      target.copy_(tensor);
    }
  }
  return absl::OkStatus();
}

}  // namespace lgpt
