// AVX-VNNI detection and the AVX2 level's table with the AVX-VNNI tile (avx_vnni.h). Built for baseline
// x86-64.
#include "core/tensor/avx_vnni.h"

namespace car::tensor::detail {

bool avx_vnni_usable() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                             __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avxvnni");
  return usable;
#else
  return false;
#endif
}

const DotKernels* avx_vnni_kernels() {
  static const DotKernels* table = []() -> const DotKernels* {
    const DotKernels* base = avx2_kernels();
    if (base == nullptr || !avx_vnni_usable()) return nullptr;
    static DotKernels k = *base;
    k.tile_repacked[slot(GgmlType::Q4_K)] = tile_q4_K_repacked_avx_vnni;
    return &k;
  }();
  return table;
}

}  // namespace car::tensor::detail
