// AVX-512 dot kernels (F, BW, VL, DQ, VNNI, BF16). Placeholder: starts as the AVX2 table.
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
const DotKernels* avx512_kernels() { return avx2_kernels(); }
}  // namespace car::tensor::detail
