// MappedFile: a read-only memory mapping of a whole file (RAII; move-only).
//
// The mapping lives as long as the object; views handed out (bytes()) are non-owning and must not outlive
// it. Thread-safe for concurrent reads. An empty file maps to an empty span without calling mmap.
#pragma once

#include <cstdint>
#include <span>
#include <string>

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

 private:
  void reset();
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  std::string path_;
};

}  // namespace car
