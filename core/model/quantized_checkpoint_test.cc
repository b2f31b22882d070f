#include "core/model/quantized_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/io/safetensors.h"
#include "core/model/checkpoint.h"
#include "core/model/quantize_model.h"
#include "core/nn/block_quant_linear.h"

namespace lgpt {
namespace {

namespace fs = std::filesystem;
constexpr char kModel[] = "tools/default_model";

GPT QuantisedDefaultModel(WeightQuantization quantization, bool tie = false) {
  LoadOptions options;
  options.parts = QuantizedModelParts(quantization);
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(kModel, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (tie) {
    auto* head = dynamic_cast<BlockQuantProjectionImpl*>(loaded->model->lm_head.get());
    at::NoGradGuard no_grad;
    head->weight.copy_(loaded->model->transformer->wte->weight);
  }
  EXPECT_TRUE(QuantizeModel(*loaded->model).ok());
  return loaded->model;
}

// A checkpoint directory holding model_config.yaml and `model` saved quantised.
std::string SavedDir(GPTImpl& model, const std::string& name) {
  const std::string dir = testing::TempDir() + "/" + name;
  fs::create_directories(dir);
  fs::copy_file(std::string(kModel) + "/model_config.yaml", dir + "/model_config.yaml",
                fs::copy_options::overwrite_existing);
  const absl::Status saved = SaveQuantizedCheckpoint(model, dir + "/" + kQuantizedWeightsFile);
  EXPECT_TRUE(saved.ok()) << saved;
  return dir;
}

at::Tensor Logits(GPTImpl& model) {
  at::NoGradGuard no_grad;
  at::manual_seed(5);
  return *model.Forward(at::randint(3, 4000, {1, 24}, at::kLong));
}

// The saved model loads with no float weights and computes the same bits.
TEST(QuantizedCheckpoint, RoundTripIsExact) {
  for (WeightQuantization q : {WeightQuantization::kInt8, WeightQuantization::kInt4}) {
    GPT original = QuantisedDefaultModel(q);
    const std::string dir = SavedDir(*original, WeightQuantizationName(q));
    absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir);  // parts from the file
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    GPTImpl& model = *loaded->model;
    EXPECT_TRUE(model.quantized_embedding().defined());
    int64_t quantised = 0;
    for (const auto& module : model.modules()) {
      if (auto* p = dynamic_cast<BlockQuantProjectionImpl*>(module.get())) {
        EXPECT_TRUE(p->quantized());
        EXPECT_EQ(p->weight.numel(), 0);
        ++quantised;
      }
    }
    EXPECT_EQ(quantised, 4 * 5 + 1);
    EXPECT_EQ(ModelWeightBytes(model), ModelWeightBytes(*original));
    EXPECT_TRUE(at::equal(Logits(model), Logits(*original))) << WeightQuantizationName(q);
    // Asking for the stored format again is fine (QuantizeModel is then a no-op).
    LoadOptions same;
    same.parts = QuantizedModelParts(q);
    absl::StatusOr<LoadedModel> again = LoadCheckpoint(dir, same);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(QuantizeModel(*again->model).ok());
    EXPECT_TRUE(at::equal(Logits(*again->model), Logits(*original)));
  }
}

TEST(QuantizedCheckpoint, TiedTableIsStoredOnce) {
  GPT untied = QuantisedDefaultModel(WeightQuantization::kInt4);
  GPT tied = QuantisedDefaultModel(WeightQuantization::kInt4, /*tie=*/true);
  const std::string untied_dir = SavedDir(*untied, "untied");
  const std::string tied_dir = SavedDir(*tied, "tied");
  const std::string file = std::string("/") + kQuantizedWeightsFile;
  // The table's bytes, plus its two header entries and checksums.
  const int64_t saved = static_cast<int64_t>(fs::file_size(untied_dir + file)) -
                        static_cast<int64_t>(fs::file_size(tied_dir + file));
  EXPECT_GE(saved, tied->quantized_embedding().bytes());
  EXPECT_LT(saved, tied->quantized_embedding().bytes() + 1024);
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(tied_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto* head = dynamic_cast<BlockQuantProjectionImpl*>(loaded->model->lm_head.get());
  EXPECT_TRUE(loaded->model->quantized_embedding().values.is_same(head->quantized_weight().values));
  EXPECT_TRUE(at::equal(Logits(*loaded->model), Logits(*tied)));
}

TEST(QuantizedCheckpoint, ConflictsAndUnquantisedModelsAreErrors) {
  GPT int4 = QuantisedDefaultModel(WeightQuantization::kInt4);
  const std::string dir = SavedDir(*int4, "conflict");
  LoadOptions int8;
  int8.parts = QuantizedModelParts(WeightQuantization::kInt8);
  absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir, int8);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("q4_0"), std::string::npos) << loaded.status();
  EXPECT_NE(loaded.status().message().find("q8_0"), std::string::npos) << loaded.status();

