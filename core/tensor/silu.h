// llama.cpp's SwiGLU on x86 with AVX-512 (ggml_vec_swiglu_f32 over ggml_v_silu and ggml_v_expf, vec.h):
// silu(x) = x / (1 + e), e = its own polynomial exp of -x, not the C library's expf; the result times the up
// value. The engine's SwiGLU follows it bit for bit (issue #27: the C library's expf differs in the last bit
// now and then, and where that value is next rounded to Q8_0 for the down projection a last-bit difference
// can move a whole quantum). The scalar functions here are the reference; the table's kernel (DotKernels::
// swiglu: scalar, or AVX2 + FMA in silu_avx2.cpp) gives the same bits.
#pragma once

#include <cmath>
#include <cstdint>

namespace car::tensor::detail {

/// ggml_v_expf's AVX-512 arithmetic for one value: x = n ln2 + b (n by the round-to-integer trick of adding
/// 1.5 * 2^23, ln2 split in two), a degree-5 polynomial in b by FMAs, scaled by 2^n (_mm512_scalef_ps, which
/// rounds once: ldexp does the same); |n| > 192 gives +inf above and 0 below.
inline float exp_ggml(float x) {
  const float r = 0x1.8p23f;
  const float n = std::fma(x, 0x1.715476p+0f, r) - r;
  if (std::isnan(n)) return n;
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  return std::ldexp(j, static_cast<int>(n));
}

/// ggml_v_silu: x / (1 + exp_ggml(0 - x)).
inline float silu_ggml(float x) {
  return x / (1.0f + exp_ggml(0.0f - x));
}

/// out[i] = silu_ggml(gate[i]) * up[i] for i in [0, n); out may alias gate or up. The scalar table's kernel.
void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n);

/// The same with AVX2 and FMA, 8 values at a time (silu_avx2.cpp).
void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n);

}  // namespace car::tensor::detail
