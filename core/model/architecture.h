// ArchTraits: what distinguishes one supported architecture from another. The forward pass is one shared
// pre-norm transformer (embeddings -> N x [RMSNorm, GQA attention, residual, RMSNorm, SwiGLU FFN or MoE,
// residual] -> RMSNorm -> output projection); everything an architecture changes is a field here, and each
// architecture defines its traits in its own file (llama.cpp, qwen2.cpp, qwen2moe.cpp, qwen3.cpp,
// qwen3moe.cpp).
//
// Optional tensors every architecture takes when the file has them (as llama.cpp's shared graph builders
// do): Q/K/V biases (blk.N.attn_{q,k,v}.bias, added after the projections) and output.bias (added to the
// logits).
//
// Immutable static data; safe to share.
#pragma once

#include <string_view>

#include "core/model/hparams.h"

namespace car::model {

struct ArchTraits {
  std::string_view name;               ///< general.architecture value
  RopeType rope_type = RopeType::norm;
  bool qk_norm = false;                ///< per-head RMSNorm of Q and K before RoPE (attn_{q,k}_norm)
  bool moe_required = false;           ///< every layer must be MoE (qwen3moe)
  bool dense_only = false;             ///< MoE tensors are not allowed (qwen3)
  /// Key holding one expert's FFN width; empty = <arch>.feed_forward_length (llama / Mixtral layout).
  std::string_view expert_ff_key;
  /// Renormalize the chosen experts' softmax weights to sum to 1 (llama.cpp's build_moe_ffn `norm_w`).
  bool moe_norm_weights = true;
  /// The files carry Q/K/V biases (qwen2, qwen2moe): `car gguf synth` writes them. Loading does not depend
  /// on it (biases are taken whenever present).
  bool qkv_bias = false;
  /// Every MoE layer also has a shared expert (ffn_{gate,up,down}_shexp, always run) whose output is scaled
  /// by sigmoid(ffn_gate_inp_shexp . x) and added to the routed experts' sum (qwen2moe). Its width is the
  /// key below, or feed_forward_length when that is absent (llama.cpp's rule).
  bool shared_expert = false;
  std::string_view shared_expert_ff_key;
};

const ArchTraits& llama_traits();
const ArchTraits& qwen2_traits();
const ArchTraits& qwen2moe_traits();
const ArchTraits& qwen3_traits();
const ArchTraits& qwen3moe_traits();

/// Traits for a general.architecture value; null when unsupported.
const ArchTraits* find_arch(std::string_view name);
/// The supported general.architecture values, comma-separated (for messages).
std::string_view supported_archs();

}  // namespace car::model
