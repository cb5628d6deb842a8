// Hparams: a transformer's hyperparameters, read from a GGUF file's `<arch>.*` metadata and checked against
// each other. Plain data; the architecture (core/model/architecture.h) says which keys are required and how
// the forward pass differs (rope style, q/k norm, MoE layout).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/util/result.h"

namespace car::model {

struct ArchTraits;

/// How RoPE pairs the elements of a head (llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX).
enum class RopeType {
  norm,  ///< adjacent pairs (x[2i], x[2i+1]) - llama
  neox,  ///< halves (x[i], x[i + n_rot/2]) - qwen2, qwen2moe, qwen3, qwen3moe
};

/// YaRN RoPE scaling (rope.scaling.type = yarn), with the constants llama.cpp derives for it (llama-context.cpp,
/// ggml's rope_yarn): each rotated pair's angle mixes the interpolated (freq_scale * theta) and the
/// extrapolated (theta) one by a ramp over the pairs between the correction dims of beta_fast and beta_slow,
/// and cos/sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale)).
struct RopeYarn {
  float ext_factor = 0.0f;   ///< 1 for yarn (llama.cpp's default), 0 = no ramp (plain or linear RoPE)
  /// cos/sin magnitude before the ramp's own factor: 1, or for yarn (0.1 ln(f) + 1) / (1 + 0.1 ln(f)) for
  /// f = 1 / freq_scale (llama.cpp cancels its mscale this way); times rope.scaling.attn_factor when given.
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;   ///< llama.cpp's defaults (gpt-oss's config has the same; the keys are not read)
  float beta_slow = 1.0f;
  int64_t n_ctx_orig = 0;    ///< rope.scaling.original_context_length (default context_length)
};

struct Hparams {
  std::string arch;              ///< general.architecture
  const ArchTraits* traits = nullptr;
  int64_t n_vocab = 0;           ///< rows of token_embd
  int64_t n_ctx_train = 0;       ///< <arch>.context_length
  int64_t n_embd = 0;            ///< <arch>.embedding_length
  int64_t n_layer = 0;           ///< <arch>.block_count
  int64_t n_head = 0;            ///< <arch>.attention.head_count
  int64_t n_head_kv = 0;         ///< <arch>.attention.head_count_kv (default n_head)
  int64_t head_dim_k = 0;        ///< <arch>.attention.key_length (default n_embd / n_head)
  int64_t head_dim_v = 0;        ///< <arch>.attention.value_length (default head_dim_k)
  int64_t n_ff = 0;              ///< dense FFN width (<arch>.feed_forward_length); 0 when every layer is MoE
  int64_t n_expert = 0;          ///< <arch>.expert_count (0 = dense)
  int64_t n_expert_used = 0;     ///< <arch>.expert_used_count
  int64_t n_ff_exp = 0;          ///< one expert's FFN width
  int64_t n_ff_shexp = 0;        ///< the shared expert's FFN width (shared_expert archs; else 0)
  float rms_eps = 1e-5f;         ///< <arch>.attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  ///< 1 / rope.scaling.factor (linear and yarn scaling)
  RopeYarn yarn;                 ///< YaRN's terms (ext_factor 0 unless rope.scaling.type = yarn)
  int64_t n_rot = 0;             ///< <arch>.rope.dimension_count (default head_dim_k)
  RopeType rope_type = RopeType::norm;
  /// Per layer: the sliding window (a query at p sees keys at p' with p - p' < window; 0 = global), or
  /// empty when every layer is global. The KV cache applies it (engine::KvCache::first_visible).
  std::vector<int64_t> swa_window;
  float rope_freq_base_swa = 0.0f;   ///< the windowed layers' RoPE base when they differ (gemma3); 0 = same
  float rope_freq_scale_swa = 1.0f;  ///< their frequency scale (with rope_freq_base_swa)
  /// scale_query archs: Q is multiplied by this before attention and the kernel's scale is 1; 0 = the
  /// kernel scales by 1/sqrt(head_dim_k).
  float attn_scale = 0.0f;
  float final_logit_softcap = 0.0f;  ///< c > 0: logits = c * tanh(logits / c) (<arch>.final_logit_softcapping)
  float attn_logit_softcap = 0.0f;   ///< c > 0: attention scores s -> c * tanh(s / c) (<arch>.attn_logit_softcapping)

  // deepseek2 (traits.mla): multi-head latent attention. head_dim_k / head_dim_v are then the per-head
  // query-key and value widths (attention.key_length_mla / value_length_mla), n_rot the rope part of each
  // query-key head, and the cache holds kv_lora_rank + n_rot keys (the latent and the rope key) and the
  // latent again as values, for one KV head (mla_cache_dim_k / _v).
  int64_t q_lora_rank = 0;         ///< attention.q_lora_rank (0 = a plain attn_q)
  int64_t kv_lora_rank = 0;        ///< attention.kv_lora_rank (> 0 = MLA)
  int64_t n_layer_dense_lead = 0;  ///< leading_dense_block_count: the first layers have a dense FFN
  int64_t n_expert_shared = 0;     ///< expert_shared_count (the shared FFN is this x n_ff_exp wide)
  /// Router: sigmoid (expert_gating_func 2) instead of softmax (1, and the default when absent).
  bool gating_sigmoid = false;
  bool expert_weights_norm = false;   ///< expert_weights_norm: the chosen weights divided by their sum
  float expert_weights_scale = 0.0f;  ///< expert_weights_scale: the weights times this (0 or 1 = none)
  int64_t n_expert_groups = 0;        ///< expert_group_count (> 1: group-limited selection)
  int64_t n_group_used = 0;           ///< expert_group_used_count
  float rope_yarn_log_mul = 0.0f;     ///< rope.scaling.yarn_log_multiplier / 0.1 (llama.cpp's mscale_all_dim)
  float mla_kq_scale = 0.0f;          ///< the attention scale mscale^2 / sqrt(key_length_mla)

  int64_t mla_cache_dim_k() const { return kv_lora_rank + n_rot; }
  int64_t mla_cache_dim_v() const { return kv_lora_rank; }
  bool is_mla() const { return kv_lora_rank > 0; }

  int64_t q_dim() const { return n_head * head_dim_k; }      ///< width of Q
  int64_t k_dim() const { return n_head_kv * head_dim_k; }   ///< width of K
  int64_t v_dim() const { return n_head_kv * head_dim_v; }   ///< width of V
  int64_t attn_out_dim() const { return n_head * head_dim_v; }
  /// The sliding window of layer il (0 = global).
  int64_t window(int64_t il) const { return swa_window.empty() ? 0 : swa_window[static_cast<size_t>(il)]; }
  /// Whether layer il rotates with the windowed layers' own RoPE base.
  bool swa_rope(int64_t il) const { return rope_freq_base_swa > 0.0f && window(il) > 0; }
  bool is_moe() const { return n_expert > 0; }
};

/// Fill h.swa_window (h.n_layer set) as llama.cpp's llama_hparams::set_swa_pattern(pattern, dense_first) does:
/// layer il has a sliding window of `n_swa` positions when pattern == 0, else when il % pattern < pattern - 1
/// (the last layer of each group of `pattern` is global), or with dense_first when il % pattern != 0 (the
/// first is global). n_swa 0 = every layer global (swa_window left empty).
void set_swa_pattern(Hparams& h, int64_t n_swa, int64_t pattern, bool dense_first = false);

/// Read and validate the hyperparameters. Errors: load_failed, naming the key and the offending values.
/// `n_vocab` is filled by the model loader from token_embd.
Result<Hparams> read_hparams(const gguf::GgufFile& file);

}  // namespace car::model
