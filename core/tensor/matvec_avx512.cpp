// AVX-512 multi-row kernels for matvec (y = W x, DotKernels::rows): Q8_0 in row pairs, the nibble formats
// (Q4_0, Q5_0, Q4_1, Q5_1) in rows of four, Q4_K one row at a time with its activation side prepared once per
// call, Q6_K one row at a time with a software prefetch. Each result equals the table's dot kernel for that
// row bit for bit (the same float operations in the same order; integer sums, being exact, may be formed
// differently); tests/tensor/rows_kernel_test.cpp checks that. Reading rows side by side defeats the hardware
// prefetcher, so these kernels prefetch in software.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

/// matvec for Q8_0, two rows at a time in one 512-bit accumulator (lanes 0..7 row 0, 8..15 row 1): one row is
/// bound by its chain of dependent FMAs (one per 34-byte block, ~28 GiB/s from L2), a pair keeps two chains
/// in flight in one instruction stream (~45 GiB/s). Lane for lane the operations are dot_q8_0's in its order
/// (the sign moved onto y by a masked negation instead of vpsignb: the same products), so each result
/// equals dot_q8_0's bit for bit; the scale products are formed in all lanes at once (fp16 -> fp32 is exact,
/// so every lane equals h2f(x.d) * h2f(y.d)). Reading two rows side by side defeats the hardware prefetcher
/// (1 GiB matvec fell to 5-8 GiB/s), so the pair prefetches the next pair's bytes, one line per block (the
/// pair after a chunk's last one starts the thread's next chunk; past the matrix's end, prefetches do not
/// fault).
inline void q8_0_row_pair(const uint8_t* w, size_t row_bytes, const block_q8_0* y, int64_t nb, float* out) {
  const auto* x0 = reinterpret_cast<const block_q8_0*>(w);
  const auto* x1 = reinterpret_cast<const block_q8_0*>(w + row_bytes);
  const char* ahead = reinterpret_cast<const char*>(w) + 2 * row_bytes;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    _mm_prefetch(ahead + i * 2 * static_cast<int64_t>(sizeof(block_q8_0)), _MM_HINT_T0);
    const __m512i yq = _mm512_broadcast_i64x4(load32(y[i].qs));
    const __m512 dy = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(y[i].d)));
    const __m512i xq = load32x2(x0[i].qs, x1[i].qs);
    const __m512i ys = _mm512_mask_sub_epi8(yq, _mm512_movepi8_mask(xq), _mm512_setzero_si512(), yq);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xq), ys);
    const __m256i dx =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(x0[i].d))),
                                _mm_set1_epi16(static_cast<int16_t>(x1[i].d)), 1);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtph_ps(dx), dy), _mm512_cvtepi32_ps(p), acc);
  }
  out[0] = hsum8(_mm512_castps512_ps256(acc));
  out[1] = hsum8(_mm512_extractf32x8_ps(acc, 1));
}

void rows_q8_0(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* y) {
  const auto* a = static_cast<const block_q8_0*>(act);
  const int64_t nb = n / QK8_0;
  int64_t r = 0;
  for (; r + 2 <= nrows; r += 2)
    q8_0_row_pair(w + static_cast<size_t>(r) * row_bytes, row_bytes, a, nb, y + r);
  if (r < nrows) y[r] = dot_q8_0(w + static_cast<size_t>(r) * row_bytes, act, n);
}

/// The levels of block i of two rows of a nibble format, 128-bit lanes lo(x0), hi(x0), lo(x1), hi(x1) (each
/// row in nibbles32's order), with the 5th bits or-ed in by a byte mask for Q5_0 / Q5_1.
template <class Block, bool kHighBit>
inline __m512i pair_levels(const Block& b0, const Block& b1, __m512i pair_idx, __m512i hi_shift,
                           __m512i low4) {
  const __m512i raw = _mm512_permutex2var_epi64(
      _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0.qs))), pair_idx,
      _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b1.qs))));
  __m512i level = _mm512_and_si512(_mm512_srlv_epi64(raw, hi_shift), low4);
  if constexpr (kHighBit) {
    uint32_t h0;
    uint32_t h1;
    std::memcpy(&h0, b0.qh, 4);
    std::memcpy(&h1, b1.qh, 4);
    const __mmask64 bits = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
    level = _mm512_or_si512(level, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)));
  }
  return level;
}

