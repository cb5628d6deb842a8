// qwen2moe (Qwen1.5-MoE, Qwen2-MoE): qwen2's attention (Q/K/V biases, NEOX RoPE) with every FFN a routed MoE
// block beside a shared expert. llama.cpp's graph (src/models/qwen2moe.cpp) per layer, h = rms_norm(x) *
// ffn_norm:
//   routed  = sum over the top-k of softmax(ffn_gate_inp h) of p_e * expert_e(h)   norm_w = false: the
//             chosen softmax probabilities are used as they are, not renormalized to sum to 1
//   shared  = (silu(h W_gate_shexp) * (h W_up_shexp)) W_down_shexp                 always run, resident
//   g       = silu(s) / s with s = ffn_gate_inp_shexp . h                          (a sigmoid, computed so)
//   x      += routed + shared * g
// One routed expert's width is expert_feed_forward_length; the shared expert's
// expert_shared_feed_forward_length (feed_forward_length when absent).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen2moe_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "qwen2moe";
    t.rope_type = RopeType::neox;
    t.moe_required = true;
    t.expert_ff_key = "expert_feed_forward_length";
    t.moe_norm_weights = false;
    t.qkv_bias = true;
    t.shared_expert = true;
    t.shared_expert_ff_key = "expert_shared_feed_forward_length";
    return t;
  }();
  return traits;
}

}  // namespace car::model
