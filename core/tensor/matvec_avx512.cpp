// AVX-512 multi-row kernels for matvec (y = W x, DotKernels::rows): Q8_0 in row pairs, the nibble formats
// (Q4_0, Q5_0, Q4_1, Q5_1) in rows of four, Q4_K one row at a time with its activation side prepared once per
// call (in ggml_vec_dot's order, and in llama.cpp's repacked gemv order with the blocks' sums reduced eight
// at a time), Q6_K one row at a time with a software prefetch; Q8_0, Q6_K and Q3_K also for 2-3 vectors at
// once (DotKernels::rows_few). Each result equals the table's dot kernel for that row bit for bit (the same
// float operations in the same order; integer sums, being exact, may be formed differently);
// tests/tensor/rows_kernel_test.cpp and matmul_test.cpp check that. Reading rows side by side defeats the
// hardware prefetcher, so these kernels prefetch in software.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

/// matvec for Q8_0, two rows at a time in one 512-bit accumulator (lanes 0..7 row 0, 8..15 row 1), for kV
/// vectors at once (y[v]'s results at out[v * ldo], out[v * ldo + 1]; kV 1 for matvec, 2-3 for
/// rows_q8_0_few). One row is bound by its chain of dependent FMAs (one per 34-byte block, ~28 GiB/s from
/// L2); a pair keeps two chains in flight in one instruction stream (~45 GiB/s). Each block's weight side
/// (the pair's levels, their magnitudes and signs, the pair's scales) is unpacked once for all kV vectors.
/// Lane for lane each vector's operations are dot_q8_0's in its order (the sign moved onto y by a masked
/// negation instead of vpsignb: the same products), so each result equals dot_q8_0's bit for bit whatever kV;
/// the scale products are formed in all lanes at once (fp16 -> fp32 is exact, so every lane equals h2f(x.d) *
/// h2f(y.d)). Reading two rows side by side defeats the hardware prefetcher (1 GiB matvec fell to 5-8
/// GiB/s), so the pair prefetches the next pair's bytes, one line per block (the pair after a chunk's last
/// one starts the thread's next chunk; past the matrix's end, prefetches do not fault).
template <int kV>
[[gnu::always_inline]] inline void q8_0_row_pair_v(const uint8_t* w, size_t row_bytes,
                                                   const block_q8_0* const* y, int64_t nb, float* out,
                                                   int64_t ldo) {
  const auto* x0 = reinterpret_cast<const block_q8_0*>(w);
  const auto* x1 = reinterpret_cast<const block_q8_0*>(w + row_bytes);
  const char* ahead = reinterpret_cast<const char*>(w) + 2 * row_bytes;
  __m512 acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    _mm_prefetch(ahead + i * 2 * static_cast<int64_t>(sizeof(block_q8_0)), kWeightStreamHint);
    const __m512i xq = load32x2(x0[i].qs, x1[i].qs);
    const __mmask64 neg = _mm512_movepi8_mask(xq);
    const __m512i ax = _mm512_abs_epi8(xq);
    const __m512 dx = _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(x0[i].d))),
                                _mm_set1_epi16(static_cast<int16_t>(x1[i].d)), 1));
    for (int v = 0; v < kV; ++v) {
      const __m512i yq = _mm512_broadcast_i64x4(load32(y[v][i].qs));
      const __m512 dy = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(y[v][i].d)));
      const __m512i ys = _mm512_mask_sub_epi8(yq, neg, _mm512_setzero_si512(), yq);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, ys);
      acc[v] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(p), acc[v]);
    }
  }
  for (int v = 0; v < kV; ++v) {
    out[v * ldo] = hsum8(_mm512_castps512_ps256(acc[v]));
    out[v * ldo + 1] = hsum8(_mm512_extractf32x8_ps(acc[v], 1));
  }
}

/// The pair for one vector (rows_q8_0).
inline void q8_0_row_pair(const uint8_t* w, size_t row_bytes, const block_q8_0* y, int64_t nb, float* out) {
  q8_0_row_pair_v<1>(w, row_bytes, &y, nb, out, 0);
}

