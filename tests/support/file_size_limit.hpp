// SPDX-License-Identifier: MIT
// For tests of writers on a full disk: runs a write with RLIMIT_FSIZE lowered and SIGXFSZ
// ignored, so that the write fails part-way with EFBIG, as it does when a disk fills up.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <trainkit/error.hpp>

namespace trainkit_test {

/// Runs `write()` with files limited to `limit` bytes; returns the message of the
/// trainkit::Error it threw ("" when it threw none). The limit and the signal's handler are
/// restored whatever `write` does.
template <class F>
std::string error_under_file_size_limit(std::uint64_t limit, F&& write) {
  rlimit old{};
  if (::getrlimit(RLIMIT_FSIZE, &old) != 0)
    throw std::runtime_error("getrlimit(RLIMIT_FSIZE) failed");
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old_action {};
  ::sigaction(SIGXFSZ, &ignore, &old_action);
  struct Restore {
    const rlimit& limit;
    const struct sigaction& action;
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      ::sigaction(SIGXFSZ, &action, nullptr);
    }
  } restore{old, old_action};
  rlimit tight = old;
  tight.rlim_cur = limit;
  if (::setrlimit(RLIMIT_FSIZE, &tight) != 0)
    throw std::runtime_error("setrlimit(RLIMIT_FSIZE) failed");
  try {
    write();
  } catch (const trainkit::Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace trainkit_test
