// AVX-512 tile kernels for matmul (prompt processing): rows x vectors blocked in registers so each weight
// block is loaded and unpacked once per group of vectors. Each result equals the AVX-512 dot kernel's for the
// same (row, vector) bit for bit (same integer sums, same float operations in the same order), so a batched
// prompt and token-by-token decode compute identical logits.
#include <immintrin.h>

#include <algorithm>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

inline float h2f(ggml_half h) { return _cvtsh_ss(h); }

inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

/// Q8_0 x Q8_0, one weight row against kV vectors: the row's block is loaded and made unsigned (|x|) once, each
/// vector's block signed by it and multiplied with dpbusd, scaled and accumulated exactly as dot_q8_0 does.
template <int kV>
void q8_0_row_tile(const block_q8_0* x, const uint8_t* acts, size_t act_bytes, int64_t nb, float* y, int64_t ldy) {
  const block_q8_0* a[kV];
  for (int v = 0; v < kV; ++v) a[v] = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
  __m256 acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i xq = load32(x[i].qs);
    const __m256i ax = _mm256_sign_epi8(xq, xq);
    const float dx = h2f(x[i].d);
    for (int v = 0; v < kV; ++v) {
      const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, _mm256_sign_epi8(load32(a[v][i].qs), xq));
      acc[v] = _mm256_fmadd_ps(_mm256_set1_ps(dx * h2f(a[v][i].d)), _mm256_cvtepi32_ps(p), acc[v]);
    }
  }
  for (int v = 0; v < kV; ++v) y[v * ldy] = hsum8(acc[v]);
}

void tile_q8_0(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK8_0;
  constexpr int64_t kGroup = 4;  // vectors per pass over the rows: their blocks stay in L1 across the rows
  int64_t v0 = 0;
  for (; v0 + kGroup <= nvec; v0 += kGroup) {
    const uint8_t* av = acts + static_cast<size_t>(v0) * act_bytes;
    for (int64_t r = 0; r < nrows; ++r) {
      const auto* x = reinterpret_cast<const block_q8_0*>(w + static_cast<size_t>(r) * row_bytes);
      q8_0_row_tile<kGroup>(x, av, act_bytes, nb, y + v0 * ldy + r, ldy);
    }
  }
  for (; v0 < nvec; ++v0) {
    const uint8_t* av = acts + static_cast<size_t>(v0) * act_bytes;
    for (int64_t r = 0; r < nrows; ++r) {
      const auto* x = reinterpret_cast<const block_q8_0*>(w + static_cast<size_t>(r) * row_bytes);
      q8_0_row_tile<1>(x, av, act_bytes, nb, y + v0 * ldy + r, ldy);
    }
  }
}

}  // namespace

void install_tiles_avx512(DotKernels& k) { k.tile[slot(GgmlType::Q8_0)] = tile_q8_0; }

}  // namespace car::tensor::detail
