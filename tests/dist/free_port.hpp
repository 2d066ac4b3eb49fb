// A TCP port for a test's rendezvous on 127.0.0.1. The port is probed by listening on it, and it
// is taken from below the kernel's ephemeral range, so that no port the kernel chooses by itself
// (a bind to port 0, the local end of an outgoing connection) can take it between the probe and
// the communicator's own bind; the walk starts at an offset given by the process id, so that test
// processes run in parallel (ctest -j) probe different ports.
#pragma once

#include <algorithm>
#include <atomic>
#include <fstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include <trainkit/dist/rendezvous.hpp>

namespace disttest {

inline int free_port() {
  int ephemeral_low = 32768, ephemeral_high = 60999;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range)
    range >> ephemeral_low >> ephemeral_high;
  // Up to 12000 ports just below the ephemeral range, or above it where it starts that low.
  int low = ephemeral_high + 1, high = 65536;
  if (ephemeral_low > 2048) {
    high = ephemeral_low;
    low = std::max(1024, high - 12000);
  }
  const int span = high - low;
  static std::atomic<int> next{0};
  const int start = static_cast<int>(::getpid() % 1000) * 37;
  for (int tries = 0; tries < span; ++tries) {
    const int port = low + (start + next.fetch_add(1)) % span;
    std::string error;
    if (trainkit::dist::detail::listen_on(port, error).valid()) return port;
  }
  throw std::runtime_error("free_port: no port to listen on below the ephemeral range");
}

}  // namespace disttest