/// The few-vector kernels' passes over one row (or row pair), as vector_passes splits them: fn(std::
/// integral_constant<int, V>, activations of the pass's V vectors, the first one's output, whether it is the
/// row's first pass).
template <class Act, class Fn>
[[gnu::always_inline]] inline void few_passes(const uint8_t* acts, size_t act_bytes, int64_t nvec, float* out,
                                              int64_t ldy, Fn&& fn) {
  vector_passes(nvec, [&](auto kv, int64_t i) [[gnu::always_inline]] {
    const Act* yv[decltype(kv)::value];
    for (int v = 0; v < decltype(kv)::value; ++v)
      yv[v] = reinterpret_cast<const Act*>(acts + static_cast<size_t>(i + v) * act_bytes);
    fn(kv, yv, out + i * ldy, i == 0);
  });
}

/// DotKernels::rows_few for Q8_0 (an MoE expert's rows in a batched decode step, 1-3 an expert): row pairs
/// as rows_q8_0 takes them, all vectors on each pair while it sits in L1, in passes of up to 3 (4 as 2 + 2);
/// an odd last row by dot_q8_0 per vector. Each result is dot_q8_0's bits.
void rows_q8_0_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                   int64_t nvec, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK8_0;
  int64_t r = 0;
  for (; r + 2 <= nrows; r += 2) {
    const uint8_t* pair = w + static_cast<size_t>(r) * row_bytes;
    few_passes<block_q8_0>(acts, act_bytes, nvec, y + r, ldy,
                           [&](auto kv, const block_q8_0* const* yv, float* out, bool /*first*/)
                               [[gnu::always_inline]] {
                                 q8_0_row_pair_v<decltype(kv)::value>(pair, row_bytes, yv, nb, out, ldy);
                               });
  }
  if (r < nrows) {
    for (int64_t v = 0; v < nvec; ++v)
      y[v * ldy + r] =
          dot_q8_0(w + static_cast<size_t>(r) * row_bytes, acts + static_cast<size_t>(v) * act_bytes, n);
  }
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
    _mm_prefetch(ahead + i * 2 * static_cast<int64_t>(sizeof(Block)), kWeightStreamHint);
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
    _mm_prefetch(ahead + i * step, kWeightStreamHint);
    _mm_prefetch(ahead + i * step + step / 2, kWeightStreamHint);
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

/// scale_min_k4_vec for four blocks at once: 128-bit lane j of `v` holds 16 bytes from block j's scales,
/// lane j of the result its 8 scales (bytes 0..7) and 8 mins (8..15). The same shuffles and masks per lane.
inline __m512i scale_min_k4_x4(__m512i v) {
  const __m512i lo = _mm512_shuffle_epi8(
      v, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)));
  const __m512i hi = _mm512_shuffle_epi8(
      v, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7)));
  const __m512i low_bits = _mm512_and_si512(
      _mm512_mask_blend_epi8(0xf000f000f000f000ull, lo, _mm512_srli_epi16(lo, 4)),
      _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15)));
  return _mm512_or_si512(low_bits, _mm512_and_si512(_mm512_srli_epi16(hi, 2), _mm512_set1_epi8(0x30)));
}

/// The activation side of the Q4_K rows kernels for one Q8_K block, formed once per call instead of once per
/// row: the values in the 512-bit pairings dot_k4 builds with load32x2, the bsums summed in pairs (as
/// mins_dot_bsums forms them) and the scale.
struct alignas(64) Q8KPrepared {
  __m512i y[4];  ///< (qs 0..31 | 64..95), (32..63 | 96..127), then the same for qs 128..255
  __m128i bsum_pairs;
  float d;
};

/// The activation side of rows_q4_K_gemv for a group of kGemvGroup Q8_K blocks (see gemv_group): the group's
/// bsum pairs (128-bit lane j: block j's 8 int16) and y.d of each block twice ([d0, d0, d1, d1, ...], the
/// pairing of the weights' (d, dmin) halves). Blocks past the row's end are zero.
constexpr int kGemvGroup = 4;
struct alignas(64) Q8KGroupPrepared {
  __m512i bsum_pairs;
  __m256 d_pairs;
};

