// Model: a loaded transformer - its hyperparameters and every weight as a view into the mmapped GGUF file.
//
// load() checks each tensor the architecture needs exists with the shape the hyperparameters imply and a type
// the kernels compute (errors name the tensor), then keeps only views: matrices stay in the file's pages
// (no copy for any format), norm vectors too when they are F32 (other types are dequantized once into a small
// owned buffer). The Model keeps the GgufFile (and so the mapping) alive. MoE layers expose their expert banks
// as ExpertBankInfo; the engine wraps them in an ExpertSource.
//
// Immutable after load; safe to share across threads.
#pragma once

#include <memory>
#include <vector>

#include "core/experts/expert_bank.h"
#include "core/gguf/gguf_file.h"
#include "core/model/hparams.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::model {

struct LayerWeights {
  const float* attn_norm = nullptr;   // (n_embd)
  tensor::MatrixView wq;              // (n_head * head_dim_k, n_embd)
  tensor::MatrixView wk;              // (n_head_kv * head_dim_k, n_embd)
  tensor::MatrixView wv;              // (n_head_kv * head_dim_v, n_embd)
  tensor::MatrixView wo;              // (n_embd, n_head * head_dim_v)
  const float* q_bias = nullptr;      // (n_head * head_dim_k), when the file has attn_q.bias (qwen2, qwen2moe)
  const float* k_bias = nullptr;      // (n_head_kv * head_dim_k), when the file has attn_k.bias
  const float* v_bias = nullptr;      // (n_head_kv * head_dim_v), when the file has attn_v.bias
  const float* o_bias = nullptr;      // (n_embd), when the file has attn_output.bias (gpt-oss)
  const float* attn_sinks = nullptr;  // (n_head) attention sink logits, attn_sinks architectures (gpt-oss)
  const float* q_norm = nullptr;      // (head_dim_k), qk_norm architectures only
  const float* k_norm = nullptr;      // (head_dim_k), qk_norm architectures only
  const float* attn_post_norm = nullptr;  // (n_embd), post_norms archs: blk.N.post_attention_norm
  const float* ffn_norm = nullptr;    // (n_embd); the file's blk.N.<traits.ffn_norm_name>.weight
  const float* ffn_post_norm = nullptr;   // (n_embd), post_norms archs: blk.N.post_ffw_norm
  // Dense FFN (is_moe == false)
  tensor::MatrixView ffn_gate;        // (n_ff, n_embd)
  tensor::MatrixView ffn_up;          // (n_ff, n_embd)
  tensor::MatrixView ffn_down;        // (n_embd, n_ff)
  // MoE (is_moe == true): the router here, the experts in the ExpertSource (banks in Model::expert_banks())
  bool is_moe = false;
  tensor::MatrixView ffn_gate_inp;    // (n_expert, n_embd), F32 in every known file
  // Router and expert biases (moe_biases archs: gpt-oss). Resident whatever the expert source: a few KB per
  // layer, read for the chosen experts' rows only (row e of each is expert e's).
  const float* ffn_gate_inp_bias = nullptr;   // (n_expert)
  const float* ffn_gate_exps_bias = nullptr;  // (n_expert, n_ff_exp)
  const float* ffn_up_exps_bias = nullptr;    // (n_expert, n_ff_exp)
  const float* ffn_down_exps_bias = nullptr;  // (n_expert, n_embd)
  // Shared expert (shared_expert archs, MoE layers): resident dense weights, run for every row.
  bool has_shexp = false;
  tensor::MatrixView ffn_gate_inp_shexp;  // (1, n_embd): its gate's logit, F32 (a 1-D tensor in the file)
  tensor::MatrixView ffn_gate_shexp;      // (n_ff_shexp, n_embd)
  tensor::MatrixView ffn_up_shexp;        // (n_ff_shexp, n_embd)
  tensor::MatrixView ffn_down_shexp;      // (n_embd, n_ff_shexp)
  // deepseek2's shared experts have no gate: ffn_gate_inp_shexp stays empty (data null) and they are added
  // unscaled. The MLA attention's weights (traits.mla; wq is attn_q when q_lora_rank == 0):
  tensor::MatrixView wq_a;           // (q_lora_rank, n_embd)
  const float* q_a_norm = nullptr;   // (q_lora_rank)
  tensor::MatrixView wq_b;           // (n_head * head_dim_k, q_lora_rank)
  tensor::MatrixView wkv_a_mqa;      // (kv_lora_rank + n_rot, n_embd)
  const float* kv_a_norm = nullptr;  // (kv_lora_rank)
  /// attn_k_b: n_head matrices of (kv_lora_rank, head_dim_k - n_rot) stacked, head h's rows at h *
  /// kv_lora_rank.
  tensor::MatrixView wk_b;
  /// attn_v_b: n_head matrices of (head_dim_v, kv_lora_rank) stacked, head h's rows at h * head_dim_v.
  tensor::MatrixView wv_b;
  const float* exp_probs_b = nullptr;  // (n_expert) selection bias (DeepSeek-V3), or null
};

class Model {
 public:
  /// Build from a parsed file. Errors: load_failed naming the key or tensor.
  static Result<std::shared_ptr<const Model>> load(std::shared_ptr<const gguf::GgufFile> file);

  const Hparams& hparams() const { return hparams_; }
  const gguf::GgufFile& file() const { return *file_; }
  const std::shared_ptr<const gguf::GgufFile>& file_ptr() const { return file_; }

  const tensor::MatrixView& token_embd() const { return token_embd_; }  // (n_vocab, n_embd)
  const float* output_norm() const { return output_norm_; }             // (n_embd)
  /// (n_vocab, n_embd); token_embd when the file has no output.weight (tied embeddings).
  const tensor::MatrixView& output() const { return output_; }
  bool tied_embeddings() const { return tied_; }
  /// (n_vocab) added to the logits, or null (output.bias: some qwen2 files).
  const float* output_bias() const { return output_bias_; }
  /// Llama 3 style per-pair RoPE frequency divisors (n_rot / 2), or null.
  const float* rope_freq_factors() const { return rope_freqs_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  /// One entry per layer (n_expert == 0 for dense layers).
  const std::vector<experts::ExpertBankInfo>& expert_banks() const { return banks_; }

  /// Bytes of tensor data the forward pass reads for one decoded token (dense weights + n_expert_used
  /// experts per MoE layer + one embedding row), for bandwidth-bound estimates.
  uint64_t bytes_per_token() const;

 private:
  Model() = default;

  std::shared_ptr<const gguf::GgufFile> file_;
  Hparams hparams_;
  tensor::MatrixView token_embd_;
  tensor::MatrixView output_;
  const float* output_norm_ = nullptr;
  const float* rope_freqs_ = nullptr;
  const float* output_bias_ = nullptr;
  bool tied_ = false;
  std::vector<LayerWeights> layers_;
  std::vector<experts::ExpertBankInfo> banks_;
  std::vector<std::unique_ptr<float[]>> owned_;  // dequantized copies of non-F32 vectors (norms)
  std::shared_ptr<uint8_t> interleaved_;  // the interleaved copies of dense matrices (interleave_weights)

  /// Hold every dense matrix that can take it (tensor::can_interleave: Q4_K or Q6_K with whole groups of 16
  /// rows, under kernels that have the layout) in the interleaved layout, in owned memory, and drop the
  /// mapping's pages of the originals. The expert banks stay as the file has them: the streamer reads them
  /// there, and a resident source interleaves its own (core/experts/resident_source.h).
  void interleave_weights();
};

}  // namespace car::model
