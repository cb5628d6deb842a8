// Test helper: a synthetic expert-bank file (random bytes laid out as a GGUF's stacked expert banks, at
// 32-byte-aligned offsets that are deliberately not 4096-aligned), its mapping, and the ExpertBankInfo a
// model would give for it; plus a counting / fault-injecting pread seam.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/experts/expert_source.h"
#include "core/experts/streamed_source.h"
#include "core/util/mapped_file.h"

namespace car::testing {

struct BankGeometry {
  int layers = 3;
  bool dense_first = true;  // layer 0 is dense (n_expert 0), as in models whose first block has no experts
  int n_expert = 8;
  int n_embd = 64;
  int n_ff = 40;  // gate/up: (n_ff, n_embd) per expert, down: (n_embd, n_ff); F32
  uint32_t seed = 7;
};

struct BankFile {
  std::string path;
  MappedFile map;
  std::vector<experts::ExpertBankInfo> banks;  // views point into `map`
  uint64_t expert_bytes(int p) const {         // per expert, projection p
    const auto& b = banks.back();
    const tensor::MatrixView* v[3] = {&b.gate_bank, &b.up_bank, &b.down_bank};
    return static_cast<uint64_t>(v[p]->rows) * v[p]->row_bytes / static_cast<uint64_t>(b.n_expert);
  }
};

inline BankFile make_bank_file(const std::string& path, const BankGeometry& g) {
  std::mt19937 rng(g.seed);
  std::vector<uint8_t> bytes(96, 0xAB);  // a "header": 3 x 32 bytes, so no bank starts page-aligned
  struct Pending {
    int layer, proj, rows, cols;
    uint64_t offset;
  };
  std::vector<Pending> placed;
  for (int l = 0; l < g.layers; ++l) {
    if (l == 0 && g.dense_first) continue;
    for (int p = 0; p < 3; ++p) {
      const int rows = (p == 2 ? g.n_embd : g.n_ff) * g.n_expert;
      const int cols = p == 2 ? g.n_ff : g.n_embd;
      const uint64_t offset = bytes.size();
      const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols) * 4;
      bytes.resize(bytes.size() + n);
      for (size_t i = 0; i < n; ++i) bytes[offset + i] = static_cast<uint8_t>(rng());
      bytes.resize(bytes.size() + 32 + 32 * (rng() % 3));  // padding, GGUF-aligned
      placed.push_back({l, p, rows, cols, offset});
    }
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  BankFile f;
  f.path = path;
  auto m = MappedFile::open(path);
  if (!m.ok()) std::abort();
  f.map = std::move(m).value();
  f.banks.resize(static_cast<size_t>(g.layers));
  for (const Pending& p : placed) {
    experts::ExpertBankInfo& b = f.banks[static_cast<size_t>(p.layer)];
    b.n_expert = g.n_expert;
    tensor::MatrixView v;
    v.type = GgmlType::F32;
    v.data = f.map.bytes().data() + p.offset;
    v.cols = p.cols;
    v.rows = p.rows;
    v.row_bytes = static_cast<size_t>(p.cols) * 4;
    v.order = tensor::ProductOrder::mul_mat_id;
    if (p.proj == 0) {
      b.gate_bank = v;
      b.gate_offset = p.offset;
    } else if (p.proj == 1) {
      b.up_bank = v;
      b.up_offset = p.offset;
    } else {
      b.down_bank = v;
      b.down_offset = p.offset;
    }
  }
  return f;
}

/// A matrix's bytes as the file lays them out (an interleaved view's rows de-interleaved).
inline std::vector<uint8_t> file_bytes(const tensor::MatrixView& v) {
  std::vector<uint8_t> out(static_cast<size_t>(v.rows) * v.row_bytes);
  if (v.interleaved) {
    tensor::deinterleave_rows(v, out.data());
  } else if (!out.empty()) {
    std::memcpy(out.data(), v.data, out.size());
  }
  return out;
}

/// Same shape, order and file bytes (a resident source may hold a bank interleaved, a streamed one never).
inline bool same_matrix(const tensor::MatrixView& got, const tensor::MatrixView& want) {
  return got.type == want.type && got.rows == want.rows && got.cols == want.cols &&
         got.row_bytes == want.row_bytes && got.order == want.order && file_bytes(got) == file_bytes(want);
}

/// The resident slice of expert e of `bank`, for comparison.
inline experts::ExpertWeights resident_weights(const experts::ExpertBankInfo& b, int e) {
  return {experts::expert_slice(b.gate_bank, b.n_expert, e), experts::expert_slice(b.up_bank, b.n_expert, e),
          experts::expert_slice(b.down_bank, b.n_expert, e)};
}

inline bool same_expert(const experts::ExpertWeights& got, const experts::ExpertBankInfo& b, int e) {
  const experts::ExpertWeights want = resident_weights(b, e);
  return same_matrix(got.gate, want.gate) && same_matrix(got.up, want.up) && same_matrix(got.down, want.down);
}

/// A pread seam that counts calls per offset and can fail, block, or refuse O_DIRECT.
class FakeReader {
 public:
  /// Make reads whose range [offset, offset+count) covers `file_offset` fail with `err`.
  void fail_at(uint64_t file_offset, int err) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_[file_offset] = err;
  }
  void clear_failures() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_.clear();
  }
  /// Reads covering `file_offset` block until open_gate().
  void gate_at(uint64_t file_offset) {
    std::lock_guard<std::mutex> lock(mu_);
    gated_.push_back(file_offset);
    gate_open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gate_open_ = true;
    }
    cv_.notify_all();
  }
  /// Block until `n` reads are waiting at the gate.
  void wait_blocked(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return blocked_ >= n; });
  }
  void refuse_direct(bool on) { refuse_direct_ = on; }

  /// pread calls whose range covered `file_offset`.
  int reads_covering(uint64_t file_offset) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& c : calls_) n += (c.offset <= file_offset && file_offset < c.offset + c.count) ? 1 : 0;
    return n;
  }
  int calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(calls_.size());
  }
  int direct_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& c : calls_) n += c.direct ? 1 : 0;
    return n;
  }
  /// Every O_DIRECT call had a 4096-aligned offset, length and buffer.
  bool direct_calls_aligned() const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : calls_) {
      if (c.direct && (c.offset % 4096 != 0 || c.count % 4096 != 0 || c.buf % 4096 != 0)) return false;
    }
    return true;
  }

  experts::PreadFn fn() {
    return [this](int fd, void* buf, size_t count, off_t offset) -> ssize_t {
      const bool direct = (::fcntl(fd, F_GETFL) & O_DIRECT) != 0;
      const uint64_t off = static_cast<uint64_t>(offset);
      {
        std::unique_lock<std::mutex> lock(mu_);
        calls_.push_back({off, count, reinterpret_cast<uintptr_t>(buf), direct});
        if (direct && refuse_direct_) {
          errno = EINVAL;
          return -1;
        }
        for (const auto& [at, err] : fail_) {
          if (off <= at && at < off + count) {
            errno = err;
            return -1;
          }
        }
        bool gated = false;
        for (uint64_t at : gated_) gated |= off <= at && at < off + count;
        if (gated && !gate_open_) {
          ++blocked_;
          cv_.notify_all();
          cv_.wait(lock, [&] { return gate_open_; });
          --blocked_;
        }
      }
      return ::pread(fd, buf, count, offset);
    };
  }

 private:
  struct Call {
    uint64_t offset;
    size_t count;
    uintptr_t buf;
    bool direct;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  std::map<uint64_t, int> fail_;
  std::vector<uint64_t> gated_;
  bool gate_open_ = true;
  int blocked_ = 0;
  std::atomic<bool> refuse_direct_{false};
};

/// Slot bytes (one expert's three windows) as StreamedExpertSource sizes them, learnt from a cap-1 open
/// (0, with the failure reported, when the file does not open).
inline uint64_t slot_bytes(const BankFile& f) {
  car::experts::StreamOptions o;
  o.ram_gb = 1e-9;
  o.io_threads = 1;
  auto s = car::experts::StreamedExpertSource::open(f.path, f.banks, o);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? (*s)->join_layout().bytes_per_expert : 0;
}

}  // namespace car::testing
