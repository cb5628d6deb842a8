#include "daemon/model_catalog.h"

#include <utility>

namespace car::daemon {

std::optional<gguf::ModelInfo> ModelCatalog::read_header(const std::filesystem::path& path) {
  auto file = gguf::GgufFile::open(path.string());
  if (!file) return std::nullopt;
  return gguf::describe_model(**file);
}

std::shared_ptr<const gguf::ModelInfo> ModelCatalog::describe(const std::filesystem::path& path) {
  const std::string key = path.string();
  // The identity is taken before the read: a file changed while it is read is stored under the old
  // identity, which the next lookup no longer matches, so it is read again then.
  auto identity = FileIdentity::of_path(key);
  if (!identity) {
    MutexLock lock(mutex_);
    entries_.erase(key);
    return nullptr;
  }
  {
    MutexLock lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end() && it->second.identity == *identity) {
      return it->second.info;
    }
    ++reads_;
  }
  std::shared_ptr<const gguf::ModelInfo> info;
  if (auto read = reader_(path)) info = std::make_shared<const gguf::ModelInfo>(std::move(*read));
  MutexLock lock(mutex_);
  if (entries_.size() >= kMaxEntries && !entries_.contains(key)) entries_.clear();
  entries_[key] = Entry{*identity, info};
  return info;
}

uint64_t ModelCatalog::reads() const {
  MutexLock lock(mutex_);
  return reads_;
}

}  // namespace car::daemon
