// `car --version` / `car-inferenced --version` (version, commit, ISA) and the client's socket discovery:
// socket_candidates() order, and `car health` reaching a daemon on the system socket when the per-user one
// does not exist, and naming every path it tried when none answers.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/daemon/daemon_process.h"
#include "tests/daemon/daemon_test_support.h"
#include "tests/test_support.h"
#include "tools/socket_discovery.h"

namespace car {
namespace {

using car::testing::TempDir;
using namespace std::chrono_literals;

const std::string kCar = std::string(CAR_BINARY_DIR) + "/tools/car";
const std::string kDaemon = std::string(CAR_BINARY_DIR) + "/daemon/car-inferenced";

struct Run {
  int status = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Run `argv` with exactly `env` (plus PATH and the sanitizer options), capturing stdout and stderr.
Run run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  TempDir dir;
  const auto out_path = dir / "out";
  const auto err_path = dir / "err";
  std::vector<std::string> env_strings;
  for (const char* keep : {"PATH", "TSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
    if (const char* v = std::getenv(keep)) env_strings.push_back(std::string(keep) + "=" + v);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  pid_t pid = ::fork();
  if (pid == 0) {
    int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, STDOUT_FILENO);
    ::dup2(e, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    ::execve(argv[0].c_str(), args.data(), envp.data());
    ::_exit(127);
  }
  Run r;
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

/// The three --version lines: "<name> <version>", "commit <hash or unknown>", "isa <name>".
void expect_version(const Run& r, const std::string& name, const std::string& isa_pattern) {
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch m;
  const std::regex re("^" + name + " ([0-9.]+)\ncommit ([0-9a-f]{12}(-dirty)?|unknown)\nisa (" + isa_pattern +
                      ")\n$");
  ASSERT_TRUE(std::regex_match(r.out, m, re)) << r.out;
  EXPECT_EQ(m[1].str(), CAR_PROJECT_VERSION);
}

TEST(InstallVersion, CarPrintsVersionCommitAndIsa) {
  expect_version(run({kCar, "--version"}, {}), "car", "scalar|avx2|avx512");
  // The ISA line is the one `car run` would use: CAR_INFERENCE_ISA is applied.
  expect_version(run({kCar, "--version"}, {{"CAR_INFERENCE_ISA", "scalar"}}), "car", "scalar");
}

TEST(InstallVersion, DaemonPrintsVersionCommitAndIsa) {
  // Works without any configuration, even with a settings value that would stop start-up.
  const auto r = run({kDaemon, "--version"}, {{"CAR_INFERENCE_WORKERS", "not-a-number"}});
  expect_version(r, "car-inferenced", "scalar|avx2|avx512");
  // Both binaries were built from the same commit.
  const auto c = run({kCar, "--version"}, {});
  EXPECT_EQ(r.out.substr(r.out.find("commit"))
                .substr(0, r.out.find('\n', r.out.find("commit")) - r.out.find("commit")),
            c.out.substr(c.out.find("commit"))
                .substr(0, c.out.find('\n', c.out.find("commit")) - c.out.find("commit")));
}

TEST(SocketDiscovery, CandidatesInOrder) {
  using tools::socket_candidates;
  const config::EnvMap user{{"XDG_RUNTIME_DIR", "/run/user/1000"}};
  // A non-root user: their own daemon first, then the system one.
  EXPECT_EQ(socket_candidates("", user, 1000),
            (std::vector<std::string>{"/run/user/1000/car-inference.sock",
                                      "/run/car-inference/car-inference.sock"}));
  // No XDG_RUNTIME_DIR: the system socket only.
  EXPECT_EQ(socket_candidates("", {}, 1000),
            std::vector<std::string>{"/run/car-inference/car-inference.sock"});
  // root: the system socket (its own default) once.
  EXPECT_EQ(socket_candidates("", user, 0),
            std::vector<std::string>{"/run/car-inference/car-inference.sock"});
  // --socket and CAR_INFERENCE_SOCKET: exactly that path, no fallback.
  EXPECT_EQ(socket_candidates("/tmp/x.sock", user, 1000), std::vector<std::string>{"/tmp/x.sock"});
  config::EnvMap explicit_env = user;
  explicit_env["CAR_INFERENCE_SOCKET"] = "/tmp/y.sock";
  EXPECT_EQ(socket_candidates("", explicit_env, 1000), std::vector<std::string>{"/tmp/y.sock"});
  // CAR_INFERENCE_SYSTEM_SOCKET moves the system socket (for root too).
  config::EnvMap moved = user;
  moved["CAR_INFERENCE_SYSTEM_SOCKET"] = "/srv/car.sock";
  EXPECT_EQ(socket_candidates("", moved, 1000),
            (std::vector<std::string>{"/run/user/1000/car-inference.sock", "/srv/car.sock"}));
  EXPECT_EQ(socket_candidates("", moved, 0), std::vector<std::string>{"/srv/car.sock"});
}

class SocketDiscoveryCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(tmp_ / "user");  // XDG_RUNTIME_DIR without a daemon in it
    std::filesystem::create_directories(tmp_ / "system");
    std::filesystem::create_directories(tmp_ / "models");
    system_socket_ = (tmp_ / "system" / "car-inference.sock").string();
    user_socket_ = (tmp_ / "user" / "car-inference.sock").string();
    client_env_ = {{"XDG_RUNTIME_DIR", (tmp_ / "user").string()},
                   {"CAR_INFERENCE_SYSTEM_SOCKET", system_socket_}};
  }
  /// A daemon serving the system socket; null, with its log reported, when the socket never appears.
  std::unique_ptr<car::testing::DaemonProcess> start_system_daemon() {
    auto daemon = std::make_unique<car::testing::DaemonProcess>(
        std::map<std::string, std::string>{{"CAR_INFERENCE_SOCKET", system_socket_},
                                           {"CAR_INFERENCE_MODELS_DIR", (tmp_ / "models").string()},
                                           {"CAR_INFERENCE_STATE_DIR", tmp_.path().string()},
                                           {"CAR_INFERENCE_THREADS", "1"}},
        (tmp_ / "daemon.log").string());
    if (!car::testing::wait_until([&] { return std::filesystem::exists(system_socket_); }, 20s)) {
      ADD_FAILURE() << "the daemon never made " << system_socket_ << ": " << daemon->log();
      return nullptr;
    }
    return daemon;
  }

  TempDir tmp_;
  std::string system_socket_;
  std::string user_socket_;
  std::map<std::string, std::string> client_env_;
};

TEST_F(SocketDiscoveryCli, PlainHealthReachesTheSystemDaemon) {
  const auto daemon = start_system_daemon();
  ASSERT_TRUE(daemon);
  const auto r = run({kCar, "health", "--json"}, client_env_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos) << r.out;
  EXPECT_EQ(daemon->terminate(), 0);
}

TEST_F(SocketDiscoveryCli, NoDaemonNamesEveryPathTried) {
  const auto r = run({kCar, "health"}, client_env_);
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find(system_socket_), std::string::npos) << r.err;
  if (::geteuid() != 0) {
    EXPECT_NE(r.err.find(user_socket_), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("No such file or directory"), std::string::npos) << r.err;
}

TEST_F(SocketDiscoveryCli, ExplicitSocketHasNoFallback) {
  const auto daemon = start_system_daemon();
  ASSERT_TRUE(daemon);
  // --socket names a path with no daemon: the system daemon is not tried behind the user's back.
  const auto r = run({kCar, "health", "--socket", (tmp_ / "nothing.sock").string()}, client_env_);
  EXPECT_EQ(r.status, 3);
  EXPECT_NE(r.err.find("nothing.sock"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(system_socket_), std::string::npos) << r.err;
  EXPECT_EQ(daemon->terminate(), 0);
}

}  // namespace
}  // namespace car