/// Vectors a gemv kernel call takes at most (rows_q4_K_gemv_few); each has its own prepared activations.
constexpr int kMaxFewVectors = kMaxVectorPass;
thread_local std::vector<Q8KPrepared> tls_q8k_prepared[kMaxFewVectors];
thread_local std::vector<Q8KGroupPrepared> tls_q8k_group_prepared[kMaxFewVectors];

/// The calling thread's Q8KPrepared for y's nb blocks in its buffer `v` (valid until its next call with `v`).
const Q8KPrepared* prepare_q8_K(const block_q8_K* y, int64_t nb, int v = 0) {
  std::vector<Q8KPrepared>& prep = tls_q8k_prepared[v];
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
  return prep.data();
}

/// The calling thread's Q8KGroupPrepared for the nb blocks of `prep` in its buffer `v` (valid until its next
/// call with `v`).
const Q8KGroupPrepared* prepare_q8_K_groups(const Q8KPrepared* prep, int64_t nb, int v = 0) {
  const int64_t ng = (nb + kGemvGroup - 1) / kGemvGroup;
  std::vector<Q8KGroupPrepared>& groups = tls_q8k_group_prepared[v];
  if (groups.size() < static_cast<size_t>(ng)) groups.resize(static_cast<size_t>(ng));
  for (int64_t g = 0; g < ng; ++g) {
    alignas(64) __m128i pairs[kGemvGroup];
    alignas(64) float d[2 * kGemvGroup];
    for (int j = 0; j < kGemvGroup; ++j) {
      const int64_t i = g * kGemvGroup + j;
      pairs[j] = i < nb ? prep[i].bsum_pairs : _mm_setzero_si128();
      d[2 * j] = d[2 * j + 1] = i < nb ? prep[i].d : 0.0f;
    }
    groups[g].bsum_pairs = _mm512_load_si512(pairs);
    groups[g].d_pairs = _mm256_load_ps(d);
  }
  return groups.data();
}

/// How far ahead the Q4_K rows kernels prefetch their weights. With 2 threads the hardware prefetcher alone
/// left the (faster) kernel at ~60 % of the read bandwidth; 1 KiB ahead was not enough, 4-16 KiB all helped
/// the vec_dot-order kernel (rows_q4_K).
constexpr int64_t kQ4KPrefetchBytes = 8192;
/// The same for the gemv-order kernels (decode's). 3 KiB was better on the 29-37 GiB/s machines (decode of
/// dense-1b Q4_K_M at 2 threads 0.97-1.01 of the vec_dot-order build 153b847 against 0.95-0.98 at 8); on the
/// 50-59 GiB/s one 8 KiB is (the 1 GiB matvec at 2 threads, swept in one run: 3 KiB 39.5-40.1 GiB/s, 8 KiB
/// 42.9-43.3, 16 KiB 40.7-42.5; decode 0.93-1.25 of 153b847 alternated; docs/performance.md, issue #29).
constexpr int64_t kQ4KGemvPrefetchBytes = 8192;

/// The constants of q4_K_block_sums.
struct Q4KConsts {
  __m512i m4 = _mm512_set1_epi8(0x0f);
  // vpshufb indices that widen scale byte a into the int16 lanes of 128-bit lanes 0, 1 and scale byte b into
  // those of lanes 2, 3 (the pairing of kK4Perm: sub-blocks {4jj, 4jj+2} low nibbles, {4jj+1, 4jj+3} high).
  __m512i p00 = scale_pair_idx(0, 2), p01 = scale_pair_idx(1, 3);
  __m512i p10 = scale_pair_idx(4, 6), p11 = scale_pair_idx(5, 7);
  static __m512i scale_pair_idx(int a, int b) {
    const __m512i lo = _mm512_set1_epi16(static_cast<int16_t>(0xff00 | a));
    const __m512i hi = _mm512_set1_epi16(static_cast<int16_t>(0xff00 | b));
    return _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
  }
};

