// deepseek2 (DeepSeek-V2 / V2-Lite / V2.5 / V3 / R1, Kimi K2; llama.cpp's LLM_ARCH_DEEPSEEK2,
// src/models/deepseek2.cpp). Pre-norm, adjacent-pair RoPE on a rope part of each head only. Per layer, with
// h = rms_norm(x) * attn_norm:
//   q        = wq h, or wq_b (rms_norm(wq_a h) * attn_q_a_norm) when attention.q_lora_rank > 0; each head is
//              [q_nope (key_length_mla - n_rot) | q_pe (n_rot)], q_pe rotated
//   latent   [c | k_pe] = wkv_a_mqa h; c = rms_norm(c) * attn_kv_a_norm (kv_lora_rank), k_pe rotated (n_rot,
//              one for all heads). The cache holds [c | k_pe] per position in fp16 (llama.cpp's MLA cache)
//   absorbed per head: Q = [attn_k_b[h] q_nope | q_pe] (kv_lora_rank + n_rot), attention over the cached
//              [c | k_pe] with the latent c as the value (MQA), scale mscale^2 / sqrt(key_length_mla);
//              the head's output (kv_lora_rank) decompressed by attn_v_b[h] to value_length_mla, then wo
//   ffn      the first leading_dense_block_count layers a dense SwiGLU FFN; the others a routed MoE whose
//              router is softmax or sigmoid (expert_gating_func), whose selection adds exp_probs_b (V3) and
//              keeps the experts of the best expert_group_used_count groups (a group's score is the sum of
//              its two best), whose weights are the chosen unbiased probabilities, normalised to sum 1 when
//              expert_weights_norm, times expert_weights_scale; plus expert_shared_count shared experts
//              as one plain SwiGLU FFN (no gate), resident whatever the expert source.
// Files with the unsplit attn_kv_b (older converters; llama.cpp runs them as full multi-head attention) are
// refused with a message.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& deepseek2_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "deepseek2";
    t.expert_ff_key = "expert_feed_forward_length";
    t.moe_norm_weights = false;  // expert_weights_norm decides (Hparams::expert_weights_norm)
    t.mla = true;
    return t;
  }();
  return traits;
}

}  // namespace car::model
