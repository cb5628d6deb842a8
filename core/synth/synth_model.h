// Synthetic GGUF models: seeded random weights in the exact layout llama.cpp expects, for tests, benchmarks
// and demos (`car gguf synth`).
//
// Architectures: `llama` dense, `llama` MoE (Mixtral layout: llama.expert_count / expert_used_count,
// blk.N.ffn_gate_inp.weight and stacked blk.N.ffn_{gate,up,down}_exps.weight), `qwen3` (per-head q/k
// RMSNorm: attn_q_norm / attn_k_norm), `qwen3moe`, `qwen2` (llama with attn_{q,k,v}.bias, NEOX RoPE) and
// `qwen2moe` (qwen2's attention; routed experts beside a shared expert: ffn_gate_inp_shexp (1-D) and
// ffn_{gate,up,down}_shexp, width expert_shared_feed_forward_length), `gemma3` (per-head q/k norms,
// post_attention_norm / post_ffw_norm, key/value lengths always written, attention.sliding_window when
// given, final_logit_softcapping when given, no rope.dimension_count, an SPM vocabulary without a space
// prefix; norm weights are drawn as the stored 1 + w of Gemma's converter, so 1 + 0.1 N(0, 1) as the
// others'); `gemma2` the same without the q/k norms and without rope.freq_base unless given (its
// converter writes neither), with attn_logit_softcapping when given, and always tied (llama.cpp loads no
// gemma2 output.weight); and `gpt-oss` (attention with Q/K/V/O biases and attn_sinks,
// post_attention_norm before the MoE, router and expert biases; keys attention.sliding_window and YaRN's
// rope.scaling.{type,factor,original_context_length}, as llama.cpp's converter writes them); and `deepseek2`
// (MLA attention with attn_q_a / attn_q_a_norm / attn_q_b or attn_q, attn_kv_a_mqa, attn_kv_a_norm and the
// split attn_k_b / attn_v_b (3-D, one matrix per head), the keys of llama.cpp's current converter:
// head_count_kv 1, key_length / value_length of the cache row, key_length_mla / value_length_mla; leading
// dense layers, then MoE layers with exp_probs_b (sigmoid gating), shared experts ffn_{gate,up,down}_shexp
// of expert_shared_count x expert width, group counts and YaRN with yarn_log_multiplier when given). Key names,
// tensor names, shapes and order follow the
// llama.cpp-made fixtures in ../shared/conformance/models/. Weights are drawn as those fixtures' were:
// token_embd N(0, 1), linear weights N(0, 0.5/sqrt(fan_in)), router N(0, 0.5), output N(0, 0.15), norm
// weights 1 + 0.1 N(0, 1), from a seeded generator: the same spec gives the same bytes. Q/K/V biases are
// N(0, 0.5), the shared expert's gate vector N(0, 2/sqrt(n_embd)) (so its sigmoid spreads over (0, 1));
// gpt-oss's O / router / down biases N(0, 0.5), its gate / up expert biases N(0, 3) (so swiglu_oai's clamp at
// 7 is reached) and sinks N(0, 2).
//
// Weight types: F32, F16, BF16 always; quantized types through car::tensor::quantize_row when car_tensor is
// linked and can_quantize() says yes (otherwise an error naming the type). Norms and the router are always
// F32, and so is every 1-D tensor (biases, the shared expert's gate) and gpt-oss's per-expert biases.
// `q4_k_m` / `q5_k_m` mix types per tensor like llama-quantize (see resolve_tensor_type); `mxfp4_moe` is
// its MXFP4_MOE: expert banks MXFP4, every other matrix Q8_0.
//
// The embedded tokenizer (unless `vocab_file` brings a real one) is a SentencePiece (`llama`) vocabulary: <unk>=0, <s>=1, </s>=2 (CONTROL), the
// 256 byte-fallback tokens <0x00>..<0xFF> (BYTE), then common English pieces with descending scores,
// padded with generated pieces to `n_vocab`, so any text tokenizes.
//
// Weights are generated when the file is written, tensor by tensor in chunks of rows (each chunk's rows
// quantized on `threads` threads), so writing a model of any size holds about one chunk in memory; the
// bytes do not depend on the chunk size or thread count.
//
// Pure functions of the spec; no global state; thread-safe (a built writer is not: see GgufWriter).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/gguf/gguf_writer.h"
#include "core/util/result.h"

