#include "core/experts/streamed_source.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <list>

#include "core/experts/expert_file.h"
#include "core/experts/usage_sidecar.h"
#include "core/util/error_codes.h"

namespace car::experts {
namespace {

constexpr double kPinFraction = 0.25;  // of a bank's cap, pinned from the sidecar (the seed's PIN_FRACTION)
constexpr size_t kMaxWarnings = 32;
constexpr int kGateSteps = 16;       // a bank's prefetch precision is over its last 16 guesses (steps)
constexpr int kGateMinSamples = 8;   // scored experts in that window before the gate may open

/// One bank's prefetch gate (see the header): its open guess, marked per expert, and the last kGateSteps
/// guesses' scores. The marks: kGuessScored (a guess only scored, no read), kGuessRead (read ahead),
/// kGuessUsed (the step asked for it; counted once).
struct PrefetchGate {
  static constexpr uint8_t kNone = 0, kGuessScored = 1, kGuessRead = 2, kGuessUsed = 3;
  std::vector<uint8_t> mark;  // per expert
  std::vector<int> open;      // the experts marked by the open guess
  int open_used = 0;
  std::array<std::pair<int, int>, kGateSteps> window{};  // (scored, used) per closed guess, a ring
  int window_pos = 0;
  int scored = 0, used = 0;  // sums over the window
  bool on = false;

  /// Close the open guess: into the window, then decide whether the next guess is read ahead.
  void close(double min_precision) {
    auto& slot = window[static_cast<size_t>(window_pos)];
    scored += static_cast<int>(open.size()) - slot.first;
    used += open_used - slot.second;
    slot = {static_cast<int>(open.size()), open_used};
    window_pos = (window_pos + 1) % kGateSteps;
    for (int e : open) mark[static_cast<size_t>(e)] = kNone;
    open.clear();
    open_used = 0;
    if (min_precision <= 0) {
      on = true;
    } else if (scored >= kGateMinSamples) {
      on = static_cast<double>(used) >= min_precision * static_cast<double>(scored);
    }
  }
};

/// Load latencies: bucket i holds [2^(i/4), 2^((i+1)/4)) microseconds (19% wide), up to ~2^28 us.
class LatencyHistogram {
 public:
  void add(double us) {
    int i = us <= 1.0 ? 0 : static_cast<int>(std::floor(std::log2(us) * 4.0));
    i = std::clamp(i, 0, kBuckets - 1);
    ++counts_[static_cast<size_t>(i)];
    ++total_;
  }
  /// The q-quantile (0..1) as its bucket's geometric middle; 0 when empty.
  double percentile(double q) const {
    if (total_ == 0) return 0;
    const uint64_t rank =
        std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(total_))));
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[static_cast<size_t>(i)];
      if (seen >= rank) return std::exp2((i + 0.5) / 4.0);
    }
    return std::exp2(kBuckets / 4.0);
  }

 private:
  static constexpr int kBuckets = 112;
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
};

// One cached expert. Lifecycle: created `loading` (in its bank's index, counted in `held`), a reader fills
// `memory` outside the lock, then `ready` (views set) or `failed` (removed from the index at once; waiters
// see the error). A ready slot is on its bank's LRU exactly when it is not pinned and has no lease; only
// LRU slots are evicted.
struct Slot {
  enum class State { loading, ready, failed };
  int expert = -1;
  State state = State::loading;
  bool started = false;        // a reader took its job; a queued duplicate (a promoted prefetch) skips
  bool demand_queued = false;  // a demand job was submitted for it
  bool pinned = false;         // in the pin set: never on the LRU, never evicted
  bool prefetched = false;     // loaded by prefetch() and not demanded since (recall bookkeeping)
  int leases = 0;              // leases handed out + acquire calls waiting for it
  bool on_lru = false;
  std::list<Slot*>::iterator lru_pos;  // valid while on_lru
  SlotMemory memory;                   // written only by the reader while loading, read-only once ready
  ExpertWeights weights;               // views into memory once ready
  Error error;                         // once failed
};

