// gemma3 (Gemma 3 text models; llama.cpp's src/models/gemma3.cpp): per layer, h = rms_norm(x) * attn_norm,
//   q, k, v = h Wq, h Wk, h Wv;  q, k = rms_norm per head * attn_{q,k}_norm;  NEOX RoPE
//   q *= 1/sqrt(key_length)  (in float; the attention's own scale is 1)
//   x += rms_norm(attention(q, k, v) Wo) * post_attention_norm
//   h  = rms_norm(x) * ffn_norm
//   x += rms_norm((gelu(h Wgate) * (h Wup)) Wdown) * post_ffw_norm
// with the input embeddings scaled by sqrtf(n_embd) and, when the file has final_logit_softcapping c, the
// logits capped as c * tanh(logits / c). Five sliding-window layers then one global layer (llama.cpp's
// set_swa_pattern(6)) when <arch>.attention.sliding_window is present and non-zero; the windowed layers
// rotate with RoPE base 10000 and frequency scale 1, the global ones with rope.freq_base (and linear
// scaling when the file has it). The 27B size (62 layers) scales Q by 1/sqrt(n_embd / n_head) instead
// (its query_pre_attn_scalar). Norm weights are stored as Gemma's (1 + w): HF's converter adds the 1, so
// they multiply as they are. The output projection is usually tied to token_embd.
// Its tokenizer is SPM (tokenizer.ggml.model "llama", no space prefix).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& gemma3_traits() {
  static const ArchTraits traits{
      .name = "gemma3",
      .rope_type = RopeType::neox,
      .qk_norm = true,
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
      .query_scale_embd_layers = 62,
      .ffn_norm_name = "ffn_norm",
      .attn_sinks = false,
      .expert_gating = ExpertGating::softmax,
      .expert_activation = ExpertActivation::swiglu,
      .moe_biases = false,
      .swa_pattern = 6,
      .swa_default_window = 0,
      .swa_rope_freq_base = 10000.0f,
      .final_logit_softcap = 0.0f,
      .attn_logit_softcap = std::nullopt,
  };
  return traits;
}

}  // namespace car::model
