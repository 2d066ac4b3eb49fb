// SPDX-License-Identifier: MIT
// trainkit/dist/rendezvous.hpp: `tcp_broadcast`, a tiny TCP rendezvous that hands a few bytes
// from rank 0 to every other rank: how NCCL's unique id reaches the ranks under torchrun or srun,
// where there is no MPI (rank 0 listens at MASTER_PORT, the others connect to MASTER_ADDR).
// Bounded by a timeout, with a magic header so a stray connection or another job on the same port
// is an error naming the address, not a hang or garbage. POSIX sockets; elsewhere it throws.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"

#if __has_include(<sys/socket.h>) && __has_include(<netdb.h>) && __has_include(<poll.h>) && \
    __has_include(<unistd.h>)
#define TRAINKIT_DETAIL_HAS_SOCKETS 1
#include <cerrno>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#else
#define TRAINKIT_DETAIL_HAS_SOCKETS 0
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace dist {
namespace detail {

#if TRAINKIT_DETAIL_HAS_SOCKETS

using RdvClock = std::chrono::steady_clock;

// "TKRDV" + protocol version 1, then rank, world_size and payload length (big-endian).
inline constexpr char kRendezvousMagic[8] = {'T', 'K', 'R', 'D', 'V', '0', '0', '1'};
inline constexpr std::size_t kRendezvousHeader = 8 + 4 + 4 + 8;

/// An owned socket descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int fd() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string errno_text(int err) {
  return trainkit::detail::concat(std::strerror(err), " (errno ", err, ")");
}

inline int remaining_ms(RdvClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - RdvClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left.count(), 1000));
}

/// Waits for `events` on fd until the deadline; false on timeout.
inline bool wait_fd(int fd, short events, RdvClock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = remaining_ms(deadline);
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (r == 0 && RdvClock::now() >= deadline) return false;
  }
}

/// Sends/receives exactly `n` bytes before the deadline; false on timeout, EOF or error.
inline bool send_all(int fd, const void* data, std::size_t n, RdvClock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}
inline bool recv_all(int fd, void* data, std::size_t n, RdvClock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

inline void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (24 - 8 * i));
}
inline void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (56 - 8 * i));
}
inline std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

inline void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/// A listening socket on `port` of every local interface (IPv6 dual-stack when available).
inline Socket listen_on(int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(nullptr, service.c_str(), &hints, &list); rc != 0) {
    error = ::gai_strerror(rc);
    return Socket();
  }
  Socket best;
  // Prefer IPv6 (dual-stack reaches IPv4 peers too), else the first that binds.
  for (int pass = 0; pass < 2 && !best.valid(); ++pass) {
    for (addrinfo* a = list; a != nullptr && !best.valid(); a = a->ai_next) {
      if ((pass == 0) != (a->ai_family == AF_INET6)) continue;
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (!s.valid()) {
        error = errno_text(errno);
        continue;
      }
      const int one = 1, zero = 0;
      (void)::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (a->ai_family == AF_INET6)
        (void)::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd(), 128) != 0) {
        error = errno_text(errno);
        continue;
      }
      set_nonblocking(s.fd());
      best = std::move(s);
    }
  }
  ::freeaddrinfo(list);
  return best;
}

/// Connects to host:port once (every address it resolves to), waiting at most until the
/// deadline for each attempt; an invalid Socket when nobody accepted.
inline Socket connect_once(const std::string& host, int port, RdvClock::time_point deadline,
                           std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0) {
    error = trainkit::detail::concat("cannot resolve '", host, "': ", ::gai_strerror(rc));
    return Socket();
  }
  Socket result;
  for (addrinfo* a = list; a != nullptr && !result.valid(); a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (!s.valid()) continue;
    set_nonblocking(s.fd());
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = errno_text(errno);
        continue;
      }
      if (!wait_fd(s.fd(), POLLOUT,
                   std::min(deadline, RdvClock::now() + std::chrono::seconds(2)))) {
        error = "connect timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        error = errno_text(err);
        continue;
      }
    }
    const int one = 1;
    (void)::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    result = std::move(s);
  }
  ::freeaddrinfo(list);
  return result;
}

#endif  // TRAINKIT_DETAIL_HAS_SOCKETS

}  // namespace detail

/// Hands `payload` from rank 0 to ranks 1..world_size-1 over TCP. Rank 0 fills `payload` and
/// listens on `port` on every local interface; the other ranks connect to `host`:`port` (retrying
/// while rank 0 is not up yet) and receive it into their `payload`, which must have the same size.
/// It returns on every rank only after rank 0 heard from all of them (a barrier too). `world_size`
/// == 1 returns at once. Throws trainkit::Error naming host, port and rank when the port cannot be
/// bound, nobody answers, a peer sends something else (another job on the port?), ranks disagree on
/// world_size or payload length, or `timeout` (positive, at most 10^7 s) passes.
TRAINKIT_INLINE void tcp_broadcast(std::string_view host, int port, int rank, int world_size,
                                   std::span<std::byte> payload, std::chrono::milliseconds timeout);

#if TRAINKIT_IMPL

TRAINKIT_INLINE void tcp_broadcast(std::string_view host, int port, int rank, int world_size,
                                   std::span<std::byte> payload,
                                   std::chrono::milliseconds timeout) {
  TRAINKIT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "tcp_broadcast: rank ", rank,
                 " is not in [0, ", world_size, ")");
  TRAINKIT_CHECK(port > 0 && port < 65536, "tcp_broadcast: port ", port, " is not in [1, 65535]");
  detail::check_timeout("tcp_broadcast", timeout);
  if (world_size == 1) return;
