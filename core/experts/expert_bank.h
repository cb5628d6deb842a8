// ExpertBankInfo: where one MoE layer's stacked expert banks are, as the model loader reads them from the
// GGUF file. A plain description (views into the mapping and file offsets) that core/model fills and the
// expert sources (expert_source.h) consume; it carries no behaviour, so the model does not depend on the
// ExpertSource interface.
#pragma once

#include <cstdint>

#include "core/tensor/kernels.h"

namespace car::experts {

/// Geometry of one layer's banks, as read from the file.
struct ExpertBankInfo {
  tensor::MatrixView gate_bank;  ///< rows = n_ff * n_expert (expert-major), cols = n_embd
  tensor::MatrixView up_bank;    ///< rows = n_ff * n_expert, cols = n_embd
  tensor::MatrixView down_bank;  ///< rows = n_embd * n_expert, cols = n_ff
  int n_expert = 0;
  uint64_t gate_offset = 0;  ///< absolute file offsets of the banks (for positional reads)
  uint64_t up_offset = 0;
  uint64_t down_offset = 0;
};

}  // namespace car::experts
