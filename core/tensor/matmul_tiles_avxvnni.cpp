// The 256-bit VNNI prompt tiles of Q5_K, Q3_K, Q6_K, Q4_1, Q5_0, Q5_1, Q8_0 and repacked Q2_K, Q4_0, IQ4_NL,
// MXFP4 (matmul_tiles_vnni256.h) on AVX2 + AVX-VNNI (the VEX vpdpbusd / vpdpwssd): the AVX2 level's tiles
// where avx_vnni_usable(). The list of entry points is matmul_tiles_vnni256_defs.h's.
#define CAR_VNNI256_NAME(base) base##_avx_vnni
#include "core/tensor/matmul_tiles_vnni256_defs.h"
