// TEMPORARY stand-in: LibTorch's own pickle_save (torch.save's zip format, plain dict).
#include "core/torch_pickle_writer.h"

#include <fstream>

#include <ATen/ATen.h>
#include <torch/serialize.h>

#include "absl/strings/str_cat.h"

namespace lgpt {

absl::Status WriteTorchStateDict(const std::string& path, const TensorMap& tensors) {
  std::vector<char> bytes;
  try {
    c10::Dict<std::string, at::Tensor> dict;
    for (const auto& [name, tensor] : tensors) {
      dict.insert(name, tensor.detach().cpu().contiguous());
    }
    bytes = torch::pickle_save(dict);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(path, ": ", e.what_without_backtrace()));
  }
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace lgpt
