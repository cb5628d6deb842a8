// The tiles of the ISA extensions (issue #26): AMX on the AVX-512 level, AVX-VNNI on the AVX2 level.
//
// AMX (core/tensor/amx.h, amx_tiles.h, matmul_q4k_amx.h):
//   - the emulated tiles follow Intel's documented semantics (tileloadd with a stride and the zeroed rest,
//     tdpbusd's unsigned x signed dword sums of 4 with wrap-around, tilestored, the configured shape);
//   - the repacked Q4_K AMX tile, run on the emulated tiles, equals the scalar references of both orders bit
//     for bit for every row count (whole and partial groups of 16), vector count 1..64 and order mix;
//   - the same kernel on the real instructions, where the CPU has AMX (skipped elsewhere, saying why);
//   - the AVX-512 level's table takes the AMX tile only where AMX is usable, and a forced lower ISA leaves
//   it.
// AVX-VNNI (core/tensor/avx_vnni.h, matmul_q4k_vnni256.h, matmul_tiles_vnni256.h):
//   - the 256-bit repacked Q4_K tile built on the EVEX vpdpbusd (AVX-512 VL + VNNI, the same instruction
//     semantics) equals the references as above; the VEX build (the table's) where the CPU has AVX-VNNI;
//   - the same for the 256-bit repacked Q2_K tile, and those of Q4_0, IQ4_NL, MXFP4 (one order);
//   - the 256-bit prompt tiles of Q5_K, Q3_K, Q6_K, Q4_1, Q5_0, Q5_1, Q8_0 (EVEX build; VEX where the CPU
//     has it) equal the AVX2 table's dot kernels bit for bit for every row count (whole and partial groups
//     of 8), vector count 1..64 and a few block counts;
//   - the AVX2 level's table takes them only where AVX-VNNI is usable.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/amx.h"
#include "core/tensor/amx_tiles.h"
#include "core/tensor/avx_vnni.h"
#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"

namespace car::tensor {
namespace {

using detail::amx::EmulatedTiles;
using detail::amx::TileConfig;
using testing::random_floats;

TEST(Amx, EmulatedTilesFollowTheDocumentedSemantics) {
  TileConfig cfg;
  cfg.rows[0] = 3;  // A: 3 x 8 bytes (K = 2 dwords)
  cfg.colsb[0] = 8;
  cfg.rows[1] = 2;  // B: 2 x 12 bytes (N = 3)
  cfg.colsb[1] = 12;
  cfg.rows[2] = 3;  // C: 3 x 12 bytes
  cfg.colsb[2] = 12;
  EmulatedTiles t;
  t.configure(cfg);
  // A rows 10 bytes apart in memory (stride > colsb): only colsb bytes of each configured row are read.
  std::vector<uint8_t> a(40);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(200 + i);  // unsigned values > 127
  std::vector<int8_t> b(2 * 12);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int8_t>(static_cast<int>(i) * 11 - 128);
  t.load<0>(a.data(), 10);
  t.load<1>(b.data(), 12);
  std::vector<int32_t> c0 = {1, -2, 3, 4, 5, 6, 7, 8, 2147483647};  // C starts as these (last: wraps)
  t.load<2>(c0.data(), 12);
  t.dpbusd<2, 0, 1>();
  std::vector<int32_t> got(3 * 4, -1);
  t.store<2>(got.data(), 16);  // stride 16 bytes: 4 dwords, the 4th of each row untouched
  for (int m = 0; m < 3; ++m) {
    for (int n = 0; n < 3; ++n) {
      int64_t s = c0[static_cast<size_t>(3 * m + n)];
      for (int k = 0; k < 2; ++k) {
        for (int i = 0; i < 4; ++i) {
          s += int64_t{a[static_cast<size_t>(10 * m + 4 * k + i)]} *
               b[static_cast<size_t>(12 * k + 4 * n + i)];
        }
      }
      const auto want = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(s)));
      EXPECT_EQ(got[static_cast<size_t>(4 * m + n)], want) << m << "," << n;
    }
    EXPECT_EQ(got[static_cast<size_t>(4 * m + 3)], -1) << "tilestored wrote past colsb";
  }
  // An unconfigured tile (0 rows) reads and writes nothing.
  EmulatedTiles u;
  u.configure(cfg);
  std::vector<uint8_t> ones(16 * 64, 1);
  u.load<3>(ones.data(), 64);  // tile 3 is unconfigured in cfg (0 rows): nothing read, all zero
  std::vector<uint8_t> back(16 * 64, 9);
  u.store<3>(back.data(), 64);  // 0 rows: writes nothing
  EXPECT_EQ(back[0], 9);
  // A shape the hardware refuses (#UD) aborts.
  TileConfig bad = cfg;
  bad.rows[1] = 3;  // B must have colsb(A) / 4 = 2 rows
  EmulatedTiles v;
  v.configure(bad);
  EXPECT_DEATH((v.dpbusd<2, 0, 1>()), "invariant failed");
}

