#include "core/experts/expert_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/util/error_codes.h"

namespace car::experts {
namespace {

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

uint64_t window_bytes(uint64_t bytes) {
  return round_up(bytes, kDirectAlign) + kDirectAlign;
}

// --- SlotMemory ---

Result<SlotMemory> SlotMemory::allocate(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(errc::kIoError, "cannot allocate " + std::to_string(bytes) +
                                          " bytes for an expert slot: " + std::strerror(errno));
  }
  SlotMemory m;
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = bytes;
  return m;
}

SlotMemory& SlotMemory::operator=(SlotMemory&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void SlotMemory::reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

// --- ExpertFile ---

ExpertFile::ExpertFile(ExpertFile&& o) noexcept {
  *this = std::move(o);
}

ExpertFile& ExpertFile::operator=(ExpertFile&& o) noexcept {
  if (this != &o) {
    close();
    fd_buffered_ = std::exchange(o.fd_buffered_, -1);
    fd_direct_ = std::exchange(o.fd_direct_, -1);
    size_ = std::exchange(o.size_, 0);
    direct_ = std::exchange(o.direct_, std::make_unique<std::atomic<bool>>(false));
    reader_ = std::move(o.reader_);
  }
  return *this;
}

ExpertFile::~ExpertFile() {
  close();
}

void ExpertFile::close() {
  if (fd_direct_ >= 0) ::close(fd_direct_);
  if (fd_buffered_ >= 0) ::close(fd_buffered_);
  fd_direct_ = -1;
  fd_buffered_ = -1;
}

Result<ExpertFile> ExpertFile::open(const std::string& path, bool direct_io, PreadFn reader,
                                    std::string* direct_refused) {
  ExpertFile f;
  f.reader_ = std::move(reader);
  f.fd_buffered_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_buffered_ < 0) {
    return make_error(errc::kIoError, path + ": cannot open for expert streaming: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(f.fd_buffered_, &st) != 0) {
    return make_error(errc::kIoError, path + ": fstat: " + std::strerror(errno));
  }
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (direct_io) {
    f.fd_direct_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (f.fd_direct_ < 0 && direct_refused != nullptr) *direct_refused = std::strerror(errno);
  }
  f.direct_->store(f.fd_direct_ >= 0);
  return f;
}

ssize_t ExpertFile::pread(int fd, void* buf, size_t count, off_t offset) const {
  return reader_ ? reader_(fd, buf, count, offset) : ::pread(fd, buf, count, offset);
}

Result<void> ExpertFile::read(uint64_t offset, uint64_t bytes, uint8_t* window, uint64_t& nread,
                              const FallbackFn& on_fallback) const {
  const uint64_t start = offset / kDirectAlign * kDirectAlign;
  const uint64_t lead = offset - start;
  for (;;) {
    const bool use_direct = direct();
    const int fd = use_direct ? fd_direct_ : fd_buffered_;
    // O_DIRECT reads the aligned window around the matrix; buffered reads exactly the matrix, at the same
    // place in the window, so the views are the same either way.
    uint8_t* dst = use_direct ? window : window + lead;
    const uint64_t at = use_direct ? start : offset;
    const uint64_t want = use_direct ? round_up(lead + bytes, kDirectAlign) : bytes;
    const uint64_t need = use_direct ? lead + bytes : bytes;
    uint64_t got = 0;
    int err = 0;
    while (got < want) {
      const ssize_t n = pread(fd, dst + got, want - got, static_cast<off_t>(at + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        err = errno;
        break;
      }
      if (n == 0) break;
      got += static_cast<uint64_t>(n);
      nread += static_cast<uint64_t>(n);
      if (use_direct && static_cast<uint64_t>(n) % kDirectAlign != 0) break;  // a partial block: end of file
    }
    if (err == EINVAL && use_direct) {
      bool expected = true;
      if (direct_->compare_exchange_strong(expected, false, std::memory_order_acq_rel) && on_fallback) {
        on_fallback(std::strerror(err));
      }
      continue;
    }
    if (err != 0) {
      return make_error(errc::kIoError, "pread of " + std::to_string(want - got) + " bytes at offset " +
                                            std::to_string(at + got) + " failed: " + std::strerror(err));
    }
    if (got < need) {
      // Count in the matrix's own bytes: an O_DIRECT read starts `lead` bytes before it, and those are not
      // the matrix's (counting them made the shortfall larger than the matrix).
      const uint64_t have = std::min(bytes, use_direct ? got - std::min(got, lead) : got);
      return make_error(errc::kIoError,
                        "the file ends " + std::to_string(bytes - have) + " bytes short of the " +
                            std::to_string(bytes) + "-byte matrix at offset " + std::to_string(offset) +
                            " (" + std::to_string(have) + " of its bytes are there; truncated after load?)");
    }
    if (!use_direct) {
      (void)::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
    }
    return {};
  }
}

}  // namespace car::experts
