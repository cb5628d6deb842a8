#include "core/model/model.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "core/model/architecture.h"
#include "core/util/error_codes.h"

namespace car::model {
namespace {

Error load_error(std::string message) {
  return make_error(errc::kLoadFailed, std::move(message));
}

std::string shape_string(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.ne[i]);
  }
  return s + "]";
}

std::string shape_string(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) s += ", ";
    first = false;
    s += std::to_string(d);
  }
  return s + "]";
}

/// Finds tensors and checks their shapes, producing load_failed errors that name the tensor.
class TensorLoader {
 public:
  explicit TensorLoader(const gguf::GgufFile& f) : f_(f) {}

  const gguf::TensorInfo* find(const std::string& name) const { return f_.find_tensor(name); }

  /// The tensor `name` with exactly `dims` (ggml order; trailing 1s may be omitted in the file).
  Result<const gguf::TensorInfo*> require(const std::string& name, std::initializer_list<int64_t> dims) const {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr) return load_error("tensor " + name + " is missing");
    size_t i = 0;
    bool ok = true;
    for (int64_t d : dims) {
      if (t->ne[i] != static_cast<uint64_t>(d)) ok = false;
      ++i;
    }
    for (; i < static_cast<size_t>(gguf::kMaxDims); ++i) {
      if (t->ne[i] != 1) ok = false;
    }
    if (!ok) {
      return load_error("tensor " + name + ": shape " + shape_string(*t) + ", expected " + shape_string(dims));
    }
    return t;
  }

  /// A matrix the kernels multiply by.
  Result<tensor::MatrixView> matrix(const std::string& name, int64_t cols, int64_t rows, int64_t n_mat = 1) const {
    auto t = n_mat == 1 ? require(name, {cols, rows}) : require(name, {cols, rows, n_mat});
    if (!t.ok()) return t.error();
    return view(**t, name);
  }

  Result<tensor::MatrixView> view(const gguf::TensorInfo& t, const std::string& name) const {
    if (!tensor::can_compute(t.type)) {
      return load_error("tensor " + name + ": type " + std::string(ggml_type_name(t.type)) +
                        " is not supported by the kernels");
    }
    auto rb = ggml_row_bytes(t.type, t.ne[0]);
    if (!rb) return load_error("tensor " + name + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of the block size");
    tensor::MatrixView v;
    v.type = t.type;
    v.data = f_.tensor_data(t).data();
    v.cols = static_cast<int64_t>(t.ne[0]);
    v.rows = static_cast<int64_t>(t.rows());
    v.row_bytes = static_cast<size_t>(*rb);
    return v;
  }

 private:
  const gguf::GgufFile& f_;
};

std::string blk(int64_t il, const char* what) { return "blk." + std::to_string(il) + "." + what + ".weight"; }
std::string blk_bias(int64_t il, const char* what) { return "blk." + std::to_string(il) + "." + what + ".bias"; }