/// Every row count, vector count 1..64 and order mix of one repacked Q4_K (or Q2_K, Q4_0, IQ4_NL, MXFP4) tile
/// against the references.
void expect_tile_equals_references(detail::RepackedTileFn tile, const char* what, std::mt19937& rng,
                                   std::initializer_list<int64_t> nbs, GgmlType type = GgmlType::Q4_K) {
  constexpr int64_t kTileRows = 48, kTileVecs = 64;
  const detail::DotKernels& ref = detail::scalar_kernels();
  for (int64_t nb : nbs) {
    const bool k_quant = testing::block_size(type) == QK_K;
    const int64_t cols = nb * testing::block_size(type);
    const size_t rb = detail::row_bytes(type, cols);
    const auto w = testing::quantize_rows(type, random_floats(rng, cols * kTileRows), kTileRows, cols);
    const size_t ab = activation_row_bytes(type, cols);
    std::vector<uint8_t> acts(ab * kTileVecs);
    for (int64_t v = 0; v < kTileVecs; ++v) {
      const float scale = v == 5 ? 0.0f : v == 6 ? 1000.0f : v == 17 ? 1e-4f : 1.0f;
      const auto xf = random_floats(rng, cols, scale);
      uint8_t* dst = acts.data() + ab * static_cast<size_t>(v);
      if (k_quant) {
        detail::quantize_act_q8_K(xf.data(), dst, cols);
      } else {
        quantize_activation(type, xf.data(), dst, cols);  // Q8_0
      }
    }
    std::vector<float> want[2];  // [0] gemv, [1] gemm; [v * kTileRows + r]
    for (int o = 0; o < 2; ++o) {
      want[o].resize(static_cast<size_t>(kTileVecs * kTileRows));
      const detail::DotFn oracle = o == 1 ? ref.dot_gemm[detail::slot(type)] : ref.dot_gemv[detail::slot(type)];
      for (int64_t v = 0; v < kTileVecs; ++v) {
        for (int64_t r = 0; r < kTileRows; ++r) {
          want[o][static_cast<size_t>(v * kTileRows + r)] =
              oracle(w.data() + rb * static_cast<size_t>(r), acts.data() + ab * static_cast<size_t>(v), cols);
        }
      }
    }
    std::vector<uint8_t> mixed(kTileVecs);
    for (auto& m : mixed) m = static_cast<uint8_t>(rng() % 3 == 0 ? 0 : 1);
    const std::vector<uint8_t> all_gemm(kTileVecs, 1);
    const uint8_t* const masks[] = {all_gemm.data(), nullptr, mixed.data()};
    for (const uint8_t* mask : masks) {
      const char* order = mask == nullptr ? "gemv" : mask == all_gemm.data() ? "gemm" : "mixed";
      for (int64_t nrows : {1, 5, 8, 9, 16, 17, 33, 48}) {
        const int64_t ldy = nrows + 3;
        for (int64_t nvec = 1; nvec <= kTileVecs; ++nvec) {
          std::vector<float> y(static_cast<size_t>(nvec * ldy + 3), -7.0f);
          tile(w.data(), rb, nrows, acts.data(), ab, nvec, cols, y.data(), ldy, mask);
          for (int64_t v = 0; v < nvec; ++v) {
            const int o = mask != nullptr && mask[v] != 0 ? 1 : 0;
            for (int64_t r = 0; r < ldy; ++r) {
              const float got = y[static_cast<size_t>(v * ldy + r)];
              const float exp = r < nrows ? want[o][static_cast<size_t>(v * kTileRows + r)] : -7.0f;
              ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0)
                  << what << " " << order << " nb " << nb << " nrows " << nrows << " nvec " << nvec << " v "
                  << v << " r " << r << ": " << got << " vs " << exp;
            }
          }
          ASSERT_EQ(y.back(), -7.0f) << what << ": wrote past the last vector";
        }
      }
    }
  }
}

