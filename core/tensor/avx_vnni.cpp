// AVX-VNNI detection and the AVX2 level's table with the AVX-VNNI tile (avx_vnni.h). Built for baseline
// x86-64.
#include "core/tensor/avx_vnni.h"

#include <utility>

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
    k.tile_repacked[slot(GgmlType::Q2_K)] = tile_q2_K_repacked_avx_vnni;
    k.tile_repacked[slot(GgmlType::Q4_0)] =
        tile_q4_0_repacked_avx_vnni;  // the AVX2 level: loops over dot_gemv
    k.tile_repacked[slot(GgmlType::IQ4_NL)] = tile_iq4_nl_repacked_avx_vnni;
    k.tile_repacked[slot(GgmlType::MXFP4)] = tile_mxfp4_repacked_avx_vnni;
    // The types without an AVX2 tile (issue #26; the AVX2 level runs Q6_K and Q8_0 as loops over their dot
    // kernels): 8 rows per register, matmul hands them whole groups.
    const std::pair<GgmlType, TileFn> tiles[] = {
        {GgmlType::Q5_K, tile_q5_K_avx_vnni}, {GgmlType::Q3_K, tile_q3_K_avx_vnni},
        {GgmlType::Q6_K, tile_q6_K_avx_vnni}, {GgmlType::Q4_1, tile_q4_1_avx_vnni},
        {GgmlType::Q5_0, tile_q5_0_avx_vnni}, {GgmlType::Q5_1, tile_q5_1_avx_vnni},
        {GgmlType::Q8_0, tile_q8_0_avx_vnni}};
    for (const auto& [t, fn] : tiles) {
      k.tile[slot(t)] = fn;
      k.tile_group[slot(t)] = 8;
    }
    return &k;
  }();
  return table;
}

}  // namespace car::tensor::detail
