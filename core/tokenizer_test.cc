#include "core/tokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lgpt {
namespace {

constexpr char kGpt2[] = "core/testdata/tokenizers/gpt2";

TEST(Gpt2Test, KnownIds) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(kGpt2);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Encode("Hello world"), (std::vector<int64_t>{15496, 995}));
  EXPECT_EQ(*(*t)->Encode(" Hello"), (std::vector<int64_t>{18435}));
}

}  // namespace
}  // namespace lgpt
