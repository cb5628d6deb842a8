// Dequantization of the conformance fixtures: every tensor of moe-llama-{q8_0,q4_0,q4_k_m,q5_k_m,q6_k,bf16}
// against the same tensor of moe-llama-f16.gguf (the same weights, stored as fp16), within the bound of the
// tensor's format. This checks the block layouts against files written by llama.cpp's own llama-quantize.
// Skipped only when no conformance folder is configured; a missing fixture fails.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/tensor/kernels.h"
#include "tests/test_support.h"

namespace car::tensor {
namespace {

// Bound on RMS(quantized - f16) / RMS(f16) per tensor. llama-quantize searches its scales, so its errors are
// below those of round-to-nearest; these bounds sit just above what a round-to-nearest fit gives and far
// below what a wrong bit layout gives (errors of the order of the values themselves, ratio ~1).
double dequant_rel_rms_bound(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0.0;
    case GgmlType::F16: return 0.0;
    case GgmlType::BF16: return 4e-3;
    case GgmlType::Q8_0: return 0.01;
    case GgmlType::Q6_K: return 0.03;
    case GgmlType::Q5_0: return 0.05;
    case GgmlType::Q5_K: return 0.05;
    case GgmlType::Q4_0: return 0.11;
    case GgmlType::Q4_K: return 0.10;
    default: return -1.0;  // not expected in these files
  }
}

std::vector<float> dequantize_tensor(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  const auto data = f.tensor_data(t);
  const int64_t cols = static_cast<int64_t>(t.ne[0]);
  const auto rows = static_cast<int64_t>(t.rows());
  const size_t row_bytes = data.size() / static_cast<size_t>(rows);
  std::vector<float> out(static_cast<size_t>(cols * rows));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, data.data() + static_cast<size_t>(r) * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}

class FixtureDequant : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureDequant, MatchesF16Weights) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto models = dir / "models";
  auto ref = gguf::GgufFile::open((models / "moe-llama-f16.gguf").string());
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  auto file = gguf::GgufFile::open((models / GetParam()).string());
  ASSERT_TRUE(file.ok()) << file.error().message;

  int checked = 0;
  for (const auto& t : (*file)->tensors()) {
    SCOPED_TRACE(t.name + " " + std::string(ggml_type_name(t.type)));
    const gguf::TensorInfo* rt = (*ref)->find_tensor(t.name);
    ASSERT_NE(rt, nullptr);
    ASSERT_EQ(rt->ne, t.ne);
    ASSERT_TRUE(can_compute(t.type));
    const double bound = dequant_rel_rms_bound(t.type);
    ASSERT_GE(bound, 0.0) << "unexpected type";
    const auto got = dequantize_tensor(**file, t);
    const auto want = dequantize_tensor(**ref, *rt);
    double err = 0, norm = 0, max_rel_elem = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << i;
      const double e = double(got[i]) - want[i];
      err += e * e;
      norm += double(want[i]) * want[i];
      if (t.type == GgmlType::BF16) {
        // Both are roundings of one fp32 value: bf16 within 2^-8, fp16 within 2^-11 relative (+ subnormals).
        max_rel_elem = std::max(max_rel_elem, std::fabs(e) / (std::fabs(double(want[i])) * (0x1p-8 + 0x1p-11) + 1e-7));
      }
    }
    const double rel = norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
    if (rt->type == GgmlType::F32) {
      EXPECT_EQ(err, 0.0) << "F32 tensors are stored unchanged in every file";
    } else {
      EXPECT_LE(rel, bound);
      if (t.type != GgmlType::F32 && t.type != GgmlType::F16) {
        EXPECT_GT(rel, bound * 1e-3) << "suspiciously exact";
      }
    }
    if (t.type == GgmlType::BF16) {
      EXPECT_LE(max_rel_elem, 1.0);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

INSTANTIATE_TEST_SUITE_P(MoeLlama, FixtureDequant,
                         ::testing::Values("moe-llama-q8_0.gguf", "moe-llama-q4_0.gguf", "moe-llama-q4_k_m.gguf",
                                           "moe-llama-q5_k_m.gguf", "moe-llama-q6_k.gguf", "moe-llama-bf16.gguf"),
                         [](const auto& param_info) {
                           std::string s = param_info.param.substr(10, param_info.param.size() - 15);
                           for (char& c : s) c = (c == '-' || c == '.') ? '_' : c;
                           return s;
                         });

}  // namespace
}  // namespace car::tensor
