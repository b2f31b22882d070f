// Conversion between Hugging Face Transformers checkpoints (config.json plus model.safetensors,
// pytorch_model.bin, or shards of either with an index) and LitGPT checkpoint directories
// (model_config.yaml plus lit_model.pth), as LitGPT's convert_hf_checkpoint.py and
// convert_lit_checkpoint.py do: weight names, the fused QKV layout and fused MLP weights of
// each family, tied embeddings; the model config comes from core/convert/hf_config.h.
//
// Families: Llama 2/3 (and Mistral, SmolLM2, Falcon 3 and other LLaMAMLP models), Mixtral (MoE),
// Gemma 1/2/3, Qwen 2.5 (qkv bias), Qwen 3 (q/k norms; MoE too), OLMo 2, Phi 1.5/2, Phi 3/4
// (fused qkv_proj and gate_up_proj), StableLM (LayerNorm), GPT-NeoX/Pythia and Falcon (7b,
// 40b, 180B), the last two with their per-group interleaved query_key_value.
//
// LitGPT's fused qkv is [Q | K | V] along dim 0: Q = n_head * head_size rows (heads in order),
// then K and V with n_query_groups * head_size rows each. GPT-NeoX and Falcon interleave per
// query group instead: [Q_g (q_per_kv * head_size rows), K_g, V_g] for each group g.
#ifndef LGPT_CORE_CONVERT_HF_CHECKPOINT_H_
#define LGPT_CORE_CONVERT_HF_CHECKPOINT_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/config/config.h"
#include "core/convert/hf_config.h"
#include "core/io/tensor_map.h"

namespace lgpt {

// Every tensor of a LitGPT model with `config` (finalised) and its shape, by LitGPT name: what
// GPTImpl builds, without building it.
std::map<std::string, std::vector<int64_t>> ExpectedLitShapes(const Config& config);

// Checks `tensors` against ExpectedLitShapes: InvalidArgument naming `source` and the first
// missing, unexpected, misshapen or not floating-point tensors.
absl::Status CheckLitTensors(const Config& config, const TensorMap& tensors,
                             const std::string& source);

// Hugging Face tensors (names as in the checkpoint) -> LitGPT state dict, for the layout of
// `family` (default: HfFamilyOf(config); config.json's architecture says it better). Tensors are
// renamed without copying where possible; q/k/v and gate/up pairs are concatenated, and
// interleaved query_key_value reordered. A missing lm_head.weight is tied to the embedding.
// Rotary inv_freq buffers and GPT-NeoX's attention masks are dropped; other unknown names,
// incomplete q/k/v sets and misshapen tensors are InvalidArgument errors naming `source`.
// The result is checked with CheckLitTensors.
absl::StatusOr<TensorMap> HfToLit(const Config& config, const TensorMap& hf,
                                  const std::string& source,
                                  std::optional<HfFamily> family = std::nullopt);

// LitGPT state dict -> Hugging Face tensors (views where possible). lm_head.weight is left
// out when it equals transformer.wte.weight bit for bit (`*tied` then says so; config.json's
// tie_word_embeddings), except for GPT-NeoX, which never ties, and heads with a bias. The
// input is checked with CheckLitTensors first. LoRA weights are FailedPrecondition (merge
// them first), adapter weights Unimplemented.
absl::StatusOr<TensorMap> LitToHf(const Config& config, const TensorMap& lit,
                                  const std::string& source, bool* tied = nullptr);

// Reads the weights of a Hugging Face directory: model.safetensors.index.json or
// pytorch_model.bin.index.json (every shard they name), else every *.safetensors, else every
// *.bin but training_args.bin. Safetensors and .bin files are memory-mapped, not copied.
// `files` (optional) receives the files read. Errors name the directory, index or shard: no
// weights, a shard the index names that is missing, a tensor the index places in a shard that
// lacks it, a name in two files; DataLoss for a .bin record that fails its CRC-32 check
// (unless `verify_checksums` is false; see ReadTorchStateDict).
absl::StatusOr<TensorMap> ReadHfTensors(const std::string& hf_dir,
                                        std::vector<std::string>* files = nullptr,
                                        bool verify_checksums = true);

struct ConvertOptions {
  // HF -> LitGPT: a preset to fill what config.json does not state (default: the preset named
  // like config.json or the directory, if any; config.json alone is enough).
  std::string model_name;
  // HF -> LitGPT: a model_config.yaml to use instead of a preset.
  std::string model_config;
  // Converts floating-point weights to this dtype (default: keep the checkpoint's).
  std::optional<c10::ScalarType> dtype;
  // HF -> LitGPT: also write model.safetensors next to lit_model.pth.
  bool write_safetensors = false;
  // HF -> LitGPT: out_dir may be hf_dir (LitGPT's layout after `litgpt download`); without
  // it, writing into the input directory is FailedPrecondition.
  bool in_place = false;
  // LitGPT -> HF: split model.safetensors into shards of at most this many bytes (with
  // model.safetensors.index.json); 0 writes one file.
  int64_t max_shard_bytes = 0;
  // Check the records of torch.save files read (pytorch_model.bin shards, lit_model.pth)
  // against their CRC-32s (ReadTorchStateDict): a mismatch is DataLoss naming the tensor and
  // this field. Off only for trusted storage.
  bool verify_checksums = true;
  // Called with a short description of each stage.
  std::function<void(const std::string&)> progress;
};

struct ConvertResult {
  Config config;
  // HF -> LitGPT (HfConfig): the preset that filled what config.json leaves out (empty: none),
  // the preset fields config.json changed, and notes for the user.
  std::string preset;
  std::vector<std::string> overridden;
  std::vector<std::string> notes;
  int64_t tensors = 0;               // Tensors written.
  int64_t bytes = 0;                 // Their data bytes.
  std::vector<std::string> written;  // Files written in out_dir (names).
};

// Converts the Hugging Face checkpoint in `hf_dir` into a LitGPT checkpoint directory
// `out_dir` (created if needed; equal to hf_dir only with `in_place`, as LitGPT converts, and
// then write_safetensors would replace the HF weights and is FailedPrecondition):
// model_config.yaml, lit_model.pth (and model.safetensors with write_safetensors), and copies
// of tokenizer.json, tokenizer.model, tokenizer_config.json, generation_config.json and
// special_tokens_map.json where present. The output directory is written as one transaction
// (core/base/output_dir.h): a killed conversion leaves it as it was. Memory: the sources are mapped, renamed tensors are views of them, so
// beyond the mapped pages only fused q/k/v (and --dtype conversions) are allocated.
absl::StatusOr<ConvertResult> ConvertHfCheckpoint(const std::string& hf_dir,
                                                  const std::string& out_dir,
                                                  const ConvertOptions& options = {});

// Converts the LitGPT checkpoint in `checkpoint_dir` (model_config.yaml plus
// model.safetensors or lit_model.pth) into a Hugging Face directory `out_dir` (not
// checkpoint_dir itself: FailedPrecondition): config.json, model.safetensors (or shards plus
// model.safetensors.index.json), and copies of the tokenizer files, as one transaction.
absl::StatusOr<ConvertResult> ConvertLitCheckpoint(const std::string& checkpoint_dir,
                                                   const std::string& out_dir,
                                                   const ConvertOptions& options = {});

}  // namespace lgpt

#endif  // LGPT_CORE_CONVERT_HF_CHECKPOINT_H_
