#include "core/io/crc32.h"

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

// One bit at a time, straight from the definition.
uint32_t Reference(const uint8_t* data, size_t size, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return ~crc;
}

std::vector<uint8_t> RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(size);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(Crc32Test, KnownVectors) {
  auto crc = [](const std::string& s) { return Crc32(s.data(), s.size()); };
  EXPECT_EQ(crc(""), 0u);
  EXPECT_EQ(crc("a"), 0xE8B7BE43u);
  EXPECT_EQ(crc("123456789"), 0xCBF43926u);
  EXPECT_EQ(crc("The quick brown fox jumps over the lazy dog"), 0x414FA339u);
  EXPECT_EQ(crc(std::string(1000, '\0')), Reference(std::vector<uint8_t>(1000).data(), 1000));
  EXPECT_EQ(Crc32(nullptr, 0, 0x12345678u), 0x12345678u);
}

// Every length around the 16- and 64-byte steps of the folding path, at every alignment.
TEST(Crc32Test, MatchesTheDefinitionForEveryLengthAndAlignment) {
  const std::vector<uint8_t> bytes = RandomBytes(4096 + 64, 1);
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t size = 0; size <= 1100; ++size) {
      const uint8_t* p = bytes.data() + offset;
      ASSERT_EQ(Crc32(p, size), Reference(p, size)) << "size " << size << " offset " << offset;
      ASSERT_EQ(crc32_internal::Crc32Portable(p, size, 0), Reference(p, size));
    }
  }
  const std::vector<uint8_t> big = RandomBytes(3 << 20, 2);
  EXPECT_EQ(Crc32(big.data(), big.size()), Reference(big.data(), big.size()));
  std::cout << "carry-less multiplication path: " << (crc32_internal::HasClmul() ? "yes" : "no")
            << "\n";
}

TEST(Crc32Test, ContinuesAndCombines) {
  const std::vector<uint8_t> bytes = RandomBytes(100000, 3);
  const uint32_t whole = Crc32(bytes.data(), bytes.size());
  for (size_t split : {0, 1, 63, 64, 1000, 65536, 99999, 100000}) {
    SCOPED_TRACE(split);
    const uint32_t a = Crc32(bytes.data(), split);
    const uint32_t b = Crc32(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(Crc32(bytes.data() + split, bytes.size() - split, a), whole);
    EXPECT_EQ(Crc32Combine(a, b, bytes.size() - split), whole);
  }
}

TEST(Crc32Test, EveryBitFlipChangesTheCrc) {
  std::vector<uint8_t> bytes = RandomBytes(4096, 4);
  const uint32_t original = Crc32(bytes.data(), bytes.size());
  for (size_t i = 0; i < bytes.size(); i += 7) {
    bytes[i] ^= static_cast<uint8_t>(1 << (i % 8));
    EXPECT_NE(Crc32(bytes.data(), bytes.size()), original) << i;
    bytes[i] ^= static_cast<uint8_t>(1 << (i % 8));
  }
}

}  // namespace
}  // namespace lgpt
