#include "core/model/hparams.h"

#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "core/model/architecture.h"
#include "core/util/error_codes.h"

namespace car::model {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 24;  // no real model has a dimension near 16M

Error load_error(std::string message) {
  return make_error(errc::kLoadFailed, std::move(message));
}

/// Reads `<arch>.<suffix>` keys, turning reader errors into load_failed errors that name the key.
class KeyReader {
 public:
  KeyReader(const gguf::GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}

  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  /// A required positive integer no larger than kMaxDim.
  Result<int64_t> dim(std::string_view suffix) const {
    const std::string k = key(suffix);
    auto v = f_.get_uint(k);
    if (!v.ok()) return load_error("model key " + k + ": " + v.error().message);
    if (*v == 0 || *v > static_cast<uint64_t>(kMaxDim)) {
      return load_error("model key " + k + " = " + std::to_string(*v) + ": must be in [1, " +
                        std::to_string(kMaxDim) + "]");
    }
    return static_cast<int64_t>(*v);
  }
  /// An optional non-negative integer (fallback when absent).
  Result<int64_t> dim_or(std::string_view suffix, int64_t fallback) const {
    const std::string k = key(suffix);
    if (!f_.has(k)) return fallback;
    auto v = f_.get_uint(k);
    if (!v.ok()) return load_error("model key " + k + ": " + v.error().message);
    if (*v > static_cast<uint64_t>(kMaxDim)) {
      return load_error("model key " + k + " = " + std::to_string(*v) + ": larger than " + std::to_string(kMaxDim));
    }
    return static_cast<int64_t>(*v);
  }
  Result<double> real_or(std::string_view suffix, double fallback) const {
    const std::string k = key(suffix);
    auto v = f_.get_float_or(k, fallback);
    if (!v.ok()) return load_error("model key " + k + ": " + v.error().message);
    if (!std::isfinite(*v)) return load_error("model key " + k + ": not a finite number");
    return *v;
  }
  Result<std::string> string_or(std::string_view suffix, std::string fallback) const {
    const std::string k = key(suffix);
    auto v = f_.get_string_or(k, std::move(fallback));
    if (!v.ok()) return load_error("model key " + k + ": " + v.error().message);
    return *v;
  }