  LoadOptions bf16;
  bf16.dtype = c10::kBFloat16;
  EXPECT_EQ(LoadCheckpoint(dir, bf16).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<LoadedModel> plain = LoadCheckpoint(kModel);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(SaveQuantizedCheckpoint(*plain->model, testing::TempDir() + "/plain.safetensors")
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// Rewrites the saved file with `edit` applied to its tensors and metadata.
void Rewrite(const std::string& path,
             const std::function<void(TensorMap&, std::map<std::string, std::string>&)>& edit) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  absl::StatusOr<TensorMap> tensors = ReadSafetensors(path);
  ASSERT_TRUE(header.ok() && tensors.ok());
  TensorMap copy;
  for (const auto& [name, t] : *tensors) copy[name] = t.clone();
  std::map<std::string, std::string> metadata = header->metadata;
  edit(copy, metadata);
  ASSERT_TRUE(WriteSafetensors(path, copy, metadata).ok());
}

TEST(QuantizedCheckpoint, DamagedFilesAreRefusedNamingTheTensor) {
  GPT int8 = QuantisedDefaultModel(WeightQuantization::kInt8);
  const std::string name = "transformer.h.1.mlp.proj.weight.qvalues";
  struct Case {
    std::string what;
    std::function<void(TensorMap&, std::map<std::string, std::string>&)> edit;
    absl::StatusCode code;
    std::string expected;
    bool verify = true;
  };
  const std::vector<Case> cases = {
      {"flipped byte", [&](TensorMap& t, auto&) { t[name].view({-1})[100] += 1; },
       absl::StatusCode::kDataLoss, name},
      {"no checksum", [&](TensorMap&, auto& m) { m.erase("lgpt.crc32." + name); },
       absl::StatusCode::kInvalidArgument, name},
      {"missing values", [&](TensorMap& t, auto&) { t.erase(name); },
       absl::StatusCode::kInvalidArgument, name, false},
      {"wrong shape", [&](TensorMap& t, auto&) { t[name] = t[name].narrow(1, 0, 2).clone(); },
       absl::StatusCode::kInvalidArgument, "mlp", false},
      {"half scale NaN",
       [&](TensorMap& t, auto&) {
         t["lm_head.weight.qscales"].view({-1})[3] = std::nanf("");
       },
       absl::StatusCode::kDataLoss, "lm_head.weight.qscales", false},
      {"left over tensor", [&](TensorMap& t, auto&) { t["extra.weight"] = at::ones({2}); },
       absl::StatusCode::kInvalidArgument, "extra.weight", false},
      {"missing norm", [&](TensorMap& t, auto&) { t.erase("transformer.ln_f.weight"); },
       absl::StatusCode::kInvalidArgument, "transformer.ln_f.weight", false},
      {"unknown format", [&](TensorMap&, auto& m) { m["lgpt.weights"] = "q2_k"; },
       absl::StatusCode::kInvalidArgument, "lgpt.weights"},
      {"no layout", [&](TensorMap&, auto& m) { m.erase("lgpt.format"); },
       absl::StatusCode::kInvalidArgument, "lgpt.format"},
  };
  for (const Case& c : cases) {
    const std::string dir = SavedDir(*int8, "damaged");
    Rewrite(dir + "/" + kQuantizedWeightsFile, c.edit);
    LoadOptions options;
    options.verify_checksums = c.verify;
    absl::StatusOr<LoadedModel> loaded = LoadCheckpoint(dir, options);
    EXPECT_EQ(loaded.status().code(), c.code) << c.what << ": " << loaded.status();
    EXPECT_NE(loaded.status().message().find(c.expected), std::string::npos)
        << c.what << ": " << loaded.status();
  }
}

}  // namespace
}  // namespace lgpt
