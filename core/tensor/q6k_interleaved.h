// Internal to core/tensor: the interleaved Q6_K layout (MatrixView::interleaved; issue #25) - where each
// byte of a group of 16 rows goes, and the portable writer and reader of one super-block of such a group.
// The AVX-512 products that read it are in matmul_q6k_vnni.cpp.
//
// Why this shape: the dot order the products must keep (dot_q6_K_q8_K_x86_ref) forms, per row and
// super-block, 8 exact int32 lanes; lane l sums, over the 8 chunks c of 32 elements, scale[2c + l / 4] times
// the products of elements 32c + 4l .. 32c + 4l + 3. With one row per int32 lane of a 512-bit register, the 4
// levels of (chunk c, lane l) for 16 rows are one 64-byte register: one vpmaddubsw against the vector's 4
// quants broadcast and one vpdpwssd by the rows' scales add them into lane l's sums of all 16 rows, with no
// horizontal reduction and each row's levels unpacked once for every vector (the file layout's one-row
// kernel unpacks them per row at ~2.8x the instructions). 6-bit levels, 4 to 3 bytes: of four chunks'
// registers A, B, C, D, three are stored with D's bits in their top two (A | D[0..1] << 6, B | D[2..3] << 6,
// C | D[4..5] << 6): A, B and C are one AND each, D six operations - fewer than the file's split of 4 low and
// 2 high bits over two registers. The super-block of 16 rows keeps the 16 rows' file bytes exactly (3360), so
// a group of 16 rows takes 16 * row_bytes wherever it sits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/tensor/blocks.h"

namespace car::tensor::detail::q6k {

constexpr int kRows = 16;             ///< rows per interleaved group: one int32 lane each
constexpr size_t kBlockBytes = 3360;  ///< one super-block of a group: 16 * sizeof(block_q6_K)
constexpr size_t kDOffset = 0;        ///< [row r]: row r's d (fp16)
constexpr size_t kScaleOffset = 32;   ///< [l][row r][2]: row r's scales 2l, 2l + 1 (int8)
/// The levels (level_offset), after d and the scales: the kernels read each super-block in address order.
constexpr size_t kLevelOffset = 288;
static_assert(kRows * sizeof(block_q6_K) == kBlockBytes);

/// The 64-byte register j (0, 1, 2) of lane l's chunks 4u .. 4u + 3 (u = 0, 1): byte 4r + e is row r's level
/// of element 32(4u + j) + 4l + e in its low 6 bits and bits 2j, 2j + 1 of the level of element
/// 32(4u + 3) + 4l + e in its top two.
constexpr size_t level_offset(int l, int u, int j) {
  return kLevelOffset + static_cast<size_t>(((l * 2 + u) * 3 + j) * 64);
}

/// A row's 256 levels (0..63) from its file block, in element order.
inline void unpack_levels(const block_q6_K& x, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = x.ql + 64 * h;
    const uint8_t* qh = x.qh + 32 * h;
    uint8_t* o = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      o[l] = static_cast<uint8_t>((ql[l] & 0xf) | ((qh[l] & 3) << 4));
      o[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
      o[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      o[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

/// The inverse: a row's file block's quants from its 256 levels.
inline void pack_levels(const uint8_t* q, block_q6_K& x) {
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = x.ql + 64 * h;
    uint8_t* qh = x.qh + 32 * h;
    const uint8_t* i = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((i[l] & 0xf) | ((i[l + 64] & 0xf) << 4));
      ql[l + 32] = static_cast<uint8_t>((i[l + 32] & 0xf) | ((i[l + 96] & 0xf) << 4));
      qh[l] = static_cast<uint8_t>((i[l] >> 4) | ((i[l + 32] >> 4) << 2) | ((i[l + 64] >> 4) << 4) |
                                   ((i[l + 96] >> 4) << 6));
    }
  }
}

/// Write super-block i of rows x(0) .. x(15) (x(r): row r's block i) interleaved into out (kBlockBytes).
template <class Row>
void write_block(Row x, uint8_t* out) {
  uint8_t q[kRows][256];
  for (int r = 0; r < kRows; ++r) unpack_levels(x(r), q[r]);
  for (int l = 0; l < 8; ++l) {
    for (int u = 0; u < 2; ++u) {
      for (int r = 0; r < kRows; ++r) {
        for (int e = 0; e < 4; ++e) {
          const int at = 4 * l + e;
          const int d = q[r][32 * (4 * u + 3) + at];
          for (int j = 0; j < 3; ++j) {
            out[level_offset(l, u, j) + 4 * r + e] =
                static_cast<uint8_t>(q[r][32 * (4 * u + j) + at] | (((d >> (2 * j)) & 3) << 6));
          }
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const block_q6_K& b = x(r);
    for (int l = 0; l < 8; ++l) {
      std::memcpy(out + kScaleOffset + 32 * l + 2 * r, b.scales + 2 * l, 2);
    }
    std::memcpy(out + kDOffset + 2 * r, &b.d, 2);
  }
}

/// Read super-block `in` of an interleaved group back into the 16 rows' file blocks x(0) .. x(15).
template <class Row>
void read_block(const uint8_t* in, Row x) {
  for (int r = 0; r < kRows; ++r) {
    uint8_t q[256];
    for (int l = 0; l < 8; ++l) {
      for (int u = 0; u < 2; ++u) {
        for (int e = 0; e < 4; ++e) {
          const int at = 4 * l + e;
          int d = 0;
          for (int j = 0; j < 3; ++j) {
            const uint8_t v = in[level_offset(l, u, j) + 4 * r + e];
            q[32 * (4 * u + j) + at] = v & 0x3f;
            d |= (v >> 6) << (2 * j);
          }
          q[32 * (4 * u + 3) + at] = static_cast<uint8_t>(d);
        }
      }
    }
    block_q6_K& b = x(r);
    pack_levels(q, b);
    for (int l = 0; l < 8; ++l) std::memcpy(b.scales + 2 * l, in + kScaleOffset + 32 * l + 2 * r, 2);
    std::memcpy(&b.d, in + kDOffset + 2 * r, 2);
  }
}

}  // namespace car::tensor::detail::q6k