/// Both rows' block scales: lanes 0..7 the first, 8..15 the second (fp16 -> fp32 is exact).
template <class Block>
inline __m512 pair_scales(const Block& b0, const Block& b1) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(b0.d))),
                              _mm_set1_epi16(static_cast<int16_t>(b1.d)), 1));
}

/// matvec for the 32-element nibble formats (Q4_0, Q5_0 with Q8_0 activations; Q4_1, Q5_1 with Q8_1), two
/// rows at a time in one 512-bit accumulator, as q8_0_row_pair (same lane layout, same prefetch of the next
/// pair's bytes, one line per block). Lane for lane the float operations are those of the table's dot kernel
/// for the type (dot_q4_0 here, the AVX2 dot_q5_0 / dot_q4_1 / dot_q5_1 inherited), in its order, with the
/// min term of Q4_1 / Q5_1 summed per row by the same scalar expression; only the exact int32 lane sums are
/// formed differently: sum (level - offset) * y is dpbusd(level, y) started from -offset * sum y (dpbusd does
/// not saturate, so the sums are the same integers). Both rows' levels are unpacked in one register
/// (pair_levels).
template <class Block, class ActBlock, int kOffset, bool kHighBit, bool kMin>
inline void nibble_row_pair(const uint8_t* w, size_t row_bytes, const ActBlock* y, int64_t nb, float* out) {
  const auto* x0 = reinterpret_cast<const Block*>(w);
  const auto* x1 = reinterpret_cast<const Block*>(w + row_bytes);
  const char* ahead = reinterpret_cast<const char*>(w) + 2 * row_bytes;
  const __m512i pair_idx = _mm512_setr_epi64(0, 1, 0, 1, 8, 9, 8, 9);
  const __m512i hi_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc = _mm512_setzero_ps();
  float summs0 = 0;
  float summs1 = 0;
  for (int64_t i = 0; i < nb; ++i) {
    _mm_prefetch(ahead + i * 2 * static_cast<int64_t>(sizeof(Block)), _MM_HINT_T0);
    if constexpr (kMin) {
      summs0 += h2f(x0[i].m) * h2f(y[i].s);
      summs1 += h2f(x1[i].m) * h2f(y[i].s);
    }
    const __m512i yq = _mm512_broadcast_i64x4(load32(y[i].qs));
    const __m512 dy = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(y[i].d)));
    __m512i p = _mm512_setzero_si512();
    if constexpr (kOffset != 0)
      p = _mm512_sub_epi32(p, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(kOffset), yq));
    p = _mm512_dpbusd_epi32(p, pair_levels<Block, kHighBit>(x0[i], x1[i], pair_idx, hi_shift, low4), yq);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(pair_scales(x0[i], x1[i]), dy), _mm512_cvtepi32_ps(p), acc);
  }
  out[0] = hsum8(_mm512_castps512_ps256(acc));
  out[1] = hsum8(_mm512_extractf32x8_ps(acc, 1));
  if constexpr (kMin) {
    out[0] = out[0] + summs0;
    out[1] = out[1] + summs1;
  }
}

