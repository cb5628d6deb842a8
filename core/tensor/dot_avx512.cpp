// AVX-512 dot kernels (F, BW, VL, DQ, VNNI, BF16; compiled with car_simd_source(... AVX512) and only called
// when CPUID reports all of them). The table starts from the AVX2 one and replaces the kernels that gain from
// AVX-512: VNNI's dpbusd / dpwssd fuse the u8 x s8 multiply with the int32 accumulation, 512-bit registers
// halve the instruction count of the K-quant loops, and dpbf16ps multiplies bf16 pairs directly. Q2_K, Q3_K,
// Q4_1, Q5_0 and Q5_1 keep their AVX2 dot kernels (matvec runs them through multi-row kernels here, equal to
// them bit for bit). The matmul tile kernels (Q8_0, Q4_K, Q6_K: one weight block unpacked once for eight
// activation vectors, each pair's result equal to the dot kernel's) live here too.
//
// Integer parts are exact (same identities as the scalar reference: levels <= 63 times |activation| <= 127
// never saturate maddubs' int16 pairs); float accumulation order differs from the scalar one.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers build masked builtins from _mm512_undefined_*() values, which -Wall
// reports as uninitialized at every inlined call site (a known false positive of those headers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

inline float h2f(ggml_half h) {
  return _cvtsh_ss(h);
}

inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}
/// Two 32-byte loads side by side in one register.
inline __m512i load32x2(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(lo)), load32(hi), 1);
}

