// Conversion between Hugging Face Transformers checkpoints (config.json plus model.safetensors,
// pytorch_model.bin, or shards of either with an index) and LitGPT checkpoint directories
// (model_config.yaml plus lit_model.pth), as LitGPT's convert_hf_checkpoint.py and
// convert_lit_checkpoint.py do: weight names, the fused QKV layout and fused MLP weights of
// each family, tied embeddings, and the model config.
//
// Families: Llama 2/3 (and Mistral, SmolLM2, Falcon 3 and other LLaMAMLP models), Mixtral (MoE),
// Gemma 1/2/3, Qwen 2.5 (qkv bias), Qwen 3 (q/k norms; MoE too), OLMo 2, Phi 1.5/2, Phi 3/4
// (fused qkv_proj and gate_up_proj), GPT-NeoX/Pythia and Falcon (7b, 40b, 180B), the last two
// with their per-group interleaved query_key_value.
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
#include "core/io/tensor_map.h"

namespace lgpt {

enum class HfFamily {
  kLlama,    // LlamaForCausalLM, MistralForCausalLM: q/k/v_proj, gate/up/down_proj.
  kMixtral,  // MixtralForCausalLM: block_sparse_moe.experts.{e}.w1/w3/w2.
  kGemma,    // GemmaForCausalLM: Llama names, tied embeddings.
  kGemma2,   // Gemma2ForCausalLM: pre/post feed-forward norms.
  kGemma3,   // Gemma3ForCausalLM (text only): Gemma 2 names plus q/k norms.
  kQwen2,    // Qwen2ForCausalLM: Llama names with q/k/v biases.
  kQwen3,    // Qwen3ForCausalLM / Qwen3MoeForCausalLM: q/k norms; mlp.experts.{e}.*_proj.
  kOlmo2,    // Olmo2ForCausalLM: post-attention/feed-forward norms only, q/k norms.
  kPhi,      // PhiForCausalLM (phi-1.5, phi-2): dense, fc1/fc2, final_layernorm, biases.
  kPhi3,     // Phi3ForCausalLM (Phi-3, Phi-4): fused qkv_proj and gate_up_proj.
  kGptNeoX,  // GPTNeoXForCausalLM (Pythia): interleaved query_key_value.
  kFalcon,   // FalconForCausalLM (falcon-7b/40b/180B): interleaved query_key_value.
};

// The family of a LitGPT config, chosen as LitGPT's converters choose it (by name, then by
// MLP class). Unimplemented for configs no converter handles.
absl::StatusOr<HfFamily> HfFamilyOf(const Config& config);

// The Hugging Face `architectures[0]` and `model_type` of a config's family.
std::string HfArchitecture(const Config& config, HfFamily family);
std::string HfModelType(const Config& config, HfFamily family);

// Every tensor of a LitGPT model with `config` (finalised) and its shape, by LitGPT name: what
// GPTImpl builds, without building it.
std::map<std::string, std::vector<int64_t>> ExpectedLitShapes(const Config& config);

// Checks `tensors` against ExpectedLitShapes: InvalidArgument naming `source` and the first
// missing, unexpected or misshapen tensors.
absl::Status CheckLitTensors(const Config& config, const TensorMap& tensors,
                             const std::string& source);

// Hugging Face tensors (names as in the checkpoint) -> LitGPT state dict. Tensors are
// renamed without copying where possible; q/k/v and gate/up pairs are concatenated, and
// interleaved query_key_value reordered. A missing lm_head.weight is tied to the embedding.
// Rotary inv_freq buffers and GPT-NeoX's attention masks are dropped; other unknown names,
// incomplete q/k/v sets and misshapen tensors are InvalidArgument errors naming `source`.
// The result is checked with CheckLitTensors.
absl::StatusOr<TensorMap> HfToLit(const Config& config, const TensorMap& hf,
                                  const std::string& source);

// LitGPT state dict -> Hugging Face tensors (views where possible). lm_head.weight is left
// out when it equals transformer.wte.weight bit for bit (`*tied` then says so; config.json's
// tie_word_embeddings), except for GPT-NeoX, which never ties, and heads with a bias. The
// input is checked with CheckLitTensors first. LoRA weights are FailedPrecondition (merge
// them first), adapter weights Unimplemented.
absl::StatusOr<TensorMap> LitToHf(const Config& config, const TensorMap& lit,
                                  const std::string& source, bool* tied = nullptr);

// The config of a Hugging Face checkpoint directory. With `model_config` (a LitGPT
// model_config.yaml, for models that are no preset) that config is used as it is. Otherwise
// the preset is the one named `model_name` if given, else the one matching config.json's
// `_name_or_path` (as given, or its last one or two path components) or the directory's name,
// else the first preset (in config.py's order) whose architecture, layers, width, heads and
// vocabulary rows match config.json. The sizes config.json gives then override the preset's
// (layers, width, heads, query groups, head size, MLP and expert sizes, vocabulary rows as
// padded_vocab_size, norm epsilon, RoPE base and fraction, window, softcapping, attention
// scale; block size where smaller), so fine-tunes and shrunken variants convert too. A
// multimodal config's text_config holds the sizes; its vocabulary (which counts image tokens)
// is cut to the preset's, as LitGPT does.
// Errors: NotFound for a missing config.json or an unknown `model_name`; InvalidArgument for
// malformed JSON or sizes (negative, past 2^31, or not a valid config); Unimplemented for an
// architecture no family has, or no matching preset (then set ConvertOptions.model_name or model_config).
absl::StatusOr<Config> ConfigFromHfDir(const std::string& hf_dir, const std::string& model_name,
                                       const std::string& model_config = "");

// config.json text for `config` (as Transformers' config of its family would hold it).
std::string HfConfigJson(const Config& config, HfFamily family, bool tie_word_embeddings,
                         c10::ScalarType dtype);

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
  // HF -> LitGPT: the preset to use instead of config.json's name.
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