/// Four rows as two pairs of nibble_row_pair (each pair's lanes the same operations), sharing the activation
/// block's work (broadcast, offset sums, scale): these formats are bound by instruction count, not by the FMA
/// chain, and four rows ran 10-15 % faster than two from L2/L3 (Q8_0's did not). Two prefetches per block,
/// half a step apart, cover the next four rows' 72+ bytes per block.
template <class Block, class ActBlock, int kOffset, bool kHighBit, bool kMin>
inline void nibble_row_quad(const uint8_t* w, size_t row_bytes, const ActBlock* y, int64_t nb, float* out) {
  const Block* x[4];
  for (int r = 0; r < 4; ++r) x[r] = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes);
  const char* ahead = reinterpret_cast<const char*>(w) + 4 * row_bytes;
  const __m512i pair_idx = _mm512_setr_epi64(0, 1, 0, 1, 8, 9, 8, 9);
  const __m512i hi_shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc01 = _mm512_setzero_ps();
  __m512 acc23 = _mm512_setzero_ps();
  float summs[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t step = 4 * static_cast<int64_t>(sizeof(Block));
    _mm_prefetch(ahead + i * step, _MM_HINT_T0);
    _mm_prefetch(ahead + i * step + step / 2, _MM_HINT_T0);
    if constexpr (kMin) {
      for (int r = 0; r < 4; ++r) summs[r] += h2f(x[r][i].m) * h2f(y[i].s);
    }
    const __m512i yq = _mm512_broadcast_i64x4(load32(y[i].qs));
    const __m512 dy = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(y[i].d)));
    __m512i off = _mm512_setzero_si512();
    if constexpr (kOffset != 0)
      off = _mm512_sub_epi32(off, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(kOffset), yq));
    const __m512i p01 = _mm512_dpbusd_epi32(
        off, pair_levels<Block, kHighBit>(x[0][i], x[1][i], pair_idx, hi_shift, low4), yq);
    const __m512i p23 = _mm512_dpbusd_epi32(
        off, pair_levels<Block, kHighBit>(x[2][i], x[3][i], pair_idx, hi_shift, low4), yq);
    acc01 = _mm512_fmadd_ps(_mm512_mul_ps(pair_scales(x[0][i], x[1][i]), dy), _mm512_cvtepi32_ps(p01), acc01);
    acc23 = _mm512_fmadd_ps(_mm512_mul_ps(pair_scales(x[2][i], x[3][i]), dy), _mm512_cvtepi32_ps(p23), acc23);
  }
  out[0] = hsum8(_mm512_castps512_ps256(acc01));
  out[1] = hsum8(_mm512_extractf32x8_ps(acc01, 1));
  out[2] = hsum8(_mm512_castps512_ps256(acc23));
  out[3] = hsum8(_mm512_extractf32x8_ps(acc23, 1));
  if constexpr (kMin) {
    for (int r = 0; r < 4; ++r) out[r] = out[r] + summs[r];
  }
}

/// RowsFn over nibble_row_quad, then nibble_row_pair; an odd last row runs as a pair of itself (rows 0 bytes
/// apart).
template <class Block, class ActBlock, int kOffset, bool kHighBit, bool kMin>
void rows_nibbles(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* y) {
  const auto* a = static_cast<const ActBlock*>(act);
  const int64_t nb = n / QK8_0;
  int64_t r = 0;
  for (; r + 4 <= nrows; r += 4)
    nibble_row_quad<Block, ActBlock, kOffset, kHighBit, kMin>(w + static_cast<size_t>(r) * row_bytes,
                                                              row_bytes, a, nb, y + r);
  for (; r + 2 <= nrows; r += 2)
    nibble_row_pair<Block, ActBlock, kOffset, kHighBit, kMin>(w + static_cast<size_t>(r) * row_bytes,
                                                              row_bytes, a, nb, y + r);
  if (r < nrows) {
    float pair[2];
    nibble_row_pair<Block, ActBlock, kOffset, kHighBit, kMin>(w + static_cast<size_t>(r) * row_bytes, 0, a,
                                                              nb, pair);
    y[r] = pair[0];
  }
}

