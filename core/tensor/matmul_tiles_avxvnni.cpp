// The 256-bit VNNI prompt tiles of Q5_K, Q3_K, Q6_K, Q4_1, Q5_0, Q5_1, Q8_0 and repacked Q2_K, Q4_0, IQ4_NL,
// MXFP4 (matmul_tiles_vnni256.h) on AVX2 + AVX-VNNI (the VEX vpdpbusd / vpdpwssd): the AVX2 level's tiles
// where avx_vnni_usable().
#include "core/tensor/avx_vnni.h"
#include "core/tensor/matmul_tiles_vnni256.h"

namespace car::tensor::detail {

void tile_q5_K_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_k8<vnni256::Q5K8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q3_K_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_k8<vnni256::Q3K8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q4_1_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_l8<vnni256::Q4_1_8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q5_0_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_l8<vnni256::Q5_0_8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q5_1_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_l8<vnni256::Q5_1_8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

void tile_q6_K_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_k8<vnni256::Q6K8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q8_0_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  vnni256::tile_l8<vnni256::Q8_0_8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

void tile_q2_K_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                 size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                 const uint8_t* gemm) {
  vnni256::tile_q2_K_repacked8(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

void tile_q4_0_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                 size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                 const uint8_t* gemm) {
  vnni256::tile_nl8_repacked<vnni256::Q4_0Nl8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}
void tile_iq4_nl_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                   size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                   const uint8_t* gemm) {
  vnni256::tile_nl8_repacked<vnni256::Iq4NlNl8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}
void tile_mxfp4_repacked_avx_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                  size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                  const uint8_t* gemm) {
  vnni256::tile_nl8_repacked<vnni256::Mxfp4Nl8>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

}  // namespace car::tensor::detail