/// deepseek2's MLA attention weights (llama_model_deepseek2::load_arch_tensors, the split attn_k_b / attn_v_b
/// form). `vec` is Model::load's norm-vector loader.
template <typename Vec>
Result<void> load_mla_attention(const TensorLoader& tl, Vec& vec, const Hparams& h, int64_t il,
                                LayerWeights& L) {
  const int64_t nope = h.head_dim_k - h.n_rot;
  if (h.q_lora_rank > 0) {
    CAR_TRY_ASSIGN(L.wq_a, tl.matrix(blk(il, "attn_q_a"), h.n_embd, h.q_lora_rank));
    CAR_TRY_ASSIGN(L.q_a_norm, vec(blk(il, "attn_q_a_norm"), h.q_lora_rank));
    CAR_TRY_ASSIGN(L.wq_b, tl.matrix(blk(il, "attn_q_b"), h.q_lora_rank, h.q_dim()));
  } else {
    CAR_TRY_ASSIGN(L.wq, tl.matrix(blk(il, "attn_q"), h.n_embd, h.q_dim()));
  }
  CAR_TRY_ASSIGN(L.wkv_a_mqa, tl.matrix(blk(il, "attn_kv_a_mqa"), h.n_embd, h.kv_lora_rank + h.n_rot));
  CAR_TRY_ASSIGN(L.kv_a_norm, vec(blk(il, "attn_kv_a_norm"), h.kv_lora_rank));
  if (tl.find(blk(il, "attn_k_b")) == nullptr && tl.find(blk(il, "attn_kv_b")) != nullptr) {
    return load_error("tensor " + blk(il, "attn_kv_b") + ": the unsplit form (an older converter) is not " +
                      "supported; convert the model again with a current llama.cpp (attn_k_b / attn_v_b)");
  }
  CAR_TRY_ASSIGN(L.wk_b, tl.matrix(blk(il, "attn_k_b"), nope, h.kv_lora_rank, h.n_head));
  CAR_TRY_ASSIGN(L.wv_b, tl.matrix(blk(il, "attn_v_b"), h.kv_lora_rank, h.head_dim_v, h.n_head));
  // Their products take a permuted (non-contiguous) activation in llama.cpp, which ggml's mul_mat sums
  // with ggml_vec_dot_* (tinyBLAS only takes contiguous ones): the mul_mat_id order of the float formats.
  L.wk_b.order = tensor::ProductOrder::mul_mat_id;
  L.wv_b.order = tensor::ProductOrder::mul_mat_id;
  return {};
}

}  // namespace

