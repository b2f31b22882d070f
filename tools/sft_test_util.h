// Tiny fine-tuning fixtures shared by the trainer's tests: a 2-layer Llama-style config with
// LoRA and adapter fields set, a character encoder over its 96-token vocabulary, and a few
// Alpaca-style records.
#ifndef LGPT_TOOLS_SFT_TEST_UTIL_H_
#define LGPT_TOOLS_SFT_TEST_UTIL_H_

#include <vector>

#include "core/config/config.h"
#include "tools/sft_data.h"

namespace lgpt {

// Characters to ids 3..92 of the tiny models' 96-token vocabulary; BOS 1, EOS 2.
SftEncoder CharEncoder();

// Six short records.
std::vector<InstructionRecord> TinyRecords();

// Llama-3.2-1B shrunk to 2 layers; LoRA r=4 on query, value and MLP; adapter prefix 4 from
// layer 0; no dropout.
Config TinyConfig();

}  // namespace lgpt

#endif  // LGPT_TOOLS_SFT_TEST_UTIL_H_
