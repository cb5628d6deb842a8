// Internal to core/tensor: unpacking of the K-quants' packed sub-block scales (shared by the dequantizers and
// the dot kernels of every ISA).
#pragma once

#include <cstdint>
#include <cstring>

namespace car::tensor::detail {

/// Q3_K's 16 six-bit scales (still offset by 32) from the 12 packed bytes.
inline void unpack_q3_K_scales(const uint8_t* packed, int8_t* out) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

/// Q4_K / Q5_K scale and min j (0..7) from the 12 packed bytes.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// The same unpacking as whole words (ggml's utmp trick): out[0..1] hold the 8 scales, out[2..3] the 8 mins,
/// one byte each in order. Branch-free; used by the SIMD kernels.
inline void unpack_scale_min_k4_words(const uint8_t* q, uint32_t* out) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, q, 12);
  out[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  out[2] = u[1] & kmask1;
  out[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  out[0] = u[0] & kmask1;
}

/// All 8 scales then all 8 mins of a Q4_K / Q5_K block: out[0..7] scales, out[8..15] mins.
inline void unpack_scale_min_k4(const uint8_t* q, uint8_t* out) {
  for (int j = 0; j < 8; ++j) get_scale_min_k4(j, q, &out[j], &out[8 + j]);
}

}  // namespace car::tensor::detail