 private:
  const gguf::GgufFile& f_;
  std::string arch_;
};

/// deepseek2's attention keys (llama_model_deepseek2::load_arch_hparams and llama-context's YaRN terms).
/// Called after the common keys: it replaces head_dim_k / head_dim_v by the MLA widths.
Result<void> read_mla_hparams(const KeyReader& kr, const gguf::GgufFile& file, Hparams& h) {
  CAR_TRY_ASSIGN(h.kv_lora_rank, kr.dim("attention.kv_lora_rank"));
  CAR_TRY_ASSIGN(h.q_lora_rank, kr.dim_or("attention.q_lora_rank", 0));
  int64_t k_mla = 0;
  int64_t v_mla = 0;
  CAR_TRY_ASSIGN(k_mla, kr.dim_or("attention.key_length_mla", 0));
  CAR_TRY_ASSIGN(v_mla, kr.dim_or("attention.value_length_mla", 0));
  if (k_mla == 0 || v_mla == 0) {
    return load_error("model keys " + kr.key("attention.key_length_mla") +
                      " / value_length_mla are missing: " +
                      "a deepseek2 file with the unsplit attn_kv_b (an older converter) is not supported; " +
                      "convert it again with a current llama.cpp");
  }
  // The cache row: the latent and the rope key (attention.key_length), the latent as value (value_length).
  if (h.head_dim_k != h.kv_lora_rank + h.n_rot || h.head_dim_v != h.kv_lora_rank || h.n_head_kv != 1) {
    return load_error("model keys " + kr.key("attention.key_length") + " = " + std::to_string(h.head_dim_k) +
                      ", value_length = " + std::to_string(h.head_dim_v) + ", head_count_kv = " +
                      std::to_string(h.n_head_kv) + ": MLA needs kv_lora_rank + rope.dimension_count = " +
                      std::to_string(h.kv_lora_rank + h.n_rot) + ", kv_lora_rank and 1");
  }
  if (h.n_rot >= k_mla) {
    return load_error("model key " + kr.key("rope.dimension_count") + " = " + std::to_string(h.n_rot) +
                      ": must be smaller than attention.key_length_mla = " + std::to_string(k_mla));
  }
  h.head_dim_k = k_mla;
  h.head_dim_v = v_mla;
  CAR_TRY_ASSIGN(h.n_layer_dense_lead, kr.dim_or("leading_dense_block_count", 0));
  if (h.n_layer_dense_lead > h.n_layer) {
    return load_error("model key " + kr.key("leading_dense_block_count") + " = " +
                      std::to_string(h.n_layer_dense_lead) + ": more than block_count");
  }
  double log_mul = 0.0;
  CAR_TRY_ASSIGN(log_mul, kr.real_or("rope.scaling.yarn_log_multiplier", 0.0));
  h.rope_yarn_log_mul = static_cast<float>(log_mul) / 0.1f;  // llama.cpp cancels the converter's 0.1
  if (h.yarn.ext_factor > 0.0f && h.rope_yarn_log_mul != 0.0f) {
    // llama_context: attn_factor = get_mscale(f, mscale) / get_mscale(f, mscale_all_dims) / (1 + 0.1 ln f),
    // mscale = mscale_all_dims for deepseek2 (so the ratio is 1), times rope.scaling.attn_factor.
    const float f = 1.0f / h.rope_freq_scale;
    const float mscale_all = h.rope_yarn_log_mul;
    const float mscale = mscale_all != 1.0f ? mscale_all : 1.0f;
    auto get_mscale = [](float factor, float m) {
      return factor <= 1.0f ? 1.0f : 0.1f * m * std::log(factor) + 1.0f;
    };
    float af = get_mscale(f, mscale) / get_mscale(f, mscale_all);
    af *= 1.0f / (1.0f + 0.1f * std::log(f));
    double rope_attn = 1.0;
    CAR_TRY_ASSIGN(rope_attn, kr.real_or("rope.scaling.attn_factor", 1.0));
    h.yarn.attn_factor = af * static_cast<float>(rope_attn);
  }
  // The graph's kq_scale: the attn_factor before llama.cpp's yarn adjustment, times the log-multiplier term.
  const float fs = h.rope_freq_scale;
  const float attn_factor_org = h.yarn.attn_factor * (1.0f + 0.1f * std::log(1.0f / fs));
  const float mscale = attn_factor_org * (1.0f + 0.1f * h.rope_yarn_log_mul * std::log(1.0f / fs));
  h.mla_kq_scale = 1.0f * mscale * mscale / std::sqrt(static_cast<float>(k_mla));
  (void)file;
  return {};
}

/// deepseek2's router keys.
Result<void> read_mla_router(const KeyReader& kr, const gguf::GgufFile& file, Hparams& h) {
  CAR_TRY_ASSIGN(h.n_expert_shared, kr.dim_or("expert_shared_count", 0));
  double scale = 0.0;
  CAR_TRY_ASSIGN(scale, kr.real_or("expert_weights_scale", 0.0));
  if (scale < 0) return load_error("model key " + kr.key("expert_weights_scale") + " is negative");
  h.expert_weights_scale = static_cast<float>(scale);
  const std::string norm_key = kr.key("expert_weights_norm");
  if (file.has(norm_key)) {
    auto v = file.get_bool(norm_key);
    if (!v.ok()) return load_error("model key " + norm_key + ": " + v.error().message);
    h.expert_weights_norm = *v;
  }
  int64_t gating = 0;
  CAR_TRY_ASSIGN(gating, kr.dim_or("expert_gating_func", 0));
  if (gating > 2) {
    return load_error("model key " + kr.key("expert_gating_func") + " = " + std::to_string(gating) +
                      ": supported are 1 (softmax) and 2 (sigmoid)");
  }
  h.gating_sigmoid = gating == 2;
  CAR_TRY_ASSIGN(h.n_expert_groups, kr.dim_or("expert_group_count", 0));
  CAR_TRY_ASSIGN(h.n_group_used, kr.dim_or("expert_group_used_count", 0));
  return {};
}

}  // namespace

