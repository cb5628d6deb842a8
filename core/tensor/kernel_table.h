// Internal to core/tensor: the per-ISA function tables behind kernels.h, and the scalar reference kernels.
//
// One DotKernels table per instruction set (scalar, AVX2+FMA, AVX-512). kernels.cpp picks one at start-up
// (set_isa) and every product goes through it, so ISA choice is a pointer, not #ifdefs. The AVX-512 table
// starts as a copy of the AVX2 one and overrides the entries it has its own kernels for; a null entry means
// the type has no dot product at all (can_compute() is false).
//
// A dot kernel computes dot(weight row, activation row) for `n` elements (a multiple of the weight block
// size), where the activation row was already rounded to the weight type's partner (act_type()). The scalar
// versions follow ggml's generic C kernels operation for operation (integer sums per block, then scaled,
// in the same float order), which is what llama.cpp's results are compared against.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/tensor/kernels.h"

namespace car::tensor::detail {

inline constexpr int kTypeSlots = 40;  ///< ggml type ids are < 40

using DotFn = float (*)(const void* w, const void* a, int64_t n);
using ConvertFn = void (*)(const float* x, void* dst, int64_t n);
/// Many rows against one activation row (matvec's inner loop): y[r] = dot(row r, act) for r in [0, nrows),
/// rows `row_bytes` apart. Kernels may interleave rows and prefetch, but each y[r] must equal, bit for bit,
/// what the table's dot kernel returns for that row.
using RowsFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                        float* y);
/// A tile of matmul: y[i * ldy + r] = dot(row r, activation i) for r in [0, nrows), i in [0, nvec);
/// activation i starts at acts + i * act_bytes. Kernels block rows x vectors in registers so each weight
/// block is loaded and unpacked once per group of vectors; each result must equal the dot kernel's bit for
/// bit.
using TileFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy);

/// A tile of a repacked product (see repacked()): as TileFn, vector i in the gemm order when gemm[i] != 0 and
/// in the gemv order otherwise (gemm null: every vector gemv); each result equals dot_gemm / dot_gemv bit for
/// bit. One call serves a mixed batch, so a kernel can share its per-row work across both orders.
using RepackedTileFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                const uint8_t* gemm);

/// llama.cpp's IQ panel order (iq_panel.h) over rows x vectors: y[i * ldy + r] = dot_iq_panel_ref(row r,
/// activation i) for r in [0, nrows) and every i in [0, nvec) with mask null or mask[i] != 0 (the others are
/// left alone); activation i (Q8_K) starts at acts + i * act_bytes.
using PanelFn = void (*)(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                         size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy);

/// tensor::swiglu (kernels.h).
using GluFn = void (*)(const float* gate, const float* up, float* out, int64_t n);

/// attend_head (kernels.h); `sink` is the head's attention sink logit or kNoSink.
using AttendFn = void (*)(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                          int64_t dv, float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink);

/// attend_group (kernels.h) for the shapes a table's group kernel takes; false (nothing written): attend per
/// head.
using AttendGroupFn = bool (*)(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv,
                               int64_t dk, int64_t dv, float scale, float* out, const float* sinks);