/// One expert matrix (gate, up or down) of a bank.
struct Projection {
  tensor::MatrixView view;   // one expert's matrix; data set per slot
  uint64_t base = 0;         // file offset of expert 0
  uint64_t bytes = 0;        // per expert
  uint64_t window = 0;       // bytes reserved in a slot for its aligned read window
  uint64_t slot_offset = 0;  // where that window starts in the slot
};

}  // namespace

uint64_t expert_slot_bytes(const uint64_t (&proj_bytes)[3]) {
  return window_bytes(proj_bytes[0]) + window_bytes(proj_bytes[1]) + window_bytes(proj_bytes[2]);
}

// All bank state below `mutex` except the geometry (n_expert, proj, slot_bytes), fixed at open.
struct StreamedExpertSource::Impl {
  struct Bank {
    int n_expert = 0;  // 0: dense layer, no bank
    std::array<Projection, 3> proj;
    uint64_t slot_bytes = 0;
    int cap = 1;                               // slots, pinned included; may be exceeded by leased slots
    int held = 0;                              // slots in `index` (loading or ready)
    std::vector<std::shared_ptr<Slot>> index;  // per expert; null = not held
    std::list<Slot*> lru;                      // ready, unpinned, unleased; front = least recently used
    std::vector<int> pin_rank;                 // experts with sidecar counts, hottest first
    std::vector<char> in_pin_set;              // per expert: among the first pin_count of pin_rank
    int pin_count = 0;
    PrefetchGate gate;
  };

  StreamedExpertSource* owner = nullptr;
  std::string path;
  ExpertFile file;  // the aligned reads (expert_file.h)
  std::shared_ptr<ExpertPool> pool;
  bool joined = false;
  std::string sidecar;
  std::vector<int> n_expert;  // per layer, for the sidecar
  double prefetch_min_precision = 0.5;

  mutable Mutex mutex;
  std::condition_variable_any loaded;  // some slot left the loading state
  // Per layer. The bookkeeping fields (cap, held, index, lru, pins) and the slots' state are read and
  // written under `mutex`, by the *_locked helpers; the geometry is read without it. Not annotated, as the
  // analysis cannot tell the two apart.
  std::vector<Bank> banks;
  std::vector<std::vector<uint64_t>> usage CAR_GUARDED_BY(mutex);  // acquires this run, per (layer, expert)
  std::vector<std::vector<uint64_t>> saved CAR_GUARDED_BY(mutex);  // the part of usage already in the sidecar
  uint64_t hits CAR_GUARDED_BY(mutex) = 0;
  uint64_t misses CAR_GUARDED_BY(mutex) = 0;
  uint64_t bytes_read CAR_GUARDED_BY(mutex) = 0;
  uint64_t prefetch_issued CAR_GUARDED_BY(mutex) = 0;
  uint64_t prefetch_used CAR_GUARDED_BY(mutex) = 0;
  uint64_t prefetch_scored CAR_GUARDED_BY(mutex) = 0;
  LatencyHistogram latency CAR_GUARDED_BY(mutex);
  std::vector<std::string> warnings CAR_GUARDED_BY(mutex);
  size_t warnings_dropped CAR_GUARDED_BY(mutex) = 0;
  Mutex save_mutex;  // serializes save_usage(); taken before `mutex`

  void warn_locked(std::string msg) CAR_REQUIRES(mutex) {
    if (warnings.size() < kMaxWarnings) {
      warnings.push_back(std::move(msg));
    } else {
      ++warnings_dropped;
    }
  }

  // --- bank bookkeeping (mutex held) ---

  void evict_locked(Bank& b, Slot* s) CAR_REQUIRES(mutex) {
    CAR_CHECK(s->leases == 0 && s->state != Slot::State::loading);
    if (s->on_lru) b.lru.erase(s->lru_pos);
    s->on_lru = false;
    CAR_CHECK(b.index[static_cast<size_t>(s->expert)].get() == s);
    --b.held;
    b.index[static_cast<size_t>(s->expert)].reset();  // may destroy s
  }

