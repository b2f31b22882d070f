#include "tests/random_lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "core/base/status_macros.h"
#include "core/io/torch_pickle_writer.h"
#include "core/model/gpt.h"
#include "core/model/state_dict.h"
#include "peft/peft_method.h"

namespace lgpt {

absl::StatusOr<std::string> WriteRandomLoraFineTune(const std::string& base_dir,
                                                    const Config& base_config,
                                                    const LoraOptions& lora, const std::string& dir,
                                                    uint64_t seed, double stddev) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  Config config = base_config;
  config.lora_r = lora.r;
  config.lora_alpha = lora.alpha;
  config.lora_query = lora.query;
  config.lora_key = lora.key;
  config.lora_value = lora.value;
  config.lora_projection = lora.projection;
  config.lora_mlp = lora.mlp;
  config.lora_head = lora.head;
  std::ofstream(fs::path(dir) / "model_config.yaml") << ConfigToYaml(config);
  std::ofstream(fs::path(dir) / "hyperparameters.yaml")
      << "checkpoint_dir: " << fs::absolute(base_dir).string() << "\n";
  ModelParts parts;
  parts.linear_factory = std::make_shared<LoraLinearFactory>(lora, LinearFactoryOrDefault(nullptr));
  ASSIGN_OR_RETURN(std::shared_ptr<GPTImpl> model, GPTImpl::Create(config, parts));
  at::manual_seed(seed);
  at::NoGradGuard no_grad;
  TensorMap trained;
  for (const auto& [name, tensor] : StateDict(*model)) {
    if (IsTrainedParameter(PeftMethod::kLora, name)) {
      trained[name] = at::randn(tensor.sizes()) * stddev;
    }
  }
  RETURN_IF_ERROR(WriteTorchStateDict((fs::path(dir) / "lit_model.pth.lora").string(), trained));
  return dir;
}

}  // namespace lgpt
