// CRC-32 as zip (and gzip, PNG) defines it: polynomial 0xEDB88320 (reflected), initial value and
// final xor 0xFFFFFFFF. The checkpoint reader runs it over every byte of the weights at load,
// so it is fast: carry-less multiplication (PCLMULQDQ, 4 x 128-bit folding) on x86-64 CPUs
// that have it, about 13 GB/s on one core; zlib's crc32_z elsewhere (about 5 GB/s).
#ifndef LGPT_CORE_IO_CRC32_H_
#define LGPT_CORE_IO_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace lgpt {

// The CRC-32 of `size` bytes at `data`, continuing from `crc`, the CRC-32 of the bytes before
// them (0 for none): Crc32(b, nb, Crc32(a, na)) is the CRC-32 of a followed by b.
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

// The CRC-32 of A followed by B, from crc_a = Crc32(A), crc_b = Crc32(B) and B's size, in
// O(log size_b): lets pieces of one record be checked on different threads.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

namespace crc32_internal {

// zlib's implementation, the fallback, exposed so tests compare both paths on any CPU.
uint32_t Crc32Portable(const void* data, size_t size, uint32_t crc);

// Whether Crc32 uses the carry-less multiplication path on this CPU.
bool HasClmul();

}  // namespace crc32_internal
}  // namespace lgpt

#endif  // LGPT_CORE_IO_CRC32_H_