  /// A ready slot just lost its last lease (or finished loading with none): LRU, or given back when over cap.
  void settle_locked(Bank& b, Slot* s) CAR_REQUIRES(mutex) {
    if (s->pinned || s->on_lru) return;
    if (b.held > b.cap) {
      evict_locked(b, s);
      return;
    }
    b.lru.push_back(s);
    s->on_lru = true;
    s->lru_pos = std::prev(b.lru.end());
  }

  void take_lease_locked(Bank& b, Slot* s) CAR_REQUIRES(mutex) {
    if (s->on_lru) {
      b.lru.erase(s->lru_pos);
      s->on_lru = false;
    }
    ++s->leases;
  }

  void drop_lease_locked(Bank& b, Slot* s) CAR_REQUIRES(mutex) {
    CAR_CHECK(s->leases > 0);
    if (--s->leases == 0 && s->state == Slot::State::ready) settle_locked(b, s);
  }

  /// A new loading slot for `expert`, reusing the least recently used slot's memory when the bank is at its
  /// cap. A demand over-commits when nothing is evictable; a prefetch gets null instead.
  std::shared_ptr<Slot> new_slot_locked(Bank& b, int expert, bool demand) CAR_REQUIRES(mutex) {
    auto s = std::make_shared<Slot>();
    s->expert = expert;
    s->pinned = b.in_pin_set[static_cast<size_t>(expert)] != 0;
    if (b.held >= b.cap) {
      if (!b.lru.empty()) {
        Slot* victim = b.lru.front();
        s->memory = std::move(victim->memory);
        evict_locked(b, victim);
      } else if (!demand) {
        return nullptr;
      }
    }
    b.index[static_cast<size_t>(expert)] = s;
    ++b.held;
    return s;
  }

  void submit(int layer, const std::shared_ptr<Slot>& s, bool demand) {
    pool->submit(this, demand, [this, layer, s] { load(layer, s); });
  }

  // --- reading (no lock held) ---

  Error read_error(int layer, int p, int expert, const std::string& what) const {
    return make_error(errc::kIoError, "reading expert " + std::to_string(expert) + " of layer " +
                                          std::to_string(layer) + " (" + bank_tensor_name(layer, p) +
                                          ") from " + path + ": " + what);
  }

  /// Read projection p of `expert` into its window of the slot at `slot_mem`.
  Result<void> read_projection(int layer, int p, int expert, uint8_t* slot_mem, uint64_t& nread) {
    const Projection& pj = banks[static_cast<size_t>(layer)].proj[static_cast<size_t>(p)];
    const uint64_t off = pj.base + static_cast<uint64_t>(expert) * pj.bytes;
    Result<void> r = file.read(off, pj.bytes, slot_mem + pj.slot_offset, nread,
                               [this](const std::string& why) { fall_back_to_buffered(why); });
    if (!r.ok()) return read_error(layer, p, expert, r.error().message);
    return {};
  }

  void fall_back_to_buffered(const std::string& why) {
    MutexLock lock(mutex);
    warn_locked(path + ": O_DIRECT read refused (" + why + "); falling back to buffered reads + DONTNEED");
  }

  /// A reader job: fill the slot, then publish it.
  void load(int layer, const std::shared_ptr<Slot>& s) {
    {
      MutexLock lock(mutex);
      if (s->started) return;
      s->started = true;
    }
    Bank& b = banks[static_cast<size_t>(layer)];
    Result<void> r;
    uint64_t nread = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if (s->memory.empty()) {
      Result<SlotMemory> m = SlotMemory::allocate(b.slot_bytes);
      if (m.ok()) {
        s->memory = std::move(m).value();
      } else {
        r = m.error();
      }
    }
    for (int p = 0; p < 3 && r.ok(); ++p) r = read_projection(layer, p, s->expert, s->memory.data(), nread);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

    MutexLock lock(mutex);
    bytes_read += nread;
    if (r.ok()) {
      latency.add(us);
      ExpertWeights w;
      tensor::MatrixView* views[3] = {&w.gate, &w.up, &w.down};
      for (size_t p = 0; p < 3; ++p) {
        const Projection& pj = b.proj[p];
        const uint64_t off = pj.base + static_cast<uint64_t>(s->expert) * pj.bytes;
        *views[p] = pj.view;
        views[p]->data = s->memory.data() + pj.slot_offset + window_lead(off);
      }
      s->weights = w;
      s->state = Slot::State::ready;
      if (s->leases == 0) settle_locked(b, s.get());
    } else {
      s->state = Slot::State::failed;
      s->error = r.error();
      if (b.index[static_cast<size_t>(s->expert)] == s) {
        --b.held;
        b.index[static_cast<size_t>(s->expert)].reset();
      }
      if (s->leases == 0) warn_locked("prefetch: " + r.error().message);
    }
    loaded.notify_all();
  }