/// 16 bytes of nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in bytes 16..31.
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/// int32 lanes += sum of 4 adjacent s8 x s8 products (the sign moved onto y so dpbusd's u8 operand is |x|).
inline __m256i dpbssd_via_sign(__m256i acc, __m256i x, __m256i y) {
  return _mm256_dpbusd_epi32(acc, _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// ---------------------------------------------------------------------------------------------------------
// 32-element blocks with Q8_0 activations

// One 8-lane accumulator over the blocks in order (ggml's ggml_vec_dot_q8_0_q8_0 and llamafile's
// tinyBLAS_Q0_AVX, whose VNNI build uses exactly this dpbusd), so results equal llama.cpp's bit for bit.
float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q8_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i p = dpbssd_via_sign(_mm256_setzero_si256(), load32(x[i].qs), load32(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum8(acc);
}

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

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles32(x[i].qs), eight);
    const __m256i p = dpbssd_via_sign(_mm256_setzero_si256(), q, load32(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum8(acc);
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

/// A tile row's accumulators between slabs of blocks (see run_tiles): `state` holds them (64 bytes per
/// register) when the row's blocks come in several slabs; `first` / `last`: this call starts / ends the row.
struct Carry {
  float* state = nullptr;
  bool first = true;
  bool last = true;
};

/// Accumulators in: zero for the first slab, else as the previous slab left them.
template <int kN>
inline void carry_in(const Carry& c, __m512* acc) {
#pragma GCC unroll 16
  for (int k = 0; k < kN; ++k) acc[k] = c.first ? _mm512_setzero_ps() : _mm512_load_ps(c.state + 16 * k);
}
/// Accumulators out; true when the row is done and its results are to be written.
template <int kN>
inline bool carry_out(const Carry& c, const __m512* acc) {
  if (c.last) return true;
#pragma GCC unroll 16
  for (int k = 0; k < kN; ++k) _mm512_store_ps(c.state + 16 * k, acc[k]);
  return false;
}

/// Grow-only, 64-byte aligned per-thread scratch.
struct Scratch {
  void* p = nullptr;
  size_t size = 0;
  ~Scratch() { ::operator delete (p, std::align_val_t{64}); }
  void* get(size_t need) {
    if (size < need) {
      ::operator delete (p, std::align_val_t{64});
      p = ::operator new (need, std::align_val_t{64});
      size = need;
    }
    return p;
  }
};

/// The matmul tile driver shared by the formats. Vectors go in groups of eight (four for a short tail; a
/// group's missing vectors repeat its last one and are computed but not stored). Per group, Tile::pack
/// writes the vector-side data every row needs (scales, sums, ...; see each tile) into a per-thread buffer
/// once, then Tile::row computes each weight row of the chunk against the whole group, its weight blocks
/// unpacked once for the group. Long rows go in slabs of Tile::kSlab blocks (the group's activations and
/// packed data should stay in L1 while the rows stream past), each row's accumulators kept between slabs,
/// so every (row, vector) still accumulates its blocks in order.
template <class Tile>
void run_tiles(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t nb, float* y, int64_t ldy) {
  thread_local Scratch pack_buf, state_buf;
  const int64_t slab = std::min<int64_t>(nb, Tile::kSlab);
  auto* pack = static_cast<uint8_t*>(pack_buf.get(Tile::template pack_bytes<8>(slab)));
  float* state = nb > slab
                     ? static_cast<float*>(state_buf.get(static_cast<size_t>(nrows) * Tile::kStateBytes))
                     : nullptr;
  int64_t v0 = 0;
  auto group = [&]<int kG>(std::integral_constant<int, kG>) {
    const int nv = static_cast<int>(std::min<int64_t>(kG, nvec - v0));
    for (int64_t b0 = 0; b0 < nb; b0 += slab) {
      const int64_t ns = std::min(slab, nb - b0);
      const uint8_t* av[kG];
#pragma GCC unroll 16
      for (int v = 0; v < kG; ++v) {
        av[v] = acts + static_cast<size_t>(v0 + std::min(v, nv - 1)) * act_bytes +
                static_cast<size_t>(b0) * Tile::kActBlockBytes;
      }
      Tile::template pack<kG>(av, ns, pack);
      for (int64_t r = 0; r < nrows; ++r) {
        const Carry c = state == nullptr
                            ? Carry{}
                            : Carry{state + r * static_cast<int64_t>(Tile::kStateBytes / sizeof(float)),
                                    b0 == 0, b0 + ns == nb};
        Tile::template row<kG>(
            w + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(b0) * Tile::kBlockBytes, av, pack,
            ns, y + v0 * ldy + r, ldy, nv, c);
      }
    }
    v0 += nv;
  };
  while (nvec - v0 > 4) group(std::integral_constant<int, 8>{});
  if (v0 < nvec) group(std::integral_constant<int, 4>{});
}

/// permutexvar indices spreading a vector of kG floats: lanes [0,8) get element 2p, [8,16) element 2p+1.
struct Spread {
  alignas(64) int32_t idx[16];
};
constexpr Spread make_spread(int p) {
  Spread s{};
  for (int l = 0; l < 16; ++l) s.idx[l] = 2 * p + l / 8;
  return s;
}
constexpr Spread kSpread[4] = {make_spread(0), make_spread(1), make_spread(2), make_spread(3)};

/// The 8 float lanes of vector 2p + h from a register holding vectors 2p, 2p+1.
inline __m256 half_ps(__m512 v, int h) {
  return h == 0 ? _mm512_castps512_ps256(v) : _mm512_extractf32x8_ps(v, 1);
}
/// The 4 float lanes [4k, 4k+4) of v.
inline __m128 extract_ps128(__m512 v, int k) {
  switch (k) {
    case 0:
      return _mm512_castps512_ps128(v);
    case 1:
      return _mm512_extractf32x4_ps(v, 1);
    case 2:
      return _mm512_extractf32x4_ps(v, 2);
    default:
      return _mm512_extractf32x4_ps(v, 3);
  }
}

/// matmul tile for Q8_0. Per block, dot_q8_0 computes p = dpbusd(|x|, sign(y, x)) in 8 int32 lanes and
/// acc = fma(dx * dy, float(p), acc). Here two vectors share a 512-bit register: the row's block is
/// broadcast to both halves once per group, each pair of vectors' blocks is signed by it (a masked negate,
/// AVX-512 having no vpsignb; x == 0 lanes multiply |x| = 0 either way) and multiplied by one dpbusd, and
/// the float step runs on 16 lanes: lane-wise the same operations as dot_q8_0, so each result is bit-equal.
/// pack: the group's activation quants, 64-byte aligned (vectors 2p, 2p+1 of a block side by side), then
/// their scales dy as floats, kG per block.
struct q8_0_tile {
  static constexpr int64_t kSlab = 64;  // the group's copies: 16 KiB per slab
  static constexpr size_t kBlockBytes = sizeof(block_q8_0), kActBlockBytes = sizeof(block_q8_0);
  static constexpr size_t kStateBytes = 4 * 64;
  template <int kG>
  static size_t pack_bytes(int64_t nb) {
    return static_cast<size_t>(nb) * (kG * 32 + kG * sizeof(float));
  }
  template <int kG>
  static void pack(const uint8_t* const* av, int64_t nb, uint8_t* out) {
    auto* dy = reinterpret_cast<float*>(out + static_cast<size_t>(nb) * kG * 32);
    for (int64_t i = 0; i < nb; ++i) {
#pragma GCC unroll 16
      for (int v = 0; v < kG; ++v) {
        const block_q8_0& y = reinterpret_cast<const block_q8_0*>(av[v])[i];
        dy[i * kG + v] = h2f(y.d);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + (i * kG + v) * 32), load32(y.qs));
      }
    }
  }
  template <int kG>
  static void row(const uint8_t* wrow, const uint8_t* const* av, const uint8_t* pk, int64_t nb, float* out,
                  int64_t ldy, int nv, const Carry& carry) {
    const auto* x = reinterpret_cast<const block_q8_0*>(wrow);
    const auto* dy = reinterpret_cast<const float*>(pk + static_cast<size_t>(nb) * kG * 32);
    constexpr int kP = kG / 2;
    __m512i spread[kP];
#pragma GCC unroll 16
    for (int p = 0; p < kP; ++p) spread[p] = _mm512_load_si512(kSpread[p].idx);
    __m512 acc[kP];
    carry_in<kP>(carry, acc);
    for (int64_t i = 0; i < nb; ++i) {
      const __m512i xq = _mm512_broadcast_i64x4(load32(x[i].qs));
      const __m512i ax = _mm512_abs_epi8(xq);
      const __mmask64 neg = _mm512_movepi8_mask(xq);
      __m512 d;
      if constexpr (kG == 8) {
        d = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_loadu_ps(dy + i * kG), _mm256_set1_ps(h2f(x[i].d))));
      } else {
        d = _mm512_castps128_ps512(_mm_mul_ps(_mm_loadu_ps(dy + i * kG), _mm_set1_ps(h2f(x[i].d))));
      }
#pragma GCC unroll 16
      for (int p = 0; p < kP; ++p) {
        const __m512i yq = _mm512_load_si512(pk + (i * kG + 2 * p) * 32);
        const __m512i ys = _mm512_mask_sub_epi8(yq, neg, _mm512_setzero_si512(), yq);
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, ys);
        acc[p] = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread[p], d), _mm512_cvtepi32_ps(s), acc[p]);
      }
    }
    // constant indices (unrolled) keep acc in registers; a variable index kept a copy on the stack
    if (!carry_out<kP>(carry, acc)) return;
