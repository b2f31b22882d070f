#include "tools/model_memory.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/base/system_memory.h"
#include "core/model/gpt.h"
#include "core/nn/linear_factory.h"

namespace lgpt {

absl::StatusOr<int64_t> CountParameters(const Config& config) {
  SkipWeightInit skip;
  ASSIGN_OR_RETURN(const std::shared_ptr<GPTImpl> model, GPTImpl::Create(config));
  int64_t parameters = 0;
  for (const at::Tensor& parameter : model->parameters()) parameters += parameter.numel();
  return parameters;
}

absl::Status CheckParametersFitMemory(const Config& config, int64_t bytes_per_parameter,
                                      absl::string_view purpose) {
  const std::optional<int64_t> available = AvailableMemoryBytes();
  if (!available) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t parameters, CountParameters(config));
  if (parameters <= *available / std::max<int64_t>(bytes_per_parameter, 1)) {
    return absl::OkStatus();
  }
  // In MiB as a double: parameters · bytes may exceed int64.
  const double needed_mib = static_cast<double>(parameters) * bytes_per_parameter / (1 << 20);
  return absl::ResourceExhaustedError(
      absl::StrCat(config.name, " has ", parameters, " parameters: ", purpose, " needs ",
                   absl::StrFormat("%.0f", needed_mib), " MiB and ", *available >> 20,
                   " MiB of memory are available"));
}

}  // namespace lgpt