  /// Wait until none of `slots` is loading; then drop every lease of a failed one and return its error.
  Result<void> wait_locked(MutexLock& lock, int layer, const std::vector<std::shared_ptr<Slot>>& slots)
      CAR_REQUIRES(mutex) {
    loaded.wait(lock, [&] {
      for (const auto& s : slots) {
        if (s->state == Slot::State::loading) return false;
      }
      return true;
    });
    std::optional<Error> first;
    for (const auto& s : slots) {
      if (s->state == Slot::State::failed && !first) first = s->error;
    }
    if (!first) return {};
    Bank& b = banks[static_cast<size_t>(layer)];
    for (const auto& s : slots) {
      if (s->state == Slot::State::failed) {
        --s->leases;
      } else {
        drop_lease_locked(b, s.get());
      }
    }
    return *first;
  }
};

// --- StreamedExpertSource ---

StreamedExpertSource::StreamedExpertSource(std::vector<ExpertBankInfo> banks, std::unique_ptr<Impl> impl)
    : ExpertSource(std::move(banks)), impl_(std::move(impl)) {}

Result<std::unique_ptr<StreamedExpertSource>> StreamedExpertSource::open(const std::string& path,
                                                                         std::vector<ExpertBankInfo> banks,
                                                                         StreamOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->sidecar = options.sidecar_path;
  impl->prefetch_min_precision = options.prefetch_min_precision;
  std::string direct_refused;
  auto file = ExpertFile::open(path, options.direct_io, options.reader, &direct_refused);
  if (!file) return file.error();
  impl->file = std::move(file).value();
  const uint64_t file_size = impl->file.size();
  // No other thread sees `impl` yet; the lock is taken so the guarded state is only ever touched under it.
  MutexLock setup(impl->mutex);
  if (!direct_refused.empty()) {
    impl->warn_locked(path + ": O_DIRECT refused by the filesystem (" + direct_refused +
                      "); buffered reads + DONTNEED");
  }

  impl->banks.resize(banks.size());
  impl->n_expert.resize(banks.size());
  impl->usage.resize(banks.size());
  impl->saved.resize(banks.size());
  for (size_t l = 0; l < banks.size(); ++l) {
    const ExpertBankInfo& info = banks[l];
    const int n = info.n_expert;
    impl->n_expert[l] = std::max(n, 0);
    if (n <= 0) continue;
    Impl::Bank& b = impl->banks[l];
    b.n_expert = n;
    const tensor::MatrixView* views[3] = {&info.gate_bank, &info.up_bank, &info.down_bank};
    const uint64_t bases[3] = {info.gate_offset, info.up_offset, info.down_offset};
    for (int p = 0; p < 3; ++p) {
      const tensor::MatrixView& v = *views[p];
      const std::string name = bank_tensor_name(static_cast<int>(l), p);
      if (v.rows <= 0 || v.rows % n != 0 || v.row_bytes == 0) {
        return make_error(errc::kLoadFailed, path + ": " + name + ": " + std::to_string(v.rows) +
                                                 " rows do not split into " + std::to_string(n) + " experts");
      }
      const uint64_t total = static_cast<uint64_t>(v.rows) * v.row_bytes;
      if (bases[p] > file_size || total > file_size - bases[p]) {
        return make_error(errc::kLoadFailed, path + ": " + name + ": data [" + std::to_string(bases[p]) +
                                                 ", " + std::to_string(bases[p] + total) +
                                                 ") past end of file (size " + std::to_string(file_size) +
                                                 ")");
      }
      Projection& pj = b.proj[static_cast<size_t>(p)];
      pj.view = v;
      pj.view.rows = v.rows / n;
      pj.view.data = nullptr;
      pj.base = bases[p];
      pj.bytes = expert_matrix_bytes(v, n);
      pj.window = window_bytes(pj.bytes);
      pj.slot_offset = b.slot_bytes;
      b.slot_bytes += pj.window;
    }
    b.index.resize(static_cast<size_t>(n));
    b.in_pin_set.assign(static_cast<size_t>(n), 0);
    b.gate.mark.assign(static_cast<size_t>(n), PrefetchGate::kNone);
    b.gate.on = options.prefetch_min_precision <= 0;
    impl->usage[l].assign(static_cast<size_t>(n), 0);
    impl->saved[l].assign(static_cast<size_t>(n), 0);
  }

  if (!impl->sidecar.empty()) {
    SidecarContents sc = read_sidecar(impl->sidecar, impl->n_expert);
    for (std::string& w : sc.warnings) impl->warn_locked(std::move(w));
    std::vector<std::vector<std::pair<uint64_t, int>>> ranked(banks.size());
    for (const auto& [key, count] : sc.counts) {
      if (count > 0) ranked[static_cast<size_t>(key.first)].push_back({count, key.second});
    }
    for (size_t l = 0; l < ranked.size(); ++l) {
      auto& r = ranked[l];
      std::sort(r.begin(), r.end(), [](const auto& a, const auto& c) {
        return a.first != c.first ? a.first > c.first : a.second < c.second;
      });
      for (const auto& [count, e] : r) impl->banks[l].pin_rank.push_back(e);
    }
  }

  setup.unlock();  // joining the pool takes the pool's mutex, then ours

  impl->pool = options.pool ? options.pool : std::make_shared<ExpertPool>(options);
  Impl* raw = impl.get();
  std::unique_ptr<StreamedExpertSource> source(new StreamedExpertSource(std::move(banks), std::move(impl)));
  raw->owner = source.get();
  raw->pool->join(source.get());
  raw->joined = true;
  source->join_layout_ = raw->pool->layout();

  // Read every bank's pin set now, all at once (the readers work through them at full queue depth).
  std::vector<std::vector<std::shared_ptr<Slot>>> pins(raw->banks.size());
  MutexLock lock(raw->mutex);
  for (size_t l = 0; l < raw->banks.size(); ++l) {
    Impl::Bank& b = raw->banks[l];
    for (int i = 0; i < b.pin_count; ++i) {
      const int e = b.pin_rank[static_cast<size_t>(i)];
      if (b.index[static_cast<size_t>(e)]) continue;
      std::shared_ptr<Slot> s = raw->new_slot_locked(b, e, true);
      s->leases = 1;
      s->demand_queued = true;
      pins[l].push_back(std::move(s));
    }
  }
  lock.unlock();
  for (size_t l = 0; l < pins.size(); ++l) {
    for (const auto& s : pins[l]) raw->submit(static_cast<int>(l), s, true);
  }
  lock.lock();
  std::optional<Error> failed;
  for (size_t l = 0; l < pins.size(); ++l) {
    if (pins[l].empty()) continue;
    Result<void> r = raw->wait_locked(lock, static_cast<int>(l), pins[l]);  // on error it drops the leases
    if (!r.ok()) {
      if (!failed) failed = r.error();
      continue;
    }
    for (const auto& s : pins[l]) raw->drop_lease_locked(raw->banks[l], s.get());
  }
  lock.unlock();
  if (failed) return *failed;  // the source's destructor leaves the pool
  return source;
}

