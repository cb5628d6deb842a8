// Internal to core/tensor's AMX kernels: the thin layer every tile operation goes through, in two
// interchangeable forms with one interface.
//
//   NativeTiles   - the AMX instructions themselves (ldtilecfg, tileloadd, tilezero, tdpbusd, tilestored,
//                   tilerelease); only in files compiled with -mamx-tile -mamx-int8 (GCC's __AMX_INT8__, clang's __AMXINT8__), only run
//                   where amx_usable() (amx.h) said yes.
//   EmulatedTiles - the same operations in plain C++ on eight 1 KiB arrays, written from Intel's documented
//                   semantics (SDM vol. 2, TILELOADD / TDPBUSD / TILESTORED; palette 1), so a kernel written
//                   against this interface is tested bit for bit on a CPU without AMX.
//
// Semantics the emulation keeps (palette 1: 8 tiles of at most 16 rows x 64 bytes, configured by a 64-byte
// TileConfig): tileloadd reads rows[t] rows of colsb[t] bytes at base + r * stride and zeroes the rest of the
// register; tdpbusd C, A, B requires rows(C) == rows(A), colsb(A) / 4 == rows(B), colsb(C) == colsb(B) and
// adds to each dword C[m][n] the sum over k < colsb(A) / 4 of the 4 products of unsigned bytes
// A[m][4k..4k+3] with signed bytes B[k][4n..4n+3] (int32, wrapping, no saturation), zeroing what lies past
// C's configured size; tilestored writes rows[t] rows of colsb[t] bytes. A shape that the hardware would
// fault on (#UD) aborts here (CAR_CHECK).
//
// Thread safety: a tile set belongs to the thread that configured it (the hardware's tiles are per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/util/result.h"

#if (defined(__AMX_INT8__) || defined(__AMXINT8__)) && (defined(__AMX_TILE__) || defined(__AMXTILE__))
#include <immintrin.h>
#endif

namespace car::tensor::detail::amx {

/// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  ///< bytes per row of tile t (t < 8)
  uint8_t rows[16] = {};    ///< rows of tile t
};
static_assert(sizeof(TileConfig) == 64);

inline constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

class EmulatedTiles {
 public:
  void configure(const TileConfig& c) {
    CAR_CHECK(c.palette_id == 1);
    for (int t = 0; t < kTiles; ++t) CAR_CHECK(c.rows[t] <= kMaxRows && c.colsb[t] <= kMaxColsb);
    cfg_ = c;
    std::memset(t_, 0, sizeof(t_));
  }
  template <int T>
  void load(const void* base, size_t stride) {
    static_assert(T >= 0 && T < kTiles);
    std::memset(t_[T], 0, sizeof(t_[T]));
    for (int r = 0; r < cfg_.rows[T]; ++r) {
      std::memcpy(t_[T][r], static_cast<const uint8_t*>(base) + static_cast<size_t>(r) * stride,
                  cfg_.colsb[T]);
    }
  }
  template <int T>
  void zero() {
    static_assert(T >= 0 && T < kTiles);
    std::memset(t_[T], 0, sizeof(t_[T]));
  }
  /// C += A (u8) x B (s8), dword sums of 4 products.
  template <int C, int A, int B>
  void dpbusd() {
    static_assert(C != A && C != B && A != B && C < kTiles && A < kTiles && B < kTiles);
    CAR_CHECK(cfg_.rows[C] == cfg_.rows[A] && cfg_.colsb[A] / 4 == cfg_.rows[B] &&
              cfg_.colsb[C] == cfg_.colsb[B]);
    CAR_CHECK(cfg_.colsb[A] % 4 == 0 && cfg_.colsb[C] % 4 == 0);
    for (int m = 0; m < cfg_.rows[C]; ++m) {
      for (int n = 0; n < cfg_.colsb[C] / 4; ++n) {
        uint32_t acc;
        std::memcpy(&acc, &t_[C][m][4 * n], 4);
        for (int k = 0; k < cfg_.colsb[A] / 4; ++k) {
          int32_t s = 0;
          for (int i = 0; i < 4; ++i) {
            s += static_cast<int32_t>(t_[A][m][4 * k + i]) *
                 static_cast<int32_t>(static_cast<int8_t>(t_[B][k][4 * n + i]));
          }
          acc += static_cast<uint32_t>(s);  // wraps like the hardware's dword add
        }
        std::memcpy(&t_[C][m][4 * n], &acc, 4);
      }
      std::memset(&t_[C][m][cfg_.colsb[C]], 0, kMaxColsb - cfg_.colsb[C]);
    }
    for (int m = cfg_.rows[C]; m < kMaxRows; ++m) std::memset(t_[C][m], 0, kMaxColsb);
  }
  template <int T>
  void store(void* base, size_t stride) const {
    static_assert(T >= 0 && T < kTiles);
    for (int r = 0; r < cfg_.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + static_cast<size_t>(r) * stride, t_[T][r], cfg_.colsb[T]);
    }
  }
  void release() { cfg_ = TileConfig{}; }

 private:
  TileConfig cfg_{};
  uint8_t t_[kTiles][kMaxRows][kMaxColsb] = {};
};

#if (defined(__AMX_INT8__) || defined(__AMXINT8__)) && (defined(__AMX_TILE__) || defined(__AMXTILE__))
// The intrinsics take the tile number as a literal (it is pasted into the instruction's text).
#define CAR_AMX_EACH_TILE(T, OP)   \
  if constexpr ((T) == 0) {        \
    OP(0);                         \
  } else if constexpr ((T) == 1) { \
    OP(1);                         \
  } else if constexpr ((T) == 2) { \
    OP(2);                         \
  } else if constexpr ((T) == 3) { \
    OP(3);                         \
  } else if constexpr ((T) == 4) { \
    OP(4);                         \
  } else if constexpr ((T) == 5) { \
    OP(5);                         \
  } else if constexpr ((T) == 6) { \
    OP(6);                         \
  } else {                         \
    static_assert((T) == 7);       \
    OP(7);                         \
  }

/// The instructions. Tile numbers are template arguments because the instructions encode them.
struct NativeTiles {
  void configure(const TileConfig& c) { _tile_loadconfig(&c); }
  template <int T>
  void load(const void* base, size_t stride) {
#define CAR_AMX_LOAD(t) _tile_loadd(t, base, static_cast<long>(stride))
    CAR_AMX_EACH_TILE(T, CAR_AMX_LOAD)
#undef CAR_AMX_LOAD
  }
  template <int T>
  void zero() {
#define CAR_AMX_ZERO(t) _tile_zero(t)
    CAR_AMX_EACH_TILE(T, CAR_AMX_ZERO)
#undef CAR_AMX_ZERO
  }
  /// The products the kernels use: C = 4 + i, A = i, B = 2 + i for i in {0, 1}.
  template <int C, int A, int B>
  void dpbusd() {
    static_assert(A < 2 && B == A + 2 && C == A + 4, "add the tile triple to NativeTiles::dpbusd");
    if constexpr (A == 0) {
      _tile_dpbusd(4, 0, 2);
    } else {
      _tile_dpbusd(5, 1, 3);
    }
  }
  template <int T>
  void store(void* base, size_t stride) const {
#define CAR_AMX_STORE(t) _tile_stored(t, base, static_cast<long>(stride))
    CAR_AMX_EACH_TILE(T, CAR_AMX_STORE)
#undef CAR_AMX_STORE
  }
  void release() {
    _tile_release();
  }
};
#undef CAR_AMX_EACH_TILE
#endif

}  // namespace car::tensor::detail::amx
