#include "core/util/file_identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/util/error_codes.h"

namespace car {

namespace {
FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_sec = static_cast<int64_t>(st.st_mtim.tv_sec);
  id.mtime_nsec = static_cast<int64_t>(st.st_mtim.tv_nsec);
  return id;
}
}  // namespace

Result<FileIdentity> FileIdentity::of_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int e = errno;
    return make_error(e == ENOENT ? errc::kNotFound : errc::kIoError,
                      "stat " + path + ": " + std::strerror(e));
  }
  return identity_of(st);
}

Result<FileIdentity> FileIdentity::of_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    return make_error(errc::kIoError, "fstat fd " + std::to_string(fd) + ": " + std::strerror(e));
  }
  return identity_of(st);
}

std::string FileIdentity::describe() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "inode %llu on device 0x%llx, %llu bytes, mtime %lld.%09lld",
                static_cast<unsigned long long>(inode), static_cast<unsigned long long>(device),
                static_cast<unsigned long long>(size), static_cast<long long>(mtime_sec),
                static_cast<long long>(mtime_nsec));
  return buf;
}

}  // namespace car