StreamedExpertSource::~StreamedExpertSource() {
  if (!impl_) return;
  impl_->pool->cancel(impl_.get());
  {
    MutexLock lock(impl_->mutex);
    for (Impl::Bank& b : impl_->banks) {
      for (const auto& s : b.index) CAR_CHECK(s == nullptr || s->leases == 0);  // leases must end first
      b.lru.clear();
      for (auto& s : b.index) s.reset();
      b.held = 0;
    }
  }
  if (impl_->joined) impl_->pool->leave(this);
}

Result<ExpertLease> StreamedExpertSource::acquire(int layer, int expert) {
  std::vector<ExpertLease> out;
  const int one[1] = {expert};
  Result<void> r = acquire_many(layer, one, out);
  if (!r.ok()) return r.error();
  return std::move(out.front());
}

Result<void> StreamedExpertSource::acquire_many(int layer, std::span<const int> experts,
                                                std::vector<ExpertLease>& out) {
  out.clear();
  CAR_CHECK(layer >= 0 && layer < n_layers() && n_expert(layer) > 0);
  Impl& I = *impl_;
  Impl::Bank& b = I.banks[static_cast<size_t>(layer)];
  std::vector<std::shared_ptr<Slot>> held;
  std::vector<std::shared_ptr<Slot>> to_read;
  held.resize(experts.size());
  MutexLock lock(I.mutex);
  // Two passes: every expert already held is leased first (off the LRU), then the misses take slots. A miss
  // handled before a later hit of the same call would otherwise evict that hit when it is least recently used.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < experts.size(); ++i) {
      const int e = experts[i];
      CAR_CHECK(e >= 0 && e < b.n_expert);
      std::shared_ptr<Slot> s = b.index[static_cast<size_t>(e)];
      if (pass == 0 ? s == nullptr : held[i] != nullptr) continue;
      ++I.usage[static_cast<size_t>(layer)][static_cast<size_t>(e)];
      uint8_t& mark = b.gate.mark[static_cast<size_t>(e)];
      if (mark == PrefetchGate::kGuessScored || (mark == PrefetchGate::kGuessRead && s && s->prefetched)) {
        mark = PrefetchGate::kGuessUsed;
        ++b.gate.open_used;
      }
      if (s) {  // held (pass 0), or made by an earlier duplicate of this call (pass 1)
        ++I.hits;
        if (s->prefetched) {
          ++I.prefetch_used;
          s->prefetched = false;
        }
        // A prefetch still queued is promoted: a demand job joins the demand queue; whichever runs first reads.
        if (s->state == Slot::State::loading && !s->started && !s->demand_queued) {
          s->demand_queued = true;
          to_read.push_back(s);
        }
      } else {
        ++I.misses;
        s = I.new_slot_locked(b, e, true);
        s->demand_queued = true;
        to_read.push_back(s);
      }
      I.take_lease_locked(b, s.get());
      held[i] = std::move(s);
    }
  }
  if (!to_read.empty()) {
    lock.unlock();
    for (const auto& s : to_read) I.submit(layer, s, true);
    lock.lock();
  }
  Result<void> r = I.wait_locked(lock, layer, held);
  if (!r.ok()) return r;
  lock.unlock();
  out.reserve(held.size());
  for (const auto& s : held) {
    out.emplace_back(this, layer, s->expert, s->weights, reinterpret_cast<uint64_t>(s.get()));
  }
  return {};
}

