// Placeholder tables until the SIMD kernel files land: no AVX2 / AVX-512 kernels in this build.
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
const DotKernels* avx2_kernels() { return nullptr; }
const DotKernels* avx512_kernels() { return nullptr; }
}  // namespace car::tensor::detail
