// bench_kernels: how fast `y = W x` consumes weight bytes, per weight format, ISA, thread count and matrix
// size (L2-resident to 1 GiB), next to a plain multithreaded streaming read of a buffer of the same size
// (the machine's attainable read bandwidth). Reported as bytes_per_second = weight bytes / time.
//
//   bench_kernels                      # sizes up to 64 MiB (a short run)
//   bench_kernels --big                # adds 256 MiB and 1 GiB
//   bench_kernels --big --benchmark_filter='1024MiB'
//   bench_kernels --big --benchmark_filter='MatvecVsStream/.*/1024MiB/t2'
//                                      # matvec's ratio to a read of the same memory, pass by pass
//   bench_kernels --benchmark_filter='Q4KShape'
//                                      # Q4_K in both summation orders on the benchmark models' shapes
//   bench_kernels --benchmark_filter='Q4KTile'
//                                      # the repacked Q4_K prompt tile (issue #26): GMAC/s, share of the
//                                      # vpdpbusd peak, weight GiB/s
//   bench_kernels --benchmark_filter='FewVectors'
//                                      # an MoE expert's product with 1-8 vectors (batched decode, issue
//                                      # #25), from cache: the core's weight bytes per second
//   bench_kernels --benchmark_filter='PromptTile'
//                                      # the Q8_0 / Q6_K / Q5_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 prompt
//                                      # tiles (issue #26), the same counters; <type>_dotloop: the loop
//                                      # over the dot kernel those types ran before their tiles
//
// Matrices are 4096 columns wide; rows = size / row_bytes. Their contents are real quantized rows (a small
// set, tiled), so the kernels see valid scales; values do not affect speed. Q4_K matrices get a row count
// that is a multiple of 8, as every Q4_K matrix of a real model has, so they are products in llama.cpp's
// repacked gemv order (kernel_table.h repacked()), the one decode runs; MatvecVsStream/Q4_K_vecdot takes one
// row fewer, which keeps ggml_vec_dot_q4_K_q8_K's order (issue #29 compares the two).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/kernels.h"
#include "core/util/thread_pool.h"

namespace {

using car::GgmlType;
using car::ThreadPool;
using namespace car::tensor;

constexpr int64_t kCols = 4096;

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : size(n), data(static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  size_t size;
  uint8_t* data;
};

ThreadPool& pool_of(int threads) {
  static ThreadPool one(1), two(2);
  return threads >= 2 ? two : one;
}

/// A cached matrix per (type, size): building a 1 GiB matrix once is enough.
struct Matrix {
  std::unique_ptr<AlignedBuffer> buf;
  MatrixView view;
};

/// `vec_dot_order`: for Q4_K, a row count that is not a multiple of 8 (the product keeps the vec_dot order);
/// otherwise Q4_K rows are rounded down to a multiple of 8 (the repacked gemv order).
Matrix& matrix(GgmlType t, size_t bytes, bool vec_dot_order = false) {
  struct Key {
    GgmlType type;
    size_t bytes;
    bool vec_dot_order;
    bool operator==(const Key&) const = default;
  };
  static std::vector<std::pair<Key, std::unique_ptr<Matrix>>> cache;
  const Key want{t, bytes, vec_dot_order};
  for (auto& [key, m] : cache) {
    if (key == want) return *m;
  }
  // Keep at most one big matrix alive.
  if (bytes >= (256u << 20)) {
    std::erase_if(cache, [](const auto& e) { return e.first.bytes >= (256u << 20); });
  }
  auto m = std::make_unique<Matrix>();
  const size_t rb = detail::row_bytes(t, kCols);
  int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(bytes / rb));
  if (t == GgmlType::Q4_K && !vec_dot_order && rows >= 8) rows -= rows % 8;
  if (t == GgmlType::Q4_K && vec_dot_order && rows % 8 == 0) rows -= 1;
  m->buf = std::make_unique<AlignedBuffer>(rb * static_cast<size_t>(rows));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  constexpr int kDistinct = 16;
  std::vector<float> x(kCols);
  std::vector<uint8_t> rows_q(rb * kDistinct);
  for (int r = 0; r < kDistinct; ++r) {
    if (!can_quantize(t)) {  // the codebook formats (no quantizer): random blocks, a small fp16 scale first
      for (size_t b = 0; b < rb; ++b) rows_q[rb * r + b] = static_cast<uint8_t>(rng());
      const int64_t bb = detail::geometry(t).block_bytes;
      for (int64_t blk = 0; blk < static_cast<int64_t>(rb) / bb; ++blk) {
        const uint16_t d = 0x2000;  // fp16 2^-7
        std::memcpy(rows_q.data() + rb * r + blk * bb, &d, 2);
      }
      continue;
    }
    for (auto& v : x) v = dist(rng);
    quantize_row(t, x.data(), rows_q.data() + rb * r, kCols);
  }
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(m->buf->data + rb * r, rows_q.data() + rb * (r % kDistinct), rb);
  m->view = MatrixView{t, m->buf->data, kCols, rows, rb};
  cache.emplace_back(want, std::move(m));
  return *cache.back().second;
}