#pragma GCC unroll 16
    for (int v = 0; v < kG; ++v) {
      if (v < nv) out[v * ldy] = hsum8(half_ps(acc[v / 2], v % 2));
    }
  }
};

void tile_q8_0(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<q8_0_tile>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK8_0, y, ldy);
}

// ---------------------------------------------------------------------------------------------------------
// K-quants

/// vpermw indices: from int16 scales in lanes 0..7, lanes [0,16) get scale a and [16,32) scale b.
struct Perm2 {
  alignas(64) int16_t idx[32];
};
constexpr Perm2 make_perm2(int a, int b) {
  Perm2 p{};
  for (int i = 0; i < 32; ++i) p.idx[i] = static_cast<int16_t>(i < 16 ? a : b);
  return p;
}
/// Four scales, each over 8 int16 lanes (16-element sub-blocks), from int16 scales in lanes 0..15.
constexpr Perm2 make_perm4(int first) {
  Perm2 p{};
  for (int i = 0; i < 32; ++i) p.idx[i] = static_cast<int16_t>(first + i / 8);
  return p;
}
// Q4_K / Q5_K: register jj (0, 1) covers sub-blocks {4jj, 4jj+2} (low nibbles) and {4jj+1, 4jj+3} (high).
constexpr Perm2 kK4Perm[2][2] = {{make_perm2(0, 2), make_perm2(1, 3)}, {make_perm2(4, 6), make_perm2(5, 7)}};
// Q6_K: half h, part p covers scales 8h + 4p .. 8h + 4p + 3.
constexpr Perm2 kK6Perm[2][2] = {{make_perm4(0), make_perm4(4)}, {make_perm4(8), make_perm4(12)}};

inline __m512i perm_idx(const Perm2& p) {
  return _mm512_load_si512(p.idx);
}

/// The mins term as ggml's AVX2 Q4_K / Q5_K kernels form it: bsums summed in pairs, times the 8 mins, into 4
/// int32 lanes (lane k: mins 2k and 2k+1).
inline __m128i mins_dot_bsums(const uint32_t* mins_words, const int16_t* bsums) {
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins_words)));
  const __m256i b = load32(bsums);
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return _mm_madd_epi16(m16, pairs);
}