TEST(Amx, Q4KTileOnEmulatedTilesEqualsTheReferences) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the AMX kernel's non-tile steps need AVX-512";
  std::mt19937 rng(51);
  expect_tile_equals_references(detail::tile_q4_K_repacked_amx_emulated, "emulated AMX", rng, {1, 3});
}

TEST(Amx, Q4KTileOnRealAmxEqualsTheReferences) {
  if (!detail::amx_usable()) {
    GTEST_SKIP()
        << "no usable AMX here (CPUID AMX-TILE/AMX-INT8, or Linux's ARCH_REQ_XCOMP_PERM for the tile "
           "data was refused): the kernel on the real tile instructions was NOT run; its numerics are "
           "covered through the emulated tiles only";
  }
  std::mt19937 rng(52);
  expect_tile_equals_references(detail::tile_q4_K_repacked_amx, "real AMX", rng, {1, 3, 9});
}

// The check amx_kernels() makes before the AMX tile serves anything: the emulated AMX tile passes it, and a
// tile one bit off anywhere fails it (then the table keeps the VNNI tile).
void tile_one_bit_off(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                      size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy, const uint8_t* gemm) {
  detail::tile_q4_K_repacked_amx_emulated(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
  uint32_t bits;
  float* last = y + (nvec - 1) * ldy + nrows - 1;
  std::memcpy(&bits, last, sizeof bits);
  bits ^= 1u;
  std::memcpy(last, &bits, sizeof bits);
}

TEST(Amx, TheSelfCheckPassesTheEmulatedTileAndFailsAWrongOne) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the check compares with the AVX-512 VNNI tile";
  const detail::DotKernels& vnni = detail::kernels_for(Isa::avx512);
  EXPECT_TRUE(detail::q4_K_tile_agrees(vnni, detail::tile_q4_K_repacked_amx_emulated));
  EXPECT_FALSE(detail::q4_K_tile_agrees(vnni, tile_one_bit_off));
}

TEST(Amx, TheAvx512LevelTakesTheAmxTileOnlyWhereUsable) {
  const int q4k = detail::slot(GgmlType::Q4_K);
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "no AVX-512 level on this CPU";
  const detail::DotKernels& k = detail::kernels_for(Isa::avx512);
  if (detail::amx_usable()) {
    ASSERT_NE(detail::amx_kernels(), nullptr);
    EXPECT_EQ(k.tile_repacked[q4k], &detail::tile_q4_K_repacked_amx);
  } else {
    EXPECT_EQ(detail::amx_kernels(), nullptr);
    EXPECT_NE(k.tile_repacked[q4k], &detail::tile_q4_K_repacked_amx);
    EXPECT_NE(k.tile_repacked[q4k], nullptr) << "the VNNI tile";
  }
  // A forced lower ISA (CAR_INFERENCE_ISA=avx2) leaves AMX with the rest of AVX-512: the AVX2 level has no
  // Q4_K tile, or AVX-VNNI's where the CPU has that (avx_vnni.h).
  testing::IsaScope scope(Isa::avx2);
  EXPECT_EQ(detail::active_kernels().tile_repacked[q4k],
            detail::avx_vnni_kernels() != nullptr ? &detail::tile_q4_K_repacked_avx_vnni : nullptr);
}

