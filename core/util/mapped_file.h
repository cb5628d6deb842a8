// MappedFile: a read-only memory mapping of a whole file (RAII; move-only).
//
// The mapping lives as long as the object; views handed out (bytes()) are non-owning and must not outlive
// it. Thread-safe for concurrent reads. An empty file maps to an empty span without calling mmap.
//
// The file may change under the mapping (another process rewrites or truncates it in place). open()
// records the identity of the file it mapped (fstat of that descriptor) and registers the mapping with the
// fault guard (core/util/fault_guard.h): when the program installed the guard, a read past the file's new
// end reads zeros and sets faulted() instead of killing the process with SIGBUS. check_unchanged() tells
// whether what was read can be trusted; matches(path) whether `path` still names the mapped file.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/util/fault_guard.h"
#include "core/util/file_identity.h"
#include "core/util/result.h"

namespace car {

class MappedFile {
 public:
  /// Map `path` read-only. Errors: "not_found", "io_error" (with errno text).
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// The underlying descriptor (kept open for positional reads, e.g. by the expert streamer).
  int fd() const { return fd_; }

  /// The mapped file as it was at open (fstat of the mapped descriptor).
  const FileIdentity& identity() const { return identity_; }
  /// Whether a read of the mapping faulted (the file shrank under it; those pages now read as zeros).
  bool faulted() const { return region_.faulted(); }
  /// Whether such a fault is absorbed rather than fatal (the mapping is registered and the guard installed).
  bool guarded() const { return region_.registered() && fault_guard::installed(); }
  /// OK when no read faulted and the open file's size and mtime are still those at open (fstat, one
  /// system call). Error io_error naming the path and what changed.
  Result<void> check_unchanged() const;
  /// OK when `path` names the mapped file unchanged (device, inode, size, mtime, by stat) - false after an
  /// atomic rename over it as well as after an in-place rewrite. Errors: not_found, io_error (the message
  /// names both identities).
  Result<void> matches(const std::string& path) const;

 private:
  void reset();
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  std::string path_;
  FileIdentity identity_;
  fault_guard::Region region_;  // released before the munmap
};

}  // namespace car
