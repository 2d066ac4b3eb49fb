// SPDX-License-Identifier: MIT
// Helpers shared by the tests in tests/io: a self-deleting temp directory, whole-file I/O and a
// forked child with a file-size limit (simulated full disk: writes fail with EFBIG).
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "trainkit/error.hpp"

namespace io_test {

/// A fresh directory under the system temp dir, removed (with its content) on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("trainkit_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

  /// Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

inline std::string to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

/// Runs `body` in a forked child whose files may not grow past `limit` bytes (SIGXFSZ ignored,
/// so writes fail with EFBIG). Returns the message of the trainkit::Error it threw, or
/// "<no error>" when it finished normally.
inline std::string run_with_file_size_limit(std::size_t limit, const std::function<void()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{};
    lim.rlim_cur = limit;
    lim.rlim_max = RLIM_INFINITY;
    std::string message = "<no error>";
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) {
      message = "<setrlimit failed>";
    } else {
      try {
        body();
      } catch (const trainkit::Error& e) {
        message = e.what();
      } catch (...) {
        message = "<other exception>";
      }
    }
    const ssize_t w = ::write(fds[1], message.data(), message.size());
    ::_exit(w == ssize_t(message.size()) ? 0 : 2);
  }
  ::close(fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) > 0;) message.append(buf, size_t(r));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return message;
}

}  // namespace io_test
