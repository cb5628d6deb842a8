#include "core/synth/synth_model.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <random>
#include <thread>
#include <utility>

#include "core/gguf/gguf_file.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernels.h"
#include "core/util/error_codes.h"
#include "core/util/thread_pool.h"

namespace car::synth {
namespace {

using gguf::ArrayValue;
using gguf::GgufWriter;
using gguf::Value;
using gguf::ValueType;

bool is_qwen3(const SynthSpec& s) { return s.arch == "qwen3" || s.arch == "qwen3moe"; }
bool is_qwen2(const SynthSpec& s) { return s.arch == "qwen2" || s.arch == "qwen2moe"; }
bool is_qwen(const SynthSpec& s) { return is_qwen3(s) || is_qwen2(s); }
bool is_gemma3(const SynthSpec& s) { return s.arch == "gemma3"; }
bool is_gemma2(const SynthSpec& s) { return s.arch == "gemma2"; }
bool is_gemma(const SynthSpec& s) { return is_gemma2(s) || is_gemma3(s); }
bool is_gpt_oss(const SynthSpec& s) { return s.arch == "gpt-oss"; }
bool is_deepseek2(const SynthSpec& s) {
  return s.arch == "deepseek2";
}
bool has_shared_expert(const SynthSpec& s) { return s.arch == "qwen2moe"; }
// Architectures whose expert width has its own key (feed_forward_length is then the dense width).
bool has_expert_ff_key(const SynthSpec& s) {
  return s.arch == "qwen3moe" || s.arch == "qwen2moe" || is_gpt_oss(s) || is_deepseek2(s);
}
// gpt-oss's defaults where the spec says 0: its released files' sliding window and YaRN terms.
uint32_t sliding_window(const SynthSpec& s) { return s.sliding_window != 0 ? s.sliding_window : 128; }
float yarn_factor(const SynthSpec& s) { return s.rope_scaling_factor != 0.0f ? s.rope_scaling_factor : 32.0f; }
uint32_t yarn_orig_ctx(const SynthSpec& s) { return s.rope_orig_ctx != 0 ? s.rope_orig_ctx : 4096; }
bool is_moe(const SynthSpec& s) { return s.n_expert > 0; }
uint32_t head_dim(const SynthSpec& s) { return s.head_dim != 0 ? s.head_dim : s.n_embd / s.n_head; }
uint32_t expert_ff(const SynthSpec& s) { return s.n_ff_expert != 0 ? s.n_ff_expert : s.n_ff; }
uint32_t shared_ff(const SynthSpec& s) { return s.n_ff_shared != 0 ? s.n_ff_shared : s.n_ff; }
uint32_t kv_lora(const SynthSpec& s) {
  return s.kv_lora_rank != 0 ? s.kv_lora_rank : s.n_embd / 2;
}
uint32_t rope_dim(const SynthSpec& s) {
  return s.rope_dim != 0 ? s.rope_dim : head_dim(s) / 2;
}
uint32_t v_head_dim(const SynthSpec& s) {
  return s.v_head_dim != 0 ? s.v_head_dim : head_dim(s);
}
uint32_t expert_used(const SynthSpec& s) {
  return s.n_expert_used != 0 ? s.n_expert_used : std::min<uint32_t>(2, s.n_expert);
}

// A weight type request: a base type, and whether llama-quantize's _M mix rules apply.
struct WeightScheme {
  GgmlType base = GgmlType::F32;
  bool mix = false;
  bool mxfp4_moe = false;  // llama-quantize's MXFP4_MOE: expert banks MXFP4, every other matrix Q8_0
  std::optional<uint32_t> file_type;  // general.file_type (llama_ftype), when there is one
};

Result<WeightScheme> parse_scheme(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "q4_k_m") return WeightScheme{GgmlType::Q4_K, true, false, 15};
  if (lower == "q5_k_m") return WeightScheme{GgmlType::Q5_K, true, false, 17};
  if (lower == "mxfp4_moe") return WeightScheme{GgmlType::MXFP4, false, true, 38};
  auto t = ggml_type_from_name(lower);
  if (!t) {
    return make_error(errc::kBadWeightType,
                      "unknown weight type '" + std::string(name) +
                          "' (f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m, q5_k_m, ...)");
  }
  // llama_ftype values for files whose weights are mostly of one type.
  std::optional<uint32_t> ft;
  switch (*t) {
    case GgmlType::F32: ft = 0; break;
    case GgmlType::F16: ft = 1; break;
    case GgmlType::Q4_0: ft = 2; break;
    case GgmlType::Q4_1: ft = 3; break;
    case GgmlType::Q8_0: ft = 7; break;
    case GgmlType::Q5_0: ft = 8; break;
    case GgmlType::Q5_1: ft = 9; break;
    case GgmlType::Q2_K: ft = 10; break;
    case GgmlType::Q3_K: ft = 12; break;
    case GgmlType::Q4_K: ft = 14; break;
    case GgmlType::Q5_K: ft = 16; break;
    case GgmlType::Q6_K: ft = 18; break;
    case GgmlType::IQ2_XXS: ft = 19; break;
    case GgmlType::IQ2_XS: ft = 20; break;
    case GgmlType::IQ3_XXS: ft = 23; break;
    case GgmlType::IQ1_S: ft = 24; break;
    case GgmlType::IQ4_NL: ft = 25; break;
    case GgmlType::IQ3_S: ft = 26; break;
    case GgmlType::IQ2_S: ft = 28; break;
    case GgmlType::IQ1_M: ft = 31; break;
    case GgmlType::TQ1_0: ft = 36; break;
    case GgmlType::TQ2_0: ft = 37; break;
    case GgmlType::IQ4_XS: ft = 30; break;
    case GgmlType::BF16: ft = 32; break;
    case GgmlType::MXFP4: ft = 38; break;  // llama.cpp's MXFP4_MOE (its only MXFP4 file type)
    default: break;
  }
  return WeightScheme{*t, false, false, ft};
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// llama.cpp's layer selection for the extra-precision tensors of the _M mixes.
bool use_more_bits(uint32_t i, uint32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama.cpp's replacement when a row is not a multiple of the chosen type's block size.
GgmlType fallback_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: case GgmlType::Q3_K: return GgmlType::IQ4_NL;
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    case GgmlType::TQ1_0: case GgmlType::TQ2_0: return GgmlType::Q4_0;
    case GgmlType::IQ4_XS: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S: case GgmlType::IQ1_M:
      return GgmlType::IQ4_NL;
    default: return GgmlType::F16;
  }
}

// ---- Random weights -------------------------------------------------------------------------------

// mt19937_64's sequence is fixed by the standard; the normal transform is our own (Box-Muller), so the
// same seed gives the same weights with any standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(gen_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(gen_() >> 11) * 0x1.0p-53;          // [0, 1)
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  std::mt19937_64 gen_;
  float spare_ = 0.0f;
  bool have_spare_ = false;
};

