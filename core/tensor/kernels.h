// Quantized tensor kernels: the arithmetic core. Row conversion (dequantize / quantize) and the matrix
// products the forward pass runs, over weights in any GGUF block format, computed in place from the bytes
// of the mmapped file.
//
// Numerics follow llama.cpp's CPU backend so that logits match it to ~1e-5: the input vector of every
// product is first rounded to the weight type's dot-product partner (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, IQ4_NL,
// MXFP4: Q8_0 blocks of 32; K-quants, IQ4_XS and the codebook types IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ1_S, IQ1_M, and the ternary TQ1_0, TQ2_0: Q8_K blocks of 256; F16: fp16; BF16: bf16;
// F32: unrounded), then multiplied.
//
// Every function has a scalar reference, always compiled (the test oracle), and SIMD variants (AVX2+FMA,
// AVX-512) picked once at start-up from CPUID, overridable with CAR_INFERENCE_ISA=scalar|avx2|avx512: the
// settings row in config/settings.cpp reads it for car-inferenced (daemon/main.cpp) and for `car run` /
// `car bench` (tools/offline_env.h), which pass it to set_isa(); core reads no environment itself.
//
// Thread safety: all functions are reentrant; matvec/matmul split rows over the given pool and allocate
// nothing in the hot path beyond the caller-provided / thread-local scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>

#include "core/gguf/ggml_type.h"

namespace car {
class ThreadPool;
}

