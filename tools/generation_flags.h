// The flags that generate and chat share (sampling, precision, device, KV cache), defined
// once, and their translation into the library's options with errors that name the flag.
#ifndef LGPT_TOOLS_GENERATION_FLAGS_H_
#define LGPT_TOOLS_GENERATION_FLAGS_H_

#include "absl/status/statusor.h"
#include "lgpt.h"

namespace lgpt {

// --temperature, --top_k, --top_p, --seed and the KV cache flags (--kv_cache, --kv_budget,
// --kv_bits, --kv_sink, --kv_residual, --kv_positions, --kv_grace, --kv_normalize_scores,
// --kv_budget_rule) into `options`; InvalidArgument naming the
// flag.
absl::Status ApplyGenerationFlags(RequestOptions& options);

// --precision, --device, --quantize and --verify_checksums (tools/load_flags.h).
absl::StatusOr<EngineOptions> EngineOptionsFromFlags();

}  // namespace lgpt

#endif  // LGPT_TOOLS_GENERATION_FLAGS_H_