bool quantizable(GgmlType t) {
  return is_float_type(t) || tensor::can_quantize(t);
}

// Encode `src` (whole rows of `cols` floats) as `type` into `out` (sized to match), rows split over `pool`.
void encode_rows(GgmlType type, const std::vector<float>& src, uint64_t cols, std::vector<uint8_t>& out,
                 ThreadPool& pool) {
  const uint64_t rows = src.size() / cols;
  const uint64_t row_bytes = *ggml_row_bytes(type, cols);
  CAR_CHECK(out.size() == rows * row_bytes);
  if (type == GgmlType::F32) {
    std::memcpy(out.data(), src.data(), out.size());
    return;
  }
  // Small chunks run on this thread alone: a fork-join costs more than they do (much more on a busy machine).
  const int64_t grain = static_cast<int64_t>(std::max<uint64_t>(1, 16384 / cols));
  const int threads = src.size() < 32768 ? 1 : 0;
  pool.parallel_for(static_cast<int64_t>(rows), grain, threads, [&](int64_t begin, int64_t end) {
    for (auto r = static_cast<uint64_t>(begin); r < static_cast<uint64_t>(end); ++r) {
      const float* in = src.data() + r * cols;
      uint8_t* dst = out.data() + r * row_bytes;
      if (type == GgmlType::F16 || type == GgmlType::BF16) {
        for (uint64_t i = 0; i < cols; ++i) {
          const uint16_t h =
              type == GgmlType::F16 ? tensor::fp32_to_fp16(in[i]) : tensor::fp32_to_bf16(in[i]);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      } else {
        tensor::quantize_row(type, in, dst, static_cast<int64_t>(cols));
      }
    }
  });
}

// ---- Model assembly -----------------------------------------------------------------------------------

// The generator the tensors' producers share: one random sequence drawn through the tensors in file order
// (so the bytes are those of drawing each whole tensor in turn), restarted when the first tensor is
// produced again (a second to_bytes / write gives the same file). Chunk buffers are reused across tensors.
struct WeightStream {
  WeightStream(uint64_t seed_, uint32_t threads_, uint64_t chunk_values_)
      : seed(seed_), rng(seed_), threads(threads_), chunk_values(chunk_values_) {}
  uint64_t seed;
  Rng rng;
  size_t next = 0;  // index of the tensor whose turn it is
  uint32_t threads;
  uint64_t chunk_values;
  std::unique_ptr<ThreadPool> pool;  // made on first use
  std::vector<float> values;
  std::vector<uint8_t> bytes;
};

class ModelBuilder {
 public:
  ModelBuilder(const SynthSpec& spec, GgufWriter& w)
      : spec_(spec),
        w_(w),
        stream_(std::make_shared<WeightStream>(
            spec.seed, spec.threads, spec.chunk_values != 0 ? spec.chunk_values : uint64_t{1} << 20)) {}

  // A weight tensor of `role` with ggml shape `shape`, values N(mean, stddev), generated at write time.
  // `per_head`: a 3-D tensor of per-head matrices (deepseek2's attn_k_b / attn_v_b), not an expert bank.
  Result<void> add(const std::string& name, TensorRole role, uint32_t layer, std::vector<uint64_t> shape,
                   float mean, float stddev, bool per_head = false) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    auto type = resolve_tensor_type(spec_, role, layer, shape[0], shape.size() == 3 && !per_head);
    if (!type) return type.error();
    if (!quantizable(*type)) {
      return make_error(errc::kUnsupportedType, "tensor " + name + ": cannot write " +
                                                    std::string(ggml_type_name(*type)) +
                                                    " weights (no quantizer for it in this build)");
    }
    if (!ggml_row_bytes(*type, shape[0])) {
      return make_error(errc::kBadShape, "tensor " + name + ": row length " + std::to_string(shape[0]) +
                                             " is not a multiple of " + std::string(ggml_type_name(*type)) +
                                             "'s block size");
    }
    any_quantized_ = any_quantized_ || !is_float_type(*type);
    const uint64_t cols = shape[0];
    const size_t index = count_++;
    auto produce = [st = stream_, index, t = *type, cols, rows = n / cols, mean,
                    stddev](const GgufWriter::ByteSink& out) {
      if (index == 0) {
        st->rng = Rng(st->seed);
        st->next = 0;
      }
      CAR_CHECK(st->next == index);  // the writer produces tensors in order
      if (!st->pool) {
        const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
        st->pool = std::make_unique<ThreadPool>(static_cast<int>(st->threads != 0 ? st->threads : hw));
      }
      const uint64_t row_bytes = *ggml_row_bytes(t, cols);
      const uint64_t chunk_rows = std::max<uint64_t>(1, st->chunk_values / cols);
      for (uint64_t r0 = 0; r0 < rows;) {
        const uint64_t nr = std::min(chunk_rows, rows - r0);
        st->values.resize(nr * cols);
        for (float& v : st->values) v = mean + stddev * st->rng.normal();
        st->bytes.resize(nr * row_bytes);
        encode_rows(t, st->values, cols, st->bytes, *st->pool);
        out(st->bytes.data(), st->bytes.size());
        r0 += nr;
      }
      st->next = index + 1;
    };
    return w_.add_tensor_streamed(name, *type, std::move(shape), std::move(produce));
  }

  bool any_quantized() const { return any_quantized_; }

 private:
  const SynthSpec& spec_;
  GgufWriter& w_;
  std::shared_ptr<WeightStream> stream_;
  size_t count_ = 0;
  bool any_quantized_ = false;
};

