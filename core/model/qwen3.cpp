// qwen3 (dense): NEOX-style RoPE (halves of each head rotate together) and a per-head RMSNorm of Q and K
// (attn_q_norm / attn_k_norm, head_dim wide) applied before RoPE. Q may be wider than n_embd
// (attention.key_length * head_count).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen3_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "qwen3";
    t.rope_type = RopeType::neox;
    t.qk_norm = true;
    t.dense_only = true;
    return t;
  }();
  return traits;
}

}  // namespace car::model
