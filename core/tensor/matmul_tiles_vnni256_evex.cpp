// The 256-bit VNNI prompt tiles of Q5_K, Q3_K, Q6_K, Q4_1, Q5_0, Q5_1, Q8_0 and repacked Q2_K, Q4_0, IQ4_NL,
// MXFP4 (matmul_tiles_vnni256.h) built with AVX-512 VL + VNNI: the EVEX encodings of the same 256-bit
// instructions, so the tests check the AVX-VNNI tiles' source on CPUs that lack AVX-VNNI. The list of entry
// points is matmul_tiles_vnni256_defs.h's.
#define CAR_VNNI256_NAME(base) base##_vnni256_evex
#include "core/tensor/matmul_tiles_vnni256_defs.h"