Result<std::shared_ptr<const Model>> Model::load(std::shared_ptr<const gguf::GgufFile> file) {
  auto hp = read_hparams(*file);
  if (!hp.ok()) return hp.error();
  std::shared_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  m->hparams_ = *hp;
  Hparams& h = m->hparams_;
  const ArchTraits& traits = *h.traits;
  TensorLoader tl(*m->file_);

  // A norm-like vector (or `rows` of them, a 2-D bias per expert): a view when F32, else dequantized into an
  // owned buffer.
  auto vec = [&](const std::string& name, int64_t n, int64_t rows = 1) -> Result<const float*> {
    auto t = rows == 1 ? tl.require(name, {n}) : tl.require(name, {n, rows});
    if (!t.ok()) return t.error();
    const gguf::TensorInfo& ti = **t;
    if (rows > 1) {
      // The per-row path below, once per row.
      if (!tensor::can_compute(ti.type) || !ggml_row_bytes(ti.type, static_cast<uint64_t>(n))) {
        return load_error("tensor " + name + ": type " + std::string(ggml_type_name(ti.type)) + " is not supported for a bias");
      }
      const size_t row_bytes = *ggml_row_bytes(ti.type, static_cast<uint64_t>(n));
      const uint8_t* data = m->file_->tensor_data(ti).data();
      auto copy = std::make_unique<float[]>(static_cast<size_t>(n * rows));
      for (int64_t r = 0; r < rows; ++r) {
        tensor::dequantize_row(ti.type, data + static_cast<size_t>(r) * row_bytes, copy.get() + r * n, n);
      }
      m->owned_.push_back(std::move(copy));
      return m->owned_.back().get();
    }
    const uint8_t* data = m->file_->tensor_data(ti).data();
    if (ti.type == GgmlType::F32) {
      if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
        auto copy = std::make_unique<float[]>(static_cast<size_t>(n));
        std::memcpy(copy.get(), data, static_cast<size_t>(n) * sizeof(float));
        m->owned_.push_back(std::move(copy));
        return m->owned_.back().get();
      }
      return reinterpret_cast<const float*>(data);
    }
    if (!tensor::can_compute(ti.type) || !ggml_row_bytes(ti.type, static_cast<uint64_t>(n))) {
      return load_error("tensor " + name + ": type " + std::string(ggml_type_name(ti.type)) + " is not supported for a vector");
    }
    auto copy = std::make_unique<float[]>(static_cast<size_t>(n));
    tensor::dequantize_row(ti.type, data, copy.get(), n);
    m->owned_.push_back(std::move(copy));
    return m->owned_.back().get();
  };

  // Embeddings: the vocabulary size comes from token_embd's shape.
  const gguf::TensorInfo* te = tl.find("token_embd.weight");
  if (te == nullptr) return load_error("tensor token_embd.weight is missing");
  if (te->n_dims != 2 || te->ne[0] != static_cast<uint64_t>(h.n_embd) || te->ne[1] == 0 || te->ne[1] > (1u << 24)) {
    return load_error("tensor token_embd.weight: shape " + shape_string(*te) + ", expected [" +
                      std::to_string(h.n_embd) + ", n_vocab]");
  }
  h.n_vocab = static_cast<int64_t>(te->ne[1]);
  CAR_TRY_ASSIGN(m->token_embd_, tl.view(*te, "token_embd.weight"));
  CAR_TRY_ASSIGN(m->output_norm_, vec("output_norm.weight", h.n_embd));
  if (tl.find("output.weight") != nullptr) {
    CAR_TRY_ASSIGN(m->output_, tl.matrix("output.weight", h.n_embd, h.n_vocab));
  } else {
    m->output_ = m->token_embd_;
    m->tied_ = true;
  }
  if (tl.find("output.bias") != nullptr) {
    CAR_TRY_ASSIGN(m->output_bias_, vec("output.bias", h.n_vocab));
  }
  if (tl.find("rope_freqs.weight") != nullptr) {
    CAR_TRY_ASSIGN(m->rope_freqs_, vec("rope_freqs.weight", h.n_rot / 2));
  }

  m->layers_.resize(static_cast<size_t>(h.n_layer));
  m->banks_.resize(static_cast<size_t>(h.n_layer));
  for (int64_t il = 0; il < h.n_layer; ++il) {
    LayerWeights& L = m->layers_[static_cast<size_t>(il)];
    CAR_TRY_ASSIGN(L.attn_norm, vec(blk(il, "attn_norm"), h.n_embd));
    if (traits.mla) {
      if (Result<void> r = load_mla_attention(tl, vec, h, il, L); !r) return r.error();
    } else {
      CAR_TRY_ASSIGN(L.wq, tl.matrix(blk(il, "attn_q"), h.n_embd, h.q_dim()));
      CAR_TRY_ASSIGN(L.wk, tl.matrix(blk(il, "attn_k"), h.n_embd, h.k_dim()));
      CAR_TRY_ASSIGN(L.wv, tl.matrix(blk(il, "attn_v"), h.n_embd, h.v_dim()));
    }
    CAR_TRY_ASSIGN(L.wo, tl.matrix(blk(il, "attn_output"), h.attn_out_dim(), h.n_embd));
    // Biases are optional for every architecture, as in llama.cpp's create_tensor_qkv / build_qkv.
    if (tl.find(blk_bias(il, "attn_q")) != nullptr) CAR_TRY_ASSIGN(L.q_bias, vec(blk_bias(il, "attn_q"), h.q_dim()));
    if (tl.find(blk_bias(il, "attn_k")) != nullptr) CAR_TRY_ASSIGN(L.k_bias, vec(blk_bias(il, "attn_k"), h.k_dim()));
    if (tl.find(blk_bias(il, "attn_v")) != nullptr) CAR_TRY_ASSIGN(L.v_bias, vec(blk_bias(il, "attn_v"), h.v_dim()));
    if (traits.moe_biases || tl.find(blk_bias(il, "attn_output")) != nullptr) {
      CAR_TRY_ASSIGN(L.o_bias, vec(blk_bias(il, "attn_output"), h.n_embd));
    }
    if (traits.attn_sinks) CAR_TRY_ASSIGN(L.attn_sinks, vec(blk(il, "attn_sinks"), h.n_head));
    if (traits.qk_norm) {
      CAR_TRY_ASSIGN(L.q_norm, vec(blk(il, "attn_q_norm"), h.head_dim_k));
      CAR_TRY_ASSIGN(L.k_norm, vec(blk(il, "attn_k_norm"), h.head_dim_k));
    }
    const std::string ffn_norm_name(traits.ffn_norm_name);
    CAR_TRY_ASSIGN(L.ffn_norm, vec(blk(il, ffn_norm_name.c_str()), h.n_embd));
    if (traits.post_norms) {
      CAR_TRY_ASSIGN(L.attn_post_norm, vec(blk(il, "post_attention_norm"), h.n_embd));
      CAR_TRY_ASSIGN(L.ffn_post_norm, vec(blk(il, "post_ffw_norm"), h.n_embd));
    }
    const bool has_router = tl.find(blk(il, "ffn_gate_inp")) != nullptr;
    if (has_router && h.n_expert == 0) {
      return load_error("tensor " + blk(il, "ffn_gate_inp") + " present but " + h.arch + ".expert_count is missing");
    }
    if (h.n_expert > 0 && !has_router && traits.moe_required) {
      return load_error("tensor " + blk(il, "ffn_gate_inp") + " is missing");
    }
    if (traits.mla && h.n_expert > 0 && has_router != (il >= h.n_layer_dense_lead)) {
      // llama.cpp takes the FFN by position: the leading_dense_block_count first layers dense, the rest MoE.
      return load_error("tensor " + blk(il, "ffn_gate_inp") +
                        (has_router ? " present in a leading dense layer" : " is missing (a MoE layer)") +
                        " (leading_dense_block_count = " + std::to_string(h.n_layer_dense_lead) + ")");
    }
    if (h.n_expert > 0 && has_router) {
      L.is_moe = true;
      CAR_TRY_ASSIGN(L.ffn_gate_inp, tl.matrix(blk(il, "ffn_gate_inp"), h.n_embd, h.n_expert));
      experts::ExpertBankInfo& b = m->banks_[static_cast<size_t>(il)];
      b.n_expert = static_cast<int>(h.n_expert);
      CAR_TRY_ASSIGN(b.gate_bank, tl.matrix(blk(il, "ffn_gate_exps"), h.n_embd, h.n_ff_exp, h.n_expert));
      CAR_TRY_ASSIGN(b.up_bank, tl.matrix(blk(il, "ffn_up_exps"), h.n_embd, h.n_ff_exp, h.n_expert));
      CAR_TRY_ASSIGN(b.down_bank, tl.matrix(blk(il, "ffn_down_exps"), h.n_ff_exp, h.n_embd, h.n_expert));
      b.gate_offset = m->file_->tensor_file_offset(*tl.find(blk(il, "ffn_gate_exps")));
      b.up_offset = m->file_->tensor_file_offset(*tl.find(blk(il, "ffn_up_exps")));
      b.down_offset = m->file_->tensor_file_offset(*tl.find(blk(il, "ffn_down_exps")));
      // Expert products are llama.cpp's mul_mat_id: its own summation order for the float formats and, for
      // repacked matrices, the gemv order on every row - so an expert row's result never depends on which
      // other rows (of the batch, or of other sequences) chose the same expert.
      for (tensor::MatrixView* v : {&b.gate_bank, &b.up_bank, &b.down_bank}) v->order = tensor::ProductOrder::mul_mat_id;
      if (traits.moe_biases) {
        CAR_TRY_ASSIGN(L.ffn_gate_inp_bias, vec(blk_bias(il, "ffn_gate_inp"), h.n_expert));
        CAR_TRY_ASSIGN(L.ffn_gate_exps_bias, vec(blk_bias(il, "ffn_gate_exps"), h.n_ff_exp, h.n_expert));
        CAR_TRY_ASSIGN(L.ffn_up_exps_bias, vec(blk_bias(il, "ffn_up_exps"), h.n_ff_exp, h.n_expert));
        CAR_TRY_ASSIGN(L.ffn_down_exps_bias, vec(blk_bias(il, "ffn_down_exps"), h.n_embd, h.n_expert));
      }
      if (traits.mla) {
        // Optional selection bias (V3) and shared experts as one plain FFN (resident, mul_mat order).
        if (tl.find(blk_bias(il, "exp_probs_b")) != nullptr) {
          CAR_TRY_ASSIGN(L.exp_probs_b, vec(blk_bias(il, "exp_probs_b"), h.n_expert));
        }
        if (h.n_ff_shexp > 0) {
          L.has_shexp = true;
          CAR_TRY_ASSIGN(L.ffn_gate_shexp, tl.matrix(blk(il, "ffn_gate_shexp"), h.n_embd, h.n_ff_shexp));
          CAR_TRY_ASSIGN(L.ffn_up_shexp, tl.matrix(blk(il, "ffn_up_shexp"), h.n_embd, h.n_ff_shexp));
          CAR_TRY_ASSIGN(L.ffn_down_shexp, tl.matrix(blk(il, "ffn_down_shexp"), h.n_ff_shexp, h.n_embd));
        }
      }
      if (traits.shared_expert) {
        // Dense weights (llama.cpp's build_ffn: mul_mat, not mul_mat_id), resident whatever the source.
        L.has_shexp = true;
        CAR_TRY_ASSIGN(L.ffn_gate_inp_shexp, tl.matrix(blk(il, "ffn_gate_inp_shexp"), h.n_embd, 1));
        CAR_TRY_ASSIGN(L.ffn_gate_shexp, tl.matrix(blk(il, "ffn_gate_shexp"), h.n_embd, h.n_ff_shexp));
        CAR_TRY_ASSIGN(L.ffn_up_shexp, tl.matrix(blk(il, "ffn_up_shexp"), h.n_embd, h.n_ff_shexp));
        CAR_TRY_ASSIGN(L.ffn_down_shexp, tl.matrix(blk(il, "ffn_down_shexp"), h.n_ff_shexp, h.n_embd));
      }
    } else {
      if (h.n_ff == 0) return load_error("layer " + std::to_string(il) + " is dense but " + h.arch + ".feed_forward_length is missing");
      CAR_TRY_ASSIGN(L.ffn_gate, tl.matrix(blk(il, "ffn_gate"), h.n_embd, h.n_ff));
      CAR_TRY_ASSIGN(L.ffn_up, tl.matrix(blk(il, "ffn_up"), h.n_embd, h.n_ff));
      CAR_TRY_ASSIGN(L.ffn_down, tl.matrix(blk(il, "ffn_down"), h.n_ff, h.n_embd));
    }
  }
  m->interleave_weights();
  return std::shared_ptr<const Model>(std::move(m));
}