/// One Q4_K block against the prepared activations of V vectors (yp[v]): prefetches kAhead bytes past the
/// block, and writes out[v], 16 int32 lanes of scale * level * y (lanes k and k+8: bytes 4k..4k+3 of every
/// 32-byte chunk, as dot_k4 pairs them), whose sum is the block's exact scale integer for vector v. The weight
/// side (the bits, the nibble masks, the scale shuffles) is built once for the V vectors. `sc`: the block's 8
/// scales in bytes 0..7 of every 128-bit lane (scale_min_k4_vec's layout), widened to int16 per register by
/// an in-lane vpshufb (cheaper than vpermw from a widened copy, ~3 % of the kernel's time from L2).
template <int V, int64_t kAhead>
inline void q4_K_block_sums_v(const block_q4_K& xb, const Q8KPrepared* const* yp, const Q4KConsts& c, __m512i sc,
                              __m512i* out) {
  const char* ahead = reinterpret_cast<const char*>(&xb) + kAhead;
  _mm_prefetch(ahead, kWeightStreamHint);
  _mm_prefetch(ahead + 64, kWeightStreamHint);
  _mm_prefetch(ahead + 128, kWeightStreamHint);
  const __m512i bits0 = load64(xb.qs), bits1 = load64(xb.qs + 64);
  const __m512i lo0 = _mm512_and_si512(bits0, c.m4), hi0 = _mm512_and_si512(_mm512_srli_epi16(bits0, 4), c.m4);
  const __m512i lo1 = _mm512_and_si512(bits1, c.m4), hi1 = _mm512_and_si512(_mm512_srli_epi16(bits1, 4), c.m4);
  const __m512i s00 = _mm512_shuffle_epi8(sc, c.p00), s01 = _mm512_shuffle_epi8(sc, c.p01);
  const __m512i s10 = _mm512_shuffle_epi8(sc, c.p10), s11 = _mm512_shuffle_epi8(sc, c.p11);
  for (int v = 0; v < V; ++v) {
    const Q8KPrepared& y = *yp[v];
    const __m512i s0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(lo0, y.y[0]), s00),
                                           _mm512_maddubs_epi16(hi0, y.y[1]), s01);
    const __m512i s1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(lo1, y.y[2]), s10),
                                           _mm512_maddubs_epi16(hi1, y.y[3]), s11);
    out[v] = _mm512_add_epi32(s0, s1);
  }
}

/// q4_K_block_sums_v for one vector (rows_q4_K).
inline __m512i q4_K_block_sums(const block_q4_K& xb, const Q8KPrepared& yp, const Q4KConsts& c, __m512i sc) {
  const Q8KPrepared* one = &yp;
  __m512i out;
  q4_K_block_sums_v<1, kQ4KPrefetchBytes>(xb, &one, c, sc, &out);
  return out;
}

/// matvec for Q4_K: dot_k4<false> per row with the activation side prepared once (Q8KPrepared), the scales
/// and mins unpacked with shuffles, the four products of a block in two chains, and the weights prefetched
/// kQ4KPrefetchBytes ahead (past the matrix's end too: prefetches do not fault). The integer sums are
/// the same (only their association changes, which integers do not see) and the float operations are
/// dot_k4's in its order, so each result equals dot_q4_K bit for bit. (Two rows side by side, sharing the
/// activation loads, were slower.)
void rows_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const block_q8_K*>(act);
  const int64_t nb = n / QK_K;
  const Q8KPrepared* prep = prepare_q8_K(y, nb);
  const Q4KConsts c;
  const __m128 sign = _mm_set1_ps(-0.0f);
  for (int64_t r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const block_q4_K& xb = x[i];
      const Q8KPrepared& yp = prep[i];
      const __m128i scale_min = scale_min_k4_vec(xb.scales);
      const __m512i s = q4_K_block_sums(xb, yp, c, _mm512_broadcast_i32x4(scale_min));
      // [y.d * h2f(x.d), y.d * h2f(x.dmin)]: d, and dmin = -y.d * h2f(x.dmin) once negated (exactly).
      uint32_t dm;
      std::memcpy(&dm, &xb.d, sizeof(dm));
      const __m128 dd = _mm_mul_ps(_mm_set1_ps(yp.d), _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm))));
      const __m128 dmin = _mm_xor_ps(_mm_permute_ps(dd, 0x55), sign);
      const __m128i mins =
          _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(scale_min, scale_min)), yp.bsum_pairs);
      acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins), acc_m);
      acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(fold16(s)), acc);
    }
    out[r] = hsum8(acc) + hsum4(acc_m);
  }
}

