// SPDX-License-Identifier: MIT
// trainkit/dist/rendezvous.hpp: `tcp_broadcast`, a tiny TCP rendezvous that hands a few bytes
// from rank 0 to every other rank: how NCCL's unique id reaches the ranks under torchrun or srun,
// where there is no MPI (rank 0 listens at MASTER_PORT, the others connect to MASTER_ADDR).
// Bounded by a timeout, with a magic header, the world size and a job key so that a stray
// connection or another job on the same port is an error naming the address, not a hang or
// another job's bytes. POSIX sockets; elsewhere it throws.
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

/// Longest job key of tcp_broadcast.
inline constexpr std::size_t kRendezvousMaxKey = 256;

#if TRAINKIT_DETAIL_HAS_SOCKETS

using RdvClock = std::chrono::steady_clock;

// A rank's hello to rank 0: "TKRDV" + protocol version 2, then rank (u32), world_size (u32),
// payload length (u64) and job key length (u32), big-endian, then the job key's bytes. Rank 0
// answers with the magic and the payload, or with kRendezvousRefusal, the length of a text (u32,
// at most kRendezvousMaxText) and the text: why it refused the group.
inline constexpr char kRendezvousMagic[8] = {'T', 'K', 'R', 'D', 'V', '0', '0', '2'};
inline constexpr char kRendezvousRefusal[8] = {'T', 'K', 'R', 'D', 'V', 'E', 'R', 'R'};
inline constexpr std::size_t kRendezvousHeader = 8 + 4 + 4 + 8 + 4;
/// Longest refusal text rank 0 sends.
inline constexpr std::size_t kRendezvousMaxText = 2048;

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

