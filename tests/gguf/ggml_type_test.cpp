// The ggml type table: block geometry per ggml-common.h's block structs, retired ids unknown.
#include <gtest/gtest.h>

#include "core/gguf/ggml_type.h"

namespace car {
namespace {

TEST(GgmlType, BlockGeometry) {
  struct Want {
    uint32_t id;
    const char* name;
    uint32_t block;
    uint32_t bytes;
  };
  // bytes = the block struct's size: e.g. Q4_K = 2 halves + 12 scale bytes + 128 nibble bytes.
  const Want want[] = {
      {0, "F32", 1, 4},         {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},
      {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
      {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
      {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
      {26, "I32", 1, 4},        {27, "I64", 1, 8},         {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
      {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
  };
  for (const auto& w : want) {
    SCOPED_TRACE(w.name);
    auto t = ggml_type_traits(w.id);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->block_size, w.block);
    EXPECT_EQ(t->bytes_per_block, w.bytes);
    EXPECT_EQ(static_cast<uint32_t>(t->type), w.id);
    EXPECT_EQ(ggml_type_from_name(w.name), t->type);
    EXPECT_EQ(&ggml_traits(t->type), &ggml_traits(t->type));
    EXPECT_EQ(ggml_type_name(t->type), w.name);
  }
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u}) {
    EXPECT_FALSE(ggml_type_traits(retired).has_value()) << retired;
  }
  EXPECT_EQ(ggml_type_from_name("q4_k"), GgmlType::Q4_K);
  EXPECT_FALSE(ggml_type_from_name("Q4_K_M").has_value());
}

TEST(GgmlType, RowBytes) {
  EXPECT_EQ(ggml_row_bytes(GgmlType::F32, 7), 28u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q8_0, 64), 68u);
  EXPECT_FALSE(ggml_row_bytes(GgmlType::Q4_K, 100).has_value());
  EXPECT_FALSE(ggml_row_bytes(GgmlType::Q8_0, 33).has_value());
}

}  // namespace
}  // namespace car