void BM_Matvec(benchmark::State& state, GgmlType t, Isa isa, bool vec_dot_order) {
  if (isa != Isa::scalar &&
      (detect_isa() == Isa::scalar || (isa == Isa::avx512 && detect_isa() != Isa::avx512))) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0)) << 10;
  const int threads = static_cast<int>(state.range(1));
  Matrix& m = matrix(t, bytes, vec_dot_order);
  set_isa(isa);
  std::vector<float> x(kCols), y(static_cast<size_t>(m.view.rows));
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  ThreadPool& pool = pool_of(threads);
  for (auto _ : state) {
    matvec(m.view, x.data(), y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.view.rows) *
                          static_cast<int64_t>(m.view.row_bytes));
}

__attribute__((target("avx2"))) uint64_t read_range(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0) ^ _mm256_extract_epi64(s, 3));
}

/// One plain read of [p, p + bytes): 64 KiB chunks split over the pool's threads by
/// ThreadPool::parallel_for_shares, as matvec splits its rows (each thread streams its own contiguous share).
uint64_t stream_read(const uint8_t* p, size_t bytes, ThreadPool& pool) {
  const size_t chunk = detail::kChunkBytes;
  const int64_t chunks = static_cast<int64_t>((bytes + chunk - 1) / chunk);
  std::atomic<uint64_t> sink{0};
  pool.parallel_for_shares(chunks, 1, 0, [&](int64_t b, int64_t e) {
    uint64_t v = 0;
    for (int64_t c = b; c < e; ++c) {
      const size_t off = static_cast<size_t>(c) * chunk;
      v ^= read_range(p + off, std::min(chunk, bytes - off));
    }
    sink.fetch_xor(v, std::memory_order_relaxed);
  });
  return sink.load();
}

