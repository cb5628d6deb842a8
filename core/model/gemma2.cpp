// gemma2 (Gemma 2; llama.cpp's src/models/gemma2-iswa.cpp): gemma3's layer without the per-head q/k norms -
// embeddings times sqrtf(n_embd), Q times 1/sqrt(key_length) before the attention (1/sqrt(n_embd / n_head)
// for the 27B size, 46 layers), post norms on both sub-blocks' outputs, GEGLU with ggml's GELU - plus the
// two soft-caps: every attention score s becomes c * tanh(s / c) inside the softmax
// (attn_logit_softcapping, default 50: ggml's flash attention divides its scale by c, then multiplies c by
// tanhf), and the logits c * tanh(logits / c) (final_logit_softcapping, default 30). Even layers use a
// sliding window (llama.cpp's set_swa_pattern(2)) of attention.sliding_window positions, 4096 when the key
// is absent; all layers share one RoPE base. Norm weights are stored as (1 + w) by the converter.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& gemma2_traits() {
  static const ArchTraits traits{
      .name = "gemma2",
      .rope_type = RopeType::neox,
      .qk_norm = false,
      .moe_required = false,
      .dense_only = true,
      .expert_ff_key = {},
      .moe_norm_weights = true,
      .qkv_bias = false,
      .shared_expert = false,
      .shared_expert_ff_key = {},
      .embed_scale = true,
      .post_norms = true,
      .ffn_act = FfnAct::gelu,
      .scale_query = true,
      .query_scale_embd_layers = 46,
      .ffn_norm_name = "ffn_norm",
      .attn_sinks = false,
      .expert_gating = ExpertGating::softmax,
      .expert_activation = ExpertActivation::swiglu,
      .moe_biases = false,
      .swa_pattern = 2,
      .swa_default_window = 4096,
      .swa_rope_freq_base = 0.0f,
      .final_logit_softcap = 30.0f,
      .attn_logit_softcap = 50.0f,
  };
  return traits;
}

}  // namespace car::model
