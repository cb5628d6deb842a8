// AMX (Advanced Matrix Extensions) in core/tensor: detection, the kernels, and where they enter the tables.
//
// AMX's tile multiplies (tdpbusd: u8 x s8 into int32 tiles) are an extension of the AVX-512 level, not an
// ISA of their own: when the CPU has AMX-TILE and AMX-INT8 and Linux grants this process the tile state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), requested once, before the first use), the AVX-512
// level's table is amx_kernels() - the AVX-512 table with the AMX tiles in place of the VNNI ones. Forcing a
// lower ISA (CAR_INFERENCE_ISA=avx2 / scalar) leaves AMX out with the rest of AVX-512. Every AMX kernel gives
// the bits of the kernel it replaces (the same scalar reference), so the choice changes speed only.
//
// The kernels are written once against the tile layer of amx_tiles.h and built twice: on the instructions
// (the table's) and on their emulation (for tests, on any AVX-512 CPU).
//
// Thread safety: amx_usable() and amx_kernels() are safe to call from any thread (computed once).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

/// CPUID reports AMX-TILE and AMX-INT8 and the kernel granted the tile data state (Linux only; the first
/// call makes the request). false on builds without the AMX kernels.
bool amx_usable();
/// The AVX-512 table with the AMX tiles, or null unless amx_usable() (and the CPU has the AVX-512 level).
const DotKernels* amx_kernels();

/// The check amx_kernels() makes before the AMX tile serves a product: `candidate` gives `vnni`'s Q4_K tile's
/// bits on a product of its own (48 rows, three groups of 16, x 20 vectors, a whole tile of 16 and a tail;
/// both orders). The AMX tile has run on the emulated instructions only where this project is tested, so a
/// CPU whose real tiles disagree keeps the VNNI tile (the same bits, slower) and says so on stderr once,
/// rather than answering wrong. Needs the AVX-512 level (vnni's tile).
bool q4_K_tile_agrees(const DotKernels& vnni, RepackedTileFn candidate);

/// The repacked Q4_K tile (RepackedTileFn; both orders, bit-equal to dot_q4_K_q8_K_gemm_ref / _gemv_ref) on
/// AMX tiles, 16 rows x 16 vectors per tdpbusd. Only where amx_usable(). Fewer than 16 vectors run the VNNI
/// tile (the same bits).
void tile_q4_K_repacked_amx(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                            size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                            const uint8_t* gemm);
/// The same kernel on the emulated tiles (amx_tiles.h EmulatedTiles), every vector count; needs the AVX-512
/// level only. For tests.
void tile_q4_K_repacked_amx_emulated(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                     size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                     const uint8_t* gemm);

}  // namespace car::tensor::detail
