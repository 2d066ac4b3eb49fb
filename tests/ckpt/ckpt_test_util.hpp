// SPDX-License-Identifier: MIT
// Helpers of the checkpoint tests: a self-deleting temp directory, child processes (the
// ckpt_trainer tool, spawned and SIGKILLed; forked children with a file-size limit), file I/O.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"

extern char** environ;

namespace ckpt_test {

using trainkit_test::TempDir;  // support/temp_dir.hpp

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

/// Names in `dir` (not recursive), sorted.
inline std::vector<std::string> entries(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// A running child process (stdout and stderr appended to `log`).
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::filesystem::path& log) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn ", args[0], ": ", std::strerror(rc));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }

  /// Waits for the child; returns the raw waitpid status.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }
  /// True while the child has not exited.
  bool running() {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      status_ = status;
      return false;
    }
    return true;
  }
  /// SIGKILLs the child and reaps it; returns the status (a child that exited before the kill
  /// reports its own status).
  int kill() {
    if (pid_ < 0) return status_;
    ::kill(pid_, SIGKILL);
    return wait();
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

/// Runs a command to completion; returns its exit code (128 + signal when killed).
inline int run(const std::vector<std::string>& args, const std::filesystem::path& log) {
  Child c(args, log);
  const int status = c.wait();
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/// Runs `body` in a forked child with RLIMIT_FSIZE = `limit` bytes and SIGXFSZ ignored (writes
/// beyond the limit fail with EFBIG: a full disk for one file). Returns the child's exit code;
/// the body's return value, 99 when it threw. Only fork from a test without running threads.
inline int in_child_with_file_limit(std::uint64_t limit, const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit rl{};
    rl.rlim_cur = rl.rlim_max = limit;
    if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) ::_exit(98);
    int rc = 99;
    try {
      rc = body();
    } catch (...) {
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// $TRAINKIT_PYTHON or python3.
inline std::string python() {
  const char* p = std::getenv("TRAINKIT_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

}  // namespace ckpt_test
