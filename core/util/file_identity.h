// FileIdentity: which version of a file a descriptor or a path refers to - device, inode, size and
// modification time, as stat(2) reports them.
//
// Two identities compare equal when all five fields do. A file replaced by rename(2) has a new inode; a
// file rewritten in place (cp over it, truncate, an editor that writes through) keeps its inode but not its
// size or mtime. The mtime has the file system's timestamp granularity, so a same-size rewrite within one
// timestamp tick goes unnoticed - atomic rename is the dependable way to replace a file that is in use.
// Plain values; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/util/result.h"

namespace car {

struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_sec = 0;
  int64_t mtime_nsec = 0;

  /// stat(2) of `path` (symlinks followed). Errors: not_found, io_error.
  static Result<FileIdentity> of_path(const std::string& path);
  /// fstat(2) of an open descriptor. Error: io_error.
  static Result<FileIdentity> of_fd(int fd);

  /// "inode 1234 on device 0x803, 5678 bytes, mtime 1764768000.123456789" for messages.
  std::string describe() const;

  friend bool operator==(const FileIdentity& a, const FileIdentity& b) = default;
};

}  // namespace car
