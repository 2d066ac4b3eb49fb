// A TCP port for a test's rendezvous on 127.0.0.1. The port is probed by listening on it, and it
// is taken from below the kernel's ephemeral range, so that no port the kernel chooses by itself
// (a bind to port 0, the local end of an outgoing connection) can take it between the probe and
// the communicator's own bind; the walk starts at an offset given by the process id, so that test
// processes run in parallel (ctest -j) probe different ports.
// Also run_out_of_fds: a listener's body in a forked child that has no file descriptor left for
// accept, while this process connects to it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

/// What a child of run_out_of_fds reported.
struct ChildReport {
  std::string message;  ///< what the body threw ("" when it returned, "?" when nothing came)
  double wall_s = -1;   ///< the body's wall time
  double cpu_s = -1;    ///< the body's CPU time (user + system)
};

/// Runs `body` in a forked child (so that this process keeps its limits and descriptors) after
/// lowering the child's RLIMIT_NOFILE and filling every free descriptor but `spare`, while
/// `parent(done)` runs on a thread of this process until the child reported (`done` is then
/// set). The child is killed after `limit_s` seconds.
template <class Body, class Parent>
ChildReport run_starved_child(int spare, Body body, Parent parent, double limit_s = 10) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("run_out_of_fds: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("run_out_of_fds: fork failed");
  if (pid == 0) {
    ::close(pipe_fds[0]);
    rlimit lim{};
    (void)::getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_cur, 256);
    (void)::setrlimit(RLIMIT_NOFILE, &lim);
    std::vector<int> filler;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
    for (int i = 0; i < spare && !filler.empty(); ++i) {
      ::close(filler.back());
      filler.pop_back();
    }
    std::string message;
    rusage before{}, after{};
    (void)::getrusage(RUSAGE_SELF, &before);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      body();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "(a non-std exception)";
    }
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    (void)::getrusage(RUSAGE_SELF, &after);
    const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
    const double cpu = seconds(after.ru_utime) - seconds(before.ru_utime) +
                       seconds(after.ru_stime) - seconds(before.ru_stime);
    char head[64];
    const int n = std::snprintf(head, sizeof head, "%.3f %.3f\n", wall, cpu);
    std::string out = std::string(head, static_cast<std::size_t>(n)) + message;
    for (std::size_t at = 0; at < out.size();) {
      const ssize_t k = ::write(pipe_fds[1], out.data() + at, out.size() - at);
      if (k <= 0) break;
      at += static_cast<std::size_t>(k);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(limit_s * 1e3));
  std::atomic<bool> done{false};
  std::thread parent_thread([&] { parent(done); });
  std::string out;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t k = ::read(pipe_fds[0], buf, sizeof buf);
    if (k <= 0) break;
    out.append(buf, static_cast<std::size_t>(k));
  }
  ::close(pipe_fds[0]);
  done.store(true);
  parent_thread.join();
  (void)::kill(pid, SIGKILL);
  int status = 0;
  (void)::waitpid(pid, &status, 0);
  ChildReport report;
  const std::size_t eol = out.find('\n');
  if (eol == std::string::npos) {
    report.message = "?";
    return report;
  }
  const bool timed =
      std::sscanf(out.substr(0, eol).c_str(), "%lf %lf", &report.wall_s, &report.cpu_s) == 2;
  report.message = timed ? out.substr(eol + 1) : std::string("?");
  return report;
}

/// run_starved_child where `body` should listen at 127.0.0.1:`port` with its `spare`
/// descriptors: this process connects there and holds the connection, so that the child's accept
/// fails with EMFILE.
template <class Body>
ChildReport run_out_of_fds(int port, int spare, Body body, double limit_s = 10) {
  return run_starved_child(
      spare, body,
      [port](const std::atomic<bool>& done) {
        int conn = -1;
        while (conn < 0 && !done.load()) {
          conn = ::socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in to{};
          to.sin_family = AF_INET;
          to.sin_port = htons(static_cast<std::uint16_t>(port));
          to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (::connect(conn, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
            ::close(conn);
            conn = -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }
        while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (conn >= 0) ::close(conn);
      },
      limit_s);
}

}  // namespace disttest