std::string default_name(const SynthSpec& s) {
  std::string name = "synthetic-" + s.arch + "-";
  if (is_moe(s)) {
    name += "moe-" + std::to_string(s.n_expert) + "x" + std::to_string(expert_ff(s)) + "-top" +
            std::to_string(expert_used(s));
  } else {
    name += "dense-ff" + std::to_string(s.n_ff);
  }
  return name + "-L" + std::to_string(s.n_layer) + "-D" + std::to_string(s.n_embd) + "-seed" +
         std::to_string(s.seed);
}

template <typename T>
ArrayValue array_of(ValueType t, const std::vector<T>& items) {
  ArrayValue a;
  a.elem_type = t;
  a.items.reserve(items.size());
  for (const auto& x : items) a.items.push_back(Value{x});
  return a;
}

void add_metadata(const SynthSpec& s, GgufWriter& w, const WeightScheme& scheme, const gguf::GgufFile* vocab) {
  const std::string& a = s.arch;
  const bool qwen = is_qwen(s) || is_gemma(s);  // 1e6 rope base (gemma2: 10000, not written), 1e-6 eps
  w.set_string("general.architecture", a);
  w.set_string("general.name", s.name.empty() ? default_name(s) : s.name);
  if (s.alignment != 0) w.set_u32("general.alignment", s.alignment);
  w.set_u32(a + ".context_length", s.n_ctx);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  if (has_expert_ff_key(s)) {
    w.set_u32(a + ".feed_forward_length", s.n_ff);
    w.set_u32(a + ".expert_feed_forward_length", expert_ff(s));
    if (has_shared_expert(s)) w.set_u32(a + ".expert_shared_feed_forward_length", shared_ff(s));
  } else {
    w.set_u32(a + ".feed_forward_length", is_moe(s) ? expert_ff(s) : s.n_ff);
  }
  w.set_u32(a + ".attention.head_count", s.n_head);
  if (is_deepseek2(s)) {
    // llama.cpp's current converter (DeepseekV2Model): the cache row's widths as key / value length, one
    // KV head, the per-head widths as the _mla keys.
    w.set_u32(a + ".attention.head_count_kv", 1);
    w.set_u32(a + ".attention.key_length", kv_lora(s) + rope_dim(s));
    w.set_u32(a + ".attention.value_length", kv_lora(s));
    w.set_u32(a + ".attention.key_length_mla", head_dim(s));
    w.set_u32(a + ".attention.value_length_mla", v_head_dim(s));
    w.set_u32(a + ".rope.dimension_count", rope_dim(s));
    w.set_u32(a + ".leading_dense_block_count", s.n_dense_lead);
    w.set_u32(a + ".attention.q_lora_rank", s.q_lora_rank);
    w.set_u32(a + ".attention.kv_lora_rank", kv_lora(s));
    w.set_u32(a + ".expert_shared_count", s.n_expert_shared);
    w.set_f32(a + ".expert_weights_scale", s.expert_weights_scale);
    w.set_bool(a + ".expert_weights_norm", s.expert_weights_norm);
    w.set_u32(a + ".expert_gating_func", s.sigmoid_gating ? 2 : 1);
    if (s.n_expert_groups != 0) {
      w.set_u32(a + ".expert_group_count", s.n_expert_groups);
      w.set_u32(a + ".expert_group_used_count", s.n_group_used);
    }
    if (s.rope_scaling_factor != 0.0f) {
      w.set_string(a + ".rope.scaling.type", "yarn");
      w.set_f32(a + ".rope.scaling.factor", s.rope_scaling_factor);
      w.set_u32(a + ".rope.scaling.original_context_length", yarn_orig_ctx(s));
      if (s.yarn_log_multiplier != 0.0f)
        w.set_f32(a + ".rope.scaling.yarn_log_multiplier", s.yarn_log_multiplier);
    }
  } else {
    w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  }
  if (!is_deepseek2(s) && (is_qwen3(s) || is_gemma(s) || head_dim(s) != s.n_embd / s.n_head)) {
    w.set_u32(a + ".attention.key_length", head_dim(s));
    w.set_u32(a + ".attention.value_length", head_dim(s));
  }
  if (!is_gemma(s) && !is_deepseek2(s))
    w.set_u32(a + ".rope.dimension_count", head_dim(s));  // Gemma's omit it
  // gpt-oss writes its window below, with its default.
  if (is_gemma(s) && s.sliding_window != 0) w.set_u32(a + ".attention.sliding_window", s.sliding_window);
  if (s.final_logit_softcap != 0.0f) w.set_f32(a + ".final_logit_softcapping", s.final_logit_softcap);
  if (s.attn_logit_softcap != 0.0f) w.set_f32(a + ".attn_logit_softcapping", s.attn_logit_softcap);
  if (!is_gemma2(s) || s.rope_freq_base != 0.0f) {
    const float default_base = qwen ? 1e6f : is_gpt_oss(s) ? 150000.0f : 1e4f;
    w.set_f32(a + ".rope.freq_base", s.rope_freq_base != 0.0f ? s.rope_freq_base : default_base);
  }
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps != 0.0f ? s.rms_eps : (qwen ? 1e-6f : 1e-5f));
  if (is_moe(s)) {
    w.set_u32(a + ".expert_count", s.n_expert);
    w.set_u32(a + ".expert_used_count", expert_used(s));
  }
  if (is_gpt_oss(s)) {
    // As llama.cpp's converter writes them (GptOssModel: sliding_window; TextModel: the yarn rope_scaling).
    w.set_u32(a + ".attention.sliding_window", sliding_window(s));
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", yarn_factor(s));
    w.set_u32(a + ".rope.scaling.original_context_length", yarn_orig_ctx(s));
  }
  w.set_u32(a + ".vocab_size", s.n_vocab);
  if (scheme.file_type) w.set_u32("general.file_type", *scheme.file_type);

  if (vocab != nullptr) {
    for (const auto& kv : vocab->metadata()) {
      if (kv.key.starts_with("tokenizer.")) w.set(kv.key, kv.value);
    }
    if (!s.chat_template.empty()) w.set_string("tokenizer.chat_template", s.chat_template);
    return;
  }
  SynthVocab v = make_synth_vocab(s.n_vocab);
  w.set_array("tokenizer.ggml.tokens", array_of(ValueType::STRING, v.tokens));
  w.set_array("tokenizer.ggml.scores", array_of(ValueType::FLOAT32, v.scores));
  w.set_array("tokenizer.ggml.token_type", array_of(ValueType::INT32, v.token_types));
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.seperator_token_id", 0xffffffffu);  // llama.cpp's spelling; unset
  w.set_u32("tokenizer.ggml.padding_token_id", 0xffffffffu);
  if (is_gemma(s)) w.set_bool("tokenizer.ggml.add_space_prefix", false);  // as Gemma's converters
  if (!s.chat_template.empty()) w.set_string("tokenizer.chat_template", s.chat_template);
}