void StreamedExpertSource::prefetch(int layer, std::span<const int> experts) {
  if (layer < 0 || layer >= n_layers() || n_expert(layer) <= 0) return;
  Impl& I = *impl_;
  Impl::Bank& b = I.banks[static_cast<size_t>(layer)];
  std::vector<std::shared_ptr<Slot>> to_read;
  {
    MutexLock lock(I.mutex);
    PrefetchGate& gate = b.gate;
    gate.close(I.prefetch_min_precision);  // the previous guess has had its step
    // The guessed experts already held move to the LRU's back, and a read ahead only evicts from before
    // them: a guess must never push out another expert of the same guess.
    size_t evictable = b.lru.size();
    if (gate.on) {
      for (int e : experts) {
        if (e < 0 || e >= b.n_expert) continue;
        Slot* h = b.index[static_cast<size_t>(e)].get();
        if (h == nullptr || !h->on_lru) continue;
        b.lru.splice(b.lru.end(), b.lru, h->lru_pos);
        --evictable;
      }
    }
    bool room = true;
    for (int e : experts) {
      if (e < 0 || e >= b.n_expert || b.index[static_cast<size_t>(e)]) continue;
      uint8_t& mark = gate.mark[static_cast<size_t>(e)];
      if (mark != PrefetchGate::kNone) continue;  // guessed twice
      if (!gate.on) {
        mark = PrefetchGate::kGuessScored;
        gate.open.push_back(e);
        ++I.prefetch_scored;
        continue;
      }
      if (!room) continue;
      const bool evicts = b.held >= b.cap;
      std::shared_ptr<Slot> s = evicts && evictable == 0 ? nullptr : I.new_slot_locked(b, e, false);
      if (!s) {  // no slot free without over-committing (prefetch never does) or evicting a guess
        room = false;
        continue;
      }
      if (evicts) --evictable;
      s->prefetched = true;
      ++I.prefetch_issued;
      mark = PrefetchGate::kGuessRead;
      gate.open.push_back(e);
      to_read.push_back(std::move(s));
    }
  }
  for (const auto& s : to_read) I.submit(layer, s, false);
}

