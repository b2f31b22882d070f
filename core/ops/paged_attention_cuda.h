// Launcher of the CUDA paged decode attention (paged_attention.cu), in plain C++ types so that
// the host compiler's code (paged_attention.cc) calls it without CUDA headers. Built only
// against a CUDA LibTorch (LGPT_LIBTORCH_HAS_CUDA); see paged_attention.h for the operation.
#ifndef LGPT_CORE_OPS_PAGED_ATTENTION_CUDA_H_
#define LGPT_CORE_OPS_PAGED_ATTENTION_CUDA_H_

#include <cstdint>

#include "core/ops/paged_attention_layout.h"

namespace lgpt {
namespace cuda {

// Device pointers and sizes of one call (every pointer on the same device).
struct PagedDecodeArgs {
  const float* q = nullptr;  // [rows, heads, head_size]
  const uint8_t* keys = nullptr;
  const uint8_t* values = nullptr;
  const int32_t* slot_positions = nullptr;   // [num_blocks, groups, entries_per_block] or null
  const int32_t* block_tables = nullptr;     // [rows, table_size]
  const int32_t* lengths = nullptr;          // [rows]
  const int32_t* query_positions = nullptr;  // [rows]
  paged::PoolShape pool;
  paged::EntryFormat format;
  int64_t table_size = 0;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t entries_per_split = 0;
  int64_t max_splits = 0;  // SplitCount(max_length, entries_per_split), at least 1
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: none
  int64_t sliding_window = 0;
  float* out = nullptr;  // [rows, heads, head_size]
  // With max_splits > 1: per (row, head, split) the unnormalised output [head_size], the max
  // score and the sum of exponentials.
  float* partial_out = nullptr;
  float* partial_max = nullptr;
  float* partial_sum = nullptr;
};

// Queues the attention (and the merge of the splits) on `stream` (a cudaStream_t). Returns the
// launch's cudaError_t (0 on success).
int LaunchPagedDecodeAttention(const PagedDecodeArgs& args, void* stream);

}  // namespace cuda
}  // namespace lgpt

#endif  // LGPT_CORE_OPS_PAGED_ATTENTION_CUDA_H_