struct DotKernels {
  DotFn dot[kTypeSlots] = {};               ///< indexed by weight type id; ProductOrder::mul_mat
  DotFn dot_id[kTypeSlots] = {};            ///< the same products in ProductOrder::mul_mat_id summation order
  /// ProductOrder::sgemm (llamafile's tinyBLAS), set only where it differs from `dot` (IQ4_NL); null: `dot`.
  DotFn dot_sgemm[kTypeSlots] = {};
  ConvertFn quantize_act[kTypeSlots] = {};  ///< indexed by *activation* type id (Q8_0, Q8_1, Q8_K, F16, BF16)
  /// Optional multi-row / tile kernels by weight type (null: matvec / matmul loop over dot). They compute the
  /// mul_mat order; kernels.cpp uses them for mul_mat_id only where dot_id equals dot (the quantized types).
  RowsFn rows[kTypeSlots] = {};
  TileFn tile[kTypeSlots] = {};
  /// A few vectors (2 to the tile's minimum: batched decode's rows of one MoE expert) in one pass over the
  /// rows, each weight block unpacked once for all of them (TileFn's arguments; each result equals `dot`'s
  /// bit for bit). Null: the loop over `dot`, one vector at a time.
  TileFn rows_few[kTypeSlots] = {};
  /// Rows a tile packs together (the VNNI tiles: a row per int32 lane), or 0. Such a tile reads each weight
  /// once per call and redoes its per-vector setup per call, so matmul hands it large chunks of whole groups.
  int16_t tile_group[kTypeSlots] = {};
  /// The products of matrices llama.cpp's x86 CPU backend repacks (see repacked()), in the order of its
  /// repacked kernels (ggml-cpu repack.cpp): `gemv` for a single vector (decode, every MoE expert row) and
  /// for the vectors of a batch past its last whole group of 4, `gemm` for those groups. Null for other
  /// types.
  DotFn dot_gemv[kTypeSlots] = {};
  DotFn dot_gemm[kTypeSlots] = {};
  /// Multi-row kernel in the gemv order (null: loop over dot_gemv).
  RowsFn rows_gemv[kTypeSlots] = {};
  /// Rows rows_gemv interleaves (matmul_nl32_vnni.cpp: kRepackedRowGroup, a row per int32 lane), or 0 for a
  /// kernel that takes its rows one at a time (Q4_K). Products hand a kernel with a group whole groups but for
  /// the matrix's last; the others get chunks of plain kChunkBytes (rounding them down cost Q4_K decode up to
  /// a fifth more calls, each preparing its activations again: issue #29).
  int16_t gemv_group[kTypeSlots] = {};
  /// A few vectors (2-3: batched decode's rows of one MoE expert, or 2-3 dense streams) in the gemv order in
  /// one pass over the rows, sharing each weight block's unpacking (TileFn's arguments; each result equals
  /// rows_gemv's bit for bit). Null: rows_gemv per vector.
  TileFn rows_gemv_few[kTypeSlots] = {};
  /// matmul tile in either order (null: loop over dot_gemm / dot_gemv). AVX-512: matmul_q4k_vnni.cpp (Q4_K),
  /// matmul_q2k_vnni.cpp (Q2_K) and matmul_nl32_vnni.cpp (Q4_0, IQ4_NL, MXFP4), which transpose the chunk's
  /// rows per call; matmul hands them chunks of whole groups of 16 rows. The AMX and AVX-VNNI tables (amx.h,
  /// avx_vnni.h) put their own Q4_K (AVX-VNNI: and Q2_K) tiles here.
  RepackedTileFn tile_repacked[kTypeSlots] = {};
  /// Per type, matrices held interleaved (MatrixView::interleaved, kernels.h): `interleave` writes that
  /// layout (interleave_rows), the others multiply it - one vector, a few, and a tile - with the bits of the
  /// kernels above in the matrix's order: Q4_K (repacked: the gemv order for one vector and a few, the tile
  /// in either order; matmul_q4k_vnni.cpp) and Q6_K (dot_q6_K's one order; matmul_q6k_vnni.cpp). Set in the
  /// AVX-512 table only; where a type's are null none of its matrices is interleaved (can_interleave), and a
  /// product that meets one anyway (the ISA changed after the load) runs on a de-interleaved copy.
  struct Interleaved {
    void (*interleave)(const uint8_t* w, size_t row_bytes, int64_t nrows, int64_t n, uint8_t* dst) = nullptr;
    RowsFn rows = nullptr;
    TileFn rows_few = nullptr;
    RepackedTileFn tile = nullptr;
    bool usable() const {
      return interleave != nullptr && rows != nullptr && rows_few != nullptr && tile != nullptr;
    }
  };
  Interleaved interleaved[kTypeSlots];
  /// The IQ panel kernel (iq_panel.h), one for every panel type; every table computes the panel order.
  PanelFn iq_panel = nullptr;
  /// One attention head over the fp16 KV cache (attend_head_scalar's arithmetic in every table).
  AttendFn attend = nullptr;
  /// The heads of one KV group together (attend_head's bits per head); null, or false for a shape: attend
  /// per head.
  AttendGroupFn attend_group = nullptr;
  /// SwiGLU in llama.cpp's AVX-512 arithmetic (silu.h: swiglu_scalar's bits in every table).
  GluFn swiglu = nullptr;
};

/// The AVX2 attention head (attention_avx2.cpp), bit-identical to attend_head_scalar.
void attend_head_avx2(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                      float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink);
/// The AVX-512 group of attention heads (attention_avx512.cpp): attend_head_avx512's bits per head, for dk a
/// multiple of 64 up to 256 and dv 64 or 128 (false for other shapes).
bool attend_group_avx512(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv,
                         int64_t dk, int64_t dv, float scale, float* out, const float* sinks);
/// The AVX-512 attention head (attention_avx512.cpp), bit-identical to attend_head_scalar.
void attend_head_avx512(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                        int64_t dv, float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink);