inline float hsum4(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

inline int hsum_i32x4(__m128i v) {
  v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
  return _mm_cvtsi128_si32(v);
}

/// 16 int32 lanes -> 8: lane k + lane k+8. Each half of the 512-bit sums holds whole 32-byte chunks, so this
/// yields exactly the 8 lanes ggml's AVX2 kernels accumulate (lane k: bytes 4k..4k+3 of every chunk).
inline __m256i fold16(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

template <bool kHasHighBit, typename Block>
float dot_k4(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i p00 = perm_idx(kK4Perm[0][0]), p01 = perm_idx(kK4Perm[0][1]);
  const __m512i p10 = perm_idx(kK4Perm[1][0]), p11 = perm_idx(kK4Perm[1][1]);
  // ggml's AVX2 Q4_K keeps the mins in a 4-lane float accumulator; its Q5_K sums them to one int per block
  // and accumulates a scalar float. Both are mirrored so the results equal llama.cpp's.
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  float summs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    const __m128i mins = mins_dot_bsums(sm + 2, y[i].bsums);
    if constexpr (kHasHighBit) {
      summs += dmin * static_cast<float>(hsum_i32x4(mins));
    } else {
      acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m);
    }
    const __m512i sc16 =
        _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
    const int8_t* q8 = y[i].qs;
    __m512i sumi = _mm512_setzero_si512();
    for (int jj = 0; jj < 2; ++jj, q8 += 128) {
      const __m512i bits = load64(x[i].qs + 64 * jj);
      __m512i lo = _mm512_and_si512(bits, m4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
      if constexpr (kHasHighBit) {
        // qh bit (2j) of byte l is the fifth bit of the low-nibble element of sub-block j-pair ..., (2j+1) of
        // the high-nibble one; this register holds sub-block pairs j = 2jj (bytes 0..31) and 2jj+1 (32..63).
        const __m256i hb = load32(x[i].qh);
        const __m512i hbz = _mm512_broadcast_i64x4(hb);
        const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(4 * jj)),
                                                 _mm256_set1_epi16(static_cast<int16_t>(4 * jj + 2)), 1);
        const __m512i hl = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(hbz, sh_lo), 4), bit4);
        const __m512i hh = _mm512_and_si512(
            _mm512_slli_epi16(_mm512_srlv_epi16(hbz, _mm512_add_epi16(sh_lo, _mm512_set1_epi16(1))), 4),
            bit4);
        lo = _mm512_or_si512(lo, hl);
        hi = _mm512_or_si512(hi, hh);
      }
      const __m512i ylo = load32x2(q8, q8 + 64);
      const __m512i yhi = load32x2(q8 + 32, q8 + 96);
      const __m512i plo = _mm512_maddubs_epi16(lo, ylo);
      const __m512i phi = _mm512_maddubs_epi16(hi, yhi);
      sumi = _mm512_dpwssd_epi32(sumi, plo, _mm512_permutexvar_epi16(jj == 0 ? p00 : p10, sc16));
      sumi = _mm512_dpwssd_epi32(sumi, phi, _mm512_permutexvar_epi16(jj == 0 ? p01 : p11, sc16));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold16(sumi)), acc);
  }
  if constexpr (kHasHighBit) {
    return hsum8(acc) + summs;
  } else {
    return hsum8(acc) + hsum4(acc_m);
  }
}

float dot_q4_K(const void* w, const void* a, int64_t n) {
  return dot_k4<false, block_q4_K>(w, a, n);
}

/// vpermw indices for the Q4_K tile: lanes [0,16) get scale 2j, [16,32) scale 2j+1.
constexpr Perm2 kK4TilePerm[4] = {make_perm2(0, 1), make_perm2(2, 3), make_perm2(4, 5), make_perm2(6, 7)};

/// matmul tile for Q4_K. Per (row, vector) and block, dot_k4<false> computes 8 int32 lanes (lane k: bytes
/// 4k..4k+3 of every 32-element chunk, times the chunk's scale), acc = fma(y.d * xd, float(lanes), acc) and
/// acc_m = fma(-y.d * xdmin, float(mins . bsum pairs), acc_m). The integer lanes are exact, so they may be
/// formed in any order: here register j holds elements 64j..64j+63 in order (low nibbles of qs[32j..32j+32)
/// then the high ones), so activations load straight from their blocks, and the nibbles and scales are
/// unpacked once per group. The float steps run on two vectors per 512-bit register (acc) and four (acc_m),
/// lane-wise the same operations as dot_k4's, so each result equals dot_q4_K bit for bit.
/// pack, per block: y.d spread for acc (kG/2 x 16 floats), -y.d spread for acc_m (kG/4 x 16) and the
/// pairwise bsums (kG/4 x 32 int16, vector v in int16 lanes [8(v%4), 8(v%4)+8)).
struct q4_K_tile {
  static constexpr int64_t kSlab = 8;  // the group's copies: 16 KiB per slab
  static constexpr size_t kBlockBytes = sizeof(block_q4_K), kActBlockBytes = sizeof(block_q8_K);
  static constexpr size_t kStateBytes = 6 * 64;
  template <int kG>
  static constexpr size_t block_pack_bytes() {
    return kG * 256 + kG / 2 * 64 + kG / 4 * 64 + kG / 4 * 64;
  }
  template <int kG>
  static size_t pack_bytes(int64_t nb) {
    return static_cast<size_t>(nb) * block_pack_bytes<kG>();
  }
  template <int kG>
  static void pack(const uint8_t* const* av, int64_t nb, uint8_t* out) {
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* qs = out + static_cast<size_t>(i) * block_pack_bytes<kG>();
      uint8_t* pk = qs + kG * 256;
      auto* yd = reinterpret_cast<float*>(pk);
      auto* ydm = reinterpret_cast<float*>(pk + kG / 2 * 64);
      auto* pairs = reinterpret_cast<__m128i*>(pk + kG / 2 * 64 + kG / 4 * 64);
#pragma GCC unroll 16
      for (int v = 0; v < kG; ++v) {
        const block_q8_K& y = reinterpret_cast<const block_q8_K*>(av[v])[i];
#pragma GCC unroll 16
        for (int l = 0; l < 8; ++l) yd[16 * (v / 2) + 8 * (v % 2) + l] = y.d;
#pragma GCC unroll 16
        for (int l = 0; l < 4; ++l) ydm[4 * v + l] = -y.d;
#pragma GCC unroll 4
        for (int m = 0; m < 4; ++m) _mm512_store_si512(qs + 256 * v + 64 * m, load64(y.qs + 64 * m));
        const __m256i b = load32(y.bsums);
        _mm_store_si128(pairs + v, _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
      }
    }
  }
  template <int kG>
  static void row(const uint8_t* wrow, const uint8_t* const* av, const uint8_t* pk, int64_t nb, float* out,
                  int64_t ldy, int nv, const Carry& carry) {
    const auto* x = reinterpret_cast<const block_q4_K*>(wrow);
    constexpr int kP = kG / 2, kQ = kG / 4;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i nibble_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512 acc[kP + kQ];  // acc: [0, kP), acc_m: [kP, kP + kQ)
    __m512* acc_m = acc + kP;
    carry_in<kP + kQ>(carry, acc);
    for (int64_t i = 0; i < nb; ++i, pk += block_pack_bytes<kG>()) {
      uint32_t sm[4];
      unpack_scale_min_k4_words(x[i].scales, sm);
      const __m512i sc16 =
          _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
      const __m512i mins = _mm512_broadcast_i32x4(
          _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 2))));
      __m512i q[4], sc[4];
