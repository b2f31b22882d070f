#include "peft/peft_method.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/config/config_presets.h"
#include "core/model/checkpoint.h"
#include "peft/adapter_v2.h"
#include "peft/lora.h"

namespace lgpt {
namespace {

TEST(PeftMethod, ParsesAndNamesEveryMethod) {
  for (PeftMethod method :
       {PeftMethod::kLora, PeftMethod::kAdapter, PeftMethod::kAdapterV2, PeftMethod::kFull}) {
    EXPECT_EQ(*ParsePeftMethod(PeftMethodName(method)), method);
  }
  EXPECT_EQ(ParsePeftMethod("qlora").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PeftMethod, TrainedParametersFollowLitGptsFilters) {
  EXPECT_TRUE(IsTrainedParameter(PeftMethod::kLora, "transformer.h.0.attn.qkv.lora_A"));
  EXPECT_FALSE(IsTrainedParameter(PeftMethod::kLora, "transformer.h.0.attn.qkv.linear.weight"));
  EXPECT_TRUE(IsTrainedParameter(PeftMethod::kAdapter, "transformer.h.1.attn.gating_factor"));
  EXPECT_FALSE(IsTrainedParameter(PeftMethod::kAdapter, "transformer.h.1.norm_1.weight"));
  EXPECT_TRUE(IsTrainedParameter(PeftMethod::kAdapterV2, "transformer.h.1.norm_1.weight"));
  EXPECT_TRUE(IsTrainedParameter(PeftMethod::kAdapterV2, "lm_head.adapter_scale"));
  EXPECT_FALSE(IsTrainedParameter(PeftMethod::kAdapterV2, "lm_head.linear.weight"));
  EXPECT_TRUE(IsTrainedParameter(PeftMethod::kFull, "lm_head.weight"));
}

TEST(PeftMethod, UnwrapsToBaseNames) {
  EXPECT_EQ(BaseParameterName("transformer.h.0.attn.qkv.linear.weight"),
            "transformer.h.0.attn.qkv.weight");
  EXPECT_EQ(BaseParameterName("lm_head.linear.bias"), "lm_head.bias");
  EXPECT_EQ(BaseParameterName("linear.weight"), "weight");
  // Stacked LoRA adapters nest the base projection.
  EXPECT_EQ(BaseParameterName("transformer.h.0.attn.qkv.linear.linear.weight"),
            "transformer.h.0.attn.qkv.weight");
  EXPECT_EQ(BaseParameterName("lm_head.linear.linear.linear.bias"), "lm_head.bias");
  EXPECT_EQ(BaseParameterName("linear.linear.weight"), "weight");
  EXPECT_EQ(BaseParameterName("transformer.wte.weight"), "transformer.wte.weight");
  TensorMap state;
  state["lm_head.linear.weight"] = at::ones({2, 2});
  state["lm_head.lora_A"] = at::ones({1, 2});
  state["transformer.h.0.attn.gating_factor"] = at::ones({1});
  state["transformer.ln_f.weight"] = at::ones({2});
  const TensorMap base = UnwrapToBaseStateDict(state);
  ASSERT_EQ(base.size(), 2u);
  EXPECT_TRUE(base.count("lm_head.weight"));
  EXPECT_TRUE(base.count("transformer.ln_f.weight"));
  EXPECT_TRUE(base.at("lm_head.weight").is_same(state.at("lm_head.linear.weight")));
}

// MarkTrainable on whole models: exactly the filter's parameters require grad, and the
// unwrapped state dict of a fresh PEFT model has the base model's names and shapes.
TEST(PeftMethod, MarkTrainableAndUnwrapOnWholeModels) {
  Config config = *PresetFromName("pythia-14m");
  config.n_layer = 2;
  config.lora_r = 2;
  config.lora_query = config.lora_value = config.lora_mlp = true;
  config.adapter_start_layer = 0;
  ASSERT_TRUE(config.Finalize().ok());
  GPT base = *GPTImpl::Create(config);
  const TensorMap base_state = StateDict(*base);
  for (PeftMethod method : {PeftMethod::kLora, PeftMethod::kAdapterV2}) {
    GPT model = method == PeftMethod::kLora ? *CreateLoraGPT(config) : *CreateAdapterV2GPT(config);
    MarkTrainable(*model, method);
    int64_t trained = 0, frozen = 0;
    for (const auto& item : model->named_parameters()) {
      EXPECT_EQ(item.value().requires_grad(), IsTrainedParameter(method, item.key())) << item.key();
      (item.value().requires_grad() ? trained : frozen) += 1;
    }
    EXPECT_GT(trained, 0);
    EXPECT_GT(frozen, 0);
    const TensorMap unwrapped = UnwrapToBaseStateDict(StateDict(*model));
    ASSERT_EQ(unwrapped.size(), base_state.size()) << PeftMethodName(method);
    for (const auto& [name, tensor] : base_state) {
      ASSERT_TRUE(unwrapped.count(name)) << name;
      EXPECT_EQ(unwrapped.at(name).sizes(), tensor.sizes()) << name;
    }
  }
}

}  // namespace
}  // namespace lgpt
