// ISA selection, the public row conversions, and the threaded matrix products over the selected table.
#include "core/tensor/kernels.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "core/tensor/amx.h"
#include "core/tensor/avx_vnni.h"
#include "core/tensor/blocks.h"
#include "core/tensor/iq_panel.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/silu.h"
#include "core/util/result.h"
#include "core/util/thread_pool.h"

namespace car::tensor {
namespace detail {

// The block structs and QK constants against the one geometry table (core/gguf/ggml_type.h).
template <typename Block>
constexpr bool same_geometry(GgmlType t, int64_t qk) {
  return ggml_traits(t).block_size == qk && ggml_traits(t).bytes_per_block == sizeof(Block);
}
static_assert(same_geometry<block_q4_0>(GgmlType::Q4_0, QK4_0));
static_assert(same_geometry<block_q4_1>(GgmlType::Q4_1, QK4_1));
static_assert(same_geometry<block_q5_0>(GgmlType::Q5_0, QK5_0));
static_assert(same_geometry<block_q5_1>(GgmlType::Q5_1, QK5_1));
static_assert(same_geometry<block_q8_0>(GgmlType::Q8_0, QK8_0));
static_assert(same_geometry<block_q8_1>(GgmlType::Q8_1, QK8_1));
static_assert(same_geometry<block_q2_K>(GgmlType::Q2_K, QK_K));
static_assert(same_geometry<block_q3_K>(GgmlType::Q3_K, QK_K));
static_assert(same_geometry<block_q4_K>(GgmlType::Q4_K, QK_K));
static_assert(same_geometry<block_q5_K>(GgmlType::Q5_K, QK_K));
static_assert(same_geometry<block_q6_K>(GgmlType::Q6_K, QK_K));
static_assert(same_geometry<block_q8_K>(GgmlType::Q8_K, QK_K));
static_assert(same_geometry<block_iq4_nl>(GgmlType::IQ4_NL, QK4_NL));
static_assert(same_geometry<block_iq2_xxs>(GgmlType::IQ2_XXS, QK_K));
static_assert(same_geometry<block_iq1_s>(GgmlType::IQ1_S, QK_K));
static_assert(same_geometry<block_iq4_xs>(GgmlType::IQ4_XS, QK_K));
static_assert(same_geometry<block_iq3_xxs>(GgmlType::IQ3_XXS, QK_K));
static_assert(same_geometry<block_iq3_s>(GgmlType::IQ3_S, QK_K));
static_assert(same_geometry<block_iq2_xs>(GgmlType::IQ2_XS, QK_K));
static_assert(same_geometry<block_iq2_s>(GgmlType::IQ2_S, QK_K));
static_assert(same_geometry<block_iq1_m>(GgmlType::IQ1_M, QK_K));
static_assert(same_geometry<block_tq1_0>(GgmlType::TQ1_0, QK_K));
static_assert(same_geometry<block_tq2_0>(GgmlType::TQ2_0, QK_K));
static_assert(same_geometry<block_mxfp4>(GgmlType::MXFP4, QK_MXFP4));
static_assert(same_geometry<float>(GgmlType::F32, 1));
static_assert(same_geometry<uint16_t>(GgmlType::F16, 1));
static_assert(same_geometry<uint16_t>(GgmlType::BF16, 1));

BlockGeometry geometry(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q8_1:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q8_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
    case GgmlType::MXFP4:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ1_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ1_M:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0: {
      const GgmlTypeTraits& g = ggml_traits(t);
      return {g.block_size, g.bytes_per_block};
    }
    default: return {};  // types the kernels do not compute
  }
}

GgmlType act_type(GgmlType w) {
  switch (w) {
    case GgmlType::F16: return GgmlType::F16;
    case GgmlType::BF16: return GgmlType::BF16;
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
    case GgmlType::MXFP4: return GgmlType::Q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return GgmlType::Q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ1_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ1_M:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0: return GgmlType::Q8_K;
    default: return GgmlType::F32;
  }
}

void check_view(const MatrixView& w, const DotKernels& k) {
  CAR_CHECK(static_cast<uint32_t>(w.type) < static_cast<uint32_t>(kTypeSlots));
  CAR_CHECK(k.dot[slot(w.type)] != nullptr);
  CAR_CHECK(!repacked(w) || (k.dot_gemv[slot(w.type)] != nullptr && k.dot_gemm[slot(w.type)] != nullptr));
  const BlockGeometry g = geometry(w.type);
  CAR_CHECK(w.cols > 0 && w.cols % g.block_size == 0);
  CAR_CHECK(w.row_bytes >= row_bytes(w.type, w.cols));
  CAR_CHECK(w.rows >= 0 && (w.rows == 0 || w.data != nullptr));
  CAR_CHECK(!w.interleaved || (((w.type == GgmlType::Q4_K && repacked(w)) ||
                                (w.type == GgmlType::Q6_K && !order_differs(k, w.type, w.order))) &&
                               w.rows % kRepackedRowGroup == 0 && w.row_bytes == row_bytes(w.type, w.cols) &&
                               k.interleaved[slot(w.type)].usable()));
}

namespace {
DotKernels make_scalar_table() {
  DotKernels k;
  k.dot[slot(GgmlType::F32)] = dot_f32_ref;
  k.dot[slot(GgmlType::F16)] = dot_f16_ref;
  k.dot[slot(GgmlType::BF16)] = dot_bf16_ref;
  k.dot[slot(GgmlType::Q4_0)] = dot_q4_0_q8_0_ref;
  k.dot[slot(GgmlType::Q4_1)] = dot_q4_1_q8_1_ref;
  k.dot[slot(GgmlType::Q5_0)] = dot_q5_0_q8_0_ref;
  k.dot[slot(GgmlType::Q5_1)] = dot_q5_1_q8_1_ref;
  k.dot[slot(GgmlType::Q8_0)] = dot_q8_0_q8_0_ref;
  k.dot[slot(GgmlType::Q2_K)] = dot_q2_K_q8_K_ref;
  k.dot[slot(GgmlType::Q3_K)] = dot_q3_K_q8_K_ref;
  k.dot[slot(GgmlType::Q4_K)] = dot_q4_K_q8_K_ref;
  k.dot[slot(GgmlType::Q5_K)] = dot_q5_K_q8_K_ref;
  k.dot[slot(GgmlType::Q6_K)] = dot_q6_K_q8_K_ref;
  k.dot[slot(GgmlType::IQ4_NL)] = dot_iq4_nl_q8_0_ref;
  k.dot[slot(GgmlType::IQ4_XS)] = dot_iq4_xs_q8_K_ref;
  k.dot[slot(GgmlType::MXFP4)] = dot_mxfp4_q8_0_ref;
  k.dot[slot(GgmlType::IQ2_XXS)] = dot_iq2_xxs_q8_K_ref;
  k.dot[slot(GgmlType::IQ1_S)] = dot_iq1_s_q8_K_ref;
  k.dot[slot(GgmlType::IQ3_XXS)] = dot_iq3_xxs_q8_K_ref;
  k.dot[slot(GgmlType::IQ3_S)] = dot_iq3_s_q8_K_ref;
  k.dot[slot(GgmlType::IQ2_XS)] = dot_iq2_xs_q8_K_ref;
  k.dot[slot(GgmlType::IQ2_S)] = dot_iq2_s_q8_K_ref;
  k.dot[slot(GgmlType::IQ1_M)] = dot_iq1_m_q8_K_ref;
  k.dot[slot(GgmlType::TQ1_0)] = dot_tq1_0_q8_K_ref;
  k.dot[slot(GgmlType::TQ2_0)] = dot_tq2_0_q8_K_ref;
  for (int t = 0; t < kTypeSlots; ++t) k.dot_id[t] = k.dot[t];  // the references have one order
  k.dot_sgemm[slot(GgmlType::IQ4_NL)] = dot_iq4_nl_q8_0_sgemm_ref;
  k.dot_gemv[slot(GgmlType::Q4_K)] = dot_q4_K_q8_K_gemv_ref;
  for (auto [t, fn] : {std::pair{GgmlType::Q4_0, &dot_q4_0_q8_0_repacked_ref},
                       std::pair{GgmlType::IQ4_NL, &dot_iq4_nl_q8_0_repacked_ref},
                       std::pair{GgmlType::MXFP4, &dot_mxfp4_q8_0_repacked_ref}}) {
    k.dot_gemv[slot(t)] = fn;  // one order for both
    k.dot_gemm[slot(t)] = fn;
  }
  k.dot_gemm[slot(GgmlType::Q4_K)] = dot_q4_K_q8_K_gemm_ref;
  k.dot_gemv[slot(GgmlType::Q2_K)] = dot_q2_K_q8_K_gemv_ref;
  k.dot_gemm[slot(GgmlType::Q2_K)] = dot_q2_K_q8_K_gemm_ref;
  k.quantize_act[slot(GgmlType::Q8_0)] = quantize_act_q8_0;
  k.quantize_act[slot(GgmlType::Q8_1)] = quantize_act_q8_1;
  k.quantize_act[slot(GgmlType::Q8_K)] = quantize_act_q8_K;
  k.quantize_act[slot(GgmlType::F16)] = convert_act_f16;
  k.quantize_act[slot(GgmlType::BF16)] = convert_act_bf16;
  k.iq_panel = iq_panel_rows_scalar;
  k.attend = attend_head_scalar;
  k.swiglu = swiglu_scalar;
  return k;
}
}  // namespace

const DotKernels& scalar_kernels() {
  static const DotKernels table = make_scalar_table();
  return table;
}

const DotKernels& kernels_for(Isa isa) {
  // AMX extends the AVX-512 level (amx.h): its table where the CPU and the OS allow the tiles.
  if (isa == Isa::avx512 && amx_kernels() != nullptr) return *amx_kernels();
  if (isa == Isa::avx512 && avx512_kernels() != nullptr) return *avx512_kernels();
  // AVX-VNNI extends the AVX2 level (avx_vnni.h): its table where the CPU has it.
  if (isa != Isa::scalar && avx_vnni_kernels() != nullptr) return *avx_vnni_kernels();
  if (isa != Isa::scalar && avx2_kernels() != nullptr) return *avx2_kernels();
  return scalar_kernels();
}

}  // namespace detail