namespace car::tensor {

enum class Isa { scalar, avx2, avx512 };
/// The best ISA this CPU supports.
Isa detect_isa();
/// Select the kernels used from now on (clamped to what the CPU supports). Not thread-safe: call at start-up.
void set_isa(Isa isa);
Isa current_isa();
std::string_view isa_name(Isa isa);
/// Parse "scalar" | "avx2" | "avx512"; false when unknown.
bool parse_isa(std::string_view s, Isa* out);

/// Can dequantize_row / matvec handle this weight type?
bool can_compute(GgmlType type);
/// Can quantize_row produce this type (for synthetic models)?
bool can_quantize(GgmlType type);

/// Dequantize `n` elements (a multiple of the block size) from `src` to `dst`.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);
/// Quantize `n` elements (round-to-nearest as ggml's reference quantizers do) into `dst`
/// (ggml_row_bytes(type, n) bytes).
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

/// Which of llama.cpp's matrix-product paths a product mirrors.
///  - mul_mat / mul_mat_id: only the float weight formats (F32, F16, BF16) sum differently on the two: ggml's
///    mul_mat (dense weights) runs llamafile's tinyBLAS (one 16-lane accumulator), mul_mat_id (MoE experts)
///    runs ggml_vec_dot_* (four accumulators). For the quantized formats both compute the same thing. Scalar
///    and AVX2 kernels have one float order only.
///  - sgemm: a quantized product that ggml's mul_mat hands to llamafile's tinyBLAS_Q0_AVX - a weight it does
///    not repack, times a batch of 2 or more vectors rounded to Q8_0. It sums like ggml_vec_dot_*_q8_0 for
///    Q8_0, Q4_0 and Q5_0, but not for IQ4_NL, whose vec_dot takes the blocks in pairs into two accumulators
///    (tinyBLAS: one). Callers that know a row's batch set it (ForwardPass: deepseek2's per-head attn_k_b /
///    attn_v_b products of a prompt's rows); for every other type it is mul_mat.
enum class ProductOrder { mul_mat, mul_mat_id, sgemm };

/// A 2-D weight matrix in a GGUF tensor: `rows` rows of `cols` elements, each row `row_bytes` bytes.
/// Non-owning: `data` points into the mapped file (or any buffer that outlives the call).
struct MatrixView {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t cols = 0;  ///< row length (ne[0])
  int64_t rows = 0;  ///< ne[1]
  size_t row_bytes = 0;
  ProductOrder order = ProductOrder::mul_mat;  ///< mul_mat_id for MoE expert matrices (see ProductOrder)
  /// The rows are held interleaved 16 at a time (interleave_rows), not as the file lays them out.
  bool interleaved = false;
};

/// The interleaved layout of a Q4_K matrix (issue #29). Each group of 16 rows keeps its 16 * row_bytes bytes,
/// super-block by super-block: for super-block i, 2048 bytes of quants, dword k of 64-element group g of all
/// 16 rows side by side ([g][k][row], the order in which a vpdpbusd with one row per int32 lane consumes
/// them), then the 16 rows' 16-byte block headers (d, dmin, the 12 scale bytes) transposed a dword per row
/// ([dword j][row]). A product over it needs no per-call transposition of the rows: decode's one-vector
/// kernel takes ~17 instructions per row and super-block where the file's layout needs ~36, and a batched
/// step's tile skips its pack. Each result is bit for bit the file layout's (llama.cpp's repacked orders).
/// Only products use the layout; a view of an interleaved matrix cannot be cut at a row that is not a
/// multiple of 16, and its rows are not rows of the file (dequantize a row through deinterleave_rows).
///
/// Q6_K has an interleaved layout too (issue #25; core/tensor/q6k_interleaved.h): per super-block the 16
/// rows' levels a register per (32-element chunk, int32 lane of the dot order), then their scales and d, in
/// the 16 rows' 3360 file bytes. Its kernels unpack each row's levels once per call for every vector (the
/// file layout's one-row kernel, once per row and call at ~2.8x the instructions), which is where a batched
/// decode step's MoE expert downs and output matrix spent their time. Each result is dot_q6_K's bits.
///
/// Can `w` be interleaved under the current kernels: Q4_K in a repacked order (kernel_table.h repacked()) or
/// Q6_K in its one dot order, rows a whole number of 16-row groups, row_bytes the row's size, and a kernel
/// table with the type's interleaved products (AVX-512; under AMX, Q6_K only; elsewhere every matrix stays as
/// the file has it).
bool can_interleave(const MatrixView& w);
/// Turn interleaving off (can_interleave false for every matrix from now on) or back on, process-wide: for
/// comparing the two layouts (tests, benchmarks). On by default. Matrices already interleaved stay so.
void set_interleave_enabled(bool on);
/// Write w's rows (can_interleave(w)) interleaved into dst (w.rows * w.row_bytes bytes, 64-byte aligned; not
/// overlapping w) and return the view of dst: w with data = dst and interleaved set. Groups of rows are split
/// over `pool` (may be null).
MatrixView interleave_rows(const MatrixView& w, uint8_t* dst, ThreadPool* pool = nullptr);
/// The inverse: an interleaved view's rows in the file's layout into dst (w.rows * w.row_bytes bytes).
void deinterleave_rows(const MatrixView& w, uint8_t* dst);
/// Interleave every matrix of `views` that can take the layout (can_interleave) into one new block of memory,
/// each view replaced by its copy's; returns the block (null when none could). The block is whole 2 MiB pages
/// with transparent huge pages advised: the copy faults a 512th as often and a product's stream crosses a
/// 512th as many TLB entries. `release_source`: the originals lie in a read-only file mapping, whose pages
/// wholly inside an interleaved matrix are dropped from the process afterwards (read from the file again if
/// touched) so the weights are not held twice - never set it for memory that is not such a mapping. The
/// copies' groups of rows are split over a temporary pool of `threads` participants (< 1: the machine's
/// hardware threads), made only when there is something to copy.
std::shared_ptr<uint8_t> interleave_all(std::span<MatrixView* const> views, bool release_source, int threads = 1);

/// y[r] = dot(W[r, :], round(x)) for r in [0, rows). x has w.cols floats, y has w.rows floats.
/// `pool` may be null (run on the calling thread).
void matvec(const MatrixView& w, const float* x, float* y, ThreadPool* pool);

/// One product of a fused group: y (w.rows floats) = W round(x) (x: w.cols floats), as matvec(w, x, y)
/// computes it. `y` must not overlap any task's x or another task's y.
struct MatvecTask {
  MatrixView w;
  const float* x = nullptr;
  float* y = nullptr;
};

/// Run `n` matvec products as one fork-join on `pool` (null: the calling thread): every distinct input vector
/// is rounded once per activation type (tasks sharing x, such as Q/K/V or gate/up, share the rounding), then
/// the rows of all matrices, in chunks, are split across the threads in contiguous shares
/// (ThreadPool::parallel_for_shares). matvec is this with one task; each y[r] equals the table's dot kernel
/// on row r bit for bit, whatever the grouping: only the scheduling differs.
void matvec_fused(const MatvecTask* tasks, size_t n, ThreadPool* pool);

/// Batched product for prompt processing: for each of n vectors i, Y[i*ldy + r] = dot(W[r,:], round(X[i*ldx +
/// :])) (for a panel product of 8 or more vectors, in the panel order: iq_panel_product). Each weight block is
/// read once per tile of vectors. X is n x w.cols (row stride ldx), Y is n x
/// w.rows (row stride ldy).
void matmul(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
            ThreadPool* pool);

/// matmul with the summation order of each vector given, for a batch that holds several sequences' rows
/// (the engine's batched step): a repacked mul_mat product (detail::repacked) takes llama.cpp's gemm order
/// for vector i when gemm[i] != 0 and its gemv order otherwise, so each row is computed as it would be in
/// its own sequence's batch whatever the company. Other products ignore `gemm` (their rows never depend on
/// the batch). matmul(w, x, n, ...) is this with gemm[i] = i < detail::gemm_vectors(n).
void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, ThreadPool* pool);

