// qwen2 (Qwen2, Qwen2.5, and the DeepSeek-R1 distills built on them): llama's layer with biases on the Q, K
// and V projections (attn_{q,k,v}.bias, added before RoPE), NEOX-style RoPE (halves of each head rotate
// together), no q/k norm, a dense SwiGLU FFN. Small models tie the output projection to token_embd.
// Its tokenizer is byte-level BPE with pre-type `qwen2` (core/tokenizer/pretokenizer.cpp).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen2_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "qwen2";
    t.rope_type = RopeType::neox;
    t.dense_only = true;
    t.qkv_bias = true;
    return t;
  }();
  return traits;
}

}  // namespace car::model