/// A compiler scheduling barrier between the blocks of a gemv group. Without it GCC hoists a group's
/// prefetches (3 per block, no dependencies) to the group's start; in a 1 GiB matvec that burst made the
/// kernel ~10 % slower than with each block's prefetches beside its work (issue #29). A volatile asm is a
/// barrier to GCC's scheduler by itself; no "memory" clobber, which made GCC reload the kernel's constants
/// (the nibble mask, the shuffle indices) from the stack after every barrier (5-8 % of its CPU time).
inline void keep_prefetch_in_place() {
  asm volatile("");
}

/// Blocks 2p and 2p + 1 of a gemv group (blocks from kCount on are zero), for each of V vectors: half[v] holds
/// their sums, each from 16 lanes to 8, side by side (128-bit lanes 0, 1: block 2p; 2, 3: block 2p + 1).
/// `scale_min`: lane j block j's scales and mins.
template <int kPair, int kCount, int V>
inline void gemv_pair(const block_q4_K* x, const Q8KPrepared* const* yp, const Q4KConsts& c, __m512i scale_min,
                      __m512i* half) {
  constexpr int j = 2 * kPair;
  __m512i sa[V], sb[V];
  const Q8KPrepared* ya[V];
  const Q8KPrepared* yb[V];
  for (int v = 0; v < V; ++v) {
    sa[v] = sb[v] = _mm512_setzero_si512();
    ya[v] = yp[v] + j;
    yb[v] = yp[v] + j + 1;
  }
  keep_prefetch_in_place();
  if constexpr (j < kCount) {
    q4_K_block_sums_v<V, kQ4KGemvPrefetchBytes>(x[j], ya, c, _mm512_shuffle_i32x4(scale_min, scale_min, 0x55 * j), sa);
  }
  keep_prefetch_in_place();
  if constexpr (j + 1 < kCount) {
    q4_K_block_sums_v<V, kQ4KGemvPrefetchBytes>(x[j + 1], yb, c,
                                                _mm512_shuffle_i32x4(scale_min, scale_min, 0x55 * (j + 1)), sb);
  }
  for (int v = 0; v < V; ++v) {
    half[v] =
        _mm512_add_epi32(_mm512_shuffle_i64x2(sa[v], sb[v], 0x44), _mm512_shuffle_i64x2(sa[v], sb[v], 0xee));
  }
}

