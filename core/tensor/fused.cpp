// matvec_fused: several matrix-vector products in one fork-join (see kernels.h).
//
// Decode issues one matvec per weight matrix, and the matrices of a 1-2B model are small (MoE experts 1.6 MB,
// K/V 0.3 MB): each region ends with one thread waiting for the other's last chunk, and each thread restarts
// its memory stream at every region and chunk it jumps to. Grouping the products that are ready at the same
// time (Q/K/V; gate/up; every chosen expert's gate/up, then their downs) into one region pays the tail once
// per group and rounds each shared input once; the contiguous shares (below) keep each thread's stream long.
// (The fork-join itself is cheap: ~0.25 us for an empty ThreadPool::run on 2 threads.) Rows are computed by
// the same kernels matvec uses (the table's multi-row kernel, else its dot kernel), so every result equals
// matvec's bit for bit.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"
#include "core/util/thread_pool.h"

namespace car::tensor {
namespace {

using detail::DotKernels;
using detail::slot;

// Chunks of about detail::kChunkBytes of weights, and groups smaller than detail::kMinParallelBytes in
// total stay on the calling thread. The chunk list (all tasks' chunks in task order) is split into one
// contiguous share per thread (ThreadPool::parallel_for_shares): each thread streams its share front to back,
// and only the tail is balanced by taking single chunks from the others' back ends. (Handing out the 64 KiB
// chunks alternately from one cursor made each thread jump every chunk; on the MoE decode products that ran
// at 22-26 GB/s against 30-37 GB/s with shares.)
constexpr size_t kActAlign = 64;

/// Per-thread bookkeeping of one call (grow-only; the rounded inputs live in detail::act_scratch).
struct FusedState {
  std::vector<const void*> act_of;      // rounded input per task
  std::vector<size_t> act_offset;       // offset of each task's rounding in the scratch
  std::vector<uint8_t> rounds;          // whether the task rounds its input (else it is F32 or shares one)
  std::vector<int64_t> chunk_end;       // cumulative chunk counts per task
  std::vector<int64_t> rows_per_chunk;  // per task
};

thread_local FusedState tls_fused;

void check_task(const MatvecTask& t, const DotKernels& k) {
  detail::check_view(t.w, k);
  CAR_CHECK(t.x != nullptr && (t.w.rows == 0 || t.y != nullptr));
}

}  // namespace

void detail::matvec_rows(const DotKernels& k, const MatrixView& w, const void* act, float* y, int64_t begin,
                         int64_t end) {
  const size_t stride = w.row_bytes;
  const uint8_t* base = w.data;
  if (w.interleaved) {  // whole groups of 16 rows (matvec_fused's chunks)
    k.q4k_interleaved.rows_gemv(base + static_cast<size_t>(begin) * stride, stride, end - begin, act, w.cols,
                                y + begin);
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
  if (detail::repacked(w)) {
    rpc = detail::whole_groups(rpc, w.interleaved ? detail::kRepackedRowGroup : k.gemv_group[slot(w.type)]);
  }
  return rpc;
}

void matvec_fused(const MatvecTask* tasks, size_t n, ThreadPool* pool) {
  if (n == 0) return;
  const DotKernels& k = detail::kernels_for(current_isa());
  if (k.q4k_interleaved.rows_gemv == nullptr) {
    // An interleaved matrix under a table without its kernels (the ISA changed after the load): the same
    // products on de-interleaved copies.
    bool any = false;
    for (size_t i = 0; i < n && !any; ++i) any = tasks[i].w.interleaved;
    if (any) {
      std::vector<MatvecTask> plain(tasks, tasks + n);
      std::vector<std::vector<uint8_t>> bufs(n);
      for (size_t i = 0; i < n; ++i) {
        if (plain[i].w.interleaved) plain[i].w = detail::plain_copy(plain[i].w, bufs[i]);
      }
      matvec_fused(plain.data(), n, pool);
      return;
    }
  }
  FusedState& s = tls_fused;
  s.act_of.assign(n, nullptr);
  s.act_offset.assign(n, 0);
  s.rounds.assign(n, 0);

  // One rounding per distinct (input, activation type, length); F32 weights read x in place.
  size_t act_bytes = 0;
  size_t total_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const MatvecTask& t = tasks[i];
    check_task(t, k);
    total_bytes += static_cast<size_t>(t.w.rows) * t.w.row_bytes;
    const GgmlType at = detail::act_type(t.w.type);
    if (at == GgmlType::F32) continue;
    size_t j = 0;
    while (j < i &&
           !(tasks[j].x == t.x && tasks[j].w.cols == t.w.cols && detail::act_type(tasks[j].w.type) == at)) {
      ++j;
    }
    if (j < i) {
      s.act_offset[i] = s.act_offset[j];
      continue;
    }
    s.rounds[i] = 1;
    s.act_offset[i] = act_bytes;
    act_bytes += (detail::row_bytes(at, t.w.cols) + kActAlign - 1) / kActAlign * kActAlign;
  }
  uint8_t* acts = detail::act_scratch(std::max<size_t>(1, act_bytes));
  for (size_t i = 0; i < n; ++i) {
    const MatvecTask& t = tasks[i];
    const GgmlType at = detail::act_type(t.w.type);
    if (at == GgmlType::F32) {
      s.act_of[i] = t.x;
      continue;
    }
    if (s.rounds[i]) k.quantize_act[slot(at)](t.x, acts + s.act_offset[i], t.w.cols);
    s.act_of[i] = acts + s.act_offset[i];
  }

  if (pool == nullptr || pool->size() == 1 || total_bytes < detail::kMinParallelBytes) {
    for (size_t i = 0; i < n; ++i)
      detail::matvec_rows(k, tasks[i].w, s.act_of[i], tasks[i].y, 0, tasks[i].w.rows);
    return;
  }

  // One chunk list over all tasks, in task order.
  s.chunk_end.resize(n);
  s.rows_per_chunk.resize(n);
  int64_t chunks = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t rpc = detail::matvec_chunk_rows(k, tasks[i].w);
    s.rows_per_chunk[i] = rpc;
    chunks += (tasks[i].w.rows + rpc - 1) / rpc;
    s.chunk_end[i] = chunks;
  }
  const int64_t* chunk_end = s.chunk_end.data();
  const int64_t* rows_per_chunk = s.rows_per_chunk.data();
  const void* const* act_of = s.act_of.data();
  pool->parallel_for_shares(chunks, 1, 0, [&](int64_t begin, int64_t end) {
    size_t i = 0;
    for (int64_t c = begin; c < end; ++c) {
      while (c >= chunk_end[i]) ++i;
      const int64_t first = i == 0 ? 0 : chunk_end[i - 1];
      const int64_t r0 = (c - first) * rows_per_chunk[i];
      detail::matvec_rows(k, tasks[i].w, act_of[i], tasks[i].y, r0,
                          std::min(tasks[i].w.rows, r0 + rows_per_chunk[i]));
    }
  });
}

}  // namespace car::tensor