#pragma GCC unroll 16
      for (int j = 0; j < 4; ++j) {
        q[j] = _mm512_and_si512(
            _mm512_srlv_epi16(_mm512_broadcast_i64x4(load32(x[i].qs + 32 * j)), nibble_shift), m4);
        sc[j] = _mm512_permutexvar_epi16(perm_idx(kK4TilePerm[j]), sc16);
      }
      const __m512 xd = _mm512_set1_ps(h2f(x[i].d));
      const __m512 xdmin = _mm512_set1_ps(h2f(x[i].dmin));
      const uint8_t* qs = pk;
      const uint8_t* pf = pk + kG * 256;
      const auto* yd = reinterpret_cast<const float*>(pf);
      const auto* ydm = reinterpret_cast<const float*>(pf + kP * 64);
      const auto* pairs = pf + kP * 64 + kQ * 64;
#pragma GCC unroll 16
      for (int p = 0; p < kP; ++p) {
        __m512i s[2];
#pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const uint8_t* q8 = qs + 256 * (2 * p + h);
          __m512i t =
              _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(q[0], load64(q8)), sc[0]);
          t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[1], load64(q8 + 64)), sc[1]);
          t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[2], load64(q8 + 128)), sc[2]);
          s[h] = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[3], load64(q8 + 192)), sc[3]);
        }
        // lanes [0,8): fold16 of vector 2p's sums, [8,16): of vector 2p+1's
        const __m512i f =
            _mm512_add_epi32(_mm512_shuffle_i64x2(s[0], s[1], 0x44), _mm512_shuffle_i64x2(s[0], s[1], 0xee));
        const __m512 d = _mm512_mul_ps(_mm512_load_ps(yd + 16 * p), xd);
        acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(f), acc[p]);
      }
#pragma GCC unroll 16
      for (int qq = 0; qq < kQ; ++qq) {
        const __m512i m = _mm512_madd_epi16(mins, _mm512_load_si512(pairs + 64 * qq));
        const __m512 dmin = _mm512_mul_ps(_mm512_load_ps(ydm + 16 * qq), xdmin);
        acc_m[qq] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(m), acc_m[qq]);
      }
    }
    // constant indices (unrolled) keep acc in registers; a variable index kept a copy on the stack
    if (!carry_out<kP + kQ>(carry, acc)) return;
#pragma GCC unroll 16
    for (int v = 0; v < kG; ++v) {
      if (v < nv)
        out[v * ldy] = hsum8(half_ps(acc[v / 2], v % 2)) + hsum4(extract_ps128(acc_m[v / 4], v % 4));
    }
  }
};

