// AVX-512 matmul tile kernels (DotKernels::tile) for prompt batches: Q8_0, Q4_K and Q6_K, vectors in groups
// of eight, each weight block unpacked once per group (run_tiles is the driver they share). Each (row,
// vector) result equals the table's dot kernel bit for bit: the float operations of every pair are the dot
// kernel's, in its order, run on several vectors per 512-bit register; only the exact integer lanes are
// formed differently. tests/tensor/matmul_test.cpp checks that for every vector count.
#include <algorithm>
#include <cmath>
#include <new>
#include <type_traits>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

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

using Scratch = AlignedScratch;

constexpr int64_t kRowsAhead = 2;  // run_tiles: rows prefetched ahead of the one computed

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
      const size_t slab_bytes = static_cast<size_t>(ns) * Tile::kBlockBytes;
      for (int64_t r = 0; r < nrows; ++r) {
        // The slab of the row after next, into L2 while this row runs against the group (a prefetch never
        // faults, also past the matrix): rows stream from memory, and the hardware prefetcher alone left
        // the tiles waiting on them (batched decode of dense-1b Q4_K_M, 8 sequences: see docs/performance.md).
        const char* ahead = reinterpret_cast<const char*>(w + static_cast<size_t>(r + kRowsAhead) * row_bytes +
                                                          static_cast<size_t>(b0) * Tile::kBlockBytes);
        for (size_t off = 0; off < slab_bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
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
/// Q5_K (Block = block_q5_K; dot_k4<true>, issue #26): the same with each level's fifth bit from qh, and the
/// mins as dot_q5_K sums them - one exact integer per block (the 4 lanes of a vector's 128 bits added up),
/// summs = fma(-y.d * xdmin, float(it), summs) in those lanes, the result hsum8(acc) + summs.
template <class Block>
struct k4_tile {
  static constexpr bool kQ5 = std::is_same_v<Block, block_q5_K>;
  static constexpr int64_t kSlab = 8;  // the group's copies: 16 KiB per slab
  static constexpr size_t kBlockBytes = sizeof(Block), kActBlockBytes = sizeof(block_q8_K);
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
    const auto* x = reinterpret_cast<const Block*>(wrow);
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
        if constexpr (kQ5) {
          // fifth bits: qh bit 2j of byte e for element 64j + e, bit 2j + 1 for element 64j + 32 + e
          const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * j)),
                                                   _mm256_set1_epi16(static_cast<int16_t>(2 * j + 1)), 1);
          const __m512i hb = _mm512_and_si512(
              _mm512_srlv_epi16(_mm512_broadcast_i64x4(load32(x[i].qh)), shift), _mm512_set1_epi8(1));
          q[j] = _mm512_or_si512(q[j], _mm512_slli_epi16(hb, 4));
        }
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
        __m512i m = _mm512_madd_epi16(mins, _mm512_load_si512(pairs + 64 * qq));
        if constexpr (kQ5) {  // each vector's 4 lanes summed (exact), in all 4
          m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
          m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_CDAB));
        }
        const __m512 dmin = _mm512_mul_ps(_mm512_load_ps(ydm + 16 * qq), xdmin);
        acc_m[qq] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(m), acc_m[qq]);
      }
    }
    // constant indices (unrolled) keep acc in registers; a variable index kept a copy on the stack
    if (!carry_out<kP + kQ>(carry, acc)) return;
#pragma GCC unroll 16
    for (int v = 0; v < kG; ++v) {
      if (v < nv) {
        const __m128 m = extract_ps128(acc_m[v / 4], v % 4);
        out[v * ldy] = hsum8(half_ps(acc[v / 2], v % 2)) + (kQ5 ? _mm_cvtss_f32(m) : hsum4(m));
      }
    }
  }
};
using q4_K_tile = k4_tile<block_q4_K>;

void tile_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<q4_K_tile>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK_K, y, ldy);
}

void tile_q5_K_pairs(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                     int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<k4_tile<block_q5_K>>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK_K, y, ldy);
}

