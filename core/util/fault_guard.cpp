#include "core/util/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "core/util/error_codes.h"

namespace car::fault_guard {

namespace {

// The table. Each slot is a seqlock: `seq` is odd while its owner writes begin/end, even when they are
// stable. A slot is free when `end` is 0. Only the slot's owner (the Region) writes it after claiming it
// with a compare-and-swap of `seq`; the signal handler only reads begin/end (re-checking `seq`, so it never
// acts on a torn pair) and sets `faulted`. The slot of a range being read cannot change under the handler:
// a Region is released only after its owner stops reading the mapping.
struct Slot {
  std::atomic<uint64_t> seq{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // exclusive; 0 = free
  std::atomic<bool> faulted{false};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uintptr_t>::is_always_lock_free &&
                  std::atomic<bool>::is_always_lock_free,
              "the signal handler may only use lock-free atomics");

Slot g_slots[kMaxRegions];
std::atomic<uint64_t> g_faults{0};
std::atomic<bool> g_installed{false};
std::atomic<uintptr_t> g_page_size{4096};
// The disposition before install(), for faults that are not ours. Written once, before our handler is set.
struct sigaction g_previous {};

/// Hand a SIGBUS that is not ours to the previous disposition.
void pass_on(int sig, siginfo_t* info, void* context) {
  const bool sent = info == nullptr || info->si_code <= 0;  // kill(), sigqueue(), tgkill(): not a fault
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if ((g_previous.sa_flags & SA_SIGINFO) == 0 && g_previous.sa_handler != SIG_DFL &&
      g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN && sent) return;
  // The default action: restore it, then let the fault happen again when the load re-executes (the core
  // dump then shows the faulting instruction), or raise a sent signal again (delivered on return).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  if (sent) ::raise(SIGBUS);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (info != nullptr && info->si_code == BUS_ADRERR) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const uintptr_t page_size = g_page_size.load(std::memory_order_relaxed);
    for (Slot& s : g_slots) {
      const uint64_t s1 = s.seq.load(std::memory_order_acquire);
      if ((s1 & 1) != 0) continue;
      const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
      const uintptr_t end = s.end.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s.seq.load(std::memory_order_relaxed) != s1) continue;
      if (end == 0 || addr < begin || addr >= end) continue;
      // Zero pages from the faulting page to the end of the range: every page there lies past the file's
      // new end, so one call covers the rest of the range instead of one signal per page.
      const uintptr_t first = addr & ~(page_size - 1);
      const uintptr_t last = (end + page_size - 1) & ~(page_size - 1);
      // The raw system call: no interceptor (sanitizers wrap mmap) runs inside the handler.
      const long p = ::syscall(SYS_mmap, first, last - first, PROT_READ,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0L);
      if (p == -1 || static_cast<uintptr_t>(p) != first) break;  // cannot repair: not ours to absorb
      s.faulted.store(true, std::memory_order_release);
      g_faults.fetch_add(1, std::memory_order_relaxed);
      errno = saved_errno;
      return;
    }
  }
  errno = saved_errno;
  pass_on(sig, info, context);
}

std::mutex g_install_mutex;

}  // namespace

Result<void> install() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed.load()) return {};
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page > 0) g_page_size.store(static_cast<uintptr_t>(page));
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  struct sigaction previous {};
  if (::sigaction(SIGBUS, nullptr, &previous) != 0) {
    return make_error(errc::kIoError, std::string("sigaction(SIGBUS): ") + std::strerror(errno));
  }
  g_previous = previous;
  if (::sigaction(SIGBUS, &action, nullptr) != 0) {
    return make_error(errc::kIoError, std::string("sigaction(SIGBUS): ") + std::strerror(errno));
  }
  g_installed.store(true);
  return {};
}

bool installed() {
  return g_installed.load();
}

uint64_t faults_handled() {
  return g_faults.load();
}

Region Region::add(const void* begin, std::size_t size) {
  const auto b = reinterpret_cast<uintptr_t>(begin);
  CAR_CHECK((b & (g_page_size.load() - 1)) == 0);
  if (size == 0 || b + size < b) return Region();
  for (std::size_t i = 0; i < kMaxRegions; ++i) {
    Slot& s = g_slots[i];
    uint64_t s1 = s.seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0 || s.end.load(std::memory_order_relaxed) != 0) continue;
    if (!s.seq.compare_exchange_strong(s1, s1 + 1, std::memory_order_acq_rel)) continue;
    std::atomic_thread_fence(std::memory_order_release);
    s.begin.store(b, std::memory_order_relaxed);
    s.end.store(b + size, std::memory_order_relaxed);
    s.faulted.store(false, std::memory_order_relaxed);
    s.seq.store(s1 + 2, std::memory_order_release);
    return Region(static_cast<int>(i));
  }
  return Region();
}

Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    reset();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void Region::reset() {
  if (slot_ < 0) return;
  Slot& s = g_slots[slot_];
  const uint64_t s1 = s.seq.load(std::memory_order_relaxed);
  s.seq.store(s1 + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.begin.store(0, std::memory_order_relaxed);
  s.end.store(0, std::memory_order_relaxed);
  s.faulted.store(false, std::memory_order_relaxed);
  s.seq.store(s1 + 2, std::memory_order_release);
  slot_ = -1;
}

bool Region::faulted() const {
  return slot_ >= 0 && g_slots[slot_].faulted.load(std::memory_order_acquire);
}

}  // namespace car::fault_guard
