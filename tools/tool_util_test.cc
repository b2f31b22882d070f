// Tools name the library's fields by their flags: the field each status carries
// (core/base/status_field.h) becomes the flag that sets it; other text stays as written.
#include "tools/tool_util.h"

#include <gtest/gtest.h>

#include "cache/kv_cache_factory.h"
#include "core/base/status_field.h"
#include "lgpt.h"

namespace lgpt {
namespace {

TEST(InFlagTermsTest, KVCacheRulesNameTheirFlags) {
  KVCacheSpec spec;
  spec.policy = "sink";
  EXPECT_EQ(InFlagTerms(ValidateKVCacheSpec(spec)),
            "--kv_budget must be >= 1 for policy sink, got 0");
  spec.budget = 2;
  EXPECT_EQ(InFlagTerms(ValidateKVCacheSpec(spec)),
            "--kv_budget=2 must be at least the sink cache's --kv_sink=4 (it keeps them all)");
  spec = KVCacheSpec();
  spec.budget = 8;
  EXPECT_EQ(InFlagTerms(ValidateKVCacheSpec(spec)),
            "--kv_budget=8 needs a budgeted --kv_cache (window, sink, h2o, tova, h2o-vlen, qh2o), "
            "not dense");
  spec = KVCacheSpec();
  spec.positions = "cache";
  EXPECT_EQ(InFlagTerms(ValidateKVCacheSpec(spec))
                .rfind("--kv_positions=cache needs --kv_cache window or sink", 0),
            0u);
  spec = KVCacheSpec();
  spec.bits = 3;
  EXPECT_EQ(InFlagTerms(ValidateKVCacheSpec(spec)), "--kv_bits must be 16, 8 or 4, got 3");
}

TEST(InFlagTermsTest, EngineAndServingOptionsNameTheirFlags) {
  EngineOptions options;
  options.serving.max_running = 0;
  EXPECT_EQ(InFlagTerms(Engine::Load("/nonexistent", options).status()),
            "--max_running must be >= 1, got 0");
  options.serving = SchedulerOptions();
  options.serving.kv_pool_bytes = -1;
  EXPECT_EQ(InFlagTerms(Engine::Load("/nonexistent", options).status()),
            "--pool_mb must be >= 0, got -1");
  options.serving = SchedulerOptions();
  options.quantize = WeightQuantization::kInt4;
  options.quantize_int8 = true;
  EXPECT_EQ(InFlagTerms(Engine::Load("/nonexistent", options).status()),
            "--quantize=int8 and --quantize=int4 contradict each other");
  options.quantize_int8 = false;
  options.dtype = c10::kBFloat16;
  EXPECT_EQ(InFlagTerms(Engine::Load("/nonexistent", options).status()),
            "--quantize=int4 needs --precision=32-true on the CPU (quantised weights run there "
            "with float32 activations; a CUDA device takes any dtype)");
  const absl::Status checksum = WithFields(
      absl::DataLossError("x fails its CRC-32 check; set EngineOptions.verify_checksums = false to "
                          "load it anyway"),
      "EngineOptions.verify_checksums");
  EXPECT_EQ(InFlagTerms(checksum),
            "x fails its CRC-32 check; set --verify_checksums=false to load it anyway");
}

TEST(InFlagTermsTest, OnlyTheCarriedFieldIsRenamed) {
  // A message that names a field it does not carry keeps it (the library's prose).
  EXPECT_EQ(InFlagTerms(absl::InvalidArgumentError("KVCacheSpec.budget is odd")),
            "KVCacheSpec.budget is odd");
  EXPECT_EQ(
      InFlagTerms(InvalidFieldError("KVCacheSpec.bits", "KVCacheSpec.bits or KVCacheSpec.budget")),
      "--kv_bits or KVCacheSpec.budget");
  // A field no flag sets stays as the library wrote it.
  EXPECT_EQ(
      InFlagTerms(InvalidFieldError("PolicyKVCacheOptions.bits", "PolicyKVCacheOptions.bits")),
      "PolicyKVCacheOptions.bits");
  EXPECT_EQ(FlagOfField("SchedulerOptions.kv_pool_bytes"), "--pool_mb");
  EXPECT_EQ(FlagOfField("EngineOptions.kv_pool_dtype"), "--kv_pool_dtype");
  EXPECT_EQ(FlagOfField("KVCacheSpec.sink_tokens"), "--kv_sink");
  EXPECT_EQ(FlagOfField("KVCacheSpec.recent_fraction"), std::nullopt);
}

}  // namespace
}  // namespace lgpt