/// matmul_ordered with llama.cpp's IQ panel order given per vector too: a panel product (iq_panel_product)
/// takes it for vector i when panel[i] != 0 and the dot order otherwise. matmul and the overload above give a
/// batch of 8 or more vectors the panel order (every vector) and a smaller one the dot order, as llama.cpp's
/// mul_mat does for one batch.
void matmul_ordered(const MatrixView& w, const float* x, int64_t n, int64_t ldx, float* y, int64_t ldy,
                    const uint8_t* gemm, const uint8_t* panel, ThreadPool* pool);

/// One product of a fused group: Y (n x w.rows, row stride ldy) = W round(X) (n x w.cols, row stride ldx) as
/// matmul_ordered(w, x, n, ldx, y, ldy, gemm, panel) computes it; `gemm` null takes matmul's mul_mat rule and
/// `panel` null the panel's rule (so a task with both null is matmul(w, x, n, ldx, y, ldy)); ldx / ldy 0 mean
/// w.cols / w.rows. `y` must not overlap any task's x or another task's y.
struct MatmulTask {
  MatrixView w;
  const float* x = nullptr;
  int64_t n = 0;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  const uint8_t* gemm = nullptr;
  const uint8_t* panel = nullptr;
};

/// Run `count` matmul products as one fork-join on `pool` (null: the calling thread), as matvec_fused does
/// for one vector each: every distinct input (same x, ldx, n, columns and activation type: Q/K/V, gate/up) is
/// rounded once, then the chunks of all products, in task order, are split across the threads. Each task
/// takes the kernels its own matmul would (a one-vector task matvec's), so every result equals its matmul's
/// bit for bit; only the scheduling differs. For the small products of a batched step (an MoE layer's
/// experts, a few rows each), which one fork-join per product left waiting on each other's tails.
void matmul_fused(const MatmulTask* tasks, size_t count, ThreadPool* pool);

/// Does llama.cpp multiply a batch of 8 or more vectors by this matrix in its IQ panel order (ggml-cpu iqp.cpp:
/// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and IQ4_XS mul_mat products, rows a multiple of 8)?
/// One exact integer per 256-element super-block and vector, times the super-block's scale and the
/// activation's by FMA, in super-block order (core/tensor/iq_panel.h). Every ISA computes that order.
bool iq_panel_product(const MatrixView& w);