namespace car::synth {

struct SynthSpec {
  /// "llama" | "qwen2" | "qwen2moe" | "qwen3" | "qwen3moe" | "gemma2" | "gemma3" | "gpt-oss" | "deepseek2"
  std::string arch = "llama";
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_ff = 512;          ///< dense FFN width (qwen3moe: feed_forward_length, unused by the model)
  uint32_t n_ff_expert = 0;     ///< MoE expert FFN width; 0 = n_ff
  uint32_t n_ff_shared = 0;     ///< qwen2moe: the shared expert's FFN width; 0 = n_ff
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t head_dim = 0;        ///< 0 = n_embd / n_head
  uint32_t n_expert = 0;        ///< > 0 makes llama a Mixtral-style MoE; qwen3moe and qwen2moe need it
  uint32_t n_expert_used = 0;   ///< 0 = min(2, n_expert)
  uint32_t n_vocab = 512;       ///< at least 260 (3 specials + 256 bytes + "▁")
  uint32_t n_ctx = 512;
  float rope_freq_base = 0.0f;  ///< 0 = 10000 (llama) / 1e6 (qwen*, gemma3) / 150000 (gpt-oss)
  float rms_eps = 0.0f;         ///< 0 = 1e-5 (llama, gpt-oss) / 1e-6 (qwen*, gemma3)
  uint32_t sliding_window = 0;  ///< gemma2/3, gpt-oss: <arch>.attention.sliding_window (0 = gemma3: not
                                ///< written, all global; gemma2: not written, 4096; gpt-oss: 128, the
                                ///< released files')
  float final_logit_softcap = 0.0f;  ///< gemma2/3: <arch>.final_logit_softcapping (0 = not written)
  float attn_logit_softcap = 0.0f;   ///< gemma2: <arch>.attn_logit_softcapping (0 = not written: 50)
  float rope_scaling_factor = 0.0f;  ///< gpt-oss: YaRN's rope.scaling.factor (0 = 32); deepseek2: 0 = no YaRN
  uint32_t rope_orig_ctx = 0;   ///< gpt-oss, deepseek2: rope.scaling.original_context_length (0 = 4096)
  bool tied_embeddings = false; ///< no output.weight (the output projection is token_embd)
  // deepseek2 (MLA attention, the V3 router). head_dim is a query-key head's width (key_length_mla),
  // n_head_kv is not used (the files say 1), n_ff is the leading dense layers' width.
  uint32_t q_lora_rank = 0;     ///< deepseek2: 0 = a plain attn_q, else attn_q_a / attn_q_a_norm / attn_q_b
  uint32_t kv_lora_rank = 0;    ///< deepseek2: the latent's width (0 = n_embd / 2)
  uint32_t rope_dim = 0;        ///< deepseek2: the rope part of a head (0 = head_dim / 2)
  uint32_t v_head_dim = 0;      ///< deepseek2: value_length_mla (0 = head_dim)
  uint32_t n_dense_lead = 1;    ///< deepseek2: leading_dense_block_count
  uint32_t n_expert_shared = 1; ///< deepseek2: expert_shared_count
  uint32_t n_expert_groups = 0; ///< deepseek2: expert_group_count (0 = not written)
  uint32_t n_group_used = 0;    ///< deepseek2: expert_group_used_count
  bool sigmoid_gating = true;   ///< deepseek2: expert_gating_func 2 (sigmoid, with exp_probs_b) or 1 (softmax)
  bool expert_weights_norm = true;     ///< deepseek2: expert_weights_norm
  float expert_weights_scale = 2.5f;   ///< deepseek2: expert_weights_scale
  float yarn_log_multiplier = 0.0f;    ///< deepseek2 with YaRN: rope.scaling.yarn_log_multiplier (0 = not written)
  uint64_t seed = 1;
  /// "f32", "f16", "bf16", "q4_k_m", "q5_k_m", "mxfp4_moe", or any ggml type name ("q8_0", "q4_0", "q6_k", ...).
  std::string weight_type = "f32";
  std::string name;             ///< general.name; empty = derived from the shape
  std::string chat_template;    ///< tokenizer.chat_template (Jinja text); empty = the key is not written
  /// A GGUF file (e.g. a vocab-only one) whose tokenizer.* keys are written instead of the embedded SPM
  /// vocabulary; n_vocab becomes its token count. chat_template, when given, still wins. Empty = embedded.
  std::string vocab_file;
  uint32_t alignment = 0;       ///< 0 = no general.alignment key (GGUF default 32)
  uint32_t threads = 0;         ///< threads converting / quantizing rows (0 = all cores); same bytes for any
  uint64_t chunk_values = 0;    ///< weights generated per step, rounded to whole rows (0 = 1 Mi); same bytes
};

/// What a tensor is, for choosing its type in a mix.
enum class TensorRole { token_embd, output, norm, router, attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
                        ffn_down };

/// The ggml type of one tensor under `spec.weight_type`: norms and routers F32; mixes pick per role and
/// layer as llama-quantize does (q4_k_m: Q4_K, with Q6_K for output and, in the "more bits" layers, for
/// attn_v and ffn_down; q5_k_m the same with Q5_K); rows that are not a multiple of the type's block fall
/// back as llama.cpp does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS and the codebook types
/// IQ3_XXS/IQ3_S/IQ2_XXS/IQ2_XS/IQ2_S/IQ1_S/IQ1_M -> IQ4_NL, TQ1_0/TQ2_0 -> Q4_0, others -> F16).
/// `expert_bank`: a stacked 3-D expert tensor (mxfp4_moe gives those MXFP4).
/// Errors: unknown weight type name.
Result<GgmlType> resolve_tensor_type(const SynthSpec& spec, TensorRole role, uint32_t layer, uint64_t row_len,
                                     bool expert_bank = false);

/// Check a spec (arch known, sizes non-zero and consistent, vocab large enough, weight type known).
Result<void> validate(const SynthSpec& spec);

/// Build the model in a writer (metadata, tokenizer, every tensor). The weights are produced when the
/// writer serializes (to_bytes / write), each time the same.
Result<gguf::GgufWriter> build_synth_model(const SynthSpec& spec);
/// Build and write to `path` (atomically), in bounded memory.
Result<void> write_synth_model(const SynthSpec& spec, const std::string& path);

/// A very small valid spec per flavour ("llama", "llama-moe", "qwen2", "qwen2moe", "qwen3", "qwen3moe",
/// "gemma2", "gemma3": seven layers, so some are global, window 4; "gpt-oss": sliding window 4): two layers
/// unless said, n_embd 32, vocab 300; a few tens of KB. For unit tests and fuzz seeds.
SynthSpec tiny_spec(std::string_view flavour);

/// The embedded tokenizer's pieces, scores and token types for a vocabulary of `n_vocab` (>= 260).
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;  ///< 1 normal, 2 unknown, 3 control, 6 byte
};
SynthVocab make_synth_vocab(uint32_t n_vocab);

}  // namespace car::synth
