// ExpertPool (the shared budget and reader threads), the memory probe and the budget formula.
#include "core/experts/expert_pool.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/experts/streamed_source.h"
#include "core/util/thread_signals.h"

namespace car::experts {
namespace {

// The seed's constants (expert_stream.rs).
constexpr double kBudgetFraction = 0.88;  // of the memory available
constexpr uint64_t kPageCacheReserve = 2'500'000'000;
constexpr uint64_t kActivationReserve = 1'200'000'000;
// Where the seed's fixed 3.7 GB of reserves would swallow all of a small limit (a 2.5 GB memory cgroup:
// MemAvailable is the host's, the cgroup is what the process may use), the reserves shrink to this share
// of what is available. Expert reads are O_DIRECT by default, so they add no page cache; the share is
// left for the mapped dense weights, activations and the KV cache.
constexpr double kMaxReserveFraction = 0.3;
// A limit at or above this is "no limit" (cgroup v1 reports unlimited as ~2^63 rounded to pages).
constexpr uint64_t kNoLimit = uint64_t{1} << 60;

std::optional<std::string> read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> parse_u64_trimmed(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

/// MemAvailable in bytes, or nullopt.
std::optional<uint64_t> mem_available(const std::string& proc_root) {
  const auto text = read_text(std::filesystem::path(proc_root) / "meminfo");
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    constexpr std::string_view key = "MemAvailable:";
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    uint64_t kb = 0;
    if (fields >> kb) return kb * 1024;
  }
  return std::nullopt;
}

/// Remaining bytes under the limits of the cgroup `rel` (a path like "/a/b") and its ancestors below
/// `mount`, reading `limit_file` and `usage_file` in each; nullopt when no level has a limit.
std::optional<uint64_t> cgroup_remaining(const std::filesystem::path& mount, const std::string& rel,
                                         const char* limit_file, const char* usage_file) {
  std::optional<uint64_t> best;
  std::filesystem::path p = std::filesystem::path(rel).relative_path();
  for (;;) {
    const std::filesystem::path dir = mount / p;
    const auto limit_text = read_text(dir / limit_file);
    const auto usage_text = read_text(dir / usage_file);
    if (limit_text && usage_text) {
      const auto limit = parse_u64_trimmed(*limit_text);  // "max" does not parse: no limit
      const auto usage = parse_u64_trimmed(*usage_text);
      if (limit && usage && *limit < kNoLimit) {
        const uint64_t rem = *limit > *usage ? *limit - *usage : 0;
        best = best ? std::min(*best, rem) : rem;
      }
    }
    if (p.empty()) break;
    p = p.parent_path();
  }
  return best;
}

}  // namespace

MemoryProbe probe_memory(const std::string& proc_root, const std::string& cgroup_root) {
  MemoryProbe probe;
  probe.mem_available = mem_available(proc_root).value_or(0);
  // /proc/self/cgroup: "hierarchy-id:controller-list:path"; v1 names "memory" in the list, v2 is "0::path".
  std::optional<std::string> v1_path;
  std::optional<std::string> v2_path;
  if (const auto text = read_text(std::filesystem::path(proc_root) / "self" / "cgroup")) {
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
      const size_t c1 = line.find(':');
      const size_t c2 = c1 == std::string::npos ? std::string::npos : line.find(':', c1 + 1);
      if (c2 == std::string::npos) continue;
      const std::string id = line.substr(0, c1);
      const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
      const std::string path = line.substr(c2 + 1);
      if (id == "0" && controllers.empty()) {
        v2_path = path;
        continue;
      }
      std::istringstream names(controllers);
      std::string name;
      while (std::getline(names, name, ',')) {
        if (name == "memory") v1_path = path;
      }
    }
  }
  const std::filesystem::path root(cgroup_root);
  if (v1_path) {
    probe.cgroup_version = "v1";
    probe.cgroup_remaining =
        cgroup_remaining(root / "memory", *v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes");
  } else if (v2_path) {
    probe.cgroup_version = "v2";
    probe.cgroup_remaining = cgroup_remaining(root, *v2_path, "memory.max", "memory.current");
  }
  probe.effective_available = probe.mem_available;
  if (probe.cgroup_remaining) {
    probe.effective_available = probe.mem_available == 0
                                    ? *probe.cgroup_remaining
                                    : std::min(probe.mem_available, *probe.cgroup_remaining);
  }
  return probe;
}

uint64_t budget_from_available(uint64_t available) {
  const double reserve = std::min(static_cast<double>(kPageCacheReserve + kActivationReserve),
                                  static_cast<double>(available) * kMaxReserveFraction);
  const double budget = static_cast<double>(available) * kBudgetFraction - reserve;
  return budget > 0 ? static_cast<uint64_t>(budget) : 0;
}

std::string PoolLayout::line() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "expert stream: %d banks x %.1f MB/expert; budget %.1f GB%s -> cap %d/bank (cache %.1f GB), "
                "pinned %d%s",
                banks, static_cast<double>(bytes_per_expert) / 1e6, static_cast<double>(budget_bytes) / 1e9,
                roomed ? " (the model cache's room)" : forced ? " (forced)" : "", cap, static_cast<double>(cache_bytes) / 1e9, pinned,
                sources > 1 ? (", shared by " + std::to_string(sources) + " models").c_str() : "");
  return buf;
}

