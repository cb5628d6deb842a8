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
  CAR_CHECK(!w.interleaved || (w.type == GgmlType::Q4_K && repacked(w) && w.rows % kRepackedRowGroup == 0 &&
                               w.row_bytes == row_bytes(w.type, w.cols) && k.q4k_interleaved.tile != nullptr));
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
}  // namespace

namespace {
/// matmul and matmul_ordered: `gemm` null = the mul_mat rule (whole groups of 4 vectors in the gemm order);
/// `panel` null = the panel's rule (every vector of a batch of kIqPanelMinBatch or more).
void matmul_impl(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                 const uint8_t* gemm, const uint8_t* panel, ThreadPool* pool) {
  if (n <= 0) return;
  // llama.cpp's IQ panel order (iq_panel.h): vector i takes it when panel_at(i).
  const bool panel_product = detail::iq_panel(w);
  auto panel_at = [&](int64_t i) {
    return panel_product && (panel != nullptr ? panel[i] != 0 : n >= detail::kIqPanelMinBatch);
  };
  if (n == 1 && (gemm == nullptr || gemm[0] == 0) && !panel_at(0)) {
    matvec(w, x, y, pool);
    return;
  }
  int64_t n_panel = 0;
  for (int64_t i = 0; i < n; ++i) n_panel += panel_at(i) ? 1 : 0;
  const DotKernels& k = *active().table;
  if (w.interleaved && k.q4k_interleaved.tile == nullptr) {
    // An interleaved matrix under a table without its kernels (the ISA changed after the load).
    std::vector<uint8_t> buf;
    matmul_impl(detail::plain_copy(w, buf), x, n, ldx, y, ldy, gemm, panel, pool);
    return;
  }
  detail::check_view(w, k);
  CAR_CHECK(ldx >= w.cols && ldy >= w.rows);
  const detail::DotFn dot = detail::dot_for(k, w.type, w.order);
  const GgmlType at = detail::act_type(w.type);
  const int64_t cols = w.cols;

  // Round every input vector once; F32 weights read X in place.
  const size_t act_bytes = at == GgmlType::F32 ? 0 : activation_row_bytes(w.type, cols);
  uint8_t* acts = detail::act_scratch(std::max<size_t>(1, act_bytes * static_cast<size_t>(n)));
  auto act_of = [&](int64_t i) -> const void* {
    return at == GgmlType::F32 ? static_cast<const void*>(x + i * ldx)
                               : static_cast<const void*>(acts + static_cast<size_t>(i) * act_bytes);
  };
  const bool threaded = pool != nullptr && pool->size() > 1 &&
                        static_cast<size_t>(w.rows) * w.row_bytes * static_cast<size_t>(n) >= detail::kMinParallelBytes;
  if (at != GgmlType::F32) {
    auto quantize = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        k.quantize_act[slot(at)](x + i * ldx, acts + static_cast<size_t>(i) * act_bytes, cols);
      }
    };
    if (threaded) {
      pool->parallel_for(n, std::max<int64_t>(1, 16384 / cols), 0, quantize);
    } else {
      quantize(0, n);
    }
  }

  // Each task owns a chunk of rows; within it, tiles of vectors sweep the chunk, so the chunk's weights come
  // from memory once and from cache for the remaining tiles.
  const uint8_t* base = w.data;
  const size_t stride = w.row_bytes;
  const bool repacked = detail::repacked(w);
  const detail::TileFn tile =
      at == GgmlType::F32 || repacked || n < kMinTileVectors ? nullptr : detail::tile_for(k, w.type, w.order);
  // Fewer vectors than the tile is worth, of a type with one order: its few-vector kernel, if it has one.
  const detail::TileFn plain_few = at == GgmlType::F32 || repacked || n >= kMinTileVectors || n_panel > 0
                                       ? nullptr
                                       : detail::rows_few_for(k, w.type, w.order);
  // Repacked products (see detail::repacked): llama.cpp's mul_mat runs its gemm over the batch's whole groups
  // of 4 vectors and its gemv over the rest; its mul_mat_id runs gemv on every row.
  const bool by_order = repacked && w.order == ProductOrder::mul_mat;
  const int64_t n_gemm = by_order ? detail::gemm_vectors(n) : 0;
  // Vector i's order: the caller's, or the mul_mat rule.
  auto gemm_at = [&](int64_t i) { return by_order && (gemm != nullptr ? gemm[i] != 0 : i < n_gemm); };
  const detail::DotFn dot_gemm = k.dot_gemm[slot(w.type)];
  const detail::DotFn dot_gemv = k.dot_gemv[slot(w.type)];
  const detail::RowsFn rows_gemv = repacked ? k.rows_gemv[slot(w.type)] : nullptr;
  // Fewer vectors than the tile is worth, all in the gemv order: the few-vector gemv kernel, if the type has one.
  bool all_gemv = true;
  for (int64_t i = 0; i < n && all_gemv; ++i) all_gemv = !gemm_at(i);
  const detail::TileFn few = repacked && all_gemv ? k.rows_gemv_few[slot(w.type)] : nullptr;
  // The repacked tile transposes each chunk's rows before it multiplies, a cost shared by the call's vectors:
  // with fewer than kMinTileVectors the other kernels, which give the same bits, are faster.
  detail::RepackedTileFn tile_rp = repacked && n >= kMinTileVectors ? k.tile_repacked[slot(w.type)] : nullptr;
  detail::TileFn rows_few = tile_rp == nullptr ? few : nullptr;
  if (w.interleaved) {
    // No rows to transpose: the tile for any batch but a few all-gemv vectors, which the few-vector kernel
    // takes in registers. (One gemv vector went to matvec above.)
    const bool few_gemv = all_gemv && n < kMinTileVectors;
    tile_rp = few_gemv ? nullptr : k.q4k_interleaved.tile;
    rows_few = few_gemv ? k.q4k_interleaved.rows_gemv_few : nullptr;
  }
  // The tile's per-vector orders: the caller's mask, the mul_mat rule written out, or null (all gemv).
  const uint8_t* orders = nullptr;
  if (tile_rp != nullptr && by_order) {
    if (gemm != nullptr) {
      orders = gemm;
    } else {
      thread_local std::vector<uint8_t> rule;  // grow-only
      if (rule.size() < static_cast<size_t>(n)) rule.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) rule[static_cast<size_t>(i)] = i < n_gemm ? 1 : 0;
      orders = rule.data();
    }
  }
  // The panel's vectors: all of them (mask null) or those the caller marks.
  const uint8_t* panel_mask = n_panel == n ? nullptr : panel;
  auto rows = [&](int64_t begin, int64_t end) {
    if (n_panel > 0) {
      k.iq_panel(w.type, base + static_cast<size_t>(begin) * stride, stride, end - begin, acts, act_bytes, n,
                 panel_mask, cols, y + begin, ldy);
      if (n_panel == n) return;
      // The rest (a batched step's decode rows beside a prompt's): the dot order, one vector at a time.
      for (int64_t r = begin; r < end; ++r) {
        const uint8_t* row = base + static_cast<size_t>(r) * stride;
        for (int64_t i = 0; i < n; ++i) {
          if (!panel_at(i)) y[i * ldy + r] = dot(row, act_of(i), cols);
        }
      }
      return;
    }
    if (tile_rp != nullptr) {
      tile_rp(base + static_cast<size_t>(begin) * stride, stride, end - begin, acts, act_bytes, n, cols,
              y + begin, ldy, orders);
      return;
    }
    if (rows_few != nullptr) {
      // A few vectors, all in the gemv order (an expert's rows in a batched decode step; 2-3 streams): one
      // pass over the rows that unpacks each weight block once for all of them, same bits as rows_gemv.
      rows_few(base + static_cast<size_t>(begin) * stride, stride, end - begin, acts, act_bytes, n, cols,
               y + begin, ldy);
      return;
    }
    if (repacked && rows_gemv != nullptr) {
      // A few vectors, some in the gemm order: the matvec kernel per gemv vector, over sub-chunks that stay in
      // L2 while the vectors take their turns, so the weights come from memory once. It gives the one-row gemv
      // kernel's bits (both are dot_q4_K_q8_K_gemv_ref's) and is faster.
      const int64_t sub = detail::whole_groups(
          static_cast<int64_t>(detail::kChunkBytes / std::max<size_t>(1, stride)), k.gemv_group[slot(w.type)]);
      for (int64_t r0 = begin; r0 < end; r0 += sub) {
        const int64_t r1 = std::min(end, r0 + sub);
        for (int64_t i = 0; i < n; ++i) {
          if (gemm_at(i)) {
            for (int64_t r = r0; r < r1; ++r) {
              y[i * ldy + r] = dot_gemm(base + static_cast<size_t>(r) * stride, act_of(i), cols);
            }
          } else {
            rows_gemv(base + static_cast<size_t>(r0) * stride, stride, r1 - r0, act_of(i), cols,
                      y + i * ldy + r0);
          }
        }
      }
      return;
    }
    if (repacked) {
      for (int64_t t0 = 0; t0 < n; t0 += kVectorTile) {
        const int64_t t1 = std::min(n, t0 + kVectorTile);
        for (int64_t r = begin; r < end; ++r) {
          const uint8_t* row = base + static_cast<size_t>(r) * stride;
          for (int64_t i = t0; i < t1; ++i) {
            y[i * ldy + r] = (gemm_at(i) ? dot_gemm : dot_gemv)(row, act_of(i), cols);
          }
        }
      }
      return;
    }
    if (tile != nullptr) {
      tile(base + static_cast<size_t>(begin) * stride, stride, end - begin, acts, act_bytes, n, cols, y + begin, ldy);
      return;
    }
    if (plain_few != nullptr) {
      plain_few(base + static_cast<size_t>(begin) * stride, stride, end - begin, acts, act_bytes, n, cols,
                y + begin, ldy);
      return;
    }
    for (int64_t t0 = 0; t0 < n; t0 += kVectorTile) {
      const int64_t t1 = std::min(n, t0 + kVectorTile);
      for (int64_t r = begin; r < end; ++r) {
        const uint8_t* row = base + static_cast<size_t>(r) * stride;
        for (int64_t i = t0; i < t1; ++i) y[i * ldy + r] = dot(row, act_of(i), cols);
      }
    }
  };
  if (!threaded) {
    rows(0, w.rows);
    return;
  }
  // A chunk is re-read once per group of vectors and should stay in L2; it is also the span over which a
  // tile kernel's per-group setup is shared, so not too small, and at least kMinMatmulChunks per product.
  int64_t grain =
      std::max<int64_t>(1, std::min(static_cast<int64_t>(detail::kChunkBytes / std::max<size_t>(1, stride)),
                                    w.rows / kMinMatmulChunks));
  // The repacked tiles interleave rows by kRepackedRowGroup, and some gemv kernels by DotKernels::gemv_group:
  // chunks of whole groups leave no padded group but the last.
  if (repacked) {
    grain = detail::whole_groups(grain, tile_rp != nullptr || w.interleaved ? detail::kRepackedRowGroup
                                                                             : k.gemv_group[slot(w.type)]);
  }
  // A tile that packs its chunk's rows (DotKernels::tile_group) reads their weights once per call, whatever the
  // vector count, but repeats its per-vector setup per call: its chunks are sized for balance alone (at least
  // kMinMatmulChunks per product and four per thread), in whole groups.
  const int64_t group = tile != nullptr ? k.tile_group[slot(w.type)] : 0;
  if (group > 0) {
    const int64_t chunks = std::max<int64_t>(kMinMatmulChunks, 4 * static_cast<int64_t>(pool->size()));
    grain = std::max<int64_t>(group, w.rows / chunks / group * group);
  }
  if (n <= kVectorTile) {
    // A few vectors (a batched decode step): memory-bound like matvec, so each thread streams its own
    // contiguous share of the rows (the schedule matvec uses) rather than chunks dealt from one cursor.
    pool->parallel_for_shares(w.rows, grain, 0, rows);
    return;
  }
  pool->parallel_for(w.rows, grain, 0, rows);
}
}  // namespace

void matmul(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy, ThreadPool* pool) {
  matmul_impl(w, x, n, ldx, y, ldy, nullptr, nullptr, pool);
}

void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, ThreadPool* pool) {
  CAR_CHECK(gemm != nullptr);
  matmul_impl(w, x, n, ldx, y, ldy, gemm, nullptr, pool);
}

void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, const uint8_t* panel, ThreadPool* pool) {
  CAR_CHECK(gemm != nullptr && panel != nullptr);
  matmul_impl(w, x, n, ldx, y, ldy, gemm, panel, pool);
}

bool iq_panel_product(const MatrixView& w) { return detail::iq_panel(w); }

float dot_row_panel(GgmlType w, const void* w_row, const void* act, int64_t n) {
  CAR_CHECK(detail::iq_panel_type(w));
  return detail::dot_iq_panel_ref(w, w_row, act, n);
}

}  // namespace car::tensor
