// The IQ panel's row kernel with AVX-512 VNNI (iq_panel.h): per decoded super-block, the 256 weights sit in four
// registers and their sub-block scales, spread one per 4-byte lane, in four more; each vector's integer I is
// then four vpdpbusd (activations fed as unsigned bytes y + 128), four lane products by the scales and one
// reduction, less 128 * wsum. I is exact, so the result equals dot_iq_panel_ref's bit for bit.
#include "core/tensor/iq_panel.h"
#include "core/tensor/iq_panel_rows.h"
#include "core/tensor/simd_avx512.h"  // <immintrin.h>, and GCC 12's intrinsic-header warnings off

namespace car::tensor::detail {

namespace {

struct Avx512Dot {
  struct Prepared {
    __m512i q[4];
    __m512i s[4];
    int32_t bias;
  };
  static Prepared prepare(const PanelBlock& b) {
    Prepared p;
    const __m512i scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.iscale)));
    for (int c = 0; c < 4; ++c) {
      p.q[c] = _mm512_load_si512(b.q + 64 * c);
      // Lane l of chunk c holds weights 64c + 4l .. 64c + 4l + 3: sub-block 4c + l / 4.
      const __m512i idx = _mm512_setr_epi32(4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1,
                                            4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 2, 4 * c + 3, 4 * c + 3,
                                            4 * c + 3, 4 * c + 3);
      p.s[c] = _mm512_permutexvar_epi32(idx, scales);
    }
    p.bias = 128 * b.wsum;
    return p;
  }
  static int32_t idot(const Prepared& p, const int8_t* y) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i yu = _mm512_xor_si512(_mm512_loadu_si512(y + 64 * c), flip);
      const __m512i lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), yu, p.q[c]);
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(lanes, p.s[c]));
    }
    return _mm512_reduce_add_epi32(acc) - p.bias;
  }
};

}  // namespace

void iq_panel_rows_avx512(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  iq_panel_rows_impl<Avx512Dot>(t, w, row_bytes, nrows, acts, act_bytes, nvec, mask, n, y, ldy);
}

}  // namespace car::tensor::detail