ExpertPool::ExpertPool(const StreamOptions& options) : options_(options) {
  const int n = std::max(1, options_.io_threads);
  max_prefetch_ = std::max(1, n / 2);
  readers_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) readers_.emplace_back([this] {
    util::block_process_signals();
    reader_loop();
  });
}

ExpertPool::~ExpertPool() {
  {
    MutexLock lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  for (std::thread& t : readers_) t.join();
}

PoolLayout ExpertPool::layout() const {
  MutexLock lock(mutex_);
  return layout_;
}

uint64_t ExpertPool::budget_bytes() const {
  return layout().budget_bytes;
}

void ExpertPool::set_room(RoomFn room) {
  MutexLock lock(mutex_);
  room_ = std::move(room);
  resize_locked();
}

void ExpertPool::refresh() {
  MutexLock lock(mutex_);
  resize_locked();
}

void ExpertPool::join(StreamedExpertSource* source) {
  MutexLock lock(mutex_);
  sources_.push_back(source);
  resize_locked();
}

void ExpertPool::leave(StreamedExpertSource* source) {
  MutexLock lock(mutex_);
  sources_.erase(std::remove(sources_.begin(), sources_.end(), source), sources_.end());
  resize_locked();
}

void ExpertPool::resize_locked() {
  PoolLayout L;
  L.sources = static_cast<int>(sources_.size());
  std::vector<StreamedExpertSource::BankShape> shapes;
  uint64_t held = 0;
  for (StreamedExpertSource* s : sources_) {
    for (const auto& b : s->bank_shapes()) shapes.push_back(b);
    held += s->resident_bytes();
  }
  L.banks = static_cast<int>(shapes.size());
  if (options_.ram_gb > 0) {
    L.forced = true;
    L.budget_bytes = static_cast<uint64_t>(options_.ram_gb * 1e9);
  } else {
    // What the caches already hold is theirs to keep using: count it as available.
    const MemoryProbe probe = probe_memory(options_.proc_root, options_.cgroup_root);
    L.budget_bytes = budget_from_available(probe.effective_available + held);
  }
  int max_experts = 1;
  for (const auto& b : shapes) {
    L.bytes_per_expert = std::max(L.bytes_per_expert, b.slot_bytes);
    L.floor_bytes += b.slot_bytes;
    max_experts = std::max(max_experts, b.n_expert);
  }
  // One budget with the owner's (the daemon's model cache): the floors are charged to the models, and the
  // caches may grow beyond them only into the room the owner's budget leaves.
  if (room_) {
    if (const std::optional<uint64_t> room = room_()) {
      const uint64_t limit = L.floor_bytes + *room;
      if (limit < L.budget_bytes) {
        L.budget_bytes = limit;
        L.roomed = true;
      }
    }
  }
  auto cost = [&](int cap) {
    uint64_t total = 0;
    for (const auto& b : shapes) total += static_cast<uint64_t>(std::min(cap, b.n_expert)) * b.slot_bytes;
    return total;
  };
  // The largest uniform cap that fits (cost is monotone in cap), at least 1.
  int lo = 1;
  int hi = max_experts;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (cost(mid) <= L.budget_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  L.cap = lo;
  L.cache_bytes = cost(L.cap);
  for (StreamedExpertSource* s : sources_) L.pinned += s->apply_cap(L.cap);
  layout_ = L;
}

void ExpertPool::submit(const void* owner, bool demand, std::function<void()> run) {
  {
    MutexLock lock(queue_mutex_);
    (demand ? demand_ : prefetch_).push_back(Job{owner, std::move(run)});
  }
  queue_cv_.notify_one();
}

void ExpertPool::cancel(const void* owner) {
  MutexLock lock(queue_mutex_);
  auto drop = [owner](std::deque<Job>& q) {
    q.erase(std::remove_if(q.begin(), q.end(), [owner](const Job& j) { return j.owner == owner; }), q.end());
  };
  drop(demand_);
  drop(prefetch_);
  idle_cv_.wait(lock, [&]() CAR_REQUIRES(queue_mutex_) {
    return std::find(running_.begin(), running_.end(), owner) == running_.end();
  });
}

void ExpertPool::reader_loop() {
  // At most half the readers serve prefetches, so a demand read always finds a free one.
  const int max_prefetch = max_prefetch_;
  MutexLock lock(queue_mutex_);
  for (;;) {
    queue_cv_.wait(lock, [&]() CAR_REQUIRES(queue_mutex_) {
      return stop_ || !demand_.empty() || (!prefetch_.empty() && prefetch_running_ < max_prefetch);
    });
    if (stop_) return;
    Job job;
    bool is_prefetch = false;
    if (!demand_.empty()) {
      job = std::move(demand_.front());
      demand_.pop_front();
    } else {
      job = std::move(prefetch_.front());
      prefetch_.pop_front();
      is_prefetch = true;
      ++prefetch_running_;
    }
    running_.push_back(job.owner);
    lock.unlock();
    job.run();
    job.run = nullptr;  // drop what the job captured before taking the lock
    lock.lock();
    running_.erase(std::find(running_.begin(), running_.end(), job.owner));
    if (is_prefetch) {
      --prefetch_running_;
      queue_cv_.notify_one();  // a prefetch may have been waiting for this reader's prefetch share
    }
    idle_cv_.notify_all();
  }
}

}  // namespace car::experts