// One deepseek2 layer, in llama.cpp's load order: MLA attention, then a dense FFN (the leading layers) or the
// router, its selection bias, the routed banks and the shared experts.
template <typename Builder>
Result<void> add_deepseek2_layer(const SynthSpec& s, Builder& b, uint32_t l) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const uint64_t d = s.n_embd;
  const uint64_t heads = s.n_head;
  const uint64_t hd = head_dim(s);
  const uint64_t rope = rope_dim(s);
  const uint64_t rank = kv_lora(s);
  const uint64_t vd = v_head_dim(s);
  const uint64_t ql = s.q_lora_rank;
  auto lin = [](uint64_t fan_in) { return 0.5f / std::sqrt(static_cast<float>(fan_in)); };
  struct T {
    std::string name;
    TensorRole role;
    std::vector<uint64_t> shape;
    float mean, stddev;
    bool per_head = false;
  };
  std::vector<T> ts = {{p + "attn_norm.weight", TensorRole::norm, {d}, 1.0f, 0.1f}};
  if (ql > 0) {
    ts.push_back({p + "attn_q_a_norm.weight", TensorRole::norm, {ql}, 1.0f, 0.1f});
  }
  ts.push_back({p + "attn_kv_a_norm.weight", TensorRole::norm, {rank}, 1.0f, 0.1f});
  if (ql > 0) {
    ts.push_back({p + "attn_q_a.weight", TensorRole::attn_q, {d, ql}, 0.0f, lin(d)});
    ts.push_back({p + "attn_q_b.weight", TensorRole::attn_q, {ql, heads * hd}, 0.0f, lin(ql)});
  } else {
    ts.push_back({p + "attn_q.weight", TensorRole::attn_q, {d, heads * hd}, 0.0f, lin(d)});
  }
  ts.push_back({p + "attn_kv_a_mqa.weight", TensorRole::attn_k, {d, rank + rope}, 0.0f, lin(d)});
  ts.push_back(
      {p + "attn_k_b.weight", TensorRole::attn_k, {hd - rope, rank, heads}, 0.0f, lin(hd - rope), true});
  ts.push_back({p + "attn_v_b.weight", TensorRole::attn_v, {rank, vd, heads}, 0.0f, lin(rank), true});
  ts.push_back({p + "attn_output.weight", TensorRole::attn_output, {heads * vd, d}, 0.0f, lin(heads * vd)});
  ts.push_back({p + "ffn_norm.weight", TensorRole::norm, {d}, 1.0f, 0.1f});
  if (l < s.n_dense_lead) {
    ts.push_back({p + "ffn_gate.weight", TensorRole::ffn_gate, {d, s.n_ff}, 0.0f, lin(d)});
    ts.push_back({p + "ffn_down.weight", TensorRole::ffn_down, {s.n_ff, d}, 0.0f, lin(s.n_ff)});
    ts.push_back({p + "ffn_up.weight", TensorRole::ffn_up, {d, s.n_ff}, 0.0f, lin(d)});
  } else {
    const uint64_t ff = expert_ff(s);
    const uint64_t ne = s.n_expert;
    // The router N(0, 2 / sqrt(n_embd)): logits of a few units, so the sigmoid does not saturate (a
    // saturated sigmoid makes near-ties of 1 - ulp that any rounding difference flips).
    ts.push_back({p + "ffn_gate_inp.weight", TensorRole::router, {d, ne}, 0.0f, 4.0f * lin(d)});
    // The V3 selection bias: wide enough (N(0, 0.3) beside sigmoid scores in (0, 1)) to change choices.
    if (s.sigmoid_gating) ts.push_back({p + "exp_probs_b.bias", TensorRole::norm, {ne}, 0.0f, 0.3f});
    ts.push_back({p + "ffn_down_exps.weight", TensorRole::ffn_down, {ff, d, ne}, 0.0f, lin(ff)});
    ts.push_back({p + "ffn_gate_exps.weight", TensorRole::ffn_gate, {d, ff, ne}, 0.0f, lin(d)});
    ts.push_back({p + "ffn_up_exps.weight", TensorRole::ffn_up, {d, ff, ne}, 0.0f, lin(d)});
    if (s.n_expert_shared > 0) {
      const uint64_t sff = ff * s.n_expert_shared;
      ts.push_back({p + "ffn_gate_shexp.weight", TensorRole::ffn_gate, {d, sff}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_down_shexp.weight", TensorRole::ffn_down, {sff, d}, 0.0f, lin(sff)});
      ts.push_back({p + "ffn_up_shexp.weight", TensorRole::ffn_up, {d, sff}, 0.0f, lin(d)});
    }
  }
  for (auto& t : ts) {
    if (auto r = b.add(t.name, t.role, l, std::move(t.shape), t.mean, t.stddev, t.per_head); !r)
      return r.error();
  }
  return {};
}

}  // namespace