/// matmul tile for Q6_K. Per (row, vector) and block, dot_q6_K forms 8 int32 lanes (lane k: bytes 4k..4k+3 of
/// every 32-element chunk, sum of scale * level * y, minus ggml's offset 32 * (bsums[2k] sc[2k] + bsums[2k+1]
/// sc[2k+1])) and acc = fma(y.d * xd, float(lanes), acc). Here levels and scales are unpacked once per group,
/// the offset joins the folded sums by one vpdpwssd of a vector pair's bsums (packed side by side) with -32 x
/// the row's scales, and the float step runs on two vectors per register, lane-wise dot_q6_K's operations
/// (bit-equal). pack, per block: the vectors' quants, y.d spread (kG/2 x 16 floats), then per vector pair the
/// bsums.
struct q6_K_tile {
  static constexpr int64_t kSlab = 8;
  static constexpr size_t kBlockBytes = sizeof(block_q6_K), kActBlockBytes = sizeof(block_q8_K);
  static constexpr size_t kStateBytes = 4 * 64;
  template <int kG>
  static constexpr size_t block_pack_bytes() {
    return kG * 256 + kG / 2 * 64 + kG / 2 * 64;
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
      uint8_t* bs = pk + kG / 2 * 64;
#pragma GCC unroll 16
      for (int v = 0; v < kG; ++v) {
        const block_q8_K& y = reinterpret_cast<const block_q8_K*>(av[v])[i];
#pragma GCC unroll 16
        for (int l = 0; l < 8; ++l) yd[16 * (v / 2) + 8 * (v % 2) + l] = y.d;
#pragma GCC unroll 16
        for (int m = 0; m < 4; ++m) _mm512_store_si512(qs + 256 * v + 64 * m, load64(y.qs + 64 * m));
        _mm256_store_si256(reinterpret_cast<__m256i*>(bs + 64 * (v / 2) + 32 * (v % 2)), load32(y.bsums));
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
      // -32 x the scales (|.| <= 4096, an int16): the offsets join the folded sums by one vpdpwssd
      const __m512i sc2 =
          _mm512_broadcast_i64x4(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5)));
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
      const __m512 xd = _mm512_set1_ps(h2f(x[i].d));
      const uint8_t* qs = pk;
      const auto* yd = reinterpret_cast<const float*>(pk + kG * 256);
      const auto* bs = reinterpret_cast<const __m512i*>(pk + kG * 256 + kP * 64);
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
        // lanes [0,8): fold16 of vector 2p's sums, [8,16): of vector 2p+1's; then the offsets, same layout
        const __m512i f = _mm512_dpwssd_epi32(
            _mm512_add_epi32(_mm512_shuffle_i64x2(s[0], s[1], 0x44), _mm512_shuffle_i64x2(s[0], s[1], 0xee)),
            _mm512_load_si512(bs + p), sc2);
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

}  // namespace

/// The VNNI tiles of the K-quants in ggml's vec_dot order (matmul_k_vnni.cpp): 16 rows a register.
void tile_q5_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q3_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q2_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
/// The VNNI tiles of the 32-element types with offsets or mins (matmul_legacy_vnni.cpp): 16 rows a register.
void tile_q4_1_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q5_0_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q5_1_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);
/// The repacked Q2_K tile (DotKernels::tile_repacked; matmul_q2k_vnni.cpp): vpdpbusd sums, 16 rows a
/// register, bit-equal to dot_q2_K_q8_K_gemm_ref / _gemv_ref.
void tile_q2_K_repacked_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                             size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                             const uint8_t* gemm);

void tile_q8_0(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  run_tiles<q8_0_tile>(w, row_bytes, nrows, acts, act_bytes, nvec, n / QK8_0, y, ldy);
}

/// Q5_K: below kQ5KPairsBelow vectors the two-vector maddubs tile (its per-row unpacking is shared by 8
/// vectors, the VNNI tile's transpose and int16 widening by all of them), else the VNNI tile; the same bits.
void tile_q5_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy) {
  constexpr int64_t kQ5KPairsBelow = 64;  // PromptTile/Q5_K: par at ~32-64 vectors
  (nvec < kQ5KPairsBelow ? tile_q5_K_pairs : tile_q5_K_vnni)(w, row_bytes, nrows, acts, act_bytes, nvec, n, y,
                                                             ldy);
}

void add_matmul_kernels(DotKernels& k) {
  k.tile_repacked[slot(GgmlType::Q4_K)] = tile_q4_K_repacked_vnni;
  k.interleaved[slot(GgmlType::Q4_K)] = {interleave_q4_K_vnni, rows_q4_K_interleaved_gemv,
                                         rows_q4_K_interleaved_gemv_few, tile_q4_K_interleaved_vnni};
  k.interleaved[slot(GgmlType::Q6_K)] = {interleave_q6_K, rows_q6_K_interleaved, rows_q6_K_interleaved_few,
                                         tile_q6_K_interleaved};
  k.tile_repacked[slot(GgmlType::Q2_K)] = tile_q2_K_repacked_vnni;
  k.tile[slot(GgmlType::Q4_K)] = tile_q4_K;
  k.tile[slot(GgmlType::Q6_K)] = tile_q6_K;
  k.tile[slot(GgmlType::Q8_0)] = tile_q8_0_vnni;
  k.tile_group[slot(GgmlType::Q8_0)] = 16;
  k.tile[slot(GgmlType::Q5_K)] = tile_q5_K;
  k.tile_group[slot(GgmlType::Q5_K)] = 16;
  k.tile[slot(GgmlType::Q3_K)] = tile_q3_K_vnni;
  k.tile_group[slot(GgmlType::Q3_K)] = 16;
  k.tile[slot(GgmlType::Q2_K)] = tile_q2_K_vnni;  // Q2_K matrices llama.cpp does not repack (repacked())
  k.tile_group[slot(GgmlType::Q2_K)] = 16;
  k.tile[slot(GgmlType::Q4_1)] = tile_q4_1_vnni;
  k.tile_group[slot(GgmlType::Q4_1)] = 16;
  k.tile[slot(GgmlType::Q5_0)] = tile_q5_0_vnni;
  k.tile_group[slot(GgmlType::Q5_0)] = 16;
  k.tile[slot(GgmlType::Q5_1)] = tile_q5_1_vnni;
  k.tile_group[slot(GgmlType::Q5_1)] = 16;
}

}  // namespace car::tensor::detail::avx512