void StreamedExpertSource::release(int layer, int expert, uint64_t token) {
  Impl& I = *impl_;
  MutexLock lock(I.mutex);
  Impl::Bank& b = I.banks[static_cast<size_t>(layer)];
  Slot* s = reinterpret_cast<Slot*>(token);
  CAR_CHECK(b.index[static_cast<size_t>(expert)].get() == s);  // a leased slot is never evicted
  I.drop_lease_locked(b, s);
}

int StreamedExpertSource::slots(int layer) const {
  MutexLock lock(impl_->mutex);
  const Impl::Bank& b = impl_->banks[static_cast<size_t>(layer)];
  if (b.n_expert <= 0) return 0;
  return std::max(1, b.cap - b.pin_count);
}

ExpertStats StreamedExpertSource::stats() const {
  ExpertStats s;
  s.mode = "streamed";
  s.budget_bytes = impl_->pool->budget_bytes();  // before our lock: the pool's mutex comes first
  const Impl& I = *impl_;
  MutexLock lock(I.mutex);
  for (const Impl::Bank& b : I.banks) {
    if (b.n_expert <= 0) continue;
    ++s.banks;
    s.cap = s.banks == 1 ? b.cap : std::min(s.cap, b.cap);
    s.cache_bytes += static_cast<uint64_t>(b.cap) * b.slot_bytes;
    s.floor_bytes += b.slot_bytes;
    s.resident_bytes += static_cast<uint64_t>(b.held) * b.slot_bytes;
    for (const auto& slot : b.index) {
      if (!slot || slot->state != Slot::State::ready) continue;
      if (slot->pinned) {
        ++s.pinned;
      } else {
        ++s.cached;
      }
    }
  }
  s.hits = I.hits;
  s.misses = I.misses;
  s.hit_rate =
      I.hits + I.misses > 0 ? static_cast<double>(I.hits) / static_cast<double>(I.hits + I.misses) : 0;
  s.bytes_read = I.bytes_read;
  s.read_p50_us = I.latency.percentile(0.50);
  s.read_p99_us = I.latency.percentile(0.99);
  s.prefetch_issued = I.prefetch_issued;
  s.prefetch_used = I.prefetch_used;
  s.prefetch_recall = I.prefetch_used + I.misses > 0 ? static_cast<double>(I.prefetch_used) /
                                                           static_cast<double>(I.prefetch_used + I.misses)
                                                     : 0;
  int scored = 0, used = 0;
  for (const Impl::Bank& b : I.banks) {
    if (b.n_expert <= 0) continue;
    scored += b.gate.scored;
    used += b.gate.used;
    if (b.gate.on) ++s.prefetch_layers_on;
  }
  s.prefetch_precision = scored > 0 ? static_cast<double>(used) / static_cast<double>(scored) : 0;
  s.prefetch_scored = I.prefetch_scored;
  return s;
}