Result<GgmlType> resolve_tensor_type(const SynthSpec& spec, TensorRole role, uint32_t layer, uint64_t row_len,
                                     bool expert_bank) {
  auto scheme = parse_scheme(spec.weight_type);
  if (!scheme) return scheme.error();
  if (role == TensorRole::norm || role == TensorRole::router) return GgmlType::F32;
  const GgmlType base = scheme->base;
  GgmlType t = base;
  if (scheme->mxfp4_moe) {
    t = expert_bank ? GgmlType::MXFP4 : GgmlType::Q8_0;
  } else if (!is_float_type(base)) {
    const bool eight_experts = spec.n_expert == 8;
    switch (role) {
      case TensorRole::output: t = base == GgmlType::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q6_K; break;
      case TensorRole::attn_k:
        if (eight_experts) t = GgmlType::Q8_0;
        break;
      case TensorRole::attn_v:
        if (eight_experts) {
          t = GgmlType::Q8_0;
        } else if (scheme->mix && use_more_bits(layer, spec.n_layer)) {
          t = GgmlType::Q6_K;
        }
        break;
      case TensorRole::attn_output:
        if (scheme->mix && base == GgmlType::Q4_K && eight_experts) t = GgmlType::Q5_K;
        break;
      case TensorRole::ffn_down:
        if (scheme->mix && use_more_bits(layer, spec.n_layer)) t = GgmlType::Q6_K;
        break;
      default: break;
    }
  }
  if (row_len % ggml_traits(t).block_size != 0) t = fallback_type(t);
  if (row_len % ggml_traits(t).block_size != 0) t = GgmlType::F16;
  return t;
}

