// The repacked Q4_K AMX tile (matmul_q4k_amx.h) on the emulated tiles (amx_tiles.h), so its numerics are
// tested on CPUs without AMX. AVX-512 flags only; slow (the tile multiply is plain C++), tests only.
#include "core/tensor/amx.h"
#include "core/tensor/matmul_q4k_amx.h"

namespace car::tensor::detail {

void tile_q4_K_repacked_amx_emulated(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                     size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                     const uint8_t* gemm) {
  amx::tile_q4_K_repacked<amx::EmulatedTiles>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

}  // namespace car::tensor::detail