/// The baseline: the machine's attainable read bandwidth, a plain streaming read of a buffer.
void BM_StreamRead(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 10;
  const int threads = static_cast<int>(state.range(1));
  static std::unique_ptr<AlignedBuffer> buf;
  if (!buf || buf->size != bytes) {
    buf.reset();
    buf = std::make_unique<AlignedBuffer>(bytes);
    std::memset(buf->data, 1, bytes);
  }
  ThreadPool& pool = pool_of(threads);
  uint64_t sink = 0;
  for (auto _ : state) sink ^= stream_read(buf->data, bytes, pool);
  benchmark::DoNotOptimize(sink);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

/// matvec against a streaming read of the same matrix memory, back to back pass by pass (the shared machine's
/// bandwidth drifts by tens of percent between seconds, so separate runs compare poorly). Counters: medians
/// over the passes of the stream's and matvec's GiB/s and of their ratio (matvec / stream, per pair).
/// `interleaved`: the Q4_K or Q6_K matrix in the interleaved layout (tensor::interleave_all; rows a multiple
/// of 16), as a model's Q4_K and Q6_K matrices are held under AVX-512 (issues #29, #25). A third argument > 1
/// multiplies that many vectors in the gemv order (matmul_ordered, as a batched decode step gives an MoE
/// expert its few rows; issue #25) instead of one; the GiB/s are still weight bytes.
void BM_MatvecVsStream(benchmark::State& state, GgmlType t, bool vec_dot_order, bool interleaved = false) {
  if (detect_isa() != Isa::avx512) {
    state.SkipWithError("needs avx512");
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0)) << 10;
  const int threads = static_cast<int>(state.range(1));
  Matrix& plain = matrix(t, bytes, vec_dot_order);
  set_isa(Isa::avx512);
  static std::shared_ptr<uint8_t> il_bytes;
  static Matrix il;
  Matrix& m = interleaved ? il : plain;
  if (interleaved && (il.view.type != plain.view.type || il.view.cols != plain.view.cols ||
                      il.view.rows != plain.view.rows / 16 * 16 || !il_bytes)) {
    il_bytes.reset();
    il.view = plain.view;
    il.view.rows -= il.view.rows % 16;
    MatrixView* one = &il.view;
    il_bytes = car::tensor::interleave_all(std::span<MatrixView* const>(&one, 1), false);
  }
  const uint8_t* data = m.view.data;
  const size_t wbytes = static_cast<size_t>(m.view.rows) * m.view.row_bytes;
  const int64_t nvec = state.range(2);
  std::vector<float> x(static_cast<size_t>(kCols * nvec), 0.5f), y(static_cast<size_t>(m.view.rows * nvec));
  const std::vector<uint8_t> gemv(static_cast<size_t>(nvec), 0);
  ThreadPool& pool = pool_of(threads);
  std::vector<double> stream_gibs, matvec_gibs, ratio;
  uint64_t sink = 0;
  using Clock = std::chrono::steady_clock;
  const double gib = static_cast<double>(wbytes) / (1u << 30);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    sink ^= stream_read(data, wbytes, pool);
    const auto t1 = Clock::now();
    if (nvec == 1) {
      matvec(m.view, x.data(), y.data(), &pool);
    } else {
      matmul_ordered(m.view, x.data(), nvec, kCols, y.data(), m.view.rows, gemv.data(), &pool);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    const auto t2 = Clock::now();
    stream_gibs.push_back(gib / std::chrono::duration<double>(t1 - t0).count());
    matvec_gibs.push_back(gib / std::chrono::duration<double>(t2 - t1).count());
    ratio.push_back(matvec_gibs.back() / stream_gibs.back());
  }
  benchmark::DoNotOptimize(sink);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["stream_GiBps"] = median(stream_gibs);
  state.counters["matvec_GiBps"] = median(matvec_gibs);
  state.counters["ratio"] = median(ratio);
}

/// One KV group's attention (a GQA group of `g` query heads over n_kv cached keys, dk = dv = 64, fp16 K / V
/// in cache), as the engine runs it: attend_group, or (`per_head`) attend_head once per head - the path
/// before attend_group. Counter: keys x heads a second.
void BM_AttentionGroup(benchmark::State& state, bool per_head) {
  const int64_t n_kv = state.range(0), g = state.range(1), dk = 64, dv = 64;
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(g * dk)), out(static_cast<size_t>(g * dv));
  for (float& x : q) x = dist(rng);
  std::vector<uint16_t> k(static_cast<size_t>(n_kv * dk)), v(static_cast<size_t>(n_kv * dv));
  for (uint16_t& x : k) x = car::tensor::fp32_to_fp16(dist(rng));
  for (uint16_t& x : v) x = car::tensor::fp32_to_fp16(dist(rng));
  std::vector<uint16_t> q16(static_cast<size_t>(dk)), acc16(static_cast<size_t>(dv));
  for (auto _ : state) {
    if (per_head) {
      for (int64_t h = 0; h < g; ++h) {
        attend_head(q.data() + h * dk, k.data(), v.data(), n_kv, dk, dv, 0.125f, out.data() + h * dv,
                    q16.data(), acc16.data());
      }
    } else {
      attend_group(q.data(), g, k.data(), v.data(), n_kv, dk, dv, 0.125f, out.data(), nullptr, q16.data(),
                   acc16.data());
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["key_heads_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * n_kv * g), benchmark::Counter::kIsRate);
}

/// `rows` quantized rows of `cols` at `data` (`rb` bytes each): 16 rows of random values, repeated - the
/// values do not change a kernel's speed, and quantizing every row of a large matrix would dominate setup.
void fill_repeating_rows(GgmlType t, int64_t rows, int64_t cols, size_t rb, uint8_t* data, std::mt19937& rng,
                         std::normal_distribution<float>& dist) {
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (r < 16) {
      for (auto& v : x) v = dist(rng);
      quantize_row(t, x.data(), data + rb * static_cast<size_t>(r), cols);
    } else {
      std::memcpy(data + rb * static_cast<size_t>(r), data + rb * static_cast<size_t>(r % 16), rb);
    }
  }
}

/// A benchmark's `rows` x `cols` matrix of type t: fill_repeating_rows's rows (drawn from the caller's rng),
/// with the active ISA set to the CPU's best.
struct FilledMatrix {
  FilledMatrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng,
               std::normal_distribution<float>& dist)
      : rb(detail::row_bytes(t, cols)),
        buf(rb * static_cast<size_t>(rows)),
        view{t, buf.data, cols, rows, rb} {
    fill_repeating_rows(t, rows, cols, rb, buf.data, rng, dist);
    set_isa(detect_isa());
  }
  size_t rb;
  AlignedBuffer buf;
  MatrixView view;
};