/// The first kCount (1..kGemvGroup) blocks of a group of a row into the gemv order's two chains of each of V
/// vectors, held in lanes 0 (scales) and 1 (mins) of acc[v]: for each block j in order, lane 0 = fma(float(scale
/// integer j), y.d * h2f(d_j), lane 0) and lane 1 = fma(float(min integer j), y.d * h2f(dmin_j), lane 1) - the
/// operations of dot_q4_K_q8_K_gemv_ref, two lanes of one FMA. yp[v], yg[v]: vector v's prepared blocks from
/// the group's first, and its group; the group's scales and mins are unpacked once for the V vectors. The
/// integers are exact whichever way they are summed: the 4 blocks' 16-lane sums are reduced together by
/// shuffles that pair registers (~3 instructions a block, where reducing each block alone took ~14 and a trip
/// through a general register), and the mins' dot with the bsum pairs is one madd for the 4 blocks.
/// Everything stays in registers except the final integers and scale products, stored whole and read back per
/// block (loads within one store, so they are forwarded). Four blocks, not eight: a row's last, partial group
/// (MoE expert rows are 4 or 11 blocks) costs as much as a full one.
template <int kCount, int V>
inline void gemv_group(const block_q4_K* x, const Q8KPrepared* const* yp, const Q8KGroupPrepared* const* yg,
                       const Q4KConsts& c, __m128* acc) {
  __m128i raw[kGemvGroup];
  for (int j = 0; j < kGemvGroup; ++j) {
    raw[j] =
        j < kCount ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[j].scales)) : _mm_setzero_si128();
  }
  const __m512i scale_min = scale_min_k4_x4(_mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_set_m128i(raw[1], raw[0])), _mm256_set_m128i(raw[3], raw[2]), 1));
  // Blocks (0, 1) and (2, 3) of every vector, as gemv_pair reduces them.
  __m512i half[2][V];
  gemv_pair<0, kCount, V>(x, yp, c, scale_min, half[0]);
  gemv_pair<1, kCount, V>(x, yp, c, scale_min, half[1]);
  uint32_t dm[kGemvGroup];
  for (int j = 0; j < kGemvGroup; ++j) {
    dm[j] = 0;
    if (j < kCount) std::memcpy(&dm[j], &x[j].d, sizeof(uint32_t));
  }
  const __m256 dmf = _mm256_cvtph_ps(_mm_setr_epi32(static_cast<int>(dm[0]), static_cast<int>(dm[1]),
                                                    static_cast<int>(dm[2]), static_cast<int>(dm[3])));
  const __m512i mins = _mm512_unpackhi_epi8(scale_min, _mm512_setzero_si512());
  for (int v = 0; v < V; ++v) {
    const __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(half[0][v], half[1][v], 0x88),
                                       _mm512_shuffle_i64x2(half[0][v], half[1][v], 0xdd));
    const __m512i m = _mm512_madd_epi16(mins, yg[v]->bsum_pairs);
    const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(s, m), _mm512_unpackhi_epi64(s, m));
    const __m512i sm = _mm512_add_epi32(_mm512_shuffle_epi32(t, static_cast<_MM_PERM_ENUM>(0x88)),
                                        _mm512_shuffle_epi32(t, static_cast<_MM_PERM_ENUM>(0xdd)));
    alignas(64) float f[4 * kGemvGroup];
    _mm512_store_ps(f, _mm512_cvtepi32_ps(sm));
    alignas(32) float dd[2 * kGemvGroup];
    _mm256_store_ps(dd, _mm256_mul_ps(yg[v]->d_pairs, dmf));
    for (int j = 0; j < kCount; ++j) {
      const __m128 d = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dd + 2 * j)));
      acc[v] = _mm_fmadd_ps(_mm_load_ps(f + 4 * j), d, acc[v]);
    }
  }
}

/// Q4_K rows in llama.cpp's repacked gemv order (kernel_table.h repacked()) against V vectors (acts + v *
/// act_bytes) in one pass, each weight block loaded and unpacked once for the V: y[v * ldy + r] equals
/// dot_q4_K_q8_K_gemv_ref bit for bit. The block work is rows_q4_K's (q4_K_block_sums_v, prefetching closer);
/// instead of reducing each block's sums to one integer on the spot (a chain of shuffles, a trip through a
/// general register and two scalar FMAs per block, which left this kernel ~25 % more instructions per block
/// than rows_q4_K and decode ~10 % slower, issue #29), it reduces kGemvGroup blocks at a time (gemv_group).
template <int V>
void rows_q4_K_gemv_v(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                      int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  const Q8KPrepared* prep[V];
  const Q8KGroupPrepared* groups[V];
  for (int v = 0; v < V; ++v) {
    const auto* yv = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    prep[v] = prepare_q8_K(yv, nb, v);
    groups[v] = prepare_q8_K_groups(prep[v], nb, v);
  }
  const Q4KConsts c;
  const int64_t full = nb / kGemvGroup;
  const int rest = static_cast<int>(nb % kGemvGroup);
  for (int64_t r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes);
    __m128 acc[V];
    for (int v = 0; v < V; ++v) acc[v] = _mm_setzero_ps();
    const Q8KPrepared* yp[V];
    const Q8KGroupPrepared* yg[V];
    for (int64_t g = 0; g <= full; ++g) {
      if (g == full && rest == 0) break;
      for (int v = 0; v < V; ++v) {
        yp[v] = prep[v] + g * kGemvGroup;
        yg[v] = groups[v] + g;
      }
      const block_q4_K* xg = x + g * kGemvGroup;
      if (g < full) {
        gemv_group<kGemvGroup, V>(xg, yp, yg, c, acc);
      } else if (rest == 1) {
        gemv_group<1, V>(xg, yp, yg, c, acc);
      } else if (rest == 2) {
        gemv_group<2, V>(xg, yp, yg, c, acc);
      } else {
        gemv_group<3, V>(xg, yp, yg, c, acc);
      }
    }
    for (int v = 0; v < V; ++v) {
      y[v * ldy + r] = _mm_cvtss_f32(acc[v]) - _mm_cvtss_f32(_mm_movehdup_ps(acc[v]));
    }
  }
}