void Model::interleave_weights() {
  std::vector<tensor::MatrixView*> views;
  for (LayerWeights& L : layers_) {
    for (tensor::MatrixView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wq_a, &L.wq_b, &L.wkv_a_mqa, &L.ffn_gate,
                                  &L.ffn_up, &L.ffn_down, &L.ffn_gate_shexp, &L.ffn_up_shexp, &L.ffn_down_shexp}) {
      views.push_back(v);
    }
  }
  // A tied output is token_embd's bytes, which the embedding lookup reads row by row.
  if (!tied_) views.push_back(&output_);
  // The copy is split over the machine's threads (a pool made only when a matrix can take the layout).
  interleaved_ = tensor::interleave_all(views, file_->fd() >= 0, /*threads=*/0);
}

uint64_t Model::bytes_per_token() const {
  auto bytes = [](const tensor::MatrixView& v) { return static_cast<uint64_t>(v.rows) * v.row_bytes; };
  uint64_t total = token_embd_.row_bytes + bytes(output_);
  for (size_t il = 0; il < layers_.size(); ++il) {
    const LayerWeights& L = layers_[il];
    total += bytes(L.wq) + bytes(L.wk) + bytes(L.wv) + bytes(L.wo);
    total += bytes(L.wq_a) + bytes(L.wq_b) + bytes(L.wkv_a_mqa) + bytes(L.wk_b) + bytes(L.wv_b);
    if (L.is_moe) {
      const experts::ExpertBankInfo& b = banks_[il];
      const uint64_t per_expert = b.expert_bytes();
      total += bytes(L.ffn_gate_inp) + per_expert * static_cast<uint64_t>(hparams_.n_expert_used);
      if (L.has_shexp) {
        total += bytes(L.ffn_gate_inp_shexp) + bytes(L.ffn_gate_shexp) + bytes(L.ffn_up_shexp) +
                 bytes(L.ffn_down_shexp);
      }
    } else {
      total += bytes(L.ffn_gate) + bytes(L.ffn_up) + bytes(L.ffn_down);
    }
  }
  return total;
}

}  // namespace car::model
