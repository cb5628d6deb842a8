// AMX detection with Linux's permission request, and the AMX table (amx.h). Built for baseline x86-64: it
// runs on every CPU, before anything knows which kernels the CPU can take.
#include "core/tensor/amx.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace car::tensor::detail {

bool amx_usable() {
  static const bool usable = [] {
#if !defined(__x86_64__)
    return false;
#else
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;  // CPUID.(EAX=7,ECX=0):EDX
    if ((edx & kAmxTile) == 0 || (edx & kAmxInt8) == 0) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    // The tile data state is off for a process until it asks (Linux 5.16+); without it the first tile
    // instruction faults. The grant is process-wide.
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
#endif
  }();
  return usable;
}

const DotKernels* amx_kernels() {
  static const DotKernels* table = []() -> const DotKernels* {
    const DotKernels* base = avx512_kernels();
    if (base == nullptr || !amx_usable()) return nullptr;
    static DotKernels k = *base;
    k.tile_repacked[slot(GgmlType::Q4_K)] = tile_q4_K_repacked_amx;
    return &k;
  }();
  return table;
}

}  // namespace car::tensor::detail
