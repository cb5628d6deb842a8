// swiglu_scalar and the entry point tensor::swiglu (silu.h, kernels.h).
#include "core/tensor/silu.h"

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"

namespace car::tensor {
namespace detail {

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_ggml(gate[i]) * up[i];
}

}  // namespace detail

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  detail::active_kernels().swiglu(gate, up, out, n);
}

}  // namespace car::tensor