namespace {

using detail::DotKernels;
using detail::slot;

bool cpu_has(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("bmi2");
    case Isa::avx512:
      return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return isa == Isa::scalar;
#endif
}

struct Active {
  Isa isa;
  const DotKernels* table;
};

Active& active() {
  static Active a = [] {
    const Isa isa = detect_isa();
    return Active{isa, &detail::kernels_for(isa)};
  }();
  return a;
}

/// Per-thread, grow-only, 64-byte aligned scratch for rounded activations (allocates only when it grows).
class Scratch {
 public:
  uint8_t* get(size_t bytes) {
    if (bytes > cap_) {
      cap_ = std::max(bytes, cap_ * 2);
      buf_.reset(static_cast<uint8_t*>(::operator new(cap_, std::align_val_t{64})));
    }
    return buf_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<uint8_t, Free> buf_;
  size_t cap_ = 0;
};

thread_local Scratch tls_act_scratch;

constexpr int64_t kVectorTile = 8;  // matmul: vectors per pass over a chunk of weight rows
// matmul: fewest vectors a tile is used for, repacked ones included. Below it the few-vector gemv kernel
// (DotKernels::rows_gemv_few) where the type has one, else the rows kernels. Since the repacked tiles fetch
// their next row group into L2 while they compute, 4 and 5 vectors run faster on the tile than in passes of
// the few-vector kernel (car bench --parallel 4,5, 2 threads: dense-1b Q4_K_M +13-20 %, moe-2b +3 %); 3 do
// not (dense x3 -8 %). Before that prefetch, the few-vector kernel served up to 5 (issue #25).
constexpr int64_t kMinTileVectors = 4;

}  // namespace

uint8_t* detail::act_scratch(size_t bytes) {
  return tls_act_scratch.get(bytes);
}

Isa detect_isa() {
  if (cpu_has(Isa::avx512) && detail::avx512_kernels() != nullptr) return Isa::avx512;
  if (cpu_has(Isa::avx2) && detail::avx2_kernels() != nullptr) return Isa::avx2;
  return Isa::scalar;
}

void set_isa(Isa isa) {
  Isa best = detect_isa();
  if (isa == Isa::avx512 && best != Isa::avx512) isa = best;
  if (isa == Isa::avx2 && best == Isa::scalar) isa = Isa::scalar;
  active() = Active{isa, &detail::kernels_for(isa)};
}

Isa current_isa() { return active().isa; }

const detail::DotKernels& detail::active_kernels() {
  return *active().table;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

bool parse_isa(std::string_view s, Isa* out) {
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (s == isa_name(isa)) {
      *out = isa;
      return true;
    }
  }
  return false;
}

bool can_compute(GgmlType type) {
  const auto id = static_cast<uint32_t>(type);
  return id < static_cast<uint32_t>(detail::kTypeSlots) && detail::scalar_kernels().dot[id] != nullptr;
}

bool can_quantize(GgmlType type) {
  // Every computed type is written (IQ2_XXS's plain quantizer in ref_iq2.cpp, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S,
  // IQ1_S, IQ1_M theirs in quantize_codebook.cpp).
  return can_compute(type) || type == GgmlType::Q8_1 || type == GgmlType::Q8_K;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  CAR_CHECK(detail::dequantize_ref(type, src, dst, n));
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  CAR_CHECK(detail::quantize_weights_ref(type, src, dst, n));
}

GgmlType activation_type(GgmlType w) { return detail::act_type(w); }

size_t activation_row_bytes(GgmlType w, int64_t n) { return detail::row_bytes(detail::act_type(w), n); }

void quantize_activation(GgmlType w, const float* x, void* dst, int64_t n) {
  const GgmlType a = detail::act_type(w);
  if (a == GgmlType::F32) {
    std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  active().table->quantize_act[slot(a)](x, dst, n);
}

float dot_row(GgmlType w, const void* w_row, const void* act, int64_t n, ProductOrder order) {
  const DotKernels& k = *active().table;
  CAR_CHECK(static_cast<uint32_t>(w) < static_cast<uint32_t>(detail::kTypeSlots) && k.dot[slot(w)] != nullptr);
  return detail::dot_for(k, w, order)(w_row, act, n);
}

void matvec(const MatrixView& w, const float* x, float* y, ThreadPool* pool) {
  const MatvecTask one{w, x, y};
  matvec_fused(&one, 1, pool);
}

namespace {
constexpr int64_t kMinMatmulChunks = 16;  // matmul: tasks per product (at least, rows permitting)

/// Does matmul hand this product to matvec (one vector, in the gemv order, not in the IQ panel's)?
bool one_vector_product(const MatrixView& w, int64_t n, const uint8_t* gemm, const uint8_t* panel) {
  const bool panel0 =
      detail::iq_panel(w) && (panel != nullptr ? panel[0] != 0 : n >= detail::kIqPanelMinBatch);
  return n == 1 && (gemm == nullptr || gemm[0] == 0) && !panel0;
}

/// One matmul product's kernel choices, made once per call; then rows(begin, end), on any thread, computes
/// rows [begin, end) of every vector against the rounded inputs (set_acts). matmul_fused runs the plans of
/// its tasks in one fork-join, and matmul, matmul_ordered, matvec and matvec_fused are matmul_fused: one set
/// of choices and kernels, so the same bits whatever the grouping. `gemm` null = the mul_mat rule (whole
/// groups of 4 vectors in the gemm order); `panel` null = the panel's rule (every vector of a batch of
/// kIqPanelMinBatch or more).
class MatmulPlan {
 public:
  MatmulPlan(const DotKernels& k, const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y,
             int64_t ldy, const uint8_t* gemm, const uint8_t* panel)
      : k_(k), w_(w), x_(x), n_(n), ldx_(ldx), y_(y), ldy_(ldy), gemm_(gemm), panel_(panel) {
    detail::check_view(w, k);
    CAR_CHECK(n >= 1 && ldx >= w.cols && ldy >= w.rows);
    at_ = detail::act_type(w.type);
    cols_ = w.cols;
    act_bytes_ = at_ == GgmlType::F32 ? 0 : activation_row_bytes(w.type, cols_);
    // One vector in the gemv order (not the IQ panel's): matvec's kernels and chunks, nothing else to choose.
    one_vector_ = one_vector_product(w, n, gemm, panel);
    if (one_vector_) return;
    panel_product_ = detail::iq_panel(w);
    for (int64_t i = 0; i < n; ++i) n_panel_ += panel_at(i) ? 1 : 0;
    dot_ = detail::dot_for(k, w.type, w.order);
    base_ = w.data;
    stride_ = w.row_bytes;
    repacked_ = detail::repacked(w);
    // (An interleaved matrix takes none of the file layout's kernels: its own are chosen below.)
    const bool file_kernels = at_ != GgmlType::F32 && !repacked_ && !w.interleaved;
    tile_ = !file_kernels || n < kMinTileVectors ? nullptr : detail::tile_for(k, w.type, w.order);
    // Fewer vectors than the tile is worth, of a type with one order: its few-vector kernel, if it has one.
    plain_few_ = !file_kernels || n >= kMinTileVectors || n_panel_ > 0
                     ? nullptr
                     : detail::rows_few_for(k, w.type, w.order);
    // Repacked products (see detail::repacked): llama.cpp's mul_mat runs its gemm over the batch's whole
    // groups of 4 vectors and its gemv over the rest; its mul_mat_id runs gemv on every row.
    by_order_ = repacked_ && w.order == ProductOrder::mul_mat;
    n_gemm_ = by_order_ ? detail::gemm_vectors(n) : 0;
    dot_gemm_ = k.dot_gemm[slot(w.type)];
    dot_gemv_ = k.dot_gemv[slot(w.type)];
    rows_gemv_ = repacked_ ? k.rows_gemv[slot(w.type)] : nullptr;
    // Fewer vectors than the tile is worth, all in the gemv order: the few-vector gemv kernel, if the type
    // has one.
    bool all_gemv = true;
    for (int64_t i = 0; i < n && all_gemv; ++i) all_gemv = !gemm_at(i);
    const detail::TileFn few = repacked_ && all_gemv ? k.rows_gemv_few[slot(w.type)] : nullptr;
    // The repacked tile transposes each chunk's rows before it multiplies, a cost shared by the call's
    // vectors: with fewer than kMinTileVectors the other kernels, which give the same bits, are faster.
    tile_rp_ = repacked_ && n >= kMinTileVectors ? k.tile_repacked[slot(w.type)] : nullptr;
    rows_few_ = tile_rp_ == nullptr ? few : nullptr;
    if (w.interleaved) {
      // No rows to transpose: the tile for any batch but a few all-gemv vectors, which the few-vector kernel
      // takes in registers. (One gemv vector goes to matvec.)
      const bool few_gemv = all_gemv && n < kMinTileVectors;
      tile_rp_ = few_gemv ? nullptr : k.interleaved[slot(w.type)].tile;
      rows_few_ = few_gemv ? k.interleaved[slot(w.type)].rows_few : nullptr;
    }
    // The tile's per-vector orders: the caller's mask, the mul_mat rule written out, or null (all gemv).
    if (tile_rp_ != nullptr && by_order_) {
      if (gemm != nullptr) {
        orders_ = gemm;
      } else {
        rule_.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) rule_[static_cast<size_t>(i)] = i < n_gemm_ ? 1 : 0;
        orders_ = rule_.data();
      }
    }
    // The panel's vectors: all of them (mask null) or those the caller marks.
    panel_mask_ = n_panel_ == n ? nullptr : panel;
  }
  // Moving keeps orders_ valid: it points into rule_'s heap buffer, which moves with it.
  MatmulPlan(MatmulPlan&&) = default;
  MatmulPlan& operator=(MatmulPlan&&) = delete;

  GgmlType act_type() const { return at_; }
  /// Bytes of one rounded vector (0: F32 weights, which read X in place).
  size_t act_bytes() const { return act_bytes_; }
  /// Where the rounded vectors are (n x act_bytes()); unused for F32 weights.
  void set_acts(uint8_t* acts) { acts_ = acts; }
  /// Rounds vectors [begin, end) into the acts.
  void quantize(int64_t begin, int64_t end) const {
    for (int64_t i = begin; i < end; ++i) {
      k_.quantize_act[slot(at_)](x_ + i * ldx_, acts_ + static_cast<size_t>(i) * act_bytes_, cols_);
    }
  }
  /// Weight bytes times vectors: the work the threading threshold weighs.
  size_t work() const { return static_cast<size_t>(w_.rows) * w_.row_bytes * static_cast<size_t>(n_); }
  int64_t vectors() const { return n_; }

  /// Rows per task on a pool of `threads`.
  int64_t grain(int threads) const {
    if (one_vector_) return detail::matvec_chunk_rows(k_, w_);
    // A chunk is re-read once per group of vectors and should stay in L2; it is also the span over which a
    // tile kernel's per-group setup is shared, so not too small, and at least kMinMatmulChunks per product.
    int64_t grain = std::max<int64_t>(
        1, std::min(static_cast<int64_t>(detail::kChunkBytes / std::max<size_t>(1, stride_)),
                    w_.rows / kMinMatmulChunks));
    // The repacked tiles interleave rows by kRepackedRowGroup, and some gemv kernels by
    // DotKernels::gemv_group: chunks of whole groups leave no padded group but the last.
    if (repacked_ || w_.interleaved) {
      grain =
          detail::whole_groups(grain, tile_rp_ != nullptr || w_.interleaved ? detail::kRepackedRowGroup
                                                                            : k_.gemv_group[slot(w_.type)]);
    }
    // A tile that packs its chunk's rows (DotKernels::tile_group) reads their weights once per call,
    // whatever the vector count, but repeats its per-vector setup per call: its chunks are sized for balance
    // alone (at least kMinMatmulChunks per product and four per thread), in whole groups.
    const int64_t group = tile_ != nullptr ? k_.tile_group[slot(w_.type)] : 0;
    if (group > 0) {
      const int64_t chunks = std::max<int64_t>(kMinMatmulChunks, 4 * static_cast<int64_t>(threads));
      grain = std::max<int64_t>(group, w_.rows / chunks / group * group);
    }
    return grain;
  }

  void rows(int64_t begin, int64_t end) const {
    if (one_vector_) {
      detail::matvec_rows(k_, w_, act_of(0), y_, begin, end);
      return;
    }
    if (n_panel_ > 0) {
      k_.iq_panel(w_.type, base_ + static_cast<size_t>(begin) * stride_, stride_, end - begin, acts_,
                  act_bytes_, n_, panel_mask_, cols_, y_ + begin, ldy_);
      if (n_panel_ == n_) return;
      // The rest (a batched step's decode rows beside a prompt's): the dot order, one vector at a time.
      for (int64_t r = begin; r < end; ++r) {
        const uint8_t* row = base_ + static_cast<size_t>(r) * stride_;
        for (int64_t i = 0; i < n_; ++i) {
          if (!panel_at(i)) y_[i * ldy_ + r] = dot_(row, act_of(i), cols_);
        }
      }
      return;
    }
    if (tile_rp_ != nullptr) {
      tile_rp_(base_ + static_cast<size_t>(begin) * stride_, stride_, end - begin, acts_, act_bytes_, n_,
               cols_, y_ + begin, ldy_, orders_);
      return;
    }
    if (rows_few_ != nullptr) {
      // A few vectors, all in the gemv order (an expert's rows in a batched decode step; 2-3 streams): one
      // pass over the rows that unpacks each weight block once for all of them, same bits as rows_gemv.
      rows_few_(base_ + static_cast<size_t>(begin) * stride_, stride_, end - begin, acts_, act_bytes_, n_,
                cols_, y_ + begin, ldy_);
      return;
    }
    if (repacked_ && rows_gemv_ != nullptr) {
      // A few vectors, some in the gemm order: the matvec kernel per gemv vector, over sub-chunks that stay in
      // L2 while the vectors take their turns, so the weights come from memory once. It gives the one-row gemv
      // kernel's bits (both are dot_q4_K_q8_K_gemv_ref's) and is faster.
      const int64_t sub =
          detail::whole_groups(static_cast<int64_t>(detail::kChunkBytes / std::max<size_t>(1, stride_)),
                               k_.gemv_group[slot(w_.type)]);
      for (int64_t r0 = begin; r0 < end; r0 += sub) {
        const int64_t r1 = std::min(end, r0 + sub);
        for (int64_t i = 0; i < n_; ++i) {
          if (gemm_at(i)) {
            for (int64_t r = r0; r < r1; ++r) {
              y_[i * ldy_ + r] = dot_gemm_(base_ + static_cast<size_t>(r) * stride_, act_of(i), cols_);
            }
          } else {
            rows_gemv_(base_ + static_cast<size_t>(r0) * stride_, stride_, r1 - r0, act_of(i), cols_,
                       y_ + i * ldy_ + r0);
          }
        }
      }
      return;
    }
    if (repacked_) {
      for (int64_t t0 = 0; t0 < n_; t0 += kVectorTile) {
        const int64_t t1 = std::min(n_, t0 + kVectorTile);
        for (int64_t r = begin; r < end; ++r) {
          const uint8_t* row = base_ + static_cast<size_t>(r) * stride_;
          for (int64_t i = t0; i < t1; ++i) {
            y_[i * ldy_ + r] = (gemm_at(i) ? dot_gemm_ : dot_gemv_)(row, act_of(i), cols_);
          }
        }
      }
      return;
    }
    if (tile_ != nullptr) {
      tile_(base_ + static_cast<size_t>(begin) * stride_, stride_, end - begin, acts_, act_bytes_, n_, cols_,
            y_ + begin, ldy_);
      return;
    }
    if (plain_few_ != nullptr) {
      plain_few_(base_ + static_cast<size_t>(begin) * stride_, stride_, end - begin, acts_, act_bytes_, n_,
                 cols_, y_ + begin, ldy_);
      return;
    }
    for (int64_t t0 = 0; t0 < n_; t0 += kVectorTile) {
      const int64_t t1 = std::min(n_, t0 + kVectorTile);
      for (int64_t r = begin; r < end; ++r) {
        const uint8_t* row = base_ + static_cast<size_t>(r) * stride_;
        for (int64_t i = t0; i < t1; ++i) y_[i * ldy_ + r] = dot_(row, act_of(i), cols_);
      }
    }
  }

 private:
  bool panel_at(int64_t i) const {
    return panel_product_ && (panel_ != nullptr ? panel_[i] != 0 : n_ >= detail::kIqPanelMinBatch);
  }
  bool gemm_at(int64_t i) const { return by_order_ && (gemm_ != nullptr ? gemm_[i] != 0 : i < n_gemm_); }
  const void* act_of(int64_t i) const {
    return at_ == GgmlType::F32 ? static_cast<const void*>(x_ + i * ldx_)
                                : static_cast<const void*>(acts_ + static_cast<size_t>(i) * act_bytes_);
  }

  const DotKernels& k_;
  MatrixView w_;
  const float* x_;
  int64_t n_, ldx_;
  float* y_;
  int64_t ldy_;
  const uint8_t* gemm_;
  const uint8_t* panel_;
  bool one_vector_ = false;
  bool panel_product_ = false;
  int64_t n_panel_ = 0;
  detail::DotFn dot_ = nullptr;
  GgmlType at_ = GgmlType::F32;
  int64_t cols_ = 0;
  size_t act_bytes_ = 0;
  uint8_t* acts_ = nullptr;
  const uint8_t* base_ = nullptr;
  size_t stride_ = 0;
  bool repacked_ = false;
  detail::TileFn tile_ = nullptr;
  detail::TileFn plain_few_ = nullptr;
  bool by_order_ = false;
  int64_t n_gemm_ = 0;
  detail::DotFn dot_gemm_ = nullptr;
  detail::DotFn dot_gemv_ = nullptr;
  detail::RowsFn rows_gemv_ = nullptr;
  detail::RepackedTileFn tile_rp_ = nullptr;
  detail::TileFn rows_few_ = nullptr;
  const uint8_t* orders_ = nullptr;
  const uint8_t* panel_mask_ = nullptr;
  std::vector<uint8_t> rule_;  // the mul_mat rule's orders, when the caller gives none
};

/// matmul_fused's bookkeeping for one call, kept per thread so a step's calls allocate nothing once grown.
struct FusedMatmulState {
  std::vector<MatmulPlan> plans;     // the tasks with vectors
  std::vector<const MatmulTask*> of;  // each plan's task
  std::vector<size_t> offset;         // each plan's rounding in the scratch
  std::vector<uint8_t> rounds;        // whether the plan rounds its input (else F32, or another plan's)
  std::vector<int64_t> round_end;     // cumulative vectors to round, per plan
  std::vector<int64_t> chunk_end;     // cumulative chunks, per plan
  std::vector<int64_t> chunk_rows;    // rows per chunk, per plan
  void clear() {
    plans.clear();
    of.clear();
    offset.clear();
    rounds.clear();
  }
};
thread_local FusedMatmulState tls_fused_matmul;

}  // namespace

void matmul(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy, ThreadPool* pool) {
  const MatmulTask t{w, x, n, ldx, y, ldy, nullptr, nullptr};
  matmul_fused(&t, 1, pool);
}

void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, ThreadPool* pool) {
  CAR_CHECK(gemm != nullptr);
  const MatmulTask t{w, x, n, ldx, y, ldy, gemm, nullptr};
  matmul_fused(&t, 1, pool);
}

