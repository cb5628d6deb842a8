// llama (Llama 1/2/3, and Mixtral's MoE layout under the same name): adjacent-pair RoPE, no q/k norm.
// MoE layers (when <arch>.expert_count > 0) store the experts as ffn_{gate,up,down}_exps banks with a router
// ffn_gate_inp; an expert's width is feed_forward_length. llama.cpp's build for this architecture passes
// norm_w = true to build_moe_ffn: softmax over all experts, take the top k, divide by their sum.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& llama_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "llama";
    return t;
  }();
  return traits;
}

const ArchTraits* find_arch(std::string_view name) {
  for (const ArchTraits* t :
       {&llama_traits(), &qwen2_traits(), &qwen2moe_traits(), &qwen3_traits(), &qwen3moe_traits(),
        &gemma2_traits(), &gemma3_traits(), &gpt_oss_traits(), &deepseek2_traits()}) {
    if (t->name == name) return t;
  }
  return nullptr;
}

std::string_view supported_archs() {
  return "llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, gpt-oss, deepseek2";
}

}  // namespace car::model