TEST(AvxVnni, Q4KTileThroughTheEvexEncodingEqualsTheReferences) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the EVEX build of the tile needs AVX-512 VL + VNNI";
  std::mt19937 rng(53);
  expect_tile_equals_references(detail::tile_q4_K_repacked_vnni256_evex, "vnni256 (EVEX)", rng, {1, 3, 9});
}

TEST(AvxVnni, Q2KTileThroughTheEvexEncodingEqualsTheReferences) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the EVEX build of the tile needs AVX-512 VL + VNNI";
  std::mt19937 rng(57);
  expect_tile_equals_references(detail::tile_q2_K_repacked_vnni256_evex, "Q2_K vnni256 (EVEX)", rng,
                                {1, 3, 9}, GgmlType::Q2_K);
}

TEST(AvxVnni, Q2KTileOnRealAvxVnniEqualsTheReferences) {
  if (!detail::avx_vnni_usable()) {
    GTEST_SKIP() << "no AVX-VNNI on this CPU: the VEX build of the 256-bit Q2_K tile was NOT run; its source "
                    "is covered through the EVEX build only";
  }
  std::mt19937 rng(58);
  expect_tile_equals_references(detail::tile_q2_K_repacked_avx_vnni, "Q2_K vnni256 (VEX)", rng, {1, 3, 9},
                                GgmlType::Q2_K);
}

/// The 256-bit repacked tiles of the 32-element table types (one order), in the two builds.
struct Vnni256RepackedTile {
  GgmlType type;
  detail::RepackedTileFn evex, vex;
};
const Vnni256RepackedTile kVnni256Nl32Tiles[] = {
    {GgmlType::Q4_0, detail::tile_q4_0_repacked_vnni256_evex, detail::tile_q4_0_repacked_avx_vnni},
    {GgmlType::IQ4_NL, detail::tile_iq4_nl_repacked_vnni256_evex, detail::tile_iq4_nl_repacked_avx_vnni},
    {GgmlType::MXFP4, detail::tile_mxfp4_repacked_vnni256_evex, detail::tile_mxfp4_repacked_avx_vnni},
};

TEST(AvxVnni, Nl32TilesThroughTheEvexEncodingEqualTheReferences) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the EVEX build of the tiles needs AVX-512 VL + VNNI";
  std::mt19937 rng(59);
  for (const Vnni256RepackedTile& t : kVnni256Nl32Tiles) {
    const std::string what = std::string(ggml_type_name(t.type)) + " vnni256 (EVEX)";
    expect_tile_equals_references(t.evex, what.c_str(), rng, {1, 7, 70}, t.type);
  }
}

TEST(AvxVnni, Nl32TilesOnRealAvxVnniEqualTheReferences) {
  if (!detail::avx_vnni_usable()) {
    GTEST_SKIP()
        << "no AVX-VNNI on this CPU: the VEX build of the 256-bit Q4_0 / IQ4_NL / MXFP4 tiles was NOT "
           "run; their source is covered through the EVEX build only";
  }
  std::mt19937 rng(60);
  for (const Vnni256RepackedTile& t : kVnni256Nl32Tiles) {
    const std::string what = std::string(ggml_type_name(t.type)) + " vnni256 (VEX)";
    expect_tile_equals_references(t.vex, what.c_str(), rng, {1, 7, 70}, t.type);
  }
}

TEST(AvxVnni, Q4KTileOnRealAvxVnniEqualsTheReferences) {
  if (!detail::avx_vnni_usable()) {
    GTEST_SKIP() << "no AVX-VNNI on this CPU: the VEX build of the 256-bit tile was NOT run; its source is "
                    "covered through the EVEX build only";
  }
  std::mt19937 rng(54);
  expect_tile_equals_references(detail::tile_q4_K_repacked_avx_vnni, "vnni256 (VEX)", rng, {1, 3, 9});
}