void tile_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<q4_K_tile>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK_K, y, ldy);
}
float dot_q5_K(const void* w, const void* a, int64_t n) {
  return dot_k4<true, block_q5_K>(w, a, n);
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
void rows_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
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
      acc_m = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins), acc_m);
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
      acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(fold16(_mm512_add_epi32(s0, s1))),
                            acc);
    }
    out[r] = hsum8(acc) + hsum4(acc_m);
  }
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q6_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  // Per 256-bit half of a register: left shifts 4 | 2 bring qh bits (0,1) | (2,3) to bits (4,5);
  // right shifts 0 | 2 bring bits (4,5) | (6,7) there.
  const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  const __m512i perm[2][2] = {{perm_idx(kK6Perm[0][0]), perm_idx(kK6Perm[0][1])},
                              {perm_idx(kK6Perm[1][0]), perm_idx(kK6Perm[1][1])}};
  const __m512i m32 = _mm512_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i sumi = _mm512_setzero_si512();
    const int8_t* q8 = y[i].qs;
    for (int h = 0; h < 2; ++h, q8 += 128) {
      const __m512i l = load64(x[i].ql + 64 * h);  // ql bytes 0..31 | 32..63 of this half
      const __m512i hb = _mm512_broadcast_i64x4(load32(x[i].qh + 32 * h));
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, shl), m30));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(hb, shr), m30));
      const __m512i y01 = load64(q8), y23 = load64(q8 + 64);
      // (level - 32) * y in int16 pairs, as ggml forms it (level * y - 32 * y; both fit).
      const __m512i p01 = _mm512_sub_epi16(_mm512_maddubs_epi16(q01, y01), _mm512_maddubs_epi16(m32, y01));
      const __m512i p23 = _mm512_sub_epi16(_mm512_maddubs_epi16(q23, y23), _mm512_maddubs_epi16(m32, y23));
      sumi = _mm512_dpwssd_epi32(sumi, p01, _mm512_permutexvar_epi16(perm[h][0], sc));
      sumi = _mm512_dpwssd_epi32(sumi, p23, _mm512_permutexvar_epi16(perm[h][1], sc));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(fold16(sumi)), acc);
  }
  return hsum8(acc);
}

/// Q6_K tile: vpermw indices arranging per-lane chunk terms as dpwssd pairs. Lane l (of 16) of the product
/// pairs chunks 2(l/8) and 2(l/8)+1 (+4 for the second register) at 4-byte group k = l % 8, so after fold16
/// lane k holds all eight chunks' terms of group k, as the main sums do.
struct Perm32 {
  alignas(64) int16_t idx[32];
};
/// From int16 values at position 8 * chunk + k (chunks 0..3 of a register).
constexpr Perm32 make_k6_group_perm() {
  Perm32 p{};
  for (int l = 0; l < 16; ++l) {
    for (int e = 0; e < 2; ++e) p.idx[2 * l + e] = static_cast<int16_t>(8 * (2 * (l / 8) + e) + l % 8);
  }
  return p;
}
/// From the 16 scales (one per 16 elements: chunk c, group k uses scale 2c + (k >= 4)), chunks from `c0`.
constexpr Perm32 make_k6_scale_perm(int c0) {
  Perm32 p{};
  for (int l = 0; l < 16; ++l) {
    for (int e = 0; e < 2; ++e)
      p.idx[2 * l + e] = static_cast<int16_t>(2 * (c0 + 2 * (l / 8) + e) + (l % 8 >= 4));
  }
  return p;
}
constexpr Perm32 kK6GroupPerm = make_k6_group_perm();
constexpr Perm32 kK6ScalePerm[2] = {make_k6_scale_perm(0), make_k6_scale_perm(4)};

