// Helpers shared by the test suites: where the conformance fixtures are, temporary directories.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>

namespace car::testing {

/// The shared conformance folder: $CAR_CONFORMANCE_DIR, else ../shared/conformance beside the checkout.
/// nullopt when it does not exist (the project's own tests must pass without it).
inline std::optional<std::filesystem::path> conformance_dir() {
  std::filesystem::path p;
  if (const char* env = std::getenv("CAR_CONFORMANCE_DIR"); env != nullptr && *env != '\0') {
    p = env;
  } else {
    p = CAR_DEFAULT_CONFORMANCE_DIR;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(p, ec)) return std::nullopt;
  return p;
}

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("car-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace car::testing
