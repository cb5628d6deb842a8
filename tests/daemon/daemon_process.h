// DaemonProcess: one real car-inferenced child for the integration tests (environment, log file, optional
// socket activation), killed if a test leaves it running.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace car::testing {

using namespace std::chrono_literals;

inline const std::string kBinary = std::string(CAR_BINARY_DIR) + "/daemon/car-inferenced";

/// One car-inferenced child process. Killed (SIGKILL) if a test leaves it running.
class DaemonProcess {
 public:
  /// A socket passed as systemd passes it: the fd and its FileDescriptorName= ("" for none).
  struct Passed {
    int fd;
    std::string name;
  };
  DaemonProcess(std::map<std::string, std::string> env, std::string log_path, int activation_fd = -1)
      : DaemonProcess(std::move(env), std::move(log_path),
                      activation_fd >= 0 ? std::vector<Passed>{{activation_fd, ""}} : std::vector<Passed>{}) {}
  /// Started with `passed` as fds 3, 4, ... and LISTEN_FDS / LISTEN_FDNAMES / LISTEN_PID set.
  DaemonProcess(std::map<std::string, std::string> env, std::string log_path, std::vector<Passed> passed)
      : log_path_(std::move(log_path)) {
    std::vector<std::string> env_strings;
    for (const char* keep : {"PATH", "TSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
      if (const char* v = std::getenv(keep)) env_strings.push_back(std::string(keep) + "=" + v);
    }
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    pid_ = ::fork();
    if (pid_ == 0) {
      int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log >= 0) {
        ::dup2(log, STDERR_FILENO);
        ::dup2(log, STDOUT_FILENO);
      }
      if (!passed.empty()) {
        // Move them above the target range first, so dup2 never overwrites one not yet moved.
        std::vector<int> high;
        for (const Passed& p : passed) high.push_back(::fcntl(p.fd, F_DUPFD, 100));
        std::string names;
        for (std::size_t i = 0; i < passed.size(); ++i) {
          const int target = 3 + static_cast<int>(i);
          ::dup2(high[i], target);
          ::close(high[i]);
          ::fcntl(target, F_SETFD, 0);  // inherited across exec
          names += (i > 0 ? ":" : "") + (passed[i].name.empty() ? std::string("unknown") : passed[i].name);
        }
        env_strings.push_back("LISTEN_FDS=" + std::to_string(passed.size()));
        env_strings.push_back("LISTEN_FDNAMES=" + names);
        env_strings.push_back("LISTEN_PID=" + std::to_string(::getpid()));
      }
      std::vector<char*> envp;
      for (auto& s : env_strings) envp.push_back(s.data());
      envp.push_back(nullptr);
      char* argv[] = {const_cast<char*>(kBinary.c_str()), nullptr};
      ::execve(kBinary.c_str(), argv, envp.data());
      ::_exit(127);
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }

  /// The exit status once the process ended within `timeout`; nullopt if it is still running.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    if (exited_) return status_;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return status_;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(5ms);
    }
  }
  /// SIGTERM, then the exit status (nullopt when it did not exit within the timeout).
  std::optional<int> terminate(std::chrono::milliseconds timeout = 20s) {
    ::kill(pid_, SIGTERM);
    return wait_exit(timeout);
  }
  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = -1;
};

}  // namespace car::testing
