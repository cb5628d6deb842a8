// Helpers shared by the test suites: where the conformance fixtures are, temporary directories.
//
// Conformance data (../shared/conformance, or $CAR_CONFORMANCE_DIR): a test that reads it starts with
// CAR_CONFORMANCE_DIR_OR_SKIP(dir). It is skipped only when no conformance data is configured at all
// (CAR_CONFORMANCE_DIR unset and nothing at the default path), so the project's tests pass on a checkout
// without it. Once a folder is configured the data is required: the test fails when CAR_CONFORMANCE_DIR
// names no directory, and must fail (ASSERT, never skip) when a fixture in the folder is missing or
// unreadable - CI has the data, and a silent skip there would hide a regression.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>

namespace car::testing {

/// Built with ASan or TSan (GCC's macros or clang's __has_feature): their shadow memory makes RSS figures
/// meaningless, so memory checks skip.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

/// What locating the conformance folder found.
struct ConformanceLookup {
  std::optional<std::filesystem::path> dir;  ///< the folder tests must read; nullopt: none configured, skip
  std::string error;                         ///< non-empty: a folder was asked for but is unusable; fail
};

/// Pure rule: `env` is $CAR_CONFORMANCE_DIR (nullptr or "" = unset), `default_dir` the folder beside the
/// checkout. A set variable must name a directory; unset, the default is used when anything exists there
/// (and must then be a directory); otherwise there is no conformance data.
inline ConformanceLookup locate_conformance(const char* env, const std::filesystem::path& default_dir) {
  std::error_code ec;
  if (env != nullptr && *env != '\0') {
    const std::filesystem::path p = env;
    if (!std::filesystem::is_directory(p, ec)) {
      return {std::nullopt, "CAR_CONFORMANCE_DIR=" + p.string() + " is not a directory"};
    }
    return {p, {}};
  }
  if (!std::filesystem::exists(default_dir, ec)) return {};
  if (!std::filesystem::is_directory(default_dir, ec)) {
    return {std::nullopt, "the default conformance folder " + default_dir.string() + " is not a directory"};
  }
  return {default_dir, {}};
}

/// locate_conformance() with this process's environment and the build's default folder.
inline ConformanceLookup find_conformance() {
  return locate_conformance(std::getenv("CAR_CONFORMANCE_DIR"), CAR_DEFAULT_CONFORMANCE_DIR);
}

/// The bytes of a fixture; nullopt when it is missing or unreadable (the calling test must then fail).
inline std::optional<std::string> read_fixture(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(ss).str();
}

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ =
        std::filesystem::temp_directory_path() / ("car-test-" + std::to_string(rd()) + std::to_string(rd()));
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

/// What a shell command printed and how it ended.
struct CommandResult {
  int exit_code = -1;  ///< -1 when it did not exit normally (a signal)
  std::string out;
  std::string err;
};

/// Runs `cmd` with /bin/sh, capturing standard output; standard error goes where `cmd` sends it.
inline CommandResult run_shell_stdout(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// Runs `cmd` with /bin/sh (so it may redirect its own standard input), capturing standard output and,
/// through a file in `tmp`, standard error.
inline CommandResult run_shell(const std::string& cmd, const TempDir& tmp) {
  const std::filesystem::path err_file = tmp / "stderr.txt";
  CommandResult r = run_shell_stdout("(" + cmd + ") 2>'" + err_file.string() + "'");
  r.err = read_fixture(err_file).value_or("");
  return r;
}

/// The `car` binary of this build tree (tests that run it skip when it is not built).
inline std::filesystem::path car_binary() {
  return std::filesystem::path(CAR_BINARY_DIR) / "tools" / "car";
}

/// Runs this build's `car` with `args` (a shell-quoted string), capturing standard output; standard error
/// is discarded.
inline CommandResult run_car(const std::string& args) {
  return run_shell_stdout(car_binary().string() + " " + args + " 2>/dev/null");
}

}  // namespace car::testing

/// In a TEST body (or any function returning void): declares `const std::filesystem::path var`, the
/// conformance folder; skips the test when none is configured and fails it when the configured one is
/// unusable (see the top of this file).
#define CAR_CONFORMANCE_DIR_OR_SKIP(var)                                                              \
  const ::car::testing::ConformanceLookup var##_lookup_ = ::car::testing::find_conformance();         \
  if (!var##_lookup_.error.empty()) FAIL() << var##_lookup_.error;                                    \
  if (!var##_lookup_.dir)                                                                             \
    GTEST_SKIP() << "no conformance data: CAR_CONFORMANCE_DIR unset and " CAR_DEFAULT_CONFORMANCE_DIR \
                    " absent";                                                                        \
  const std::filesystem::path var = *var##_lookup_.dir