Result<void> validate(const SynthSpec& s) {
  auto bad = [](const std::string& msg) { return make_error(errc::kBadSpec, msg); };
  if (s.arch != "llama" && !is_qwen(s) && !is_gemma(s) && !is_gpt_oss(s) && !is_deepseek2(s)) {
    return bad("unknown arch '" + s.arch +
               "' (llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, gpt-oss, deepseek2)");
  }
  if (is_deepseek2(s)) {
    if (s.n_expert == 0) return bad("deepseek2 needs experts > 0");
    if (s.n_dense_lead >= s.n_layer) return bad("deepseek2 needs a MoE layer after the leading dense ones");
    if (rope_dim(s) == 0 || rope_dim(s) % 2 != 0 || rope_dim(s) >= head_dim(s)) {
      return bad("deepseek2's rope dim " + std::to_string(rope_dim(s)) + " must be even and below head dim " +
                 std::to_string(head_dim(s)));
    }
    if (s.n_expert_groups > 1 &&
        (s.n_expert % s.n_expert_groups != 0 || s.n_group_used == 0 || s.n_group_used >= s.n_expert_groups)) {
      return bad("deepseek2's expert groups must divide the experts, with 1 <= groups used < groups");
    }
  }
  if (is_gemma(s) && s.n_expert != 0) return bad(s.arch + " is dense");
  if (!is_gemma(s) && !is_gpt_oss(s) && s.sliding_window != 0) {
    return bad("a sliding window is a gemma2 / gemma3 / gpt-oss key (arch " + s.arch + ")");
  }
  if (!is_gemma(s) && s.final_logit_softcap != 0.0f) {
    return bad("final logit soft-capping is a gemma2 / gemma3 key");
  }
  if (!is_gemma2(s) && s.attn_logit_softcap != 0.0f) return bad("attention logit soft-capping is a gemma2 key");
  if (is_gemma2(s) && !s.tied_embeddings) {
    return bad("gemma2 ties its output to token_embd (llama.cpp refuses a gemma2 file with output.weight): "
               "give --tied");
  }
  if (s.final_logit_softcap < 0.0f || s.attn_logit_softcap < 0.0f) return bad("soft-caps must be >= 0");
  if (s.n_layer == 0 || s.n_embd == 0 || s.n_ff == 0 || s.n_head == 0 || s.n_head_kv == 0 || s.n_ctx == 0) {
    return bad("layers, n_embd, n_ff, heads, kv heads and context length must all be > 0");
  }
  if (s.n_head % s.n_head_kv != 0) {
    return bad("head count " + std::to_string(s.n_head) + " is not a multiple of kv head count " +
               std::to_string(s.n_head_kv));
  }
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0) {
    return bad("n_embd " + std::to_string(s.n_embd) + " is not a multiple of head count " +
               std::to_string(s.n_head) + "; give head_dim");
  }
  if (head_dim(s) % 2 != 0) return bad("head dim " + std::to_string(head_dim(s)) + " must be even (RoPE pairs)");
  if (s.arch == "qwen3moe" && s.n_expert == 0) return bad("qwen3moe needs experts > 0");
  if (s.arch == "qwen3" && s.n_expert != 0) return bad("qwen3 is dense; use qwen3moe for experts");
  if (s.arch == "qwen2moe" && s.n_expert == 0) return bad("qwen2moe needs experts > 0");
  if (s.arch == "qwen2" && s.n_expert != 0) return bad("qwen2 is dense; use qwen2moe for experts");
  if (is_gpt_oss(s) && s.n_expert == 0) return bad("gpt-oss needs experts > 0");
  if (!is_gpt_oss(s) && !is_deepseek2(s) && (s.rope_scaling_factor != 0.0f || s.rope_orig_ctx != 0)) {
    return bad("YaRN terms are gpt-oss's and deepseek2's (arch " + s.arch + ")");
  }
  if (s.rope_scaling_factor < 0.0f) return bad("rope scaling factor must be >= 0");
  if (is_qwen2(s) && head_dim(s) * s.n_head != s.n_embd) {
    // llama.cpp's qwen2 / qwen2moe take Q and the attention output n_embd wide.
    return bad(s.arch + " needs head dim x heads = n_embd (" + std::to_string(head_dim(s)) + " x " +
               std::to_string(s.n_head) + " != " + std::to_string(s.n_embd) + ")");
  }
  if (is_moe(s) && (expert_used(s) == 0 || expert_used(s) > s.n_expert)) {
    return bad("experts used " + std::to_string(expert_used(s)) + " not in 1.." + std::to_string(s.n_expert));
  }
  if (!is_moe(s) && s.n_expert_used != 0) return bad("experts used given without experts");
  if (s.n_vocab < 260) return bad("vocab size " + std::to_string(s.n_vocab) + " < 260 (3 specials + 256 bytes + 1)");
  if (s.alignment != 0 && (s.alignment & (s.alignment - 1)) != 0) {
    return bad("alignment " + std::to_string(s.alignment) + " is not a power of two");
  }
  auto scheme = parse_scheme(s.weight_type);
  if (!scheme) return scheme.error();
  return {};
}