/// One thread, one Q4_K matrix of the given shape (1.6-6.5 MB, L3-resident), in the repacked gemv order
/// (rows as given, a multiple of 8) or the vec_dot order (one row fewer): the kernels' CPU cost per weight
/// byte on the shapes decode multiplies (issue #29; bench/e2e models: dense 2048 / 5632, MoE experts 1024 /
/// 2816 columns).
void BM_Q4KShape(benchmark::State& state, bool vec_dot_order) {
  const GgmlType t = GgmlType::Q4_K;
  const int64_t rows = state.range(0) - (vec_dot_order ? 1 : 0);
  const int64_t cols = state.range(1);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const FilledMatrix m(t, rows, cols, rng, dist);
  const MatrixView& view = m.view;
  const size_t rb = m.rb;
  std::vector<float> x(static_cast<size_t>(cols));
  for (auto& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(rows));
  for (auto _ : state) {
    matvec(view, x.data(), y.data(), nullptr);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * static_cast<int64_t>(rb));
}

/// This core's clock in GHz as the kernel reports it (/proc/cpuinfo "cpu MHz"; 0 when absent).
double cpu_ghz() {
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return 0.0;
  char line[256];
  double mhz = 0.0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "cpu MHz : %lf", &mhz) == 1) break;
  }
  std::fclose(f);
  return mhz / 1000.0;
}

