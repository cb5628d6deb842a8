#include "core/experts/usage_sidecar.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/experts/streamed_source.h"
#include "core/util/error_codes.h"

namespace car::experts {
namespace {

constexpr const char* kProjections[3] = {"gate", "up", "down"};

std::string errno_text(int err) {
  return std::strerror(err);
}

bool parse_u64(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

/// "blk.<layer>.ffn_<proj>_exps.weight" -> layer, or -1.
int parse_bank_name(std::string_view name) {
  constexpr std::string_view prefix = "blk.";
  if (name.substr(0, prefix.size()) != prefix) return -1;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return -1;
  uint64_t layer = 0;
  if (!parse_u64(name.substr(0, dot), layer) ||
      layer > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return -1;
  }
  const std::string_view rest = name.substr(dot + 1);
  for (const char* p : kProjections) {
    if (rest == std::string("ffn_") + p + "_exps.weight") return static_cast<int>(layer);
  }
  return -1;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> f;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) f.push_back(line.substr(start, i - start));
  }
  return f;
}

std::string excerpt(std::string_view line) {
  std::string s;
  for (char c : line.substr(0, 60)) s.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c);
  if (line.size() > 60) s += "...";
  return s;
}

/// fsync the directory holding `path` so the rename is durable. Best effort.
void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

uint64_t fnv1a64(std::string_view s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

std::string bank_tensor_name(int layer, int projection) {
  CAR_CHECK(projection >= 0 && projection < 3);
  return "blk." + std::to_string(layer) + ".ffn_" + kProjections[projection] + "_exps.weight";
}

SidecarContents parse_sidecar(std::string_view text, std::span<const int> n_expert,
                              const std::string& origin) {
  SidecarContents out;
  size_t skipped = 0;
  auto warn = [&](size_t line_no, const std::string& why, std::string_view line) {
    ++skipped;
    if (out.warnings.size() < kMaxSidecarWarnings) {
      out.warnings.push_back(origin + ":" + std::to_string(line_no) + ": " + why + ", line skipped: '" +
                             excerpt(line) + "'");
    }
  };
  size_t pos = 0;
  size_t line_no = 0;
  while (pos < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    const bool terminated = nl != std::string_view::npos;
    const std::string_view line = text.substr(pos, terminated ? nl - pos : std::string_view::npos);
    pos = terminated ? nl + 1 : text.size();
    const std::vector<std::string_view> f = split_fields(line);
    if (f.empty() || f[0][0] == '#') continue;
    if (!terminated) {
      warn(line_no, "no final newline (torn write)", line);
      continue;
    }
    if (f.size() != 3) {
      warn(line_no, "expected 'name expert count'", line);
      continue;
    }
    const int layer = parse_bank_name(f[0]);
    if (layer < 0) {
      warn(line_no, "not an expert bank name", line);
      continue;
    }
    if (static_cast<size_t>(layer) >= n_expert.size() || n_expert[static_cast<size_t>(layer)] <= 0) {
      warn(line_no, "layer " + std::to_string(layer) + " has no experts in this model", line);
      continue;
    }
    uint64_t expert = 0;
    uint64_t count = 0;
    if (!parse_u64(f[1], expert) || expert >= static_cast<uint64_t>(n_expert[static_cast<size_t>(layer)])) {
      warn(line_no,
           "expert index out of range [0, " + std::to_string(n_expert[static_cast<size_t>(layer)]) + ")",
           line);
      continue;
    }
    if (!parse_u64(f[2], count)) {
      warn(line_no, "count is not an unsigned decimal", line);
      continue;
    }
    uint64_t& slot = out.counts[{layer, static_cast<int>(expert)}];
    slot = std::max(slot, count);
  }
  if (skipped > out.warnings.size()) {
    out.warnings.push_back(origin + ": " + std::to_string(skipped - out.warnings.size()) +
                           " more malformed or foreign lines skipped");
  }
  return out;
}

SidecarContents read_sidecar(const std::string& path, std::span<const int> n_expert) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    SidecarContents out;
    out.warnings.push_back(path + ": cannot read the expert usage sidecar: " + errno_text(errno) +
                           "; ignored");
    return out;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_sidecar(ss.str(), n_expert, path);
}

std::string format_sidecar(const UsageCounts& counts) {
  std::string out = "# car-inference expert usage: <bank tensor> <expert> <count>\n";
  for (int p = 0; p < 3; ++p) {
    for (const auto& [key, count] : counts) {
      out += bank_tensor_name(key.first, p);
      out += ' ';
      out += std::to_string(key.second);
      out += ' ';
      out += std::to_string(count);
      out += '\n';
    }
  }
  return out;
}

Result<void> write_file_atomic(const std::string& path, std::string_view text) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.parent_path();
  std::error_code ec;
  if (!dir.empty()) {
    fs::create_directories(dir, ec);
    if (ec) return make_error(errc::kIoError, "creating " + dir.string() + ": " + ec.message());
  }
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(errc::kIoError, "creating " + tmp + ": " + errno_text(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_error(errc::kIoError, "writing " + tmp + ": " + errno_text(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return make_error(errc::kIoError, "fsync " + tmp + ": " + errno_text(err));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return make_error(errc::kIoError, "renaming " + tmp + " to " + path + ": " + errno_text(err));
  }
  sync_directory(dir);
  return {};
}

Result<void> merge_into_sidecar(const std::string& path, std::span<const int> n_expert,
                                const UsageCounts& delta, std::vector<std::string>& warnings) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) {
    fs::create_directories(dir, ec);
    if (ec) return make_error(errc::kIoError, "creating " + dir.string() + ": " + ec.message());
  }
  const std::string lock_path = path + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return make_error(errc::kIoError, "opening " + lock_path + ": " + errno_text(errno));
  while (::flock(lock_fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const int err = errno;
      ::close(lock_fd);
      return make_error(errc::kIoError, "locking " + lock_path + ": " + errno_text(err));
    }
  }
  SidecarContents merged = read_sidecar(path, n_expert);
  for (const auto& [key, d] : delta) {
    uint64_t& c = merged.counts[key];
    c = c > UINT64_MAX - d ? UINT64_MAX : c + d;
  }
  Result<void> r = write_file_atomic(path, format_sidecar(merged.counts));
  ::close(lock_fd);  // releases the lock
  for (std::string& w : merged.warnings) warnings.push_back(std::move(w));
  return r;
}

Result<std::string> sidecar_path(const std::string& state_dir, const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(model_path, ec), ec);
  if (ec) abs = fs::path(model_path).lexically_normal();
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) {
    return make_error(errc::kNotFound,
                      model_path + ": cannot stat the model for its usage sidecar: " + errno_text(errno));
  }
  const uint64_t h = fnv1a64(std::to_string(static_cast<uint64_t>(st.st_size)), fnv1a64(abs.string() + '\n'));
  char hex[13];
  std::snprintf(hex, sizeof(hex), "%012llx", static_cast<unsigned long long>(h >> 16));
  std::string stem = abs.stem().string();
  for (char& c : stem) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_';
    if (!ok) c = '_';
  }
  if (stem.empty()) stem = "model";
  return (fs::path(state_dir) / "experts" / (stem + "-" + hex + ".usage")).string();
}

}  // namespace car::experts