void set_swa_pattern(Hparams& h, int64_t n_swa, int64_t pattern, bool dense_first) {
  h.swa_window.clear();
  if (n_swa <= 0) return;
  h.swa_window.resize(static_cast<size_t>(h.n_layer), 0);
  for (int64_t il = 0; il < h.n_layer; ++il) {
    const bool windowed = pattern == 0 || (dense_first ? il % pattern != 0 : il % pattern < pattern - 1);
    h.swa_window[static_cast<size_t>(il)] = windowed ? n_swa : 0;
  }
}

Result<Hparams> read_hparams(const gguf::GgufFile& file) {
  Hparams h;
  auto arch = file.get_string("general.architecture");
  if (!arch.ok()) return load_error("model key general.architecture: " + arch.error().message);
  h.arch = *arch;
  h.traits = find_arch(h.arch);
  if (h.traits == nullptr) {
    return load_error("general.architecture '" + h.arch + "' is not supported (supported: " +
                      std::string(supported_archs()) + ")");
  }
  const ArchTraits& t = *h.traits;
  h.rope_type = t.rope_type;
  KeyReader kr(file, h.arch);

  CAR_TRY_ASSIGN(h.n_ctx_train, kr.dim("context_length"));
  CAR_TRY_ASSIGN(h.n_embd, kr.dim("embedding_length"));
  CAR_TRY_ASSIGN(h.n_layer, kr.dim("block_count"));
  CAR_TRY_ASSIGN(h.n_head, kr.dim("attention.head_count"));
  CAR_TRY_ASSIGN(h.n_head_kv, kr.dim_or("attention.head_count_kv", h.n_head));
  if (h.n_head_kv == 0 || h.n_head % h.n_head_kv != 0) {
    return load_error("model key " + kr.key("attention.head_count_kv") + " = " + std::to_string(h.n_head_kv) +
                      ": must divide attention.head_count = " + std::to_string(h.n_head));
  }
  int64_t default_head_dim = h.n_embd % h.n_head == 0 ? h.n_embd / h.n_head : 0;
  CAR_TRY_ASSIGN(h.head_dim_k, kr.dim_or("attention.key_length", default_head_dim));
  if (h.head_dim_k == 0) {
    return load_error("model key " + kr.key("attention.key_length") + " is absent and embedding_length " +
                      std::to_string(h.n_embd) + " is not a multiple of head_count " + std::to_string(h.n_head));
  }
  CAR_TRY_ASSIGN(h.head_dim_v, kr.dim_or("attention.value_length", h.head_dim_k));
  if (h.head_dim_v == 0) return load_error("model key " + kr.key("attention.value_length") + " is 0");
  CAR_TRY_ASSIGN(h.n_rot, kr.dim_or("rope.dimension_count", h.head_dim_k));
  if (h.n_rot == 0 || h.n_rot > h.head_dim_k || h.n_rot % 2 != 0) {
    return load_error("model key " + kr.key("rope.dimension_count") + " = " + std::to_string(h.n_rot) +
                      ": must be even and in [2, key_length = " + std::to_string(h.head_dim_k) + "]");
  }

  double eps = 0;
  CAR_TRY_ASSIGN(eps, kr.real_or("attention.layer_norm_rms_epsilon", -1.0));
  if (eps < 0) return load_error("model key " + kr.key("attention.layer_norm_rms_epsilon") + " is missing");
  if (eps == 0 || eps > 1) return load_error("model key " + kr.key("attention.layer_norm_rms_epsilon") + " out of (0, 1]");
  h.rms_eps = static_cast<float>(eps);
  double base = 0;
  CAR_TRY_ASSIGN(base, kr.real_or("rope.freq_base", 10000.0));
  if (base <= 1) return load_error("model key " + kr.key("rope.freq_base") + " = " + std::to_string(base) + ": must be > 1");
  h.rope_freq_base = static_cast<float>(base);

  // Rope scaling: none, linear and yarn are computed; anything else would silently change the model's output.
  std::string scaling;
  CAR_TRY_ASSIGN(scaling, kr.string_or("rope.scaling.type", "linear"));  // llama.cpp's default when absent
  double factor = 0;
  CAR_TRY_ASSIGN(factor, kr.real_or("rope.scaling.factor", 0.0));
  if (factor == 0) CAR_TRY_ASSIGN(factor, kr.real_or("rope.scale_linear", 0.0));
  // llama.cpp applies 1 / factor as the frequency scale for linear and yarn, and none for "none".
  if (scaling != "none" && !scaling.empty() && scaling != "linear" && scaling != "yarn") {
    return load_error("model key " + kr.key("rope.scaling.type") + " = '" + scaling +
                      "': unsupported rope scaling (supported: none, linear, yarn)");
  }
  if (factor < 0) return load_error("model key " + kr.key("rope.scaling.factor") + " is negative");
  h.rope_freq_scale = factor == 0 ? 1.0f : static_cast<float>(1.0 / factor);
  if (scaling == "none") h.rope_freq_scale = 1.0f;  // llama.cpp: "never scale if scaling type is none"
  double attn_factor = 1.0;
  CAR_TRY_ASSIGN(attn_factor, kr.real_or("rope.scaling.attn_factor", 1.0));
  if (attn_factor <= 0) return load_error("model key " + kr.key("rope.scaling.attn_factor") + " must be > 0");
  CAR_TRY_ASSIGN(h.yarn.n_ctx_orig, kr.dim_or("rope.scaling.original_context_length", h.n_ctx_train));
  if (h.yarn.n_ctx_orig == 0) h.yarn.n_ctx_orig = h.n_ctx_train;
  if (scaling == "yarn") {
    // llama_context's constructor: ext_factor 1; attn_factor = mscale(f) / (1 + 0.1 ln f), in float.
    h.yarn.ext_factor = 1.0f;
    const float f = 1.0f / h.rope_freq_scale;
    float mscale = f <= 1.0f ? 1.0f : 0.1f * 1.0f * std::log(f) + 1.0f;
    mscale *= 1.0f / (1.0f + 0.1f * std::log(f));
    h.yarn.attn_factor = mscale;
  }
  h.yarn.attn_factor *= static_cast<float>(attn_factor);

  // Sliding-window layers (gemma2, gemma3, gpt-oss) and the other per-architecture numbers of
  // core/model/architecture.h.
  if (t.swa_pattern > 0) {
    int64_t n_swa = 0;
    CAR_TRY_ASSIGN(n_swa, kr.dim_or("attention.sliding_window", t.swa_default_window));
    set_swa_pattern(h, n_swa, t.swa_pattern);
    if (n_swa > 0 && t.swa_rope_freq_base > 0.0f) {
      h.rope_freq_base_swa = t.swa_rope_freq_base;
      h.rope_freq_scale_swa = 1.0f;
    }
  }
  if (t.scale_query) {
    const bool by_embd = t.query_scale_embd_layers > 0 && h.n_layer == t.query_scale_embd_layers;
    const int64_t d = by_embd ? h.n_embd / h.n_head : h.head_dim_k;
    if (d <= 0) return load_error("model key " + kr.key("embedding_length") + ": smaller than head_count");
    h.attn_scale = 1.0f / std::sqrt(static_cast<float>(d));
  }
  // Soft-caps: 0 = none (llama.cpp would divide by a zero final cap).
  using Cap = std::tuple<std::optional<float>, const char*, float*>;
  for (auto [def, key, out] : {Cap{t.final_logit_softcap, "final_logit_softcapping", &h.final_logit_softcap},
                               Cap{t.attn_logit_softcap, "attn_logit_softcapping", &h.attn_logit_softcap}}) {
    if (!def) continue;
    double cap = 0;
    CAR_TRY_ASSIGN(cap, kr.real_or(key, *def));
    if (cap < 0) return load_error("model key " + kr.key(key) + " is negative");
    *out = static_cast<float>(cap);
  }

  if (t.mla) {
    if (Result<void> r = read_mla_hparams(kr, file, h); !r) return r.error();
  }

  CAR_TRY_ASSIGN(h.n_expert, kr.dim_or("expert_count", 0));
  CAR_TRY_ASSIGN(h.n_expert_used, kr.dim_or("expert_used_count", 0));
  if (t.mla) {
    if (Result<void> r = read_mla_router(kr, file, h); !r) return r.error();
  }
  if (h.n_expert > 0) {
    if (t.dense_only) return load_error("model key " + kr.key("expert_count") + ": architecture " + h.arch + " is dense");
    if (h.n_expert_used == 0 || h.n_expert_used > h.n_expert) {
      return load_error("model key " + kr.key("expert_used_count") + " = " + std::to_string(h.n_expert_used) +
                        ": must be in [1, expert_count = " + std::to_string(h.n_expert) + "]");
    }
    if (!t.expert_ff_key.empty()) {
      CAR_TRY_ASSIGN(h.n_ff_exp, kr.dim(t.expert_ff_key));
      CAR_TRY_ASSIGN(h.n_ff, kr.dim_or("feed_forward_length", 0));
      if (t.shared_expert) {
        CAR_TRY_ASSIGN(h.n_ff_shexp, kr.dim_or(t.shared_expert_ff_key, h.n_ff));
        if (h.n_ff_shexp == 0) {
          return load_error("model key " + kr.key(t.shared_expert_ff_key) + " is missing (and so is " +
                            kr.key("feed_forward_length") + ", its fallback): the shared expert's width");
        }
      }
    } else {
      CAR_TRY_ASSIGN(h.n_ff_exp, kr.dim("feed_forward_length"));
      h.n_ff = h.n_ff_exp;
    }
  } else {
    if (t.moe_required) return load_error("model key " + kr.key("expert_count") + " is missing (architecture " + h.arch + " is MoE)");
    if (h.n_expert_used != 0) {
      return load_error("model key " + kr.key("expert_used_count") + " = " + std::to_string(h.n_expert_used) +
                        " without expert_count");
    }
    CAR_TRY_ASSIGN(h.n_ff, kr.dim("feed_forward_length"));
  }
  if (t.mla && h.n_expert > 0) {
    if (h.n_layer_dense_lead >= h.n_layer) {
      return load_error("model key " + kr.key("leading_dense_block_count") + " = " +
                        std::to_string(h.n_layer_dense_lead) + ": no MoE layer left of " +
                        std::to_string(h.n_layer));
    }
    if (h.n_expert_shared > 0) h.n_ff_shexp = h.n_ff_exp * h.n_expert_shared;
    if (h.n_expert_groups > 1) {
      // llama.cpp's asserts, as errors.
      if (h.n_expert % h.n_expert_groups != 0 || h.n_group_used == 0 || h.n_group_used >= h.n_expert_groups ||
          h.n_expert_groups > 1024 || h.n_expert / h.n_expert_groups < 2 ||
          h.n_group_used * (h.n_expert / h.n_expert_groups) < h.n_expert_used) {
        return load_error("model keys " + kr.key("expert_group_count") + " = " +
                          std::to_string(h.n_expert_groups) +
                          ", expert_group_used_count = " + std::to_string(h.n_group_used) +
                          ": the groups must divide expert_count = " + std::to_string(h.n_expert) +
                          ", be at most 1024 of two experts or more, and the used groups fewer than " +
                          "all yet hold " +
                          "expert_used_count = " + std::to_string(h.n_expert_used));
      }
    }
  }
  return h;
}

}  // namespace car::model
