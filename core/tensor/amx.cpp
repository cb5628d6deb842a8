// AMX detection with Linux's permission request, and the AMX table (amx.h). Built for baseline x86-64: it
// runs on every CPU, before anything knows which kernels the CPU can take.
#include "core/tensor/amx.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/tensor/kernels.h"

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

bool q4_K_tile_agrees(const DotKernels& vnni, RepackedTileFn candidate) {
  constexpr int64_t kRows = 48, kVec = 20, kCols = 2 * 256;
  const size_t rb = row_bytes(GgmlType::Q4_K, kCols), ab = row_bytes(GgmlType::Q8_K, kCols);
  std::vector<uint8_t> w(rb * kRows), acts(ab * kVec);
  std::vector<float> x(static_cast<size_t>(kCols));
  uint32_t state = 0x9e3779b9u;  // xorshift: no dependence on <random>'s implementation
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return static_cast<float>(static_cast<int32_t>(state)) * 0x1p-31f;
  };
  for (int64_t r = 0; r < kRows; ++r) {
    for (auto& v : x) v = next();
    quantize_row(GgmlType::Q4_K, x.data(), w.data() + rb * static_cast<size_t>(r), kCols);
  }
  for (int64_t v = 0; v < kVec; ++v) {
    for (auto& e : x) e = next() * 4.0f;
    quantize_act_q8_K(x.data(), acts.data() + ab * static_cast<size_t>(v), kCols);
  }
  std::vector<uint8_t> orders(kVec);
  for (int64_t v = 0; v < kVec; ++v) orders[static_cast<size_t>(v)] = static_cast<uint8_t>(v % 3 != 0);
  std::vector<float> want(static_cast<size_t>(kRows * kVec)), got(want.size());
  for (const uint8_t* gemm : {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(orders.data())}) {
    vnni.tile_repacked[slot(GgmlType::Q4_K)](w.data(), rb, kRows, acts.data(), ab, kVec, kCols, want.data(), kRows,
                                             gemm);
    candidate(w.data(), rb, kRows, acts.data(), ab, kVec, kCols, got.data(), kRows, gemm);
    if (std::memcmp(want.data(), got.data(), sizeof(float) * want.size()) != 0) return false;
  }
  return true;
}

const DotKernels* amx_kernels() {
  static const DotKernels* table = []() -> const DotKernels* {
    const DotKernels* base = avx512_kernels();
    if (base == nullptr || !amx_usable() || base->tile_repacked[slot(GgmlType::Q4_K)] == nullptr) return nullptr;
    if (!q4_K_tile_agrees(*base, tile_q4_K_repacked_amx)) {
      std::fprintf(stderr,
                   "car-inference: the AMX Q4_K tile disagrees with the VNNI tile on this CPU; using VNNI "
                   "(please report)\n");
      return nullptr;
    }
    static DotKernels k = *base;
    k.tile_repacked[slot(GgmlType::Q4_K)] = tile_q4_K_repacked_amx;
    // The AMX tile reads the file's layout: no Q4_K matrix is interleaved under this table, so prompts keep it.
    k.interleaved[slot(GgmlType::Q4_K)] = {};
    return &k;
  }();
  return table;
}

}  // namespace car::tensor::detail
