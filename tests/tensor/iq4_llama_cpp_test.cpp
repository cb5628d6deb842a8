// Our IQ4_NL / IQ4_XS / MXFP4 / IQ2_XXS / IQ1_S kernels (and the second slice's IQ3_XXS / IQ3_S / IQ2_XS /
// IQ2_S / IQ1_M: tests/data/reference/iq27) against llama.cpp's own (issue #27), bit for bit: the weight rows,
// activations and results in tests/data/reference/quant27/kernel_goldens.json were made by calling the
// ggml libraries of the reference harness's llama.cpp build (make_kernel_goldens.py: ggml's quantizers and
// dequantizers, the CPU backend's activation rounding and ggml_vec_dot_*, its AVX2 and AVX-512 builds
// agreeing). This is what pins the block layouts, value tables, scale decoding and summation order to
// llama.cpp's; the model-level goldens (engine_quant_goldens_test) check them in a forward pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "tests/tensor/test_data.h"
#include "tests/test_support.h"

namespace car::tensor {
namespace {

using nlohmann::json;

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<uint8_t>(std::stoul(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

float from_bits(const std::string& h) {
  const auto u = static_cast<uint32_t>(std::stoul(h, nullptr, 16));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char s[9];
  std::snprintf(s, sizeof s, "%08x", u);
  return s;
}

/// Every type of a kernel_goldens.json (`types` of them): activation rounding, dequantizer and each ISA's dot
/// kernel against llama.cpp's bits.
void check_kernel_goldens(const char* file, size_t types) {
  const auto path = std::filesystem::path(CAR_SOURCE_DIR) / file;
  const auto text = car::testing::read_fixture(path);
  ASSERT_TRUE(text) << "missing " << path;
  const json doc = json::parse(*text);
  const auto n = doc.at("n").get<int64_t>();
  ASSERT_EQ(doc.at("types").size(), types);
  for (const json& t : doc.at("types")) {
    const auto type = ggml_type_from_name(t.at("type").get<std::string>());
    ASSERT_TRUE(type.has_value());
    SCOPED_TRACE(std::string(ggml_type_name(*type)));
    ASSERT_EQ(ggml_type_name(activation_type(*type)), t.at("activation_type").get<std::string>());

    std::vector<std::vector<uint8_t>> acts;
    for (size_t i = 0; i < t.at("activations").size(); ++i) {
      std::vector<float> x;
      for (const json& b : t.at("activations")[i]) x.push_back(from_bits(b.get<std::string>()));
      ASSERT_EQ(static_cast<int64_t>(x.size()), n);
      const auto want = from_hex(t.at("activations_rounded")[i].get<std::string>());
      for (Isa isa : testing::available_isas()) {
        testing::IsaScope scope(isa);
        std::vector<uint8_t> got(activation_row_bytes(*type, n));
        quantize_activation(*type, x.data(), got.data(), n);
        ASSERT_EQ(got, want) << "activation " << i << " rounded differently, " << isa_name(isa);
      }
      acts.push_back(want);
    }

    for (size_t r = 0; r < t.at("rows").size(); ++r) {
      const auto row = from_hex(t.at("rows")[r].get<std::string>());
      ASSERT_EQ(row.size(), *ggml_row_bytes(*type, static_cast<uint64_t>(n)));
      const auto deq = testing::dequantized(*type, row.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(deq[static_cast<size_t>(i)]),
                  t.at("dequantized")[r][static_cast<size_t>(i)].get<std::string>())
            << "row " << r << " element " << i;
      }
      for (size_t i = 0; i < acts.size(); ++i) {
        const std::string want = t.at("dots")[r][i].get<std::string>();
        for (Isa isa : testing::available_isas()) {
          const auto& k = detail::kernels_for(isa);
          EXPECT_EQ(bits(k.dot[detail::slot(*type)](row.data(), acts[i].data(), n)), want)
              << "row " << r << " activation " << i << " " << isa_name(isa) << " (llama.cpp "
              << from_bits(want) << ")";
        }
      }
    }
  }
}

TEST(Iq4LlamaCpp, KernelsGiveLlamaCppsBits) {
  check_kernel_goldens("tests/data/reference/quant27/kernel_goldens.json", 5);
}

// The second slice of issue #27's types (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M, TQ1_0, TQ2_0): rows from ggml's quantizers
// and random rows, tests/data/reference/iq27/make_kernel_goldens.py.
TEST(IqSlice2LlamaCpp, KernelsGiveLlamaCppsBits) {
  check_kernel_goldens("tests/data/reference/iq27/kernel_goldens.json", 7);
}

}  // namespace
}  // namespace car::tensor
