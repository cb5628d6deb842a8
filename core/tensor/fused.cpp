// matvec's rows: the kernels of a one-vector product, which matvec, matvec_fused and matmul_fused's
// one-vector tasks run (kernels.cpp: matvec_fused is matmul_fused with one vector per task).
//
// Why decode fuses its products: it issues one matvec per weight matrix, and the matrices of a 1-2B model are
// small (MoE experts 1.6 MB, K/V 0.3 MB), so each region ends with one thread waiting for the other's last
// chunk, and each thread restarts its memory stream at every region and chunk it jumps to. Grouping the
// products that are ready at the same time (Q/K/V; gate/up; every chosen expert's gate/up, then their downs)
// into one region pays the tail once per group and rounds each shared input once. (The fork-join itself is
// cheap: ~0.25 us for an empty ThreadPool::run on 2 threads.)
//
// Chunks are about detail::kChunkBytes of weights, and groups smaller than detail::kMinParallelBytes in total
// stay on the calling thread. The chunk list (all tasks' chunks in task order) is split into one contiguous
// share per thread (ThreadPool::parallel_for_shares): each thread streams its share front to back, and only
// the tail is balanced by taking single chunks from the others' back ends. (Handing out the 64 KiB chunks
// alternately from one cursor made each thread jump every chunk; on the MoE decode products that ran at 22-26
// GB/s against 30-37 GB/s with shares.)
#include <algorithm>
#include <cstdint>

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"

namespace car::tensor {

using detail::DotKernels;
using detail::slot;

void detail::matvec_rows(const DotKernels& k, const MatrixView& w, const void* act, float* y, int64_t begin,
                         int64_t end) {
  const size_t stride = w.row_bytes;
  const uint8_t* base = w.data;
  if (w.interleaved) {  // whole groups of 16 rows (matvec_chunk_rows)
    k.interleaved[slot(w.type)].rows(base + static_cast<size_t>(begin) * stride, stride, end - begin, act,
                                     w.cols, y + begin);
    return;
  }
  if (detail::repacked(w)) {  // a single vector: llama.cpp's repacked gemv order
    if (const detail::RowsFn multi = k.rows_gemv[slot(w.type)]; multi != nullptr) {
      multi(base + static_cast<size_t>(begin) * stride, stride, end - begin, act, w.cols, y + begin);
      return;
    }
    const detail::DotFn dot = k.dot_gemv[slot(w.type)];
    for (int64_t r = begin; r < end; ++r) y[r] = dot(base + static_cast<size_t>(r) * stride, act, w.cols);
    return;
  }
  if (const detail::RowsFn multi = detail::rows_for(k, w.type, w.order); multi != nullptr) {
    multi(base + static_cast<size_t>(begin) * stride, stride, end - begin, act, w.cols, y + begin);
    return;
  }
  const detail::DotFn dot = detail::dot_for(k, w.type, w.order);
  for (int64_t r = begin; r < end; ++r) y[r] = dot(base + static_cast<size_t>(r) * stride, act, w.cols);
}

int64_t detail::matvec_chunk_rows(const DotKernels& k, const MatrixView& w) {
  int64_t rpc =
      std::max<int64_t>(1, static_cast<int64_t>(detail::kChunkBytes / std::max<size_t>(1, w.row_bytes)));
  // A gemv kernel that interleaves rows (DotKernels::gemv_group) gets whole groups, none padded.
  if (w.interleaved) {
    rpc = detail::whole_groups(rpc, detail::kRepackedRowGroup);
  } else if (detail::repacked(w)) {
    rpc = detail::whole_groups(rpc, k.gemv_group[slot(w.type)]);
  }
  return rpc;
}

}  // namespace car::tensor
