// How much memory the machine can still give this process: what guards against sizes (a model
// shape, a KV pool) that would end in the kernel's OOM killer check against, so that they are
// refused with their numbers instead.
#ifndef LGPT_CORE_BASE_SYSTEM_MEMORY_H_
#define LGPT_CORE_BASE_SYSTEM_MEMORY_H_

#include <cstdint>
#include <optional>

namespace lgpt {

// MemAvailable of /proc/meminfo in bytes (free memory plus what the kernel can reclaim);
// nullopt where it cannot be read (not Linux, a sandbox without /proc).
std::optional<int64_t> AvailableMemoryBytes();

}  // namespace lgpt

#endif  // LGPT_CORE_BASE_SYSTEM_MEMORY_H_
