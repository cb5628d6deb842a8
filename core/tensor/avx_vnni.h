// AVX-VNNI (the VEX, 256-bit vpdpbusd of AVX2 cores such as Alder Lake) in core/tensor: detection, the
// kernels, and their table.
//
// Like AMX for the AVX-512 level (amx.h), AVX-VNNI extends the AVX2 level: where the CPU reports it, the AVX2
// level's table is avx_vnni_kernels() - the AVX2 table with the 256-bit VNNI prompt tiles: repacked Q4_K
// (matmul_q4k_vnni256.h), repacked Q2_K, Q4_0, IQ4_NL, MXFP4 and the vec_dot-order Q5_K, Q3_K, Q6_K, Q4_1,
// Q5_0, Q5_1, Q8_0 (matmul_tiles_vnni256.h), each giving the bits of the loop over the dot kernels it
// replaces. An AVX-512 CPU keeps its own table; CAR_INFERENCE_ISA=avx2 on a CPU with both selects this one,
// =scalar neither.
//
// Thread safety: safe from any thread (computed once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

/// CPUID reports AVX-VNNI (and the AVX2 level).
bool avx_vnni_usable();
/// The AVX2 table with the AVX-VNNI tile, or null unless avx_vnni_usable().
const DotKernels* avx_vnni_kernels();

/// The repacked Q4_K tile (RepackedTileFn; both orders, bit-equal to dot_q4_K_q8_K_gemm_ref / _gemv_ref),
/// 8 rows per register: on the VEX vpdpbusd (only where avx_vnni_usable()), and the same source on the EVEX
/// 256-bit vpdpbusd of AVX-512 VL + VNNI (identical semantics; for tests on CPUs without AVX-VNNI).
void tile_q4_K_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                 size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                 const uint8_t* gemm);
void tile_q4_K_repacked_vnni256_evex(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                     size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                     const uint8_t* gemm);
/// The same for repacked Q2_K (bit-equal to dot_q2_K_q8_K_gemm_ref / _gemv_ref; matmul_tiles_vnni256.h).
void tile_q2_K_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                 size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                 const uint8_t* gemm);
void tile_q2_K_repacked_vnni256_evex(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                     size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                     const uint8_t* gemm);

/// The same for repacked Q4_0, IQ4_NL and MXFP4 (one order: bit-equal to dot_*_q8_0_repacked_ref).
using RepackedTileSignature = std::remove_pointer_t<RepackedTileFn>;
RepackedTileSignature tile_q4_0_repacked_avx_vnni;
RepackedTileSignature tile_iq4_nl_repacked_avx_vnni;
RepackedTileSignature tile_mxfp4_repacked_avx_vnni;
RepackedTileSignature tile_q4_0_repacked_vnni256_evex;
RepackedTileSignature tile_iq4_nl_repacked_vnni256_evex;
RepackedTileSignature tile_mxfp4_repacked_vnni256_evex;

/// The prompt tiles (TileFn) of Q5_K, Q3_K, Q6_K, Q4_1, Q5_0, Q5_1 and Q8_0, 8 rows per register, bit-equal
/// to the AVX2 table's dot kernels (matmul_tiles_vnni256.h): VEX builds (avx_vnni; the AVX-VNNI table's) and
/// EVEX builds of the same source (vnni256_evex; for tests on CPUs without AVX-VNNI).
using TileSignature = std::remove_pointer_t<TileFn>;  // declarations of TileFn functions
TileSignature tile_q5_K_avx_vnni;
TileSignature tile_q3_K_avx_vnni;
TileSignature tile_q4_1_avx_vnni;
TileSignature tile_q5_0_avx_vnni;
TileSignature tile_q5_1_avx_vnni;
TileSignature tile_q6_K_avx_vnni;
TileSignature tile_q8_0_avx_vnni;
TileSignature tile_q5_K_vnni256_evex;
TileSignature tile_q3_K_vnni256_evex;
TileSignature tile_q4_1_vnni256_evex;
TileSignature tile_q5_0_vnni256_evex;
TileSignature tile_q5_1_vnni256_evex;
TileSignature tile_q6_K_vnni256_evex;
TileSignature tile_q8_0_vnni256_evex;

}  // namespace car::tensor::detail
