// GGUF files holding the 4-bit table formats (IQ4_NL, IQ4_XS, MXFP4) and the codebook formats IQ3_XXS, IQ3_S,
// IQ2_XS, IQ2_S, IQ1_M (issue #27): sized from the type table,
// and a truncated tensor or a row that is not whole blocks of the type is a clear error, not a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/util/error_codes.h"

namespace car::gguf {
namespace {

struct Iq4Case {
  GgmlType type;
  uint64_t row;        ///< elements per row (whole blocks)
  uint64_t row_bytes;  ///< bytes per row, per ggml-common.h's block structs
};
constexpr Iq4Case kIq4Cases[] = {
    {GgmlType::IQ4_NL, 64, 2 * 18},
    {GgmlType::IQ4_XS, 512, 2 * 136},
    {GgmlType::MXFP4, 96, 3 * 17},
    // The second slice of codebook formats (issue #27): two super-blocks per row.
    {GgmlType::IQ3_XXS, 512, 2 * 98},
    {GgmlType::IQ3_S, 512, 2 * 110},
    {GgmlType::IQ2_XS, 512, 2 * 74},
    {GgmlType::IQ2_S, 512, 2 * 82},
    {GgmlType::IQ1_M, 512, 2 * 56},
    {GgmlType::TQ1_0, 512, 2 * 54},
    {GgmlType::TQ2_0, 512, 2 * 66},
};

std::vector<uint8_t> one_tensor_file(const Iq4Case& c, uint64_t rows) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  EXPECT_TRUE(w.add_tensor("blk.0.ffn_down.weight", c.type, {c.row, rows},
                           std::vector<uint8_t>(c.row_bytes * rows, 0x5a))
                  .ok());
  return w.to_bytes();
}

TEST(GgufIq4, TensorsOfTheNewTypesParseWithTheirSize) {
  for (const Iq4Case& c : kIq4Cases) {
    SCOPED_TRACE(std::string(ggml_type_name(c.type)));
    const auto bytes = one_tensor_file(c, 3);
    auto g = GgufFile::parse(bytes);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const auto& t = (*g)->tensors().at(0);
    EXPECT_EQ(t.type, c.type);
    EXPECT_EQ((*g)->tensor_data(t).size(), 3 * c.row_bytes);
  }
}

TEST(GgufIq4, TruncatedTensorDataIsOutOfBoundsNamingTheTensor) {
  for (const Iq4Case& c : kIq4Cases) {
    SCOPED_TRACE(std::string(ggml_type_name(c.type)));
    auto bytes = one_tensor_file(c, 3);
    bytes.resize(bytes.size() - c.row_bytes);  // the last row (and any padding) is gone
    auto g = GgufFile::parse(bytes);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, errc::kGgufOutOfBounds);
    EXPECT_NE(g.error().message.find("blk.0.ffn_down.weight"), std::string::npos) << g.error().message;
  }
}

// A row length that is not a multiple of the type's block (an IQ4_XS row of 32, an MXFP4 row of 16): the
// shape is patched in the encoded tensor info, since the writer refuses to write it.
TEST(GgufIq4, RowNotWholeBlocksIsBadShape) {
  for (const Iq4Case& c : kIq4Cases) {
    SCOPED_TRACE(std::string(ggml_type_name(c.type)));
    auto bytes = one_tensor_file(c, 1);
    const std::string name = "blk.0.ffn_down.weight";
    const auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
    ASSERT_NE(it, bytes.end());
    const size_t ne0_at = static_cast<size_t>(it - bytes.begin()) + name.size() + 4;  // after n_dims (u32)
    uint64_t ne0 = 0;
    std::memcpy(&ne0, bytes.data() + ne0_at, 8);
    ASSERT_EQ(ne0, c.row);
    ne0 = c.row - 16;  // every block size here is 32 or 256
    std::memcpy(bytes.data() + ne0_at, &ne0, 8);
    auto g = GgufFile::parse(bytes);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, errc::kGgufBadShape) << g.error().message;
  }
}

}  // namespace
}  // namespace car::gguf
