// Test fixtures: a LoRA fine-tune directory as LitGPT's finetune writes it (model_config.yaml
// with the LoRA fields, hyperparameters.yaml naming the base, lit_model.pth.lora), with random
// A and B at the sites `lora` enables, over the base checkpoint `base_dir` of `base_config`.
#ifndef LGPT_TESTS_RANDOM_LORA_H_
#define LGPT_TESTS_RANDOM_LORA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "peft/lora.h"

namespace lgpt {

// Writes the fine-tune into `dir` (created); its path. `stddev`: of the random A and B.
absl::StatusOr<std::string> WriteRandomLoraFineTune(const std::string& base_dir,
                                                    const Config& base_config,
                                                    const LoraOptions& lora, const std::string& dir,
                                                    uint64_t seed, double stddev = 0.3);

}  // namespace lgpt

#endif  // LGPT_TESTS_RANDOM_LORA_H_
