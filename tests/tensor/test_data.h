// Helpers for the tensor tests: random rows, quantized weights, double-precision oracles.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/gguf/ggml_type.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"

namespace car::tensor::testing {

/// Selects an ISA's kernels for the scope's lifetime, then restores the previous choice.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : saved_(current_isa()) { set_isa(isa); }
  ~IsaScope() { set_isa(saved_); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  Isa saved_;
};

/// Every ISA this CPU can run, scalar first.
inline std::vector<Isa> available_isas() {
  std::vector<Isa> out = {Isa::scalar};
  if (detect_isa() != Isa::scalar) out.push_back(Isa::avx2);
  if (detect_isa() == Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

/// Every type with a dot product, and the block size of each.
inline const std::vector<GgmlType>& computable_types() {
  static const std::vector<GgmlType> types = {
      GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
      GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
      GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
      GgmlType::MXFP4};
  return types;
}

inline int64_t block_size(GgmlType t) { return detail::geometry(t).block_size; }

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

/// `nvec` Q8_0 activation rows of `cols` random values; vectors first_special, first_special + 1 and
/// first_special + 2 are all zero, 1000x and 1e-4x (extreme activation scales beside ordinary ones).
inline std::vector<uint8_t> q8_0_acts(std::mt19937& rng, int64_t nvec, int64_t cols, int64_t first_special) {
  const size_t ab = detail::row_bytes(GgmlType::Q8_0, cols);
  std::vector<uint8_t> acts(ab * static_cast<size_t>(nvec));
  for (int64_t v = 0; v < nvec; ++v) {
    const int64_t k = v - first_special;
    const float scale = k == 0 ? 0.0f : k == 1 ? 1000.0f : k == 2 ? 1e-4f : 1.0f;
    const auto xf = random_floats(rng, cols, scale);
    detail::quantize_act_q8_0(xf.data(), acts.data() + ab * static_cast<size_t>(v), cols);
  }
  return acts;
}

/// What a product computes for row r of `w` against the rounded vector i of an n-vector product (matvec: i 0,
/// n 1), with the current ISA's kernels: llama.cpp's repacked gemm / gemv order for the matrices it repacks
/// (detail::repacked: gemm for the whole groups of 4 vectors of a mul_mat batch), its IQ panel order for a
/// panel product (iq_panel_product) of 8 or more vectors, else the dot kernel of w.order.
inline float product_dot(const MatrixView& w, int64_t r, const void* act, int64_t i, int64_t n) {
  const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
  if (detail::repacked(w)) {
    const detail::DotKernels& k = detail::kernels_for(current_isa());
    const bool gemm = w.order == ProductOrder::mul_mat && i < detail::gemm_vectors(n);
    return (gemm ? k.dot_gemm : k.dot_gemv)[detail::slot(w.type)](row, act, w.cols);
  }
  if (iq_panel_product(w) && n >= 8) return dot_row_panel(w.type, row, act, w.cols);  // llama.cpp's IQ panel
  return dot_row(w.type, row, act, w.cols, w.order);
}

/// `rows` rows of n elements quantized to t (row-major, row_bytes each).
inline std::vector<uint8_t> quantize_rows(GgmlType t, const std::vector<float>& x, int64_t rows, int64_t n) {
  const size_t rb = detail::row_bytes(t, n);
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, x.data() + r * n, out.data() + rb * static_cast<size_t>(r), n);
  return out;
}

inline std::vector<float> dequantized(GgmlType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, src, out.data(), n);
  return out;
}

}  // namespace car::tensor::testing
