// The AMX build of the repacked Q4_K tile (matmul_q4k_amx.h on NativeTiles). Compiled with the AVX-512 flags
// plus -mamx-tile -mamx-int8; nothing here runs unless amx_usable() (amx.cpp, built for baseline x86-64).
#include "core/tensor/amx.h"
#include "core/tensor/matmul_q4k_amx.h"

namespace car::tensor::detail {

void tile_q4_K_repacked_amx(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                            size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                            const uint8_t* gemm) {
  if (nvec < amx::kVecs) {  // a group of 16 vectors mostly empty: the VNNI tile
    avx512::tile_q4_K_repacked_vnni(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
    return;
  }
  amx::tile_q4_K_repacked<amx::NativeTiles>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

}  // namespace car::tensor::detail
