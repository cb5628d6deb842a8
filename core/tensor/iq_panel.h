// Internal to core/tensor: llama.cpp's "IQ panel" order for batched products of the grid-based IQ types.
//
// The llama.cpp build the reference harness carries (de3ff81, ggml-cpu iqp.cpp) multiplies a batch of 8 or
// more vectors by an IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M or IQ4_XS matrix (a plain 2-D
// mul_mat; rows a multiple of 8, columns of 256) in another order than ggml_vec_dot: each super-block of a row
// is decoded to 256 integers and 16 integer scales (one per 16 weights) beside one float factor `dfac`, so that
// dfac * iscale * q is the dequantized weight bit for bit; each output then is
//
//     acc = 0;  for each super-block b:  acc = fma(float(I_b), dfac_b * y_b.d, acc)
//
// with I_b = sum over sub-blocks s of iscale_s * sum(q * y.qs) - an exact integer, so any summation order of
// the integer part gives the same bits. This file is the format of that decode (PanelBlock), its scalar
// reference and the row kernels that compute many vectors per decoded block (the scalar one in
// iq_panel.cpp, iq_panel_avx2.cpp, iq_panel_avx512.cpp). Which products take the order: kernels.h
// (matmul_ordered).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/gguf/ggml_type.h"
#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"

namespace car::tensor::detail {

/// Vectors a mul_mat batch needs for llama.cpp to take the panel (GGML_IQP_MIN_BATCH).
inline constexpr int64_t kIqPanelMinBatch = 8;
/// Weights per integer sub-block scale in the panel's decode.
inline constexpr int kIqPanelSub = 16;

/// One decoded super-block: weight j is dfac * iscale[j / 16] * q[j], exactly as the type's dequantizer
/// computes it. `wsum` = sum over sub-blocks of iscale * sum(q), for kernels that feed the activations as
/// unsigned bytes (y + 128) and subtract 128 * wsum.
struct alignas(64) PanelBlock {
  int8_t q[QK_K];
  int8_t iscale[QK_K / kIqPanelSub];
  float dfac;
  int32_t wsum;
};

/// Is `t` one of the eight types llama.cpp's panel takes?
bool iq_panel_type(GgmlType t);

/// Whether the engine takes the panel at all: set_iq_panel_enabled (kernels.h), `car bench --no-iq-panel`.
bool iq_panel_enabled();

/// Does the panel apply to this matrix when a batch has enough vectors? Plain mul_mat products only. MoE
/// expert matrices (mul_mat_id) keep the dot order although llama.cpp takes the panel for an expert with 8 or
/// more of a ubatch's rows: that count depends on how a prompt is chunked, so on its company here, and a
/// sequence's bits must not (docs/performance.md, "The engine takes the IQ panel order").
inline bool iq_panel(const MatrixView& w) {
  return iq_panel_type(w.type) && w.order == ProductOrder::mul_mat && w.rows % 8 == 0 && w.cols % QK_K == 0 &&
         iq_panel_enabled();
}

/// The calling thread's grow-only scratch for a panel kernel call: vecs (nvec), acts (act_bytes), yd (blocks)
/// and acc (acc_floats). Defined in iq_panel.cpp so that the ISA files instantiate no container themselves.
struct PanelScratch {
  int64_t* vecs;
  void* acts;
  float* yd;
  float* acc;
};
PanelScratch panel_scratch(size_t nvec, size_t act_bytes, size_t blocks, size_t acc_floats);

/// IQ1_M has no d field: its fp16 super-block scale is the top nibbles of the four scale words.
inline uint16_t iq1_m_scale_bits(const uint16_t sc[4]) {
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

/// Decode one super-block of type `t` (iq_panel_type(t)).
void iq_panel_decode(GgmlType t, const void* block, PanelBlock& out);

/// The panel order's dot of one row with one Q8_K activation row of `n` elements: the scalar reference the
/// kernels are checked against.
float dot_iq_panel_ref(GgmlType t, const void* w, const void* a, int64_t n);

/// The PanelFn kernels (kernel_table.h), each super-block of each row decoded once per call.
void iq_panel_rows_scalar(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy);
/// AVX2 (iq_panel_avx2.cpp); same bits.
void iq_panel_rows_avx2(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy);
/// AVX-512 VNNI (iq_panel_avx512.cpp); same bits.
void iq_panel_rows_avx512(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy);

}  // namespace car::tensor::detail