/// unpack_scale_min_k4_words with byte shuffles: bytes 0..7 of the result are the 8 scales, 8..15 the 8 mins
/// (the same values; about a third of the instructions of the scalar word arithmetic). Reads 16 bytes from
/// `q`, the block's 12 scale bytes and the first 4 of its nibbles.
inline __m128i scale_min_k4_vec(const uint8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  // Scale / min j < 4: q[j] & 63, q[j + 4] & 63. j >= 4: the low / high nibble of q[j + 4] with bits 6..7 of
  // q[j - 4] / q[j] above it.
  const __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i hi =
      _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i low_bits =
      _mm_and_si128(_mm_mask_blend_epi8(0xf000, lo, _mm_srli_epi16(lo, 4)),
                    _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
  return _mm_or_si128(low_bits, _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30)));
}

/// The activation side of rows_q4_K for one Q8_K block, formed once per call instead of once per row: the
/// values in the 512-bit pairings dot_k4 builds with load32x2, the bsums summed in pairs (as mins_dot_bsums
/// forms them) and the scale.
struct alignas(64) Q8KPrepared {
  __m512i y[4];  ///< (qs 0..31 | 64..95), (32..63 | 96..127), then the same for qs 128..255
  __m128i bsum_pairs;
  float d;
};

thread_local std::vector<Q8KPrepared> tls_q8k_prepared;

/// How far ahead rows_q4_K prefetches its weights. With 2 threads the hardware prefetcher alone left the
/// (faster) kernel at ~60 % of the read bandwidth; 1 KiB ahead was not enough, 4-16 KiB all helped.
constexpr int64_t kQ4KPrefetchBytes = 8192;

/// matvec for Q4_K: dot_k4<false> per row with the activation side prepared once (Q8KPrepared), the scales
/// and mins unpacked with shuffles, the four products of a block in two chains, and the weights prefetched
/// kQ4KPrefetchBytes ahead (past the matrix's end too: prefetches do not fault). The integer sums are
/// the same (only their association changes, which integers do not see) and the float operations are
/// dot_k4's in its order, so each result equals dot_q4_K bit for bit. (Two rows side by side, sharing the
/// activation loads, were slower.)
template <bool kRepacked>
void rows_q4_K_impl(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                    float* out) {
  const auto* y = static_cast<const block_q8_K*>(act);
  const int64_t nb = n / QK_K;
  std::vector<Q8KPrepared>& prep = tls_q8k_prepared;
  if (prep.size() < static_cast<size_t>(nb)) prep.resize(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    const int8_t* q8 = y[i].qs;
    prep[i].y[0] = load32x2(q8, q8 + 64);
    prep[i].y[1] = load32x2(q8 + 32, q8 + 96);
    prep[i].y[2] = load32x2(q8 + 128, q8 + 192);
    prep[i].y[3] = load32x2(q8 + 160, q8 + 224);
    const __m256i b = load32(y[i].bsums);
    prep[i].bsum_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    prep[i].d = y[i].d;
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i p00 = perm_idx(kK4Perm[0][0]), p01 = perm_idx(kK4Perm[0][1]);
  const __m512i p10 = perm_idx(kK4Perm[1][0]), p11 = perm_idx(kK4Perm[1][1]);
  const __m128 sign = _mm_set1_ps(-0.0f);
  for (int64_t r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    float acc_s = 0.0f, acc_ms = 0.0f;  // kRepacked
    for (int64_t i = 0; i < nb; ++i) {
      const block_q4_K& xb = x[i];
      const Q8KPrepared& yp = prep[i];
      const char* ahead = reinterpret_cast<const char*>(&xb) + kQ4KPrefetchBytes;
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      // [y.d * h2f(x.d), y.d * h2f(x.dmin)]: d, and dmin = -y.d * h2f(x.dmin) once negated (exactly).
      uint32_t dm;
      std::memcpy(&dm, &xb.d, sizeof(dm));
      const __m128 dd = _mm_mul_ps(_mm_set1_ps(yp.d), _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm))));
      const __m128 dmin = _mm_xor_ps(_mm_permute_ps(dd, 0x55), sign);
      const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(scale_min_k4_vec(xb.scales)));
      const __m128i mins = _mm_madd_epi16(_mm512_extracti32x4_epi32(sc16, 1), yp.bsum_pairs);
      if constexpr (!kRepacked) acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins), acc_m);
      const __m512i bits0 = load64(xb.qs), bits1 = load64(xb.qs + 64);
      const __m512i s0 = _mm512_dpwssd_epi32(
          _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(bits0, m4), yp.y[0]),
                            _mm512_permutexvar_epi16(p00, sc16)),
          _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(bits0, 4), m4), yp.y[1]),
          _mm512_permutexvar_epi16(p01, sc16));
      const __m512i s1 = _mm512_dpwssd_epi32(
          _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_and_si512(bits1, m4), yp.y[2]),
                            _mm512_permutexvar_epi16(p10, sc16)),
          _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(bits1, 4), m4), yp.y[3]),
          _mm512_permutexvar_epi16(p11, sc16));
      if constexpr (kRepacked) {
        // llama.cpp's repacked gemv: one exact integer per super-block for the scales and one for the mins.
        acc_s = std::fma(static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(s0, s1))),
                         _mm_cvtss_f32(dd), acc_s);
        acc_ms =
            std::fma(static_cast<float>(hsum_i32x4(mins)), _mm_cvtss_f32(_mm_permute_ps(dd, 0x55)), acc_ms);
      } else {
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(fold16(_mm512_add_epi32(s0, s1))),
                              acc);
      }
    }
    if constexpr (kRepacked) {
      out[r] = acc_s - acc_ms;
    } else {
      out[r] = hsum8(acc) + hsum4(acc_m);
    }
  }
}

