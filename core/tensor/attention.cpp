// The attention head over an fp16 KV cache (see attend_head in kernels.h): the scalar version (the scalar
// table's kernel and the oracle of the SIMD ones), llama.cpp's Q.K order (dot_f16_ggml), and the entry point,
// which runs the current table's kernel.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/tensor/online_softmax.h"

namespace car::tensor {

float dot_f16_ggml(const uint16_t* x, const uint16_t* y, int64_t n) {
  // Whole chunks of 64: four 16-lane float accumulators, one FMA per element.
  const int64_t np = n & ~int64_t{63};
  float acc[4][16] = {};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 16; ++l) {
        const int64_t e = i + j * 16 + l;
        acc[j][l] = std::fma(fp16_to_fp32(x[e]), fp16_to_fp32(y[e]), acc[j][l]);
      }
    }
  }
  double sum = 0.0;
  if (np > 0) {
    // GGML_F32x16_REDUCE: accumulators pairwise (0+2, 1+3, then the two), then _mm512_reduce_add_ps's tree.
    float v[16];
    for (int l = 0; l < 16; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    float h[8];
    for (int l = 0; l < 8; ++l) h[l] = v[l + 8] + v[l];
    float q[4];
    for (int l = 0; l < 4; ++l) q[l] = h[l + 4] + h[l];
    sum = static_cast<double>((q[0] + q[2]) + (q[1] + q[3]));
  }
  for (int64_t i = np; i < n; ++i) {
    sum += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  }
  return static_cast<float>(sum);
}

void attend_head_scalar(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                        float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink) {
  for (int64_t d = 0; d < dk; ++d) q16[d] = fp32_to_fp16(q[d]);
  std::memset(acc16, 0, static_cast<size_t>(dv) * sizeof(uint16_t));
  float sum = 0.0f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t ic = 0; ic < n_kv; ++ic) {
    const float s = dot_f16_ggml(k + ic * dk, q16, dk) * scale;
    float ms, vs;
    if (detail::online_softmax_step(s, mx, ms, vs)) {
      for (int64_t d = 0; d < dv; ++d) acc16[d] = fp32_to_fp16(fp16_to_fp32(acc16[d]) * ms);
    }
    const uint16_t* vr = v + ic * dv;
    for (int64_t d = 0; d < dv; ++d) {
      acc16[d] = fp32_to_fp16(std::fma(fp16_to_fp32(vr[d]), vs, fp16_to_fp32(acc16[d])));
    }
    sum = sum * ms + vs;
  }
  if (sink == kNoSink) {
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int64_t d = 0; d < dv; ++d) out[d] = fp16_to_fp32(acc16[d]) * inv;
    return;
  }
  // The sink scales the float accumulator (after its fp16 conversion), then the sum divides it.
  const float ms = detail::online_sink_step(sink, mx, sum);
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int64_t d = 0; d < dv; ++d) out[d] = (fp16_to_fp32(acc16[d]) * ms) * inv;
}

void attend_head(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                 float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink) {
  detail::active_kernels().attend(q, k, v, n_kv, dk, dv, scale, out, q16, acc16, sink);
}

void attend_group(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                  int64_t dv, float scale, float* out, const float* sinks, uint16_t* q16, uint16_t* acc16) {
  const detail::DotKernels& kt = detail::active_kernels();
  if (kt.attend_group != nullptr && kt.attend_group(q, g, k, v, n_kv, dk, dv, scale, out, sinks)) return;
  for (int64_t h = 0; h < g; ++h) {
    kt.attend(q + h * dk, k, v, n_kv, dk, dv, scale, out + h * dv, q16, acc16,
              sinks != nullptr ? sinks[h] : kNoSink);
  }
}

}  // namespace car::tensor
