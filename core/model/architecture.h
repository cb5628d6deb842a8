// ArchTraits: what distinguishes one supported architecture from another. The forward pass is one shared
// pre-norm transformer (embeddings -> N x [RMSNorm, GQA attention, residual, RMSNorm, SwiGLU FFN or MoE,
// residual] -> RMSNorm -> output projection); everything an architecture changes is a field here, and each
// architecture defines its traits in its own file (llama.cpp, qwen3.cpp, qwen3moe.cpp).
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
};

const ArchTraits& llama_traits();
const ArchTraits& qwen3_traits();
const ArchTraits& qwen3moe_traits();

/// Traits for a general.architecture value; null when unsupported.
const ArchTraits* find_arch(std::string_view name);

}  // namespace car::model