/// The 256-bit prompt tiles of the types without an AVX2 tile (issue #26), in the two builds.
struct Vnni256Tile {
  GgmlType type;
  detail::TileFn evex, vex;
};
const Vnni256Tile kVnni256Tiles[] = {
    {GgmlType::Q5_K, detail::tile_q5_K_vnni256_evex, detail::tile_q5_K_avx_vnni},
    {GgmlType::Q3_K, detail::tile_q3_K_vnni256_evex, detail::tile_q3_K_avx_vnni},
    {GgmlType::Q4_1, detail::tile_q4_1_vnni256_evex, detail::tile_q4_1_avx_vnni},
    {GgmlType::Q5_0, detail::tile_q5_0_vnni256_evex, detail::tile_q5_0_avx_vnni},
    {GgmlType::Q5_1, detail::tile_q5_1_vnni256_evex, detail::tile_q5_1_avx_vnni},
    {GgmlType::Q8_0, detail::tile_q8_0_vnni256_evex, detail::tile_q8_0_avx_vnni},
    {GgmlType::Q6_K, detail::tile_q6_K_vnni256_evex, detail::tile_q6_K_avx_vnni},
};

/// Every row count (whole and partial groups of 8), vector count 1..64 and a few block counts of one tile of
/// type t against the AVX2 table's dot kernel (the AVX-VNNI table's dot), bit for bit; nothing written past
/// the rows or the last vector.
void expect_tile_equals_avx2_dot(GgmlType t, detail::TileFn tile, const char* what, std::mt19937& rng) {
  constexpr int64_t kTileRows = 48, kTileVecs = 64;
  const detail::DotFn dot = detail::kernels_for(Isa::avx2).dot[detail::slot(t)];
  ASSERT_NE(dot, nullptr);
  const bool k_quant = testing::block_size(t) == QK_K;
  for (int64_t nb : k_quant ? std::vector<int64_t>{1, 3, 9} : std::vector<int64_t>{1, 7, 70}) {
    const int64_t cols = nb * testing::block_size(t);
    const size_t rb = detail::row_bytes(t, cols);
    const auto w = testing::quantize_rows(t, random_floats(rng, cols * kTileRows), kTileRows, cols);
    const size_t ab = activation_row_bytes(t, cols);
    std::vector<uint8_t> acts(ab * kTileVecs);
    for (int64_t v = 0; v < kTileVecs; ++v) {
      const float scale = v == 5 ? 0.0f : v == 6 ? 1000.0f : v == 7 ? 1e-4f : 1.0f;
      const auto xf = random_floats(rng, cols, scale);
      quantize_activation(t, xf.data(), acts.data() + ab * static_cast<size_t>(v), cols);
    }
    std::vector<float> want(static_cast<size_t>(kTileVecs * kTileRows));
    for (int64_t v = 0; v < kTileVecs; ++v) {
      for (int64_t r = 0; r < kTileRows; ++r) {
        want[static_cast<size_t>(v * kTileRows + r)] =
            dot(w.data() + rb * static_cast<size_t>(r), acts.data() + ab * static_cast<size_t>(v), cols);
      }
    }
    for (int64_t nrows : {1, 5, 8, 9, 15, 17, 48}) {
      const int64_t ldy = nrows + 3;
      for (int64_t nvec = 1; nvec <= kTileVecs; ++nvec) {
        std::vector<float> y(static_cast<size_t>(nvec * ldy + 3), -7.0f);
        tile(w.data(), rb, nrows, acts.data(), ab, nvec, cols, y.data(), ldy);
        for (int64_t v = 0; v < nvec; ++v) {
          for (int64_t r = 0; r < ldy; ++r) {
            const float got = y[static_cast<size_t>(v * ldy + r)];
            const float exp = r < nrows ? want[static_cast<size_t>(v * kTileRows + r)] : -7.0f;
            ASSERT_EQ(std::memcmp(&got, &exp, sizeof(float)), 0)
                << what << " " << ggml_type_name(t) << " nb " << nb << " nrows " << nrows << " nvec " << nvec
                << " v " << v << " r " << r << ": " << got << " vs " << exp;
          }
        }
        ASSERT_EQ(y.back(), -7.0f) << what << ": wrote past the last vector";
      }
    }
  }
}

