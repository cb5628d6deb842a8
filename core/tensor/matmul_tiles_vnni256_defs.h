// The entry points of the 256-bit VNNI prompt tiles (matmul_tiles_vnni256.h) - Q5_K, Q3_K, Q6_K, Q4_1, Q5_0,
// Q5_1, Q8_0 and repacked Q2_K, Q4_0, IQ4_NL, MXFP4 - for one encoding. Included once by each file that
// compiles them: matmul_tiles_avxvnni.cpp (AVX2 + AVX-VNNI, the VEX encoding: names ..._avx_vnni) and
// matmul_tiles_vnni256_evex.cpp (AVX-512 VL + VNNI, the EVEX encoding: ..._vnni256_evex), each defining
// CAR_VNNI256_NAME(base) to its suffix first. One list, so the two builds cannot drift apart.
// (No include guard: it is meant to be included once per translation unit, with a different name.)
#ifndef CAR_VNNI256_NAME
#error "define CAR_VNNI256_NAME(base) before including matmul_tiles_vnni256_defs.h"
#endif

#include "core/tensor/avx_vnni.h"
#include "core/tensor/matmul_tiles_vnni256.h"

namespace car::tensor::detail {

#define CAR_VNNI256_TILE(type, driver)                                                                     \
  void CAR_VNNI256_NAME(tile_##type)(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, \
                                     size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {     \
    driver(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);                                           \
  }
#define CAR_VNNI256_REPACKED_TILE(type, driver)                                                              \
  void CAR_VNNI256_NAME(tile_##type##_repacked)(const uint8_t* w, size_t row_bytes, int64_t nrows,           \
                                                const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t n, \
                                                float* y, int64_t ldy, const uint8_t* gemm) {                \
    driver(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);                                     \
  }

CAR_VNNI256_TILE(q5_K, vnni256::tile_k8<vnni256::Q5K8>)
CAR_VNNI256_TILE(q3_K, vnni256::tile_k8<vnni256::Q3K8>)
CAR_VNNI256_TILE(q6_K, vnni256::tile_k8<vnni256::Q6K8>)
CAR_VNNI256_TILE(q4_1, vnni256::tile_l8<vnni256::Q4_1_8>)
CAR_VNNI256_TILE(q5_0, vnni256::tile_l8<vnni256::Q5_0_8>)
CAR_VNNI256_TILE(q5_1, vnni256::tile_l8<vnni256::Q5_1_8>)
CAR_VNNI256_TILE(q8_0, vnni256::tile_l8<vnni256::Q8_0_8>)
CAR_VNNI256_REPACKED_TILE(q2_K, vnni256::tile_q2_K_repacked8)
CAR_VNNI256_REPACKED_TILE(q4_0, vnni256::tile_nl8_repacked<vnni256::Q4_0Nl8>)
CAR_VNNI256_REPACKED_TILE(iq4_nl, vnni256::tile_nl8_repacked<vnni256::Iq4NlNl8>)
CAR_VNNI256_REPACKED_TILE(mxfp4, vnni256::tile_nl8_repacked<vnni256::Mxfp4Nl8>)

#undef CAR_VNNI256_REPACKED_TILE
#undef CAR_VNNI256_TILE

}  // namespace car::tensor::detail