#if TRAINKIT_DETAIL_HAS_SOCKETS
  using detail::RdvClock;
  const auto deadline = RdvClock::now() + timeout;
  const std::string where = trainkit::detail::concat(host, ":", port);
  const double seconds = static_cast<double>(timeout.count()) / 1000.0;

  if (rank == 0) {
    std::string error;
    detail::Socket listener = detail::listen_on(port, error);
    TRAINKIT_CHECK(listener.valid(), "tcp_broadcast: rank 0 cannot listen on port ", port, ": ",
                   error, " (is another job using it? set MASTER_PORT or TRAINKIT_RDZV_PORT)");
    std::vector<detail::Socket> peers(static_cast<std::size_t>(world_size));
    int joined = 0;
    while (joined < world_size - 1) {
      if (!detail::wait_fd(listener.fd(), POLLIN, deadline))
        TRAINKIT_FAIL("tcp_broadcast: rank 0 waited ", seconds, " s on port ", port, " but only ",
                      joined, " of the other ", world_size - 1, " ranks connected");
      detail::Socket s(::accept(listener.fd(), nullptr, nullptr));
      if (!s.valid()) continue;
      // Non-blocking (an accepted socket does not inherit it from the listener): a blocking send
      // of the payload to a peer that stops reading would never return, whatever the deadline.
      detail::set_nonblocking(s.fd());
      unsigned char header[detail::kRendezvousHeader];
      // A connection that does not speak our protocol (a port scanner, a health check) is
      // dropped; one that does but disagrees is an error.
      if (!detail::recv_all(s.fd(), header, sizeof header,
                            std::min(deadline, RdvClock::now() + std::chrono::seconds(5))) ||
          std::memcmp(header, detail::kRendezvousMagic, 8) != 0)
        continue;
      const auto peer_rank = static_cast<int>(detail::get_u32(header + 8));
      const auto peer_size = static_cast<int>(detail::get_u32(header + 12));
      const std::uint64_t peer_len = detail::get_u64(header + 16);
      TRAINKIT_CHECK(peer_size == world_size && peer_len == payload.size(),
                     "tcp_broadcast on port ", port, ": rank ", peer_rank, " expects ", peer_size,
                     " ranks and ", peer_len, " bytes, rank 0 has ", world_size, " ranks and ",
                     payload.size(), " bytes (two jobs on one port?)");
      TRAINKIT_CHECK(peer_rank >= 1 && peer_rank < world_size, "tcp_broadcast on port ", port,
                     ": a peer claims rank ", peer_rank, " of ", world_size);
      TRAINKIT_CHECK(!peers[static_cast<std::size_t>(peer_rank)].valid(), "tcp_broadcast on port ",
                     port, ": rank ", peer_rank, " connected twice (two jobs on one port?)");
      peers[static_cast<std::size_t>(peer_rank)] = std::move(s);
      ++joined;
    }
    for (int r = 1; r < world_size; ++r) {
      const int fd = peers[static_cast<std::size_t>(r)].fd();
      TRAINKIT_CHECK(detail::send_all(fd, detail::kRendezvousMagic, 8, deadline) &&
                         detail::send_all(fd, payload.data(), payload.size(), deadline),
                     "tcp_broadcast: rank 0 could not send to rank ", r, " on port ", port);
    }
    return;
  }

  std::string error = "connection refused";
  for (;;) {
    detail::Socket s = detail::connect_once(std::string(host), port, deadline, error);
    if (s.valid()) {
      unsigned char header[detail::kRendezvousHeader];
      std::memcpy(header, detail::kRendezvousMagic, 8);
      detail::put_u32(header + 8, static_cast<std::uint32_t>(rank));
      detail::put_u32(header + 12, static_cast<std::uint32_t>(world_size));
      detail::put_u64(header + 16, payload.size());
      char magic[8];
      if (detail::send_all(s.fd(), header, sizeof header, deadline)) {
        // Rank 0 answers once every rank joined; waiting for that is bounded by the deadline.
        TRAINKIT_CHECK(detail::recv_all(s.fd(), magic, 8, deadline), "tcp_broadcast: rank ", rank,
                       " connected to ", where, " but got no answer within ", seconds,
                       " s (not every rank joined, or rank 0 failed: see its log)");
        TRAINKIT_CHECK(std::memcmp(magic, detail::kRendezvousMagic, 8) == 0, "tcp_broadcast: rank ",
                       rank, ": ", where,
                       " is not a trainkit rendezvous (another service on MASTER_PORT? "
                       "under torchrun's agent store use MASTER_PORT + 1)");
        TRAINKIT_CHECK(detail::recv_all(s.fd(), payload.data(), payload.size(), deadline),
                       "tcp_broadcast: rank ", rank, ": ", where, " closed before sending ",
                       payload.size(), " bytes");
        return;
      }
    }
    TRAINKIT_CHECK(RdvClock::now() < deadline, "tcp_broadcast: rank ", rank,
                   " could not reach rank 0 at ", where, " within ", seconds,
                   " s (last error: ", error,
                   "); check MASTER_ADDR/MASTER_PORT and that rank 0 is running");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
#else
  (void)host;
  (void)payload;
  (void)timeout;
  TRAINKIT_FAIL("tcp_broadcast: this platform has no POSIX sockets; use MPI to bootstrap");
#endif
}

#endif  // TRAINKIT_IMPL

}  // namespace dist
TRAINKIT_NAMESPACE_END
