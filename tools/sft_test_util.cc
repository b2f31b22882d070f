#include "tools/sft_test_util.h"

#include <glog/logging.h>

#include <cstdint>

#include "core/config/config_presets.h"
#include "tests/test_models.h"

namespace lgpt {

SftEncoder CharEncoder() {
  return [](absl::string_view text, bool response) -> absl::StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> ids;
    if (!response) ids.push_back(1);
    for (unsigned char c : text) ids.push_back(3 + c % 90);
    if (response) ids.push_back(2);
    return ids;
  };
}

std::vector<InstructionRecord> TinyRecords() {
  return {{"Say hi.", "", "hi"}, {"Say yo.", "", "yo"}, {"Echo", "abc", "abc"},
          {"Echo", "xy", "xy"},  {"Count", "", "123"},  {"Name", "", "Eve"}};
}

Config TinyConfig() {
  Config config = ShrinkConfig(*PresetFromName("Llama-3.2-1B")).value();
  config.n_layer = 2;
  config.lora_r = 4;
  config.lora_alpha = 8;
  config.lora_query = config.lora_value = config.lora_mlp = true;
  config.adapter_prompt_length = 4;
  config.adapter_start_layer = 0;
  const absl::Status finalized = config.Finalize();
  CHECK(finalized.ok()) << finalized;
  return config;
}

}  // namespace lgpt
