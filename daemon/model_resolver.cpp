#include "daemon/model_resolver.h"

#include <algorithm>
#include <system_error>

#include "core/util/error_codes.h"
#include "daemon/safe_text.h"

namespace car::daemon {

namespace fs = std::filesystem;

namespace {
constexpr std::size_t kMaxIdBytes = 255;

bool inside(const fs::path& dir, const fs::path& file) {
  // Both canonical: `file` is inside `dir` when dir's components are a prefix of file's.
  auto d = dir.begin();
  auto f = file.begin();
  for (; d != dir.end(); ++d, ++f) {
    if (d->empty()) continue;  // trailing separator of the directory
    if (f == file.end() || *d != *f) return false;
  }
  return f != file.end();
}
}  // namespace

Result<void> check_model_id(const std::string& id) {
  if (id.empty()) return make_error(errc::kForbidden, "model id is empty");
  if (id.size() > kMaxIdBytes) {
    return make_error(errc::kForbidden,
                      "model id is " + std::to_string(id.size()) + " bytes, the limit is 255");
  }
  // The id is echoed in the messages below only once it is known to hold no unsafe character.
  if (auto why = unsafe_text_reason(id)) return make_error(errc::kForbidden, "model id rejected: " + *why);
  if (id.front() == '.') return make_error(errc::kForbidden, "model id '" + id + "' starts with '.'");
  for (unsigned char c : id) {
    if (c == '/' || c == '\\')
      return make_error(errc::kForbidden, "model id '" + id + "' contains a path separator");
  }
  if (id.find("..") != std::string::npos)
    return make_error(errc::kForbidden, "model id '" + id + "' contains '..'");
  return {};
}

Result<ResolvedModel> resolve_model(const fs::path& models_dir, const std::string& id) {
  if (auto ok = check_model_id(id); !ok) return ok.error();
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(models_dir, ec);
  if (ec) return make_error(errc::kNotFound, "models directory " + models_dir.string() + ": " + ec.message());
  fs::path file = fs::weakly_canonical(dir / (id + ".gguf"), ec);
  if (ec) return make_error(errc::kNotFound, "model '" + id + "': " + ec.message());
  if (!inside(dir, file)) {
    return make_error(errc::kForbidden, "model '" + id + "' resolves outside the models directory");
  }
  auto status = fs::status(file, ec);
  if (ec || !fs::exists(status)) {
    return make_error(errc::kNotFound,
                      "model '" + id + "' not found (no " + (dir / (id + ".gguf")).string() + ")");
  }
  if (!fs::is_regular_file(status)) {
    return make_error(errc::kNotFound, "model '" + id + "': " + file.string() + " is not a regular file");
  }
  uint64_t size = fs::file_size(file, ec);
  if (ec) return make_error(errc::kNotFound, "model '" + id + "': " + ec.message());
  return ResolvedModel{id, file, size};
}

Result<std::vector<ListedModel>> list_models(const fs::path& models_dir) {
  std::vector<ListedModel> out;
  std::error_code ec;
  if (!fs::exists(models_dir, ec)) return out;
  fs::directory_iterator it(models_dir, ec);
  if (ec)
    return make_error(errc::kInternal,
                      "cannot read models directory " + models_dir.string() + ": " + ec.message());
  for (const auto& entry : it) {
    const fs::path& p = entry.path();
    if (p.extension() != ".gguf") continue;
    std::string id = p.stem().string();
    auto resolved = resolve_model(models_dir, id);
    if (!resolved) continue;  // forbidden names and dangling links are not models
    out.push_back({id, resolved->path, resolved->file_bytes});
  }
  std::sort(out.begin(), out.end(), [](const ListedModel& a, const ListedModel& b) { return a.id < b.id; });
  return out;
}

}  // namespace car::daemon