Result<GgufWriter> build_synth_model(const SynthSpec& spec) {
  // A real tokenizer from another file: its token count is the vocabulary size.
  SynthSpec s = spec;
  std::shared_ptr<const gguf::GgufFile> vocab_src;
  if (!spec.vocab_file.empty()) {
    auto f = gguf::GgufFile::open(spec.vocab_file);
    if (!f) return make_error(errc::kBadSpec, "vocab file " + spec.vocab_file + ": " + f.error().message);
    vocab_src = *f;
    auto tokens = vocab_src->get_array("tokenizer.ggml.tokens", ValueType::STRING);
    if (!tokens) return make_error(errc::kBadSpec, "vocab file " + spec.vocab_file + ": " + tokens.error().message);
    s.n_vocab = static_cast<uint32_t>((*tokens)->items.size());
  }
  if (auto v = validate(s); !v) return v.error();
  auto scheme = parse_scheme(s.weight_type);
  GgufWriter w;
  add_metadata(s, w, *scheme, vocab_src.get());

  ModelBuilder b(s, w);
  const uint64_t d = s.n_embd;
  const uint64_t hd = head_dim(s);
  const uint64_t q_dim = hd * s.n_head;
  const uint64_t kv_dim = hd * s.n_head_kv;
  const uint64_t vocab = s.n_vocab;
  auto lin = [](uint64_t fan_in) { return 0.5f / std::sqrt(static_cast<float>(fan_in)); };
  if (auto r = b.add("token_embd.weight", TensorRole::token_embd, 0, {d, vocab}, 0.0f, 1.0f); !r) return r.error();
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    struct T {
      std::string name;
      TensorRole role;
      std::vector<uint64_t> shape;
      float mean, stddev;
    };
    if (is_deepseek2(s)) {
      if (auto r = add_deepseek2_layer(s, b, l); !r) return r.error();
      continue;
    }
    std::vector<T> ts = {
        {p + "attn_norm.weight", TensorRole::norm, {d}, 1.0f, 0.1f},
        {p + "attn_q.weight", TensorRole::attn_q, {d, q_dim}, 0.0f, lin(d)},
        {p + "attn_k.weight", TensorRole::attn_k, {d, kv_dim}, 0.0f, lin(d)},
        {p + "attn_v.weight", TensorRole::attn_v, {d, kv_dim}, 0.0f, lin(d)},
        {p + "attn_output.weight", TensorRole::attn_output, {q_dim, d}, 0.0f, lin(q_dim)},
    };
    if (is_qwen2(s) || is_gpt_oss(s)) {  // 1-D: F32 whatever the weight type (the norm role)
      ts.push_back({p + "attn_q.bias", TensorRole::norm, {q_dim}, 0.0f, 0.5f});
      ts.push_back({p + "attn_k.bias", TensorRole::norm, {kv_dim}, 0.0f, 0.5f});
      ts.push_back({p + "attn_v.bias", TensorRole::norm, {kv_dim}, 0.0f, 0.5f});
    }
    if (is_gpt_oss(s)) {
      // The output bias, and one sink logit per head spread so that it sometimes tops a head's scores.
      ts.push_back({p + "attn_output.bias", TensorRole::norm, {d}, 0.0f, 0.5f});
      ts.push_back({p + "attn_sinks.weight", TensorRole::norm, {s.n_head}, 0.0f, 2.0f});
    }
    if (is_qwen3(s) || is_gemma3(s)) {
      ts.push_back({p + "attn_q_norm.weight", TensorRole::norm, {hd}, 1.0f, 0.1f});
      ts.push_back({p + "attn_k_norm.weight", TensorRole::norm, {hd}, 1.0f, 0.1f});
    }
    if (is_gemma(s)) ts.push_back({p + "post_attention_norm.weight", TensorRole::norm, {d}, 1.0f, 0.1f});
    ts.push_back({p + (is_gpt_oss(s) ? "post_attention_norm.weight" : "ffn_norm.weight"), TensorRole::norm, {d},
                  1.0f, 0.1f});
    if (is_gpt_oss(s)) {
      // Router and experts with their biases (F32, 2-D per expert). The gate / up biases are wide enough
      // (N(0, 3)) that some activations pass swiglu_oai's clamp at 7.
      const uint64_t ff = expert_ff(s);
      const uint64_t ne = s.n_expert;
      ts.push_back({p + "ffn_gate_inp.weight", TensorRole::router, {d, ne}, 0.0f, 0.5f});
      ts.push_back({p + "ffn_gate_inp.bias", TensorRole::norm, {ne}, 0.0f, 0.5f});
      ts.push_back({p + "ffn_gate_exps.weight", TensorRole::ffn_gate, {d, ff, ne}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_gate_exps.bias", TensorRole::norm, {ff, ne}, 0.0f, 3.0f});
      ts.push_back({p + "ffn_up_exps.weight", TensorRole::ffn_up, {d, ff, ne}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_up_exps.bias", TensorRole::norm, {ff, ne}, 0.0f, 3.0f});
      ts.push_back({p + "ffn_down_exps.weight", TensorRole::ffn_down, {ff, d, ne}, 0.0f, lin(ff)});
      ts.push_back({p + "ffn_down_exps.bias", TensorRole::norm, {d, ne}, 0.0f, 0.5f});
    } else if (is_moe(s)) {
      const uint64_t ff = expert_ff(s);
      const uint64_t ne = s.n_expert;
      ts.push_back({p + "ffn_gate_inp.weight", TensorRole::router, {d, ne}, 0.0f, 0.5f});
      ts.push_back({p + "ffn_gate_exps.weight", TensorRole::ffn_gate, {d, ff, ne}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_up_exps.weight", TensorRole::ffn_up, {d, ff, ne}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_down_exps.weight", TensorRole::ffn_down, {ff, d, ne}, 0.0f, lin(ff)});
      if (has_shared_expert(s)) {
        const uint64_t sff = shared_ff(s);
        ts.push_back({p + "ffn_gate_inp_shexp.weight", TensorRole::router, {d}, 0.0f, 4.0f * lin(d)});
        ts.push_back({p + "ffn_gate_shexp.weight", TensorRole::ffn_gate, {d, sff}, 0.0f, lin(d)});
        ts.push_back({p + "ffn_up_shexp.weight", TensorRole::ffn_up, {d, sff}, 0.0f, lin(d)});
        ts.push_back({p + "ffn_down_shexp.weight", TensorRole::ffn_down, {sff, d}, 0.0f, lin(sff)});
      }
    } else {
      const uint64_t ff = s.n_ff;
      ts.push_back({p + "ffn_gate.weight", TensorRole::ffn_gate, {d, ff}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_up.weight", TensorRole::ffn_up, {d, ff}, 0.0f, lin(d)});
      ts.push_back({p + "ffn_down.weight", TensorRole::ffn_down, {ff, d}, 0.0f, lin(ff)});
    }
    if (is_gemma(s)) ts.push_back({p + "post_ffw_norm.weight", TensorRole::norm, {d}, 1.0f, 0.1f});
    for (auto& t : ts) {
      if (auto r = b.add(t.name, t.role, l, std::move(t.shape), t.mean, t.stddev); !r) return r.error();
    }
  }
  if (auto r = b.add("output_norm.weight", TensorRole::norm, 0, {d}, 1.0f, 0.1f); !r) return r.error();
  if (!s.tied_embeddings) {
    if (auto r = b.add("output.weight", TensorRole::output, 0, {d, vocab}, 0.0f, 0.15f); !r) return r.error();
  }
  if (b.any_quantized()) w.set_u32("general.quantization_version", 2);
  return w;
}

Result<void> write_synth_model(const SynthSpec& spec, const std::string& path) {
  auto w = build_synth_model(spec);
  if (!w) return w.error();
  return w->write(path);
}

SynthSpec tiny_spec(std::string_view flavour) {
  SynthSpec s;
  s.n_layer = 2;
  s.n_embd = 32;
  s.n_ff = 64;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_vocab = 300;
  s.n_ctx = 128;
  s.seed = 42;
  if (flavour == "llama-moe") {
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_expert = 32;
  } else if (flavour == "qwen3") {
    s.arch = "qwen3";
    s.head_dim = 16;  // q is 64 wide, wider than n_embd, as in the qwen3 fixture
  } else if (flavour == "qwen2") {
    s.arch = "qwen2";
  } else if (flavour == "gemma3" || flavour == "gemma2") {
    s.arch = std::string(flavour);
    s.tied_embeddings = flavour == "gemma2";
    s.n_layer = 7;
    s.head_dim = 16;
    s.sliding_window = 4;
  } else if (flavour == "qwen2moe") {
    s.arch = "qwen2moe";
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_expert = 32;
    s.n_ff_shared = 48;
  } else if (flavour == "gpt-oss") {
    s.arch = "gpt-oss";
    s.head_dim = 16;  // q is 64 wide, n_embd 32: as in the released files, Q is not n_embd wide
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_expert = 32;
    s.sliding_window = 4;
  } else if (flavour == "deepseek2") {
    s.arch = "deepseek2";
    s.n_layer = 3;  // one leading dense layer, two MoE layers
    s.head_dim = 16;
    s.rope_dim = 8;
    s.kv_lora_rank = 32;
    s.q_lora_rank = 32;
    s.v_head_dim = 16;
    s.n_expert = 8;
    s.n_expert_used = 2;
    s.n_ff_expert = 32;
    s.n_expert_groups = 4;
    s.n_group_used = 2;
  } else if (flavour == "qwen3moe") {
    s.arch = "qwen3moe";
    s.head_dim = 8;
    s.n_expert = 4;
    s.n_expert_used = 2;
    s.n_ff_expert = 32;
  }
  return s;
}

}  // namespace car::synth