void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, const uint8_t* panel, ThreadPool* pool) {
  CAR_CHECK(gemm != nullptr && panel != nullptr);
  const MatmulTask t{w, x, n, ldx, y, ldy, gemm, panel};
  matmul_fused(&t, 1, pool);
}

void matmul_fused(const MatmulTask* tasks, size_t count, ThreadPool* pool) {
  const DotKernels& k = *active().table;
  auto ldx_of = [](const MatmulTask& t) { return t.ldx != 0 ? t.ldx : t.w.cols; };
  auto ldy_of = [](const MatmulTask& t) { return t.ldy != 0 ? t.ldy : t.w.rows; };
  {
    // An interleaved matrix under a table without its kernels (the ISA changed after the load): the same
    // products on de-interleaved copies (slow, but the same bits).
    auto orphan = [&](const MatrixView& w) {
      return w.interleaved && (static_cast<uint32_t>(w.type) >= static_cast<uint32_t>(detail::kTypeSlots) ||
                               !k.interleaved[slot(w.type)].usable());
    };
    bool any = false;
    for (size_t i = 0; i < count && !any; ++i) any = orphan(tasks[i].w);
    if (any) {
      std::vector<MatmulTask> plain(tasks, tasks + count);
      std::vector<std::vector<uint8_t>> bufs(count);
      for (size_t i = 0; i < count; ++i) {
        if (orphan(plain[i].w)) plain[i].w = detail::plain_copy(plain[i].w, bufs[i]);
      }
      matmul_fused(plain.data(), count, pool);
      return;
    }
  }
  // The plans (tasks without vectors have none), and where each one's rounded vectors go: one rounding per
  // distinct input, shared by the tasks that read it.
  FusedMatmulState& st = tls_fused_matmul;
  st.clear();
  std::vector<MatmulPlan>& plans = st.plans;
  std::vector<const MatmulTask*>& of = st.of;
  std::vector<size_t>& offset = st.offset;
  std::vector<uint8_t>& rounds = st.rounds;
  size_t bytes = 0, work = 0;
  int64_t to_round = 0, max_cols = 1;
  for (size_t i = 0; i < count; ++i) {
    const MatmulTask& t = tasks[i];
    if (t.n <= 0) continue;
    CAR_CHECK(t.x != nullptr && (t.w.rows == 0 || t.y != nullptr));
    plans.emplace_back(k, t.w, t.x, t.n, ldx_of(t), t.y, ldy_of(t), t.gemm, t.panel);
    of.push_back(&t);
    const MatmulPlan& p = plans.back();
    work += p.work();
    size_t off = bytes;
    uint8_t round = 0;
    if (p.act_type() != GgmlType::F32) {
      size_t j = 0;
      while (j + 1 < plans.size() && !(of[j]->x == t.x && ldx_of(*of[j]) == ldx_of(t) && of[j]->n == t.n &&
                                       of[j]->w.cols == t.w.cols && plans[j].act_type() == p.act_type())) {
        ++j;
      }
      if (j + 1 < plans.size()) {
        off = offset[j];
      } else {
        round = 1;
        bytes += (p.act_bytes() * static_cast<size_t>(t.n) + 63) / 64 * 64;
        to_round += t.n;
        max_cols = std::max(max_cols, t.w.cols);
      }
    }
    offset.push_back(off);
    rounds.push_back(round);
  }
  if (plans.empty()) return;
  uint8_t* acts = detail::act_scratch(std::max<size_t>(1, bytes));
  for (size_t i = 0; i < plans.size(); ++i) plans[i].set_acts(acts + offset[i]);
  const bool threaded = pool != nullptr && pool->size() > 1 && work >= detail::kMinParallelBytes;

  // Round the inputs: every vector to round, numbered across the plans that round.
  std::vector<int64_t>& round_end = st.round_end;
  round_end.resize(plans.size());
  for (size_t i = 0, v = 0; i < plans.size(); ++i) {
    v += rounds[i] ? static_cast<size_t>(plans[i].vectors()) : 0;
    round_end[i] = static_cast<int64_t>(v);
  }
  auto quantize = [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t v = begin; v < end; ++v) {
      while (v >= round_end[i]) ++i;
      const int64_t first = round_end[i] - plans[i].vectors();
      plans[i].quantize(v - first, v - first + 1);
    }
  };
  if (to_round > 0) {
    if (threaded) {
      pool->parallel_for(to_round, std::max<int64_t>(1, 16384 / max_cols), 0, quantize);
    } else {
      quantize(0, to_round);
    }
  }

  if (!threaded) {
    for (size_t i = 0; i < plans.size(); ++i) plans[i].rows(0, of[i]->w.rows);
    return;
  }
  // One chunk list over all plans, in task order; each plan's chunks as its own matmul (or matvec) cuts them.
  std::vector<int64_t>& chunk_end = st.chunk_end;
  std::vector<int64_t>& chunk_rows = st.chunk_rows;
  chunk_end.resize(plans.size());
  chunk_rows.resize(plans.size());
  int64_t chunks = 0;
  bool few = true;
  for (size_t i = 0; i < plans.size(); ++i) {
    const MatmulTask& t = *of[i];
    chunk_rows[i] = plans[i].grain(pool->size());
    chunks += (t.w.rows + chunk_rows[i] - 1) / chunk_rows[i];
    chunk_end[i] = chunks;
    few = few && t.n <= kVectorTile;
  }
  auto chunk = [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t c = begin; c < end; ++c) {
      while (c >= chunk_end[i]) ++i;
      const int64_t r0 = (c - (i == 0 ? 0 : chunk_end[i - 1])) * chunk_rows[i];
      plans[i].rows(r0, std::min(of[i]->w.rows, r0 + chunk_rows[i]));
    }
  };
  // One vector, or a batched decode step's few per product: memory-bound, so each thread streams its own
  // contiguous share of the chunks (fused.cpp says why). More vectors: chunks dealt from one cursor; within a
  // chunk the tiles of vectors sweep its rows, so they come from memory once and from cache for the rest.
  if (few) {
    pool->parallel_for_shares(chunks, 1, 0, chunk);
  } else {
    pool->parallel_for(chunks, 1, 0, chunk);
  }
}

void matvec_fused(const MatvecTask* tasks, size_t n, ThreadPool* pool) {
  // matmul_fused's one-vector tasks take matvec's kernels and chunks (MatmulPlan); per thread, so decode's
  // calls allocate nothing once grown.
  thread_local std::vector<MatmulTask> as_matmul;
  as_matmul.clear();
  for (size_t i = 0; i < n; ++i) as_matmul.push_back(MatmulTask{tasks[i].w, tasks[i].x, 1, 0, tasks[i].y, 0});
  matmul_fused(as_matmul.data(), as_matmul.size(), pool);
}

bool iq_panel_product(const MatrixView& w) { return detail::iq_panel(w); }

float dot_row_panel(GgmlType w, const void* w_row, const void* act, int64_t n) {
  CAR_CHECK(detail::iq_panel_type(w));
  return detail::dot_iq_panel_ref(w, w_row, act, n);
}

}  // namespace car::tensor