void rows_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  rows_q4_K_impl<false>(w, row_bytes, nrows, act, n, out);
}

/// rows_q4_K in llama.cpp's repacked gemv order (kernel_table.h repacked()): equals dot_q4_K_q8_K_gemv_ref.
void rows_q4_K_gemv(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                    float* out) {
  rows_q4_K_impl<true>(w, row_bytes, nrows, act, n, out);
}

/// How far ahead rows_q6_K prefetches. Q6_K's one-row loop is cheap enough to be bound by the memory
/// stream, which the hardware prefetcher alone kept at ~60 % of the read (2026-12-03, 1 GiB, 1 and 2
/// threads).
constexpr int64_t kQ6KPrefetchBytes = 8192;

/// matvec for Q6_K: q6_K_row (dot_q6_K's body) per row, with the weights prefetched kQ6KPrefetchBytes ahead.
void rows_q6_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const block_q8_K*>(act);
  for (int64_t r = 0; r < nrows; ++r)
    out[r] = q6_K_row<kQ6KPrefetchBytes>(
        reinterpret_cast<const block_q6_K*>(w + static_cast<size_t>(r) * row_bytes), y, n / QK_K);
}

}  // namespace

void add_matvec_kernels(DotKernels& k) {
  k.rows[slot(GgmlType::Q4_0)] = rows_nibbles<block_q4_0, block_q8_0, 8, false, false>;
  k.rows[slot(GgmlType::Q5_0)] = rows_nibbles<block_q5_0, block_q8_0, 16, true, false>;
  k.rows[slot(GgmlType::Q4_1)] = rows_nibbles<block_q4_1, block_q8_1, 0, false, true>;
  k.rows[slot(GgmlType::Q5_1)] = rows_nibbles<block_q5_1, block_q8_1, 0, true, true>;
  k.rows[slot(GgmlType::Q8_0)] = rows_q8_0;
  k.rows[slot(GgmlType::Q4_K)] = rows_q4_K;
  k.rows_gemv[slot(GgmlType::Q4_K)] = rows_q4_K_gemv;
  k.rows[slot(GgmlType::Q6_K)] = rows_q6_K;
}

}  // namespace car::tensor::detail::avx512
