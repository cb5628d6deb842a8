// ModelCatalog: what each model file's GGUF header says (architecture, parameters, quantization, context
// length: gguf::ModelInfo), remembered per file version so the `list` op does not parse every model's
// header again on each call - on the io thread, where a slow disk or a large models directory would stall
// every connection.
//
// Contract: describe(path) stats the file (one stat(2), no read) and returns the facts read the last time
// the file had this FileIdentity (device, inode, size, mtime); on a first sight or any change (renamed
// over, rewritten in place, truncated) it reads the header again through the reader. A file the reader
// cannot describe (not GGUF, corrupt) is remembered as such, so it is not re-read either until it changes.
// A same-size rewrite within one mtime tick goes unnoticed (core/util/file_identity.h). At most
// kMaxEntries files are remembered; past that the catalog starts over (a models directory that large is
// re-read, not grown without bound).
//
// Ownership: the returned facts are shared and immutable; a caller may keep them after the entry changes.
// Thread-safety: every member function may be called from any thread. The header is read without the
// lock held, so a slow read blocks no other lookup; two threads that miss on the same file at once may
// both read it (the last one stored wins - both read the same version or the next lookup corrects it).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/gguf/model_info.h"
#include "core/util/file_identity.h"
#include "core/util/thread_annotations.h"

namespace car::daemon {

class ModelCatalog {
 public:
  /// Reads a file's header: its ModelInfo, or nullopt when it is not a readable GGUF file.
  using Reader = std::function<std::optional<gguf::ModelInfo>(const std::filesystem::path&)>;

  static constexpr std::size_t kMaxEntries = 4096;

  /// The production reader: gguf::GgufFile::open (header and tensor index only, no tensor data) +
  /// gguf::describe_model.
  static std::optional<gguf::ModelInfo> read_header(const std::filesystem::path& path);

  explicit ModelCatalog(Reader reader = &ModelCatalog::read_header) : reader_(std::move(reader)) {}
  ModelCatalog(const ModelCatalog&) = delete;
  ModelCatalog& operator=(const ModelCatalog&) = delete;

  /// The facts of the file at `path` (symlinks followed), from the catalog while the file is unchanged.
  /// Null when the file is not a readable GGUF file or cannot be stat'ed (gone since it was listed).
  std::shared_ptr<const gguf::ModelInfo> describe(const std::filesystem::path& path);

  /// Header reads so far (misses), for tests and the curious.
  uint64_t reads() const;

 private:
  struct Entry {
    FileIdentity identity;                       // the version `info` was read from
    std::shared_ptr<const gguf::ModelInfo> info;  // null: not a readable GGUF file
  };

  const Reader reader_;
  mutable Mutex mutex_;
  std::unordered_map<std::string, Entry> entries_ CAR_GUARDED_BY(mutex_);  // by path as given
  uint64_t reads_ CAR_GUARDED_BY(mutex_) = 0;
};

}  // namespace car::daemon
