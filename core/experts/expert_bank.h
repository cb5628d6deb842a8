// ExpertBankInfo: where one MoE layer's stacked expert banks are, as the model loader reads them from the
// GGUF file. A plain description (views into the mapping and file offsets) that core/model fills and the
// expert sources (expert_source.h) consume; it carries no behaviour, so the model does not depend on the
// ExpertSource interface.
#pragma once

#include <cstdint>

#include "core/tensor/kernels.h"

namespace car::experts {

/// Bytes of one expert's matrix in `bank`: its e-th of n_expert equal slices of rows (expert_slice in
/// expert_source.h), whichever expert. The one derivation the sources, the stream reads and the bench's
/// bytes-per-step count share.
inline uint64_t expert_matrix_bytes(const tensor::MatrixView& bank, int n_expert) {
  return static_cast<uint64_t>(bank.rows / n_expert) * bank.row_bytes;
}

/// Geometry of one layer's banks, as read from the file.
struct ExpertBankInfo {
  tensor::MatrixView gate_bank;  ///< rows = n_ff * n_expert (expert-major), cols = n_embd
  tensor::MatrixView up_bank;    ///< rows = n_ff * n_expert, cols = n_embd
  tensor::MatrixView down_bank;  ///< rows = n_embd * n_expert, cols = n_ff
  int n_expert = 0;
  uint64_t gate_offset = 0;  ///< absolute file offsets of the banks (for positional reads)
  uint64_t up_offset = 0;
  uint64_t down_offset = 0;

  /// Bytes of one expert's three matrices (n_expert > 0).
  uint64_t expert_bytes() const {
    return expert_matrix_bytes(gate_bank, n_expert) + expert_matrix_bytes(up_bank, n_expert) +
           expert_matrix_bytes(down_bank, n_expert);
  }
};

}  // namespace car::experts