/// matmul tile for Q6_K. Per (row, vector) and block, dot_q6_K forms 8 int32 lanes (lane k: bytes 4k..4k+3 of
/// every 32-element chunk c, sum of scale * (level - 32) * y) and acc = fma(y.d * xd, float(lanes), acc). The
/// integer lanes are exact, so here they are formed as sum(scale * level * y) (levels and scales unpacked
/// once per group) plus sum_c (-32 scale) * S4(c, k), S4 being the sums of four activations, packed once per
/// group; the float step runs on two vectors per register, lane-wise dot_q6_K's operations (bit-equal).
/// pack, per block: y.d spread (kG/2 x 16 floats), then per vector the S4 sums as two dpwssd operands.
struct q6_K_tile {
  static constexpr int64_t kSlab = 8;
  static constexpr size_t kBlockBytes = sizeof(block_q6_K), kActBlockBytes = sizeof(block_q8_K);
  static constexpr size_t kStateBytes = 4 * 64;
  template <int kG>
  static constexpr size_t block_pack_bytes() {
    return kG * 256 + kG / 2 * 64 + kG * 128;
  }
  template <int kG>
  static size_t pack_bytes(int64_t nb) {
    return static_cast<size_t>(nb) * block_pack_bytes<kG>();
  }
  template <int kG>
  static void pack(const uint8_t* const* av, int64_t nb, uint8_t* out) {
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i perm = _mm512_load_si512(kK6GroupPerm.idx);
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t* qs = out + static_cast<size_t>(i) * block_pack_bytes<kG>();
      uint8_t* pk = qs + kG * 256;
      auto* yd = reinterpret_cast<float*>(pk);
      auto* s4 = reinterpret_cast<__m512i*>(pk + kG / 2 * 64);
#pragma GCC unroll 16
      for (int v = 0; v < kG; ++v) {
        const block_q8_K& y = reinterpret_cast<const block_q8_K*>(av[v])[i];
#pragma GCC unroll 16
        for (int l = 0; l < 8; ++l) yd[16 * (v / 2) + 8 * (v % 2) + l] = y.d;
        __m256i t[4];
#pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) {
          const __m512i q8 = load64(y.qs + 64 * m);
          _mm512_store_si512(qs + 256 * v + 64 * m, q8);
          t[m] = _mm512_cvtepi32_epi16(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q8));
        }
        s4[2 * v] = _mm512_permutexvar_epi16(perm, _mm512_inserti64x4(_mm512_castsi256_si512(t[0]), t[1], 1));
        s4[2 * v + 1] =
            _mm512_permutexvar_epi16(perm, _mm512_inserti64x4(_mm512_castsi256_si512(t[2]), t[3], 1));
      }
    }
  }
  template <int kG>
  static void row(const uint8_t* wrow, const uint8_t* const* av, const uint8_t* pk, int64_t nb, float* out,
                  int64_t ldy, int nv, const Carry& carry) {
    const auto* x = reinterpret_cast<const block_q6_K*>(wrow);
    constexpr int kP = kG / 2;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
    __m512 acc[kP];
    carry_in<kP>(carry, acc);
    for (int64_t i = 0; i < nb; ++i, pk += block_pack_bytes<kG>()) {
      const __m256i sc16 =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
      const __m512i scw = _mm512_castsi256_si512(sc16);
      const __m512i scm = _mm512_castsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
      __m512i q[4], sc[4];
#pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m512i l = load64(x[i].ql + 64 * h);
        const __m512i hb = _mm512_broadcast_i64x4(load32(x[i].qh + 32 * h));
        q[2 * h] =
            _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, shl), m30));
        q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(hb, shr), m30));
        sc[2 * h] = _mm512_permutexvar_epi16(perm_idx(kK6Perm[h][0]), scw);
        sc[2 * h + 1] = _mm512_permutexvar_epi16(perm_idx(kK6Perm[h][1]), scw);
      }
      const __m512i cs0 = _mm512_permutexvar_epi16(_mm512_load_si512(kK6ScalePerm[0].idx), scm);
      const __m512i cs1 = _mm512_permutexvar_epi16(_mm512_load_si512(kK6ScalePerm[1].idx), scm);
      const __m512 xd = _mm512_set1_ps(h2f(x[i].d));
      const uint8_t* qs = pk;
      const auto* yd = reinterpret_cast<const float*>(pk + kG * 256);
      const auto* s4 = reinterpret_cast<const __m512i*>(pk + kG * 256 + kP * 64);
#pragma GCC unroll 16
      for (int p = 0; p < kP; ++p) {
        __m512i s[2];
#pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          const int v = 2 * p + h;
          const uint8_t* q8 = qs + 256 * v;
          __m512i t =
              _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(q[0], load64(q8)), sc[0]);
          t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[1], load64(q8 + 64)), sc[1]);
          t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[2], load64(q8 + 128)), sc[2]);
          t = _mm512_dpwssd_epi32(t, _mm512_maddubs_epi16(q[3], load64(q8 + 192)), sc[3]);
          t = _mm512_dpwssd_epi32(t, _mm512_load_si512(s4 + 2 * v), cs0);
          s[h] = _mm512_dpwssd_epi32(t, _mm512_load_si512(s4 + 2 * v + 1), cs1);
        }
        const __m512i f =
            _mm512_add_epi32(_mm512_shuffle_i64x2(s[0], s[1], 0x44), _mm512_shuffle_i64x2(s[0], s[1], 0xee));
        acc[p] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(yd + 16 * p), xd), _mm512_cvtepi32_ps(f), acc[p]);
      }
    }
    // constant indices (unrolled) keep acc in registers; a variable index kept a copy on the stack
    if (!carry_out<kP>(carry, acc)) return;
#pragma GCC unroll 16
    for (int v = 0; v < kG; ++v) {
      if (v < nv) out[v * ldy] = hsum8(half_ps(acc[v / 2], v % 2));
    }
  }
};

void tile_q6_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<q6_K_tile>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK_K, y, ldy);
}

// ---------------------------------------------------------------------------------------------------------
// Float formats. Two summation orders, as llama.cpp has two paths:
//  - mul_mat (dense weights): llamafile's tinyBLAS, one 16-lane accumulator over k (32 bf16 per dpbf16ps),
//    reduced with _mm512_reduce_add_ps; it requires k % 16 == 0 (bf16: 32), else ggml_vec_dot_* is used;
//  - mul_mat_id (MoE experts): ggml_vec_dot_f32 / _f16 (four 16-lane accumulators over 64-element steps,
//    reduced pairwise, leftovers added one by one, in float for F32 and double for F16) and _bf16 (two
//    dpbf16ps accumulators over 64-element steps, each reduced into a double, leftovers in double).