/// One thread, matmul of a Q4_K matrix (rows a multiple of 8: the repacked orders) with `nvec` vectors, all
/// in the gemm order (a prompt batch of whole groups of 4) or all in the gemv order (MoE expert rows,
/// mul_mat_id). Counters: GMAC/s (rows x cols x nvec multiply-adds, the activations' rounding included in the
/// time), peak_GMACps = 64 MAC/cycle (one 512-bit vpdpbusd a cycle, as Zen 4 and Ice Lake / Sapphire Rapids
/// issue them) at the nominal clock /proc/cpuinfo reports - cores boost above it, so Q4KTile/VnniPeak's
/// measured rate is the denominator to quote - and the weight bytes per second of one pass.
void BM_Q4KTile(benchmark::State& state, bool gemm) {
  const GgmlType t = GgmlType::Q4_K;
  const int64_t rows = state.range(0), cols = state.range(1), nvec = state.range(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const FilledMatrix m(t, rows, cols, rng, dist);
  const MatrixView& view = m.view;
  const size_t rb = m.rb;
  std::vector<float> x(static_cast<size_t>(cols * nvec));
  for (auto& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(rows * nvec));
  std::vector<uint8_t> order(static_cast<size_t>(nvec), gemm ? 1 : 0);
  for (auto _ : state) {
    matmul_ordered(view, x.data(), nvec, cols, y.data(), rows, order.data(), nullptr);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double macs = static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(nvec);
  state.counters["GMACps"] =
      benchmark::Counter(macs * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  const double ghz = cpu_ghz();
  state.counters["peak_GMACps"] = 64.0 * ghz;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * static_cast<int64_t>(rb));
}

/// One thread, an MoE expert's product with `nvec` vectors in the gemv order (mul_mat_id), through
/// matmul_ordered as a batched decode step runs it: the Q4_K gate/up shape (2816 x 1024) in the interleaved
/// layout a model holds, and the Q6_K down shape (1024 x 2816; Q4_K_M files keep half the downs in Q6_K),
/// also interleaved as a model holds it, and as "Q6_K_file" in the file's layout (issue #25: what the layout
/// saves). The 1.6-2.3 MB matrix stays in cache, so the weight bytes per second are the CPU's ceiling for
/// that many vectors: batched decode at N sequences gives each expert about N x used / experts of them (issue
/// #25), and two threads at this rate against the machine's read rate say whether those products wait on
/// memory or on the core.
void BM_FewVectors(benchmark::State& state, GgmlType t, bool file_layout) {
  const int64_t rows = state.range(0), cols = state.range(1), nvec = state.range(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  FilledMatrix m(t, rows, cols, rng, dist);
  MatrixView& view = m.view;
  const size_t rb = m.rb;
  std::shared_ptr<uint8_t> il;
  if (!file_layout && detect_isa() == Isa::avx512) {
    MatrixView* one = &view;
    il = car::tensor::interleave_all(std::span<MatrixView* const>(&one, 1), false);
  }
  std::vector<float> x(static_cast<size_t>(cols * nvec));
  for (auto& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(rows * nvec));
  const std::vector<uint8_t> gemv(static_cast<size_t>(nvec), 0);
  for (auto _ : state) {
    matmul_ordered(view, x.data(), nvec, cols, y.data(), rows, gemv.data(), nullptr);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * static_cast<int64_t>(rb));
}

/// One thread, the prompt tile (DotKernels::tile) of a `t` matrix that llama.cpp does not repack (Q8_0, Q6_K,
/// ...; for Q2_K, which it repacks, DotKernels::tile_repacked in the gemm order) with `nvec` vectors, called
/// on chunks of rows as matmul deals them to its threads (about kChunkBytes of rows, or a 16th of them for a
/// tile that packs rows); the activations are rounded once, outside the timing. The same counters as
/// BM_Q4KTile.
void BM_PromptTile(benchmark::State& state, GgmlType t, bool dot_loop = false, bool vec_dot = false) {
  const int64_t rows = state.range(0), cols = state.range(1), nvec = state.range(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const FilledMatrix m(t, rows, cols, rng, dist);
  const size_t rb = m.rb;
  // dot_loop: what matmul runs for a type without a tile (kernels.cpp: per chunk, vectors 8 at a time, each
  // (row, vector) by the dot kernel) - the "before" of a new tile.
  // A type llama.cpp repacks (Q2_K) runs its repacked tile with every vector in the gemm order, as a prompt's
  // whole groups of 4 are, or the loop over dot_gemm.
  const bool repacked = t == GgmlType::Q2_K && !vec_dot;  // vec_dot: its tile in the vec_dot order
  const detail::DotFn dot = repacked ? detail::active_kernels().dot_gemm[detail::slot(t)]
                                     : detail::active_kernels().dot[detail::slot(t)];
  const detail::RepackedTileFn tile_rp =
      repacked && !dot_loop ? detail::active_kernels().tile_repacked[detail::slot(t)] : nullptr;
  const std::vector<uint8_t> all_gemm(static_cast<size_t>(nvec), 1);
  const detail::TileFn tile = dot_loop || repacked ? nullptr : detail::active_kernels().tile[detail::slot(t)];
  if (tile == nullptr && tile_rp == nullptr && !dot_loop) {
    state.SkipWithError("no tile for this type in the active table");
    return;
  }
  const size_t ab = activation_row_bytes(t, cols);
  std::vector<uint8_t> acts(ab * static_cast<size_t>(nvec));
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t v = 0; v < nvec; ++v) {
    for (auto& e : x) e = dist(rng);
    quantize_activation(t, x.data(), acts.data() + ab * static_cast<size_t>(v), cols);
  }
  // MatmulPlan::grain's chunks (kernels.cpp)
  int64_t grain = std::max<int64_t>(1, std::min(static_cast<int64_t>(detail::kChunkBytes / rb), rows / 16));
  const int64_t group = dot_loop             ? 0
                        : tile_rp != nullptr ? 16
                                             : detail::active_kernels().tile_group[detail::slot(t)];
  if (group > 0) grain = std::max<int64_t>(group, rows / 16 / group * group);
  std::vector<float> y(static_cast<size_t>(rows * nvec));
  auto loop = [&](const uint8_t* w, int64_t nrows, float* out) {
    for (int64_t t0 = 0; t0 < nvec; t0 += 8) {
      for (int64_t r = 0; r < nrows; ++r) {
        for (int64_t i = t0; i < std::min(nvec, t0 + 8); ++i) {
          out[i * rows + r] =
              dot(w + static_cast<size_t>(r) * rb, acts.data() + ab * static_cast<size_t>(i), cols);
        }
      }
    }
  };
  for (auto _ : state) {
    for (int64_t r0 = 0; r0 < rows; r0 += grain) {
      if (tile != nullptr) {
        tile(m.buf.data + static_cast<size_t>(r0) * rb, rb, std::min(grain, rows - r0), acts.data(), ab, nvec,
             cols, y.data() + r0, rows);
      } else if (tile_rp != nullptr) {
        tile_rp(m.buf.data + static_cast<size_t>(r0) * rb, rb, std::min(grain, rows - r0), acts.data(), ab,
                nvec, cols, y.data() + r0, rows, all_gemm.data());
      } else {
        loop(m.buf.data + static_cast<size_t>(r0) * rb, std::min(grain, rows - r0), y.data() + r0);
      }
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double macs = static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(nvec);
  state.counters["GMACps"] =
      benchmark::Counter(macs * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_GMACps"] = 64.0 * cpu_ghz();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * rows * static_cast<int64_t>(rb));
}

/// 12 independent vpdpbusd chains (more than latency x throughput on current cores): this core's attainable
/// integer multiply-add rate, the denominator of the kernels' share of the peak. Needs AVX512-VNNI.
// GCC 12's AVX-512 headers trip -Wuninitialized in _mm512_reduce_add_epi32 (see core/tensor/simd_avx512.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t vnni_chains(int64_t iters) {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    __asm__ volatile("" : "+v"(w), "+v"(x));
  }
  __m512i s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, a[i]);
  return _mm512_reduce_add_epi32(s);
}
#pragma GCC diagnostic pop

void BM_VnniPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("no AVX512-VNNI on this CPU");
    return;
  }
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) benchmark::DoNotOptimize(vnni_chains(kIters));
  state.counters["GMACps"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kIters * 12 * 64 * 1e-9, benchmark::Counter::kIsRate);
}

