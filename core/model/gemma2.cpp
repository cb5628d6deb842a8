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
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "gemma2";
    t.rope_type = RopeType::neox;
    t.dense_only = true;
    t.embed_scale = true;
    t.post_norms = true;
    t.ffn_act = FfnAct::gelu;
    t.scale_query = true;
    t.query_scale_embd_layers = 46;
    t.swa_pattern = 2;
    t.swa_default_window = 4096;
    t.final_logit_softcap = 30.0f;
    t.attn_logit_softcap = 50.0f;
    return t;
  }();
  return traits;
}

}  // namespace car::model