/// Turn the panel order off (every product in the dot order) or back on, process-wide: llama.cpp's
/// GGML_NO_IQ_PANEL, for comparing against goldens made with it set. On by default.
void set_iq_panel_enabled(bool on);

/// The panel order's dot of one weight row of a panel type with a rounded (Q8_K) activation row: the scalar
/// reference the panel kernels equal bit for bit.
float dot_row_panel(GgmlType w, const void* w_row, const void* act, int64_t n);

// ---- Lower-level entry points (the pieces matvec is made of), for callers that reuse a rounded vector. ----

/// The type an input vector is rounded to for products with weights of type `w`: Q8_0 (Q4_0, Q5_0, Q8_0,
/// IQ4_NL, MXFP4), Q8_1 (Q4_1, Q5_1; Q8_0 rounding plus per-block sums, as ggml pairs them), Q8_K (K-quants,
/// IQ4_XS, the IQ codebook types, TQ1_0, TQ2_0), F16, BF16, or F32 (F32 weights: not rounded).
GgmlType activation_type(GgmlType w);
/// Bytes of a rounded activation row of `n` elements for weights of type `w`.
size_t activation_row_bytes(GgmlType w, int64_t n);
/// Round `n` floats (a multiple of the weight block size) to activation_type(w) into `dst`.
void quantize_activation(GgmlType w, const float* x, void* dst, int64_t n);
/// dot(weight row, rounded activation row) of `n` elements with the current ISA's kernel.
float dot_row(GgmlType w, const void* w_row, const void* act, int64_t n,
              ProductOrder order = ProductOrder::mul_mat);

// ---- Attention over an fp16 KV cache (the engine's attention step; see core/engine/ops.h for its order). ----

/// No attention sink (attend_head's `sink` for every architecture but gpt-oss).
inline constexpr float kNoSink = -std::numeric_limits<float>::infinity();

/// Attention of one query head over `n_kv` cached positions, with the current ISA's kernel. k: n_kv rows of
/// dk fp16 values (row stride dk), v: n_kv rows of dv fp16 values. out: dv floats. q16 (dk) and acc16 (dv)
/// are scratch. `sink` (gpt-oss's attn_sinks, one logit per head) joins the softmax's denominator without a
/// value, as ggml's flash attention applies it after the last key; kNoSink = none (and the arithmetic of a
/// head without one is unchanged).
void attend_head(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                 float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink = kNoSink);

/// attend_head for the `g` query heads of one KV group (grouped-query attention), which share `k` and `v`:
/// head j's query at q + j * dk, its output at out + j * dv, its sink sinks[j] (sinks null: none). Each
/// head's result is attend_head's bit for bit; the AVX-512 kernel reads and converts each key and value row
/// once for two heads and keeps their accumulators in registers (dk a multiple of 64 up to 256, dv 64 or
/// 128; other shapes run attend_head per head). q16 (dk) and acc16 (dv) are scratch.
void attend_group(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                  int64_t dv, float scale, float* out, const float* sinks, uint16_t* q16, uint16_t* acc16);

/// out[i] = silu(gate[i]) * up[i] for i in [0, n), silu(x) = x / (1 + exp(-x)) with llama.cpp's AVX-512 exp
/// (ggml_v_expf; silu.h), with the current ISA's kernel; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

/// The scalar version of attend_head (the scalar table's kernel and the test oracle for the SIMD one).
void attend_head_scalar(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                        int64_t dv, float scale, float* out, uint16_t* q16, uint16_t* acc16,
                        float sink = kNoSink);

/// dot(x, y) of fp16 vectors in the order of ggml's AVX-512 ggml_vec_dot_f16 (llama.cpp's Q.K product): each
/// whole chunk of 64 elements into four 16-lane float accumulators by FMA, the accumulators reduced pairwise
/// and then across lanes in _mm512_reduce_add_ps's tree order, the tail (n % 64) added in double.
float dot_f16_ggml(const uint16_t* x, const uint16_t* y, int64_t n);

}  // namespace car::tensor