/// Does llama.cpp's CPU backend (x86, AVX2 or better) hold this matrix repacked (ggml-cpu repack.cpp,
/// ggml_repack_get_optimal_repack_type)? Q4_K weights whose row count is a multiple of 8 become
/// block_q4_Kx8 and are multiplied by ggml_gemv / ggml_gemm_q4_K_8x8_q8_K, which sum each output in another
/// order than ggml_vec_dot_q4_K_q8_K: one exact integer per super-block (gemv) or per 64 elements (gemm),
/// each times the scale product and added by FMA, the mins likewise, subtracted at the end. Q2_K weights
/// with a row count that is a multiple of 8 are repacked too where the backend has AVX-512 (block_q2_Kx8,
/// ggml_gemv / ggml_gemm_q2_K_8x8_q8_K: the same two chains, per super-block / per 128 elements; issue #27):
/// this project follows that build, the one its goldens come from (an AVX2-only llama.cpp sums Q2_K in
/// ggml_vec_dot_q2_K_q8_K's order instead). Q4_0, IQ4_NL and MXFP4 weights with a row count that is a multiple
/// of 8 become block_q4_0x8 / block_iq4_nlx8 / block_mxfp4x8, multiplied by one template of gemv and gemm
/// whose two orders are the same: one exact integer per 32-element block, times the product of the scales by
/// FMA, in block order (dot_*_repacked_ref). It is a property of the product, not of our ISA: every table
/// computes these products in the same order. A view in the sgemm order is by definition one llama.cpp did
/// not repack (ProductOrder::sgemm).
inline bool repacked(const MatrixView& w) {
  if (w.order == ProductOrder::sgemm) return false;
  switch (w.type) {
    case GgmlType::Q4_K:
    case GgmlType::Q2_K:
    case GgmlType::Q4_0:
    case GgmlType::IQ4_NL:
    case GgmlType::MXFP4:
      return w.rows % 8 == 0;
    default:
      return false;
  }
}
/// Vectors [0, gemm_vectors(n)) of an n-vector batch of a repacked mul_mat product use the gemm order, the
/// rest the gemv order (llama.cpp runs gemm on whole groups of 4 rows of src1 and gemv on the remainder).
inline int64_t gemm_vectors(int64_t n) {
  return n - n % 4;
}

/// Block geometry for the types this module knows (block elements, bytes); {0, 0} for others.
struct BlockGeometry {
  int64_t block_size = 0;
  int64_t block_bytes = 0;
};
BlockGeometry geometry(GgmlType t);
/// Bytes of a row of n elements of type t (n a multiple of the block size).
inline size_t row_bytes(GgmlType t, int64_t n) {
  const BlockGeometry g = geometry(t);
  return static_cast<size_t>(n / g.block_size * g.block_bytes);
}

/// The type an activation row is rounded to before a product with weights of type w.
GgmlType act_type(GgmlType w);

const DotKernels& scalar_kernels();
/// nullptr when the build has no such kernels (never on x86-64 builds of this project).
const DotKernels* avx2_kernels();
const DotKernels* avx512_kernels();
/// The kernel for a weight type in the given order.
inline DotFn dot_for(const DotKernels& k, GgmlType t, ProductOrder order) {
  const int s = static_cast<int>(t);
  if (order == ProductOrder::sgemm && k.dot_sgemm[s] != nullptr) return k.dot_sgemm[s];
  return order == ProductOrder::mul_mat_id ? k.dot_id[s] : k.dot[s];
}
/// Does the product's order leave the table's multi-row / tile kernels (which compute `dot`) unusable?
inline bool order_differs(const DotKernels& k, GgmlType t, ProductOrder order) {
  const int s = static_cast<int>(t);
  return (order == ProductOrder::mul_mat_id && k.dot_id[s] != k.dot[s]) ||
         (order == ProductOrder::sgemm && k.dot_sgemm[s] != nullptr);
}

/// The multi-row / tile kernels for a product, or null when the product must loop over dot_for().
inline RowsFn rows_for(const DotKernels& k, GgmlType t, ProductOrder order) {
  return order_differs(k, t, order) ? nullptr : k.rows[static_cast<int>(t)];
}
inline TileFn tile_for(const DotKernels& k, GgmlType t, ProductOrder order) {
  return order_differs(k, t, order) ? nullptr : k.tile[static_cast<int>(t)];
}
inline TileFn rows_few_for(const DotKernels& k, GgmlType t, ProductOrder order) {
  return order_differs(k, t, order) ? nullptr : k.rows_few[static_cast<int>(t)];
}

