#include "core/util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/util/error_codes.h"

namespace car {

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return make_error(e == ENOENT ? errc::kNotFound : errc::kIoError,
                      "open " + path + ": " + std::strerror(e));
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::kIoError, "stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(errc::kIoError, path + ": not a regular file");
  }
  MappedFile f;
  f.fd_ = fd;
  f.path_ = path;
  f.size_ = static_cast<uint64_t>(st.st_size);
  auto identity = FileIdentity::of_fd(fd);
  if (!identity) return identity.error();
  f.identity_ = *identity;
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      return make_error(errc::kIoError, "mmap " + path + ": " + std::strerror(e));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.region_ = fault_guard::Region::add(f.data_, f.size_);
  }
  return f;
}

Result<void> MappedFile::check_unchanged() const {
  if (faulted()) {
    return make_error(errc::kIoError, path_ + " shrank while mapped: a read past its new end faulted");
  }
  if (fd_ < 0) return {};
  auto now = FileIdentity::of_fd(fd_);
  if (!now) return make_error(errc::kIoError, path_ + ": " + now.error().message);
  if (now->size != identity_.size || now->mtime_sec != identity_.mtime_sec ||
      now->mtime_nsec != identity_.mtime_nsec) {
    return make_error(errc::kIoError, path_ + " was modified in place while mapped (was " +
                                          identity_.describe() + ", now " + now->describe() + ")");
  }
  return {};
}

Result<void> MappedFile::matches(const std::string& path) const {
  auto now = FileIdentity::of_path(path);
  if (!now) return now.error();
  if (*now != identity_) {
    return make_error(errc::kIoError, path + " changed on disk (mapped: " + identity_.describe() +
                                          "; now: " + now->describe() + ")");
  }
  return {};
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      identity_(other.identity_),
      region_(std::move(other.region_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    identity_ = other.identity_;
    region_ = std::move(other.region_);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  region_.reset();  // before the munmap: the address range may be reused by the next mapping
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

}  // namespace car
