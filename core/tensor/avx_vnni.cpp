// AVX-VNNI detection and the AVX2 level's table with the AVX-VNNI tile (avx_vnni.h). Built for baseline
// x86-64.
#include "core/tensor/avx_vnni.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace car::tensor::detail {

bool avx_vnni_usable() {
#if defined(__x86_64__)
  // CPUID.(EAX=7,ECX=1):EAX bit 4 (read directly: clang 14's __builtin_cpu_supports has no "avxvnni"). The
  // AVX2 check includes the OS's YMM state, which AVX-VNNI uses too.
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return (eax & (1u << 4)) != 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
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