/// Waits for `events` on fd until the deadline; false on timeout, also when the fd is ready but
/// the deadline has passed: a loop that waits on a socket that keeps being ready (a stream of
/// junk connections or bytes) must still end at its deadline.
inline bool wait_fd(int fd, short events, RdvClock::time_point deadline) {
  for (;;) {
    if (RdvClock::now() >= deadline) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
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

/// Accepts a connection pending on the non-blocking `listener`. An invalid Socket with `error` 0
/// when there is none after all, or it was aborted or failed on the network (try again later);
/// with `error` = errno when accept cannot succeed now: out of descriptors (EMFILE, ENFILE) or
/// kernel memory (ENOBUFS, ENOMEM), or a broken listener. Such a connection stays queued and poll
/// keeps reporting it, so retrying would spin until the deadline: callers fail instead, with
/// accept_error_text.
inline Socket accept_connection(int listener, int& error) noexcept {
  error = 0;
  const int fd = ::accept(listener, nullptr, nullptr);
  if (fd >= 0) return Socket(fd);
  const int e = errno;
  if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM || e == EBADF || e == EINVAL ||
      e == ENOTSOCK || e == EFAULT)
    error = e;
  return Socket();
}

/// "cannot accept connections on port 29500: Too many open files (errno 24) (...)".
inline std::string accept_error_text(int port, int error) {
  return trainkit::detail::concat(
      "cannot accept connections on port ", port, ": ", errno_text(error),
      error == EMFILE || error == ENFILE
          ? " (out of file descriptors: raise the open-file limit, ulimit -n)"
          : "");
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
      const bool answered =
          wait_fd(s.fd(), POLLOUT, std::min(deadline, RdvClock::now() + std::chrono::seconds(2)));
      // An attempt at the deadline has no time left to wait, but a refusal that already came is
      // still a better last error than a timeout.
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0 || !answered) {
        error = err != 0 ? errno_text(err) : std::string("connect timed out");
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
/// == 1 returns at once. `job_key` (at most 256 bytes, any bytes; dist::init passes one from the
/// launcher's job id) names the job: every rank must pass the same, so that ranks of another job,
/// or of an earlier group, that reach the same port are refused instead of being handed this
/// job's bytes. Throws trainkit::Error naming host, port and rank when the port cannot be bound
/// or accept fails (out of file descriptors), nobody answers, a peer sends something else
/// (another job on the port?), ranks disagree on job key, world_size or payload length (rank 0
/// names the peer and what it expected, and tells that peer and those that already joined why;
/// they throw with its message), or `timeout` (positive, at most 10^7 s) passes.
TRAINKIT_INLINE void tcp_broadcast(std::string_view host, int port, int rank, int world_size,
                                   std::span<std::byte> payload, std::chrono::milliseconds timeout,
                                   std::string_view job_key = {});

#if TRAINKIT_IMPL

TRAINKIT_INLINE void tcp_broadcast(std::string_view host, int port, int rank, int world_size,
                                   std::span<std::byte> payload, std::chrono::milliseconds timeout,
                                   std::string_view job_key) {
  TRAINKIT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "tcp_broadcast: rank ", rank,
                 " is not in [0, ", world_size, ")");
  TRAINKIT_CHECK(port > 0 && port < 65536, "tcp_broadcast: port ", port, " is not in [1, 65535]");
  detail::check_timeout("tcp_broadcast", timeout);
  TRAINKIT_CHECK(job_key.size() <= detail::kRendezvousMaxKey, "tcp_broadcast: the job key has ",
                 job_key.size(), " bytes, at most ", detail::kRendezvousMaxKey, " are allowed");
  if (world_size == 1) return;
#if TRAINKIT_DETAIL_HAS_SOCKETS
  using detail::RdvClock;
  const auto deadline = RdvClock::now() + timeout;
  const std::string where = trainkit::detail::concat(host, ":", port);
  const double seconds = static_cast<double>(timeout.count()) / 1000.0;
  const std::string key_text =
      trainkit::detail::concat("'", ::trainkit::detail::printable_bytes(job_key), "'");

  if (rank == 0) {
    std::string error;
    detail::Socket listener = detail::listen_on(port, error);
    TRAINKIT_CHECK(listener.valid(), "tcp_broadcast: rank 0 cannot listen on port ", port, ": ",
                   error, " (is another job using it? set MASTER_PORT or TRAINKIT_RDZV_PORT)");
    std::vector<detail::Socket> peers(static_cast<std::size_t>(world_size));
    // Rank 0's verdict reaches the refused peer (in peers[0]) and every rank that already joined,
    // then rank 0 throws it.
    auto refuse = [&](const std::string& message) {
      const std::string full =
          trainkit::detail::concat("tcp_broadcast on port ", port, ": ", message);
      const std::size_t n = std::min(full.size(), detail::kRendezvousMaxText);
      unsigned char head[12];
      std::memcpy(head, detail::kRendezvousRefusal, 8);
      detail::put_u32(head + 8, static_cast<std::uint32_t>(n));
      // Half a second for all of them together, also when rank 0 refuses because its deadline
      // passed: the verdict must still go out, and a peer that does not read cannot hold it.
      const auto until = RdvClock::now() + std::chrono::milliseconds(500);
      for (const detail::Socket& s : peers)
        if (s.valid())
          (void)(detail::send_all(s.fd(), head, sizeof head, until) &&
                 detail::send_all(s.fd(), full.data(), n, until));
      TRAINKIT_FAIL(full);
    };
    int joined = 0;
    while (joined < world_size - 1) {
      if (!detail::wait_fd(listener.fd(), POLLIN, deadline))
        refuse(trainkit::detail::concat("rank 0 waited ", seconds, " s but only ", joined,
                                        " of the other ", world_size - 1, " ranks connected"));
      int accept_error = 0;
      detail::Socket s = detail::accept_connection(listener.fd(), accept_error);
      if (accept_error != 0) refuse(detail::accept_error_text(port, accept_error));
      if (!s.valid()) continue;
      // Non-blocking (an accepted socket does not inherit it from the listener): a blocking send
      // of the payload to a peer that stops reading would never return, whatever the deadline.
      detail::set_nonblocking(s.fd());
      unsigned char header[detail::kRendezvousHeader];
      const auto hello_deadline = std::min(deadline, RdvClock::now() + std::chrono::seconds(5));
      // A connection that does not speak our protocol (a port scanner, a health check) is
      // dropped; one that does but disagrees is an error.
      if (!detail::recv_all(s.fd(), header, 8, hello_deadline)) continue;
      if (std::memcmp(header, detail::kRendezvousMagic, 8) != 0) {
        if (std::memcmp(header, detail::kRendezvousMagic, 5) != 0) continue;
        peers[0] = std::move(s);  // so that it hears the verdict too
        refuse(trainkit::detail::concat(
            "a peer speaks rendezvous protocol '",
            ::trainkit::detail::printable_bytes(
                std::string_view(reinterpret_cast<const char*>(header), 8)),
            "', rank 0 speaks 'TKRDV002' (are all ranks the same trainkit build?)"));
      }
      if (!detail::recv_all(s.fd(), header + 8, sizeof header - 8, hello_deadline)) continue;
      const std::uint32_t peer_rank = detail::get_u32(header + 8);
      const std::uint32_t peer_size = detail::get_u32(header + 12);
      const std::uint64_t peer_len = detail::get_u64(header + 16);
      const std::uint32_t key_len = detail::get_u32(header + 24);
      peers[0] = std::move(s);  // until it is accepted: a refusal reaches it
      if (key_len > detail::kRendezvousMaxKey)
        refuse(trainkit::detail::concat("rank ", peer_rank, " sent a job key of ", key_len,
                                        " bytes (at most ", detail::kRendezvousMaxKey, ")"));
      std::string key(key_len, '\0');
      if (!detail::recv_all(peers[0].fd(), key.data(), key.size(), hello_deadline)) {
        peers[0].reset();
        continue;
      }
      if (key != job_key)
        refuse(trainkit::detail::concat(
            "rank ", peer_rank, " of ", peer_size, " belongs to job '",
            ::trainkit::detail::printable_bytes(key), "', rank 0 expects job ", key_text,
            " (ranks of two jobs, or of an earlier group, on one port: give each job its own "
            "MASTER_PORT or TRAINKIT_RDZV_PORT)"));
      if (peer_size != static_cast<std::uint32_t>(world_size) || peer_len != payload.size())
        refuse(trainkit::detail::concat("rank ", peer_rank, " expects ", peer_size, " ranks and ",
                                        peer_len, " bytes, rank 0 has ", world_size, " ranks and ",
                                        payload.size(),
                                        " bytes (two jobs on one port, or a wrong WORLD_SIZE?)"));
      if (peer_rank < 1 || peer_rank >= static_cast<std::uint32_t>(world_size))
        refuse(trainkit::detail::concat("a peer claims rank ", peer_rank, ", which is not in [1, ",
                                        world_size, ")"));
      if (peers[peer_rank].valid())
        refuse(trainkit::detail::concat(
            "rank ", peer_rank, " connected twice (two processes started with RANK=", peer_rank,
            ", or two jobs on one port)"));
      peers[peer_rank] = std::move(peers[0]);
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

  // The wait for rank 0's answer lasts a little longer than rank 0's own wait, so that its reason
  // for giving up (which rank is missing) arrives also at a rank that started before it.
  const auto answer_deadline = deadline + std::chrono::seconds(1);
  std::string error = "connection refused";
  for (;;) {
    detail::Socket s = detail::connect_once(std::string(host), port, deadline, error);
    if (s.valid()) {
      unsigned char header[detail::kRendezvousHeader];
      std::memcpy(header, detail::kRendezvousMagic, 8);
      detail::put_u32(header + 8, static_cast<std::uint32_t>(rank));
      detail::put_u32(header + 12, static_cast<std::uint32_t>(world_size));
      detail::put_u64(header + 16, payload.size());
      detail::put_u32(header + 24, static_cast<std::uint32_t>(job_key.size()));
      char magic[8];
      if (detail::send_all(s.fd(), header, sizeof header, deadline) &&
          detail::send_all(s.fd(), job_key.data(), job_key.size(), deadline)) {
        // Rank 0 answers once every rank joined; waiting for that is bounded by the deadline.
        TRAINKIT_CHECK(detail::recv_all(s.fd(), magic, 8, answer_deadline), "tcp_broadcast: rank ",
                       rank, " connected to ", where, " but got no answer within ", seconds,
                       " s (not every rank joined, or rank 0 failed: see its log)");
        if (std::memcmp(magic, detail::kRendezvousRefusal, 8) == 0) {
          unsigned char length[4];
          std::string text;
          if (detail::recv_all(s.fd(), length, 4, answer_deadline) &&
              detail::get_u32(length) <= detail::kRendezvousMaxText) {
            text.resize(detail::get_u32(length));
            if (!detail::recv_all(s.fd(), text.data(), text.size(), answer_deadline)) text.clear();
          }
          TRAINKIT_FAIL("tcp_broadcast: rank ", rank, " (job ", key_text, ", ", world_size,
                        " ranks): rank 0 at ", where, " refused the group: ",
                        text.empty() ? std::string("(no reason given)")
                                     : ::trainkit::detail::printable_bytes(text));
        }
        TRAINKIT_CHECK(std::memcmp(magic, detail::kRendezvousMagic, 8) == 0, "tcp_broadcast: rank ",
                       rank, ": ", where,
                       " is not a trainkit rendezvous (another service on MASTER_PORT? "
                       "under torchrun's agent store use MASTER_PORT + 1)");
        TRAINKIT_CHECK(detail::recv_all(s.fd(), payload.data(), payload.size(), answer_deadline),
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
  (void)job_key;
  TRAINKIT_FAIL("tcp_broadcast: this platform has no POSIX sockets; use MPI to bootstrap");
#endif
}

#endif  // TRAINKIT_IMPL

}  // namespace dist
TRAINKIT_NAMESPACE_END