/// Products with fewer weight bytes than this (all vectors counted) run on the calling thread: a fork-join
/// would cost more than it saves.
inline constexpr size_t kMinParallelBytes = 96 * 1024;
/// The unit of work of matvec and matmul: rows of about this many weight bytes (matvec: ThreadPool::
/// parallel_for_shares hands each thread a contiguous share of such chunks; matmul: one task sweeps one chunk
/// with every vector, at most this many bytes).
inline constexpr size_t kChunkBytes = 64 * 1024;
/// Rows a repacked tile or gemv kernel interleaves (one per int32 lane of a 512-bit register): products
/// hand repacked matrices to their kernels in whole groups of this many rows, but for the matrix's last.
inline constexpr int64_t kRepackedRowGroup = 16;
/// `rows` rounded down to whole groups of `group` rows (at least one group); `rows` itself when group <= 1.
inline int64_t whole_groups(int64_t rows, int64_t group) {
  return group <= 1 ? std::max<int64_t>(1, rows) : std::max(group, rows / group * group);
}

/// The calling thread's grow-only, 64-byte aligned scratch for rounded activations (matvec_fused, matmul;
/// never both at once on one thread). Allocates only when it grows; valid until the next call.
uint8_t* act_scratch(size_t bytes);

/// Abort (CAR_CHECK) unless `w` is a product k can compute: a known type with a dot kernel, whole blocks per
/// row, row_bytes large enough, data present.
void check_view(const MatrixView& w, const DotKernels& k);

/// The table for an ISA (scalar for Isa::scalar); does not check that the CPU supports it.
const DotKernels& kernels_for(Isa isa);
/// The table set_isa() selected (detect_isa()'s by default).
const DotKernels& active_kernels();
/// An interleaved view's rows in the file's layout in `buf` (the products of a table without the interleaved
/// kernels: slow, but the same bits).
MatrixView plain_copy(const MatrixView& w, std::vector<uint8_t>& buf);
/// matvec's rows [begin, end) of w against a rounded input (fused.cpp; matvec_fused's kernels), and the rows
/// of its chunks (whole row groups where its kernel interleaves rows).
void matvec_rows(const DotKernels& k, const MatrixView& w, const void* act, float* y, int64_t begin,
                 int64_t end);
int64_t matvec_chunk_rows(const DotKernels& k, const MatrixView& w);

// ---- scalar references (ref_quantize.cpp, ref_dequantize.cpp, ref_dot.cpp) ----

// Activation rounding, as llama.cpp's x86 CPU backend does it.
void quantize_act_q8_0(const float* x, void* dst, int64_t n);  ///< RNE(x * 127/amax), fp16 scale amax/127
void quantize_act_q8_1(const float* x, void* dst, int64_t n);  ///< as Q8_0 plus s = fp16(d * sum q)
void quantize_act_q8_K(const float* x, void* dst, int64_t n);  ///< ggml's quantize_row_q8_K_ref
void convert_act_f16(const float* x, void* dst, int64_t n);
void convert_act_bf16(const float* x, void* dst, int64_t n);

/// Weight quantizers (round to nearest, for writing synthetic models). false when the type has none.
bool quantize_weights_ref(GgmlType t, const float* x, void* dst, int64_t n);
/// Dequantize; false when the type has no dequantizer.
bool dequantize_ref(GgmlType t, const void* src, float* dst, int64_t n);