/// matvec for Q4_K in the gemv order (DotKernels::rows_gemv: decode, every MoE expert row): the one-vector
/// instance.
void rows_q4_K_gemv(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  rows_q4_K_gemv_v<1>(w, row_bytes, nrows, static_cast<const uint8_t*>(act), 0, n, out, 0);
}

/// DotKernels::rows_gemv_few for Q4_K: vectors in passes of up to kMaxFewVectors (rows_q4_K_gemv_v).
void rows_q4_K_gemv_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                        int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vector_passes(nvec, [&](auto kv, int64_t i) [[gnu::always_inline]] {
    rows_q4_K_gemv_v<decltype(kv)::value>(w, row_bytes, nrows, acts + static_cast<size_t>(i) * act_bytes,
                                          act_bytes, n, y + i * ldy, ldy);
  });
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

/// DotKernels::rows_few for Q6_K (an MoE expert's down rows in a batched decode step, 1-3 an expert): each
/// row once for all vectors, in passes of up to 3 (4 as 2 + 2) while it sits in L1, the first pass
/// prefetching as rows_q6_K does; each result is dot_q6_K's bits.
void rows_q6_K_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                   int64_t nvec, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  for (int64_t r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const block_q6_K*>(w + static_cast<size_t>(r) * row_bytes);
    few_passes<block_q8_K>(acts, act_bytes, nvec, y + r, ldy,
                           [&](auto kv, const block_q8_K* const* yv, float* out, bool first)
                               [[gnu::always_inline]] {
                                 if (first) {
                                   q6_K_row_v<decltype(kv)::value, kQ6KPrefetchBytes>(x, yv, nb, out, ldy);
                                 } else {
                                   q6_K_row_v<decltype(kv)::value, 0>(x, yv, nb, out, ldy);
                                 }
                               });
  }
}

/// DotKernels::rows_few for Q3_K (an MoE expert's rows in a batched decode step, 2-3 an expert): each row
/// once for all vectors, in passes of up to 3 (4 as 2 + 2) while it sits in L1; each result is dot_q3_K's
/// bits. No prefetch: Q3_K's arithmetic, not the stream, bounds it.
void rows_q3_K_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                   int64_t nvec, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  for (int64_t r = 0; r < nrows; ++r) {
    const auto* x = reinterpret_cast<const block_q3_K*>(w + static_cast<size_t>(r) * row_bytes);
    few_passes<block_q8_K>(
        acts, act_bytes, nvec, y + r, ldy,
        [&](auto kv, const block_q8_K* const* yv, float* out, bool /*first*/)
            [[gnu::always_inline]] { q3_K_row_v<decltype(kv)::value>(x, yv, nb, out, ldy); });
  }
}

}  // namespace

void add_matvec_kernels(DotKernels& k) {
  k.rows[slot(GgmlType::Q4_0)] = rows_nibbles<block_q4_0, block_q8_0, 8, false, false>;
  k.rows[slot(GgmlType::Q5_0)] = rows_nibbles<block_q5_0, block_q8_0, 16, true, false>;
  k.rows[slot(GgmlType::Q4_1)] = rows_nibbles<block_q4_1, block_q8_1, 0, false, true>;
  k.rows[slot(GgmlType::Q5_1)] = rows_nibbles<block_q5_1, block_q8_1, 0, true, true>;
  k.rows[slot(GgmlType::Q8_0)] = rows_q8_0;
  k.rows_few[slot(GgmlType::Q8_0)] = rows_q8_0_few;
  k.rows[slot(GgmlType::Q4_K)] = rows_q4_K;
  k.rows_gemv[slot(GgmlType::Q4_K)] = rows_q4_K_gemv;
  k.rows_gemv_few[slot(GgmlType::Q4_K)] = rows_q4_K_gemv_few;
  k.rows[slot(GgmlType::Q6_K)] = rows_q6_K;
  k.rows_few[slot(GgmlType::Q6_K)] = rows_q6_K_few;
  k.rows_few[slot(GgmlType::Q3_K)] = rows_q3_K_few;
}

}  // namespace car::tensor::detail::avx512