void register_all(bool big) {
  std::vector<int64_t> sizes_kib = {256, 4 << 10, 64 << 10};  // L2-resident, L3-resident, DRAM
  if (big) {
    sizes_kib.push_back(256 << 10);
    sizes_kib.push_back(1 << 20);  // 1 GiB
  }
  auto name_size = [](int64_t kib) {
    return kib >= 1024 ? std::to_string(kib >> 10) + "MiB" : std::to_string(kib) + "KiB";
  };
  for (int64_t kib : sizes_kib) {
    for (int threads : {1, 2}) {
      benchmark::RegisterBenchmark(("StreamRead/" + name_size(kib) + "/t" + std::to_string(threads)).c_str(),
                                   BM_StreamRead)
          ->Args({kib, threads})
          ->UseRealTime()
          ->MinTime(big ? 1.0 : 0.2);
    }
  }
  for (int64_t kib : sizes_kib) {
    if (kib < (64 << 10)) continue;  // DRAM-sized only: the point is the bandwidth ratio
    for (GgmlType t :
         {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
          GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4, GgmlType::IQ2_XXS,
          GgmlType::IQ1_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ2_XS, GgmlType::IQ2_S,
          GgmlType::IQ1_M, GgmlType::TQ1_0, GgmlType::TQ2_0}) {
      for (int threads : {1, 2}) {
        const std::string name = "MatvecVsStream/" + std::string(car::ggml_type_name(t)) + "/" +
                                 name_size(kib) + "/t" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [t](benchmark::State& s) { BM_MatvecVsStream(s, t, false); })
            ->Args({kib, threads, 1})
            ->UseRealTime()
            ->MinTime(big ? 2.0 : 0.5);
      }
    }
    for (int threads : {1, 2}) {
      const std::string name =
          "MatvecVsStream/Q4_K_vecdot/" + name_size(kib) + "/t" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [](benchmark::State& s) { BM_MatvecVsStream(s, GgmlType::Q4_K, true); })
          ->Args({kib, threads, 1})
          ->UseRealTime()
          ->MinTime(big ? 2.0 : 0.5);
    }
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K}) {
      for (int threads : {1, 2}) {
        const std::string name = "MatvecVsStream/" + std::string(car::ggml_type_name(t)) + "_interleaved/" +
                                 name_size(kib) + "/t" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [t](benchmark::State& s) { BM_MatvecVsStream(s, t, false, true); })
            ->Args({kib, threads, 1})
            ->UseRealTime()
            ->MinTime(big ? 2.0 : 0.5);
      }
    }
    // A batched decode step's expert products (issue #25): 2-8 vectors in the gemv order, two threads, Q4_K
    // interleaved, Q6_K interleaved and in the file's layout.
    for (int64_t nvec : {2, 3, 4, 8}) {
      for (const auto& [t, il] : {std::pair{GgmlType::Q4_K, true}, std::pair{GgmlType::Q6_K, true},
                                  std::pair{GgmlType::Q6_K, false}}) {
        const std::string name = "MatvecVsStream/" + std::string(car::ggml_type_name(t)) +
                                 (il ? "_interleaved/" : "/") + name_size(kib) + "/t2/v" +
                                 std::to_string(nvec);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [t, il](benchmark::State& s) { BM_MatvecVsStream(s, t, false, il); })
            ->Args({kib, 2, nvec})
            ->UseRealTime()
            ->MinTime(big ? 2.0 : 0.5);
      }
    }
  }
  for (bool vec_dot_order : {false, true}) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{2048, 2048}, {5632, 2048}, {2048, 5632}, {2816, 1024}, {1024, 2816}}) {
      const std::string name = std::string("Q4KShape/") + (vec_dot_order ? "vecdot" : "gemv") + "/" +
                               std::to_string(rows) + "x" + std::to_string(cols);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [vec_dot_order](benchmark::State& s) { BM_Q4KShape(s, vec_dot_order); })
          ->Args({rows, cols})
          ->MinTime(0.3);
    }
  }
  for (bool per_head : {false, true}) {
    for (int64_t n_kv : {16, 64, 512, 4096}) {
      const std::string name = std::string("AttentionGroup/") + (per_head ? "per_head" : "group") + "/kv" +
                               std::to_string(n_kv) + "/g2";
      benchmark::RegisterBenchmark(name.c_str(),
                                   [per_head](benchmark::State& s) { BM_AttentionGroup(s, per_head); })
          ->Args({n_kv, 2})
          ->MinTime(0.3);
    }
  }
  benchmark::RegisterBenchmark("Q4KTile/VnniPeak", BM_VnniPeak)->MinTime(0.5);
  for (bool gemm : {true, false}) {
    // dense-1b's products (gemm, a 128-token prompt) and moe-2b's expert products (gemv, 16 rows an expert)
    const std::vector<std::array<int64_t, 3>> shapes =
        gemm ? std::vector<std::array<int64_t, 3>>{{2048, 2048, 128}, {5632, 2048, 128}, {2048, 5632, 128}}
             : std::vector<std::array<int64_t, 3>>{{2816, 1024, 16}, {1024, 2816, 16}, {2048, 2048, 8}};
    for (const auto& sh : shapes) {
      const std::string name = std::string("Q4KTile/") + (gemm ? "gemm" : "gemv") + "/" +
                               std::to_string(sh[0]) + "x" + std::to_string(sh[1]) + "/v" +
                               std::to_string(sh[2]);
      benchmark::RegisterBenchmark(name.c_str(), [gemm](benchmark::State& s) { BM_Q4KTile(s, gemm); })
          ->Args({sh[0], sh[1], sh[2]})
          ->MinTime(0.5);
    }
  }
  for (const auto& [t, rows, cols, file] : {std::tuple{GgmlType::Q4_K, int64_t{2816}, int64_t{1024}, false},
                                            std::tuple{GgmlType::Q6_K, int64_t{1024}, int64_t{2816}, false},
                                            std::tuple{GgmlType::Q6_K, int64_t{1024}, int64_t{2816}, true}}) {
    for (int64_t nvec : {1, 2, 3, 4, 8}) {
      const std::string name = std::string("FewVectors/") + std::string(car::ggml_type_name(t)) +
                               (file ? "_file/" : "/") + std::to_string(rows) + "x" + std::to_string(cols) +
                               "/v" + std::to_string(nvec);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [t, file](benchmark::State& st) { BM_FewVectors(st, t, file); })
          ->Args({rows, cols, nvec})
          ->MinTime(0.5);
    }
  }
  // Q5_K (and the types after it, issue #26) also as "<type>_dotloop": the path they had before their tile.
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::Q3_K, GgmlType::Q2_K,
                     GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1}) {
    for (bool dot_loop : {false, true}) {
      if (dot_loop && (t == GgmlType::Q8_0 || t == GgmlType::Q6_K)) continue;
      // dense-1b's products with a 128-token prompt (attention, gate/up, down), 32 / 16 / 8 / 4 vectors
      // (short prompts, batched decode), and cache-resident ones (256 rows: 168-384 KiB, in L2) with a
      // prompt's 128 vectors and batched decode's 8
      const std::vector<std::array<int64_t, 3>> shapes = {
          {2048, 2048, 128}, {5632, 2048, 128}, {2048, 5632, 128}, {2048, 2048, 32},
          {2048, 2048, 16},  {2048, 2048, 8},   {2048, 2048, 4},   {256, 2048, 128}, {256, 2048, 8}};
      for (const std::array<int64_t, 3>& sh : shapes) {
        const std::string name = std::string("PromptTile/") + std::string(car::ggml_type_name(t)) +
                                 (dot_loop ? "_dotloop" : "") + "/" + std::to_string(sh[0]) + "x" +
                                 std::to_string(sh[1]) + "/v" + std::to_string(sh[2]);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [t, dot_loop](benchmark::State& s) { BM_PromptTile(s, t, dot_loop); })
            ->Args({sh[0], sh[1], sh[2]})
            ->MinTime(0.5);
      }
    }
  }
  // Q2_K in the vec_dot order (a matrix whose row count is not a multiple of 8; the rows here are, but the
  // tile is called directly)
  for (bool dot_loop : {false, true}) {
    for (const std::array<int64_t, 3>& sh :
         std::vector<std::array<int64_t, 3>>{{2048, 2048, 128}, {2048, 2048, 8}, {2048, 2048, 4}}) {
      const std::string name = std::string("PromptTile/Q2_K_vecdot") + (dot_loop ? "_dotloop" : "") + "/" +
                               std::to_string(sh[0]) + "x" + std::to_string(sh[1]) + "/v" +
                               std::to_string(sh[2]);
      benchmark::RegisterBenchmark(
          name.c_str(), [dot_loop](benchmark::State& s) { BM_PromptTile(s, GgmlType::Q2_K, dot_loop, true); })
          ->Args({sh[0], sh[1], sh[2]})
          ->MinTime(0.5);
    }
  }
  const GgmlType types[] = {
      GgmlType::Q4_0,   GgmlType::Q4_1,    GgmlType::Q5_0,  GgmlType::Q5_1,    GgmlType::Q8_0,
      GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::Q4_K,  GgmlType::Q5_K,    GgmlType::Q6_K,
      GgmlType::F16,    GgmlType::BF16,    GgmlType::F32,   GgmlType::IQ4_NL,  GgmlType::IQ4_XS,
      GgmlType::MXFP4,  GgmlType::IQ2_XXS, GgmlType::IQ1_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S,
      GgmlType::IQ2_XS, GgmlType::IQ2_S,   GgmlType::IQ1_M, GgmlType::TQ1_0,   GgmlType::TQ2_0};
  for (GgmlType t : types) {
    // Q4_K twice: the repacked gemv order (rows % 8 == 0, as in models) and the vec_dot order.
    for (bool vec_dot_order : {false, true}) {
      if (vec_dot_order && t != GgmlType::Q4_K) continue;
      for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
        for (int64_t kib : sizes_kib) {
          // The scalar kernels are only the oracle: measure them at one small size.
          if (isa == Isa::scalar && kib > (4 << 10)) continue;
          for (int threads : {1, 2}) {
            const std::string name = "Matvec/" + std::string(car::ggml_type_name(t)) +
                                     (vec_dot_order ? "_vecdot" : "") + "/" + std::string(isa_name(isa)) +
                                     "/" + name_size(kib) + "/t" + std::to_string(threads);
            benchmark::RegisterBenchmark(
                name.c_str(),
                [t, isa, vec_dot_order](benchmark::State& s) { BM_Matvec(s, t, isa, vec_dot_order); })
                ->Args({kib, threads})
                ->UseRealTime()
                ->MinTime(big ? 1.0 : 0.2);
          }
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool big = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--big") {
      big = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  register_all(big);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