uint64_t StreamedExpertSource::resident_bytes() const {
  MutexLock lock(impl_->mutex);
  uint64_t total = 0;
  for (const Impl::Bank& b : impl_->banks) total += static_cast<uint64_t>(b.held) * b.slot_bytes;
  return total;
}

bool StreamedExpertSource::direct_io() const {
  return impl_->file.direct();
}

uint64_t StreamedExpertSource::use_count(int layer, int expert) const {
  MutexLock lock(impl_->mutex);
  CAR_CHECK(layer >= 0 && layer < n_layers() && expert >= 0 && expert < n_expert(layer));
  return impl_->usage[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
}

std::vector<std::string> StreamedExpertSource::take_warnings() {
  MutexLock lock(impl_->mutex);
  std::vector<std::string> out;
  out.swap(impl_->warnings);
  if (impl_->warnings_dropped > 0) {
    out.push_back(std::to_string(impl_->warnings_dropped) + " more warnings dropped");
    impl_->warnings_dropped = 0;
  }
  return out;
}

Result<void> StreamedExpertSource::save_usage() {
  Impl& I = *impl_;
  if (I.sidecar.empty()) return {};
  MutexLock save_lock(I.save_mutex);
  UsageCounts delta;
  std::vector<std::vector<uint64_t>> snapshot;
  {
    MutexLock lock(I.mutex);
    snapshot = I.usage;
    for (size_t l = 0; l < snapshot.size(); ++l) {
      for (size_t e = 0; e < snapshot[l].size(); ++e) {
        const uint64_t d = snapshot[l][e] - I.saved[l][e];
        if (d > 0) delta[{static_cast<int>(l), static_cast<int>(e)}] = d;
      }
    }
  }
  if (delta.empty()) return {};  // nothing new: periodic saves cost a lock and a scan
  std::vector<std::string> warnings;
  Result<void> r = merge_into_sidecar(I.sidecar, I.n_expert, delta, warnings);
  MutexLock lock(I.mutex);
  for (std::string& w : warnings) I.warn_locked(std::move(w));
  if (r.ok()) I.saved = std::move(snapshot);
  return r;
}

std::vector<StreamedExpertSource::BankShape> StreamedExpertSource::bank_shapes() const {
  std::vector<BankShape> out;
  for (const Impl::Bank& b : impl_->banks) {  // geometry: fixed at open, no lock needed
    if (b.n_expert > 0) out.push_back({b.slot_bytes, b.n_expert});
  }
  return out;
}

int StreamedExpertSource::apply_cap(int cap) {
  Impl& I = *impl_;
  MutexLock lock(I.mutex);
  int pinned = 0;
  for (Impl::Bank& b : I.banks) {
    if (b.n_expert <= 0) continue;
    b.cap = std::clamp(cap, 1, b.n_expert);
    b.pin_count = std::min(static_cast<int>(b.pin_rank.size()),
                           static_cast<int>(std::floor(static_cast<double>(b.cap) * kPinFraction)));
    std::fill(b.in_pin_set.begin(), b.in_pin_set.end(), 0);
    for (int i = 0; i < b.pin_count; ++i)
      b.in_pin_set[static_cast<size_t>(b.pin_rank[static_cast<size_t>(i)])] = 1;
    for (size_t e = 0; e < b.index.size(); ++e) {
      Slot* s = b.index[e].get();
      if (s == nullptr) continue;
      const bool want = b.in_pin_set[e] != 0;
      if (s->pinned == want) continue;
      s->pinned = want;
      if (s->state != Slot::State::ready || s->leases > 0)
        continue;  // settles when it loads / its lease ends
      if (want && s->on_lru) {
        b.lru.erase(s->lru_pos);
        s->on_lru = false;
      } else if (!want) {
        b.lru.push_back(s);
        s->on_lru = true;
        s->lru_pos = std::prev(b.lru.end());
      }
    }
    while (b.held > b.cap && !b.lru.empty()) I.evict_locked(b, b.lru.front());
    pinned += b.pin_count;
  }
  return pinned;
}

}  // namespace car::experts