TEST(AvxVnni, PromptTilesThroughTheEvexEncodingEqualTheAvx2DotKernels) {
  if (detect_isa() != Isa::avx512) GTEST_SKIP() << "the EVEX build of the tiles needs AVX-512 VL + VNNI";
  std::mt19937 rng(55);
  for (const Vnni256Tile& t : kVnni256Tiles)
    expect_tile_equals_avx2_dot(t.type, t.evex, "vnni256 (EVEX)", rng);
}

TEST(AvxVnni, PromptTilesOnRealAvxVnniEqualTheAvx2DotKernels) {
  if (!detail::avx_vnni_usable()) {
    GTEST_SKIP() << "no AVX-VNNI on this CPU: the VEX build of the 256-bit prompt tiles was NOT run; their "
                    "source is covered through the EVEX build only";
  }
  std::mt19937 rng(56);
  for (const Vnni256Tile& t : kVnni256Tiles) expect_tile_equals_avx2_dot(t.type, t.vex, "vnni256 (VEX)", rng);
}

TEST(AvxVnni, TheAvx2LevelTakesThePromptTilesOnlyWhereUsable) {
  if (detect_isa() == Isa::scalar) GTEST_SKIP() << "no AVX2 level on this CPU";
  const detail::DotKernels& k = detail::kernels_for(Isa::avx2);
  for (const Vnni256Tile& t : kVnni256Tiles) {
    const int s = detail::slot(t.type);
    if (detail::avx_vnni_usable()) {
      EXPECT_EQ(k.tile[s], t.vex) << ggml_type_name(t.type);
      EXPECT_EQ(k.tile_group[s], 8) << ggml_type_name(t.type);
    } else {
      EXPECT_EQ(k.tile[s], nullptr) << ggml_type_name(t.type) << ": the AVX2 level has no tile of its own";
    }
  }
  // A forced lower ISA (CAR_INFERENCE_ISA=scalar) leaves them with the rest of the AVX2 level.
  testing::IsaScope scope(Isa::scalar);
  for (const Vnni256Tile& t : kVnni256Tiles)
    EXPECT_EQ(detail::active_kernels().tile[detail::slot(t.type)], nullptr);
}

TEST(AvxVnni, TheAvx2LevelTakesTheTileOnlyWhereUsable) {
  const int q4k = detail::slot(GgmlType::Q4_K);
  if (detect_isa() == Isa::scalar) GTEST_SKIP() << "no AVX2 level on this CPU";
  const detail::DotKernels& k = detail::kernels_for(Isa::avx2);
  const int q2k = detail::slot(GgmlType::Q2_K);
  if (detail::avx_vnni_usable()) {
    ASSERT_NE(detail::avx_vnni_kernels(), nullptr);
    EXPECT_EQ(k.tile_repacked[q4k], &detail::tile_q4_K_repacked_avx_vnni);
    EXPECT_EQ(k.tile_repacked[q2k], &detail::tile_q2_K_repacked_avx_vnni);
    for (const Vnni256RepackedTile& t : kVnni256Nl32Tiles)
      EXPECT_EQ(k.tile_repacked[detail::slot(t.type)], t.vex) << ggml_type_name(t.type);
  } else {
    EXPECT_EQ(detail::avx_vnni_kernels(), nullptr);
    EXPECT_EQ(k.tile_repacked[q4k], nullptr);
    EXPECT_EQ(k.tile_repacked[q2k], nullptr);
    for (const Vnni256RepackedTile& t : kVnni256Nl32Tiles)
      EXPECT_EQ(k.tile_repacked[detail::slot(t.type)], nullptr) << ggml_type_name(t.type);
  }
  testing::IsaScope scope(Isa::scalar);
  EXPECT_EQ(detail::active_kernels().tile_repacked[q4k], nullptr);
  EXPECT_EQ(detail::active_kernels().tile_repacked[q2k], nullptr);
  for (const Vnni256RepackedTile& t : kVnni256Nl32Tiles)
    EXPECT_EQ(detail::active_kernels().tile_repacked[detail::slot(t.type)], nullptr);
}

}  // namespace
}  // namespace car::tensor
