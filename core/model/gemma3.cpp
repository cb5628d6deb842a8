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
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "gemma3";
    t.rope_type = RopeType::neox;
    t.qk_norm = true;
    t.dense_only = true;
    t.embed_scale = true;
    t.post_norms = true;
    t.ffn_act = FfnAct::gelu;
    t.scale_query = true;
    t.query_scale_embd_layers = 62;
    t.swa_pattern = 6;
    t.swa_rope_freq_base = 10000.0f;
    t.final_logit_softcap = 0.0f;
    return t;
  }();
  return traits;
}

}  // namespace car::model
