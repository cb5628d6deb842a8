// disk_read: the disk's own parallel read rate, measured the way the expert streamer reads - `depth`
// threads each issuing one positional O_DIRECT read of `chunk` bytes at a time (so `depth` reads are in
// flight), at random 4 KiB-aligned offsets of a large file, until `seconds` have passed or `max` bytes were
// read. O_DIRECT bypasses the page cache, so the figure is the device's, whatever is cached.
//
//   disk_read FILE [--depth 8] [--chunk 2359296] [--seconds 5] [--max BYTES] [--seed 1] [--json]
//
// The default chunk is one 2048 x 2048 Q4_K expert matrix (2.25 MiB), the streamer's unit of reading for
// the benchmark model. Prints GB/s (10^9 bytes per second), reads, bytes, and per-read latency p50/p99;
// --json prints one object. Exit 2 on bad arguments, 1 on I/O errors (or when O_DIRECT is refused).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr uint64_t kAlign = 4096;

struct Options {
  std::string path;
  int depth = 8;
  uint64_t chunk = 2359296;
  double seconds = 5.0;
  uint64_t max_bytes = 0;  // 0 = the file's size
  uint64_t seed = 1;
  bool json = false;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "disk_read: %s\nusage: disk_read FILE [--depth N] [--chunk BYTES] [--seconds S] [--max BYTES] "
               "[--seed N] [--json]\n",
               msg);
  std::exit(2);
}

uint64_t parse_u64(const char* s, const char* what) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') usage((std::string("bad ") + what + ": " + s).c_str());
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* what) {
      if (i + 1 >= argc) usage((std::string(what) + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--depth") {
      o.depth = static_cast<int>(parse_u64(next("--depth"), "depth"));
    } else if (a == "--chunk") {
      o.chunk = parse_u64(next("--chunk"), "chunk");
    } else if (a == "--seconds") {
      const char* s = next("--seconds");
      char* end = nullptr;
      o.seconds = std::strtod(s, &end);
      if (end == s || *end != '\0' || !(o.seconds > 0)) usage("bad --seconds");
    } else if (a == "--max") {
      o.max_bytes = parse_u64(next("--max"), "max");
    } else if (a == "--seed") {
      o.seed = parse_u64(next("--seed"), "seed");
    } else if (a == "--json") {
      o.json = true;
    } else if (!a.empty() && a[0] == '-') {
      usage(("unknown option " + a).c_str());
    } else if (o.path.empty()) {
      o.path = a;
    } else {
      usage("one FILE only");
    }
  }
  if (o.path.empty()) usage("no FILE");
  if (o.depth < 1 || o.depth > 256) usage("--depth must be 1..256");
  if (o.chunk == 0 || o.chunk > (uint64_t{1} << 30)) usage("--chunk must be 1 B .. 1 GiB");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int fd = ::open(o.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "disk_read: open %s with O_DIRECT: %s\n", o.path.c_str(), std::strerror(errno));
    return 1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::fprintf(stderr, "disk_read: stat %s: %s\n", o.path.c_str(), std::strerror(errno));
    return 1;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // O_DIRECT wants aligned offsets, lengths and buffers: read whole 4 KiB pages covering the chunk.
  const uint64_t len = (o.chunk + kAlign - 1) / kAlign * kAlign;
  if (size < len + kAlign) {
    std::fprintf(stderr, "disk_read: %s (%" PRIu64 " bytes) is too small for %" PRIu64 "-byte reads\n",
                 o.path.c_str(), size, len);
    return 1;
  }
  const uint64_t max_bytes = o.max_bytes != 0 ? o.max_bytes : size;
  const uint64_t slots = (size - len) / kAlign + 1;  // aligned start positions

  std::atomic<uint64_t> issued{0};  // bytes claimed so far (stops the threads at max_bytes)
  std::atomic<bool> failed{false};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(o.depth));
  std::vector<uint64_t> done(static_cast<size_t>(o.depth), 0);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(o.seconds));
  auto reader = [&](int t) {
    void* buf = nullptr;
    if (::posix_memalign(&buf, kAlign, len) != 0) {
      failed = true;
      return;
    }
    std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(t));
    while (!failed && std::chrono::steady_clock::now() < deadline) {
      if (issued.fetch_add(len) >= max_bytes) break;
      const uint64_t off = (rng() % slots) * kAlign;
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t got = 0;
      while (got < len) {
        const ssize_t r =
            ::pread(fd, static_cast<char*>(buf) + got, len - got, static_cast<off_t>(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          std::fprintf(stderr, "disk_read: pread at %" PRIu64 ": %s\n", off + got,
                       r < 0 ? std::strerror(errno) : "unexpected end of file");
          failed = true;
          break;
        }
        got += static_cast<uint64_t>(r);
      }
      if (failed) break;
      latencies[static_cast<size_t>(t)].push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      done[static_cast<size_t>(t)] += len;
    }
    std::free(buf);
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(o.depth));
  for (int t = 0; t < o.depth; ++t) threads.emplace_back(reader, t);
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(fd);
  if (failed) return 1;

  uint64_t bytes = 0;
  std::vector<double> all;
  for (int t = 0; t < o.depth; ++t) {
    bytes += done[static_cast<size_t>(t)];
    all.insert(all.end(), latencies[static_cast<size_t>(t)].begin(), latencies[static_cast<size_t>(t)].end());
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    if (all.empty()) return 0.0;
    return all[std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())))];
  };
  const double gbs = secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0.0;
  if (o.json) {
    std::printf("{\"file\": \"%s\", \"depth\": %d, \"chunk_bytes\": %" PRIu64
                ", \"reads\": %zu, \"bytes\": %" PRIu64
                ", \"seconds\": %.3f, \"gb_per_s\": %.4f, \"read_p50_us\": %.0f, \"read_p99_us\": %.0f}\n",
                o.path.c_str(), o.depth, len, all.size(), bytes, secs, gbs, pct(0.5), pct(0.99));
  } else {
    std::printf("%s: %zu O_DIRECT reads of %" PRIu64
                " bytes at queue depth %d: %.2f GB/s (%.0f MB in %.2f s), "
                "read p50 %.0f us p99 %.0f us\n",
                o.path.c_str(), all.size(), len, o.depth, gbs, static_cast<double>(bytes) / 1e6, secs,
                pct(0.5), pct(0.99));
  }
  return 0;
}