float dot_f32_ref(const void* w, const void* a, int64_t n);
float dot_f16_ref(const void* w, const void* a, int64_t n);
float dot_bf16_ref(const void* w, const void* a, int64_t n);
float dot_q4_0_q8_0_ref(const void* w, const void* a, int64_t n);
float dot_q4_1_q8_1_ref(const void* w, const void* a, int64_t n);
float dot_q5_0_q8_0_ref(const void* w, const void* a, int64_t n);
float dot_q5_1_q8_1_ref(const void* w, const void* a, int64_t n);
float dot_q8_0_q8_0_ref(const void* w, const void* a, int64_t n);
float dot_q2_K_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_q3_K_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_q4_K_q8_K_ref(const void* w, const void* a, int64_t n);
/// Q4_K in llama.cpp's repacked orders (see repacked()): per super-block acc = fma(float(isum), d * y.d,
/// acc), acc_m = fma(float(imin), dmin * y.d, acc_m), result acc - acc_m (gemv); the same per 64-element
/// group of the super-block (gemm).
float dot_q4_K_q8_K_gemv_ref(const void* w, const void* a, int64_t n);
float dot_q4_K_q8_K_gemm_ref(const void* w, const void* a, int64_t n);
/// Q2_K in llama.cpp's repacked orders (x86 with AVX-512: block_q2_Kx8, ggml_gemv / ggml_gemm_q2_K_8x8_q8_K):
/// per super-block acc = fma(float(isum), d * y.d, acc), acc_m = fma(float(imin), dmin * y.d, acc_m), result
/// acc - acc_m (gemv); the same per 128-element half of the super-block (gemm). isum: sum of scale * level *
/// q8, imin: sum of min * bsum, both exact.
float dot_q2_K_q8_K_gemv_ref(const void* w, const void* a, int64_t n);
float dot_q2_K_q8_K_gemm_ref(const void* w, const void* a, int64_t n);
float dot_q5_K_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_q6_K_q8_K_ref(const void* w, const void* a, int64_t n);
/// Q6_K in ggml's x86 (AVX2) ggml_vec_dot_q6_K_q8_K order, which the AVX2 / AVX-512 kernels reproduce: per
/// super-block 8 int32 lanes (lane l: elements 4l..4l+3 of every 32-element chunk, sum of scale * level * y,
/// levels 0..63) minus the offset 32 * (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]); acc[l] = fma(y.d * d,
/// float(lane), acc[l]); the 8 accumulators summed as hsum_float_8 does.
float dot_q6_K_q8_K_x86_ref(const void* w, const void* a, int64_t n);

// The 4-bit table formats (ref_iq4.cpp), in ggml's x86 order (see there).
/// Dequantize / quantize nb blocks of IQ4_NL, IQ4_XS or MXFP4; false for any other type.
bool dequantize_iq4_ref(GgmlType t, const void* src, float* dst, int64_t nb);
bool quantize_iq4_ref(GgmlType t, const float* x, void* dst, int64_t nb);
float dot_iq4_nl_q8_0_ref(const void* w, const void* a, int64_t n);
float dot_mxfp4_q8_0_ref(const void* w, const void* a, int64_t n);
/// Q4_0, IQ4_NL and MXFP4 in llama.cpp's repacked order (repacked(); the gemv and gemm orders are one order).
float dot_q4_0_q8_0_repacked_ref(const void* w, const void* a, int64_t n);
float dot_iq4_nl_q8_0_repacked_ref(const void* w, const void* a, int64_t n);
float dot_iq4_nl_q8_0_sgemm_ref(const void* w, const void* a, int64_t n);  ///< ProductOrder::sgemm
float dot_mxfp4_q8_0_repacked_ref(const void* w, const void* a, int64_t n);
float dot_iq4_xs_q8_K_ref(const void* w, const void* a, int64_t n);
// The codebook formats IQ2_XXS, IQ1_S (ref_iq2.cpp; a plain quantizer for IQ2_XXS only).
bool dequantize_iq2_xxs_ref(const void* src, float* dst, int64_t nb);
void quantize_iq2_xxs_ref(const float* x, void* dst, int64_t nb);
float dot_iq2_xxs_q8_K_ref(const void* w, const void* a, int64_t n);
bool dequantize_iq1_s_ref(const void* src, float* dst, int64_t nb);
float dot_iq1_s_q8_K_ref(const void* w, const void* a, int64_t n);
// The second slice of codebook formats, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M (ref_iq3.cpp: dequantizers and
// dots in ggml's x86 order; quantize_codebook.cpp: the quantizers). false for any other type.
bool dequantize_codebook_ref(GgmlType t, const void* src, float* dst, int64_t nb);
bool quantize_codebook_ref(GgmlType t, const float* x, void* dst, int64_t nb);  ///< also IQ1_S
float dot_iq3_xxs_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_iq3_s_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_iq2_xs_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_iq2_s_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_iq1_m_q8_K_ref(const void* w, const void* a, int64_t n);
// The ternary formats TQ1_0, TQ2_0 (ref_tq.cpp): dequantizer, quantizer, dots in ggml's x86 order; false for
// any other type.
bool dequantize_tq_ref(GgmlType t, const void* src, float* dst, int64_t nb);
bool quantize_tq_ref(GgmlType t, const float* x, void* dst, int64_t nb);
float dot_tq1_0_q8_K_ref(const void* w, const void* a, int64_t n);
float dot_tq2_0_q8_K_ref(const void* w, const void* a, int64_t n);

inline int slot(GgmlType t) {
  return static_cast<int>(t);
}

}  // namespace car::tensor::detail