float dot_f32_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  const int64_t np = n & ~int64_t{63};
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j)
      sum[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * j), _mm512_loadu_ps(y + i + 16 * j), sum[j]);
  }
  sum[0] = _mm512_add_ps(sum[0], sum[2]);
  sum[1] = _mm512_add_ps(sum[1], sum[3]);
  sum[0] = _mm512_add_ps(sum[0], sum[1]);
  float sumf = _mm512_reduce_add_ps(sum[0]);
  for (int64_t i = np; i < n; ++i) sumf += x[i] * y[i];
  return sumf;
}

float dot_f32(const void* w, const void* a, int64_t n) {
  if (n % 16 != 0) return dot_f32_vec(w, a, n);
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
  return _mm512_reduce_add_ps(acc);
}

inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(load32(p));
}

float dot_f16_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  const int64_t np = n & ~int64_t{63};
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j)
      sum[j] = _mm512_fmadd_ps(load_f16x16(x + i + 16 * j), load_f16x16(y + i + 16 * j), sum[j]);
  }
  sum[0] = _mm512_add_ps(sum[0], sum[2]);
  sum[1] = _mm512_add_ps(sum[1], sum[3]);
  sum[0] = _mm512_add_ps(sum[0], sum[1]);
  double sumf = _mm512_reduce_add_ps(sum[0]);
  for (int64_t i = np; i < n; ++i) sumf += static_cast<double>(h2f(x[i]) * h2f(y[i]));
  return static_cast<float>(sumf);
}

float dot_f16(const void* w, const void* a, int64_t n) {
  if (n % 16 != 0) return dot_f16_vec(w, a, n);
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(load_f16x16(x + i), load_f16x16(y + i), acc);
  return _mm512_reduce_add_ps(acc);
}

inline float bf16f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float dot_bf16_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    c1 = _mm512_dpbf16_ps(c1, (__m512bh)load64(x + i), (__m512bh)load64(y + i));
    c2 = _mm512_dpbf16_ps(c2, (__m512bh)load64(x + i + 32), (__m512bh)load64(y + i + 32));
  }
  double sumf = 0.0;
  sumf += static_cast<double>(_mm512_reduce_add_ps(c1));
  sumf += static_cast<double>(_mm512_reduce_add_ps(c2));
  for (; i < n; ++i) sumf += static_cast<double>(bf16f(x[i]) * bf16f(y[i]));
  return static_cast<float>(sumf);
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  if (n % 32 != 0) return dot_bf16_vec(w, a, n);
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)load64(x + i), (__m512bh)load64(y + i));
  return _mm512_reduce_add_ps(acc);
}

DotKernels make_table() {
  const DotKernels* base = avx2_kernels();
  DotKernels k = base != nullptr ? *base : scalar_kernels();
  k.dot[slot(GgmlType::F32)] = dot_f32;
  k.dot[slot(GgmlType::F16)] = dot_f16;
  k.dot[slot(GgmlType::BF16)] = dot_bf16;
  for (int t = 0; t < kTypeSlots; ++t) k.dot_id[t] = k.dot[t];
  k.dot_id[slot(GgmlType::F32)] = dot_f32_vec;
  k.dot_id[slot(GgmlType::F16)] = dot_f16_vec;
  k.dot_id[slot(GgmlType::BF16)] = dot_bf16_vec;
  k.dot[slot(GgmlType::Q4_0)] = dot_q4_0;
  k.dot[slot(GgmlType::Q8_0)] = dot_q8_0;
  k.dot[slot(GgmlType::Q4_K)] = dot_q4_K;
  k.dot[slot(GgmlType::Q5_K)] = dot_q5_K;
  k.dot[slot(GgmlType::Q6_K)] = dot_q6_K;
  k.rows[slot(GgmlType::Q4_0)] = rows_nibbles<block_q4_0, block_q8_0, 8, false, false>;
  k.rows[slot(GgmlType::Q5_0)] = rows_nibbles<block_q5_0, block_q8_0, 16, true, false>;
  k.rows[slot(GgmlType::Q4_1)] = rows_nibbles<block_q4_1, block_q8_1, 0, false, true>;
  k.rows[slot(GgmlType::Q5_1)] = rows_nibbles<block_q5_1, block_q8_1, 0, true, true>;
  k.rows[slot(GgmlType::Q8_0)] = rows_q8_0;
  k.rows[slot(GgmlType::Q4_K)] = rows_q4_K;
  k.tile[slot(GgmlType::Q4_K)] = tile_q4_K;
  k.tile[slot(GgmlType::Q6_K)] = tile_q6_K;
  k.tile[slot(GgmlType::Q8_0)] = tile_q8_0;
  return k;
}

}  // namespace

const DotKernels* avx512_kernels() {
  static const DotKernels table = make_table();
  return &table;
}

}  // namespace car::tensor::detail
