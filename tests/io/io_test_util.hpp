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

#include "support/temp_dir.hpp"

namespace io_test {

using trainkit_test::TempDir;  // support/temp_dir.hpp

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
