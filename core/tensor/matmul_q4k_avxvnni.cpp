// The 256-bit VNNI repacked Q4_K tile (matmul_q4k_vnni256.h) on AVX2 + AVX-VNNI (the VEX vpdpbusd): the AVX2
// level's tile where avx_vnni_usable().
#include "core/tensor/avx_vnni.h"
#include "core/tensor/matmul_q4k_vnni256.h"

namespace car::tensor::detail {

void tile_q4_K_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                 size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                 const uint8_t* gemm) {
  vnni256::tile_q4_K_repacked(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

}  // namespace car::tensor::detail
