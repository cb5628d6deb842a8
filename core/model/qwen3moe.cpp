// qwen3moe: qwen3's attention (NEOX RoPE, per-head q/k RMSNorm) with every FFN a routed MoE block. One
// expert's width is expert_feed_forward_length (feed_forward_length is unused). llama.cpp builds it with
// norm_w = true (the top-k softmax weights renormalized to sum to 1), softmax gating, no shared expert.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen3moe_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "qwen3moe";
    t.rope_type = RopeType::neox;
    t.qk_norm = true;
    t.moe_required = true;
    t.expert_ff_key = "expert_feed_forward_length";
    return t;
  }();
  return traits;
}

}  // namespace car::model
