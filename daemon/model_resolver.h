// Model ids -> files: an id names `<models_dir>/<id>.gguf` and nothing else. Model ids come from the socket
// (untrusted), so resolution refuses anything that could name a file outside the models directory.
//
// Rules: an id that is empty, longer than 255 bytes, not valid UTF-8, contains '/', '\\', NUL, a control
// character (C0, DEL, C1) or another unsafe character (safe_text.h: U+2028/U+2029, bidi controls, zero-width
// characters), or is "." / ".." / starts with '.' is `forbidden`; so is an id whose file resolves (symlinks
// followed, weakly_canonical) to a path outside the canonical models directory. A well-formed id whose file
// does not exist (or is not a regular file) is `not_found`. Pure functions over the file system; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/util/result.h"

namespace car::daemon {

struct ResolvedModel {
  std::string id;
  std::filesystem::path path;  ///< canonical path of the .gguf file
  uint64_t file_bytes = 0;     ///< its size, the cache budget charge before the engine reports more
};

/// Check an id's spelling only (no file system access). Error forbidden.
Result<void> check_model_id(const std::string& id);
/// Resolve an id to its file. Errors: forbidden, not_found.
Result<ResolvedModel> resolve_model(const std::filesystem::path& models_dir, const std::string& id);

struct ListedModel {
  std::string id;
  std::filesystem::path path;  ///< as resolve_model gives it
  uint64_t file_bytes = 0;
};
/// The models directory's *.gguf files whose id resolves (sorted by id). A missing directory is an empty
/// list; an unreadable one is an error (code internal).
Result<std::vector<ListedModel>> list_models(const std::filesystem::path& models_dir);

}  // namespace car::daemon
