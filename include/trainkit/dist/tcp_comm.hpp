// SPDX-License-Identifier: MIT
// trainkit/dist/tcp_comm.hpp: TcpComm, a communicator for host memory between processes (or
// threads) over TCP: what CPU jobs started by torchrun, or by any launcher without MPI, reduce
// with. Rank 0 listens at MASTER_ADDR:port, collects every rank's address and hands out the
// table; the ranks then form a ring and run ThreadComm's algorithms over it (same segments, same
// summation order, hence the same bits). Every connect, read and write is bounded by a timeout.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/dist/host_reduce.hpp"
#include "trainkit/dist/rendezvous.hpp"
#include "trainkit/dist/thread_comm.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_DETAIL_HAS_SOCKETS
#include <arpa/inet.h>
#include <sys/uio.h>
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Options of a TcpComm (every rank of a group should pass the same).
struct TcpCommOptions {
  /// Bounds the bootstrap (connecting, waiting for the other ranks) and, during a collective,
  /// how long a rank may wait without any byte moving to or from its neighbours. Default:
  /// default_timeout() ($TRAINKIT_DIST_TIMEOUT or 300 s).
  std::chrono::milliseconds timeout = default_timeout();
  /// Pipelining granularity of the ring in bytes: the unit a rank sends on as soon as it has
  /// reduced it. Results do not depend on it (only the ring's segments fix the summation order).
  std::int64_t chunk_bytes = std::int64_t{256} << 10;
  /// The address the other ranks reach this rank at. Empty: the local address of this rank's
  /// connection to rank 0 (the interface that routes to MASTER_ADDR); rank 0: the master address.
  /// At most 1024 printable characters without blanks, like the master address:
  /// the constructor refuses any other.
  std::string announce_addr;
  /// Names the job (at most 256 bytes, any bytes, and at most 1024 together with announce_addr;
  /// every rank must pass the same): rank 0 refuses a rank whose key differs, naming both, so
  /// that ranks of another job (or of an earlier group) that reach the same master port do not
  /// join this group. dist::init sets it from the launcher's job id (see
  /// detail::rendezvous_job_key); empty by default.
  std::string job_key;
  /// Fault injection for tests: called on the progress thread before this rank sends unit `unit`
  /// of its collective number `op` (counted from 1); it may sleep (a stall) or throw (a crash).
  std::function<void(int rank, std::uint64_t op, std::int64_t unit)> fault_injection;
};

namespace detail {

// ---- the wire format ----------------------------------------------------------------------------
// Every message is a 40-byte frame, big-endian, optionally followed by a payload of `length`
// bytes:
//   0 "TKTC" | 4 version | 5 type | 6 kind | 7 op | 8 dtype | 9-11 zero | 12 a (u32) | 16 b (u32)
//   | 20 seq (u64) | 28 length (u64) | 36-39 zero

inline constexpr unsigned char kTcpMagic[4] = {'T', 'K', 'T', 'C'};
inline constexpr std::uint8_t kTcpVersion = 1;
inline constexpr std::size_t kTcpFrameBytes = 40;
/// Longest reason text of an abort or leave frame.
inline constexpr std::uint64_t kTcpMaxText = 4096;
/// Longest host name or address a rank may announce.
inline constexpr std::uint64_t kTcpMaxAddress = 1024;
/// Largest world size TcpComm accepts.
inline constexpr int kTcpMaxWorld = 65536;
/// Largest data frame (a ring unit) a peer may announce; the receiver also requires the exact
/// size it computed itself.
inline constexpr std::uint64_t kTcpMaxUnit = std::uint64_t{1} << 31;

/// What a frame is.
///  - kHello: rank -> rank 0 at bootstrap. a = rank, b = world size, seq = the rank's listening
///    port + (the length of its job key << 32), payload = its address, then its job key (at most
///    kTcpMaxAddress bytes together).
///  - kTable: rank 0 -> every rank. b = world size, seq = the group's random id, payload = every
///    rank's (port u32, address length u32, address) in rank order.
///  - kLink: a rank -> its right neighbour when the ring forms. a = rank, b = world size, seq =
///    the group's id.
///  - kHeader: the first frame of each collective, to the right neighbour. kind/op/dtype, a =
///    broadcast root, b = the sender's chunk_bytes, seq = collective number, length = element
///    count.
///  - kData: one ring unit. seq = collective number, a = unit number (low 32 bits), payload =
///    the unit's bytes.
///  - kAbort: the group failed; payload = the first failure's message. Sent both ways.
///  - kLeave: the sender's TcpComm was destroyed between collectives; seq = the number of
///    collectives it completed, payload = why.
enum class TcpFrameType : std::uint8_t {
  kHello = 1,
  kTable = 2,
  kLink = 3,
  kHeader = 4,
  kData = 5,
  kAbort = 6,
  kLeave = 7
};

/// A decoded frame (see TcpFrameType for what each field means per type).
struct TcpFrame {
  TcpFrameType type = TcpFrameType::kHeader;
  RingOp kind = RingOp::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kF32;
  std::uint32_t a = 0;
  std::uint32_t b = 0;
  std::uint64_t seq = 0;
  std::uint64_t length = 0;
};

/// One rank's entry of the bootstrap table.
struct TcpEndpoint {
  std::string host;
  int port = 0;
};

/// Writes `f` as 40 bytes at `out`.
inline void encode_tcp_frame(const TcpFrame& f, unsigned char* out) noexcept {
  std::memset(out, 0, kTcpFrameBytes);
  std::memcpy(out, kTcpMagic, 4);
  out[4] = kTcpVersion;
  out[5] = static_cast<unsigned char>(f.type);
  out[6] = static_cast<unsigned char>(f.kind);
  out[7] = static_cast<unsigned char>(f.op);
  out[8] = static_cast<unsigned char>(f.dtype);
  put_u32(out + 12, f.a);
  put_u32(out + 16, f.b);
  put_u64(out + 20, f.seq);
  put_u64(out + 28, f.length);
}

/// Decodes the frame in bytes[0, size) received from `from` ("rank 3", "127.0.0.1:29500").
/// Untrusted input: throws trainkit::Error naming `from` unless size == kTcpFrameBytes and the
/// magic, version, type, enums, zero fields and the type's length limit are all valid. A decoded
/// length never exceeds what the type allows (kTcpMaxText, kTcpMaxAddress, the table of b ranks,
/// kTcpMaxUnit), so callers may allocate it.
inline TcpFrame decode_tcp_frame(const unsigned char* bytes, std::size_t size,
                                 std::string_view from) {
  TRAINKIT_CHECK(size == kTcpFrameBytes, "TcpComm: ", from, " sent a truncated frame (", size,
                 " of ", kTcpFrameBytes, " bytes)");
  TRAINKIT_CHECK(std::memcmp(bytes, kTcpMagic, 4) == 0, "TcpComm: ", from,
                 " does not speak the TcpComm protocol (another service on the port?)");
  TRAINKIT_CHECK(bytes[4] == kTcpVersion, "TcpComm: ", from, " speaks TcpComm protocol version ",
                 static_cast<int>(bytes[4]), ", this build speaks version ",
                 static_cast<int>(kTcpVersion), " (are all ranks the same trainkit build?)");
  const unsigned type = bytes[5];
  TRAINKIT_CHECK(type >= 1 && type <= 7, "TcpComm: ", from, " sent a frame of unknown type ", type);
  TRAINKIT_CHECK(bytes[9] == 0 && bytes[10] == 0 && bytes[11] == 0 && bytes[36] == 0 &&
                     bytes[37] == 0 && bytes[38] == 0 && bytes[39] == 0,
                 "TcpComm: ", from, " sent a frame whose reserved bytes are not zero");
  TRAINKIT_CHECK(bytes[6] <= static_cast<unsigned>(RingOp::kBarrier), "TcpComm: ", from,
                 " sent a frame with an unknown collective kind ", static_cast<int>(bytes[6]));
  TRAINKIT_CHECK(bytes[7] <= static_cast<unsigned>(ReduceOp::kMin), "TcpComm: ", from,
                 " sent a frame with an unknown reduction ", static_cast<int>(bytes[7]));
  TRAINKIT_CHECK(bytes[8] <= static_cast<unsigned>(DType::kBool), "TcpComm: ", from,
                 " sent a frame with an unknown dtype ", static_cast<int>(bytes[8]));
  TcpFrame f;
  f.type = static_cast<TcpFrameType>(type);
  f.kind = static_cast<RingOp>(bytes[6]);
  f.op = static_cast<ReduceOp>(bytes[7]);
  f.dtype = static_cast<DType>(bytes[8]);
  f.a = get_u32(bytes + 12);
  f.b = get_u32(bytes + 16);
  f.seq = get_u64(bytes + 20);
  f.length = get_u64(bytes + 28);
  std::uint64_t limit = 0;
  switch (f.type) {
    case TcpFrameType::kHello: limit = kTcpMaxAddress; break;
    case TcpFrameType::kTable:
      TRAINKIT_CHECK(f.b >= 1 && f.b <= static_cast<std::uint32_t>(kTcpMaxWorld), "TcpComm: ", from,
                     " sent a table for ", f.b, " ranks (at most ", kTcpMaxWorld, ")");
      limit = std::uint64_t{f.b} * (8 + kTcpMaxAddress);
      break;
    case TcpFrameType::kLink: limit = 0; break;
    case TcpFrameType::kHeader: limit = std::uint64_t{1} << 62; break;
    case TcpFrameType::kData: limit = kTcpMaxUnit; break;
    case TcpFrameType::kAbort:
    case TcpFrameType::kLeave: limit = kTcpMaxText; break;
  }
  TRAINKIT_CHECK(f.length <= limit, "TcpComm: ", from, " announced ", f.length,
                 " bytes in a frame of type ", type, " (at most ", limit, ")");
  return f;
}

/// True for what a rank may announce as its address (and rank 0 may list in the table): 1 to
/// kTcpMaxAddress printable ASCII characters without blanks.
inline bool is_tcp_address(std::string_view host) noexcept {
  if (host.empty() || host.size() > kTcpMaxAddress) return false;
  for (const char ch : host)
    if (!(ch > ' ' && ch < 127)) return false;
  return true;
}

/// The payload of a kTable frame for `table`.
inline std::vector<unsigned char> encode_tcp_table(const std::vector<TcpEndpoint>& table) {
  std::vector<unsigned char> out;
  for (const TcpEndpoint& e : table) {
    const std::size_t at = out.size();
    out.resize(at + 8 + e.host.size());
    put_u32(out.data() + at, static_cast<std::uint32_t>(e.port));
    put_u32(out.data() + at + 4, static_cast<std::uint32_t>(e.host.size()));
    std::memcpy(out.data() + at + 8, e.host.data(), e.host.size());
  }
  return out;
}

/// Decodes a kTable payload of `world_size` entries received from `from`. Untrusted input:
/// throws trainkit::Error unless every entry has a port in [1, 65535] and a non-empty printable
/// address of at most kTcpMaxAddress bytes, and the entries fill the payload exactly.
inline std::vector<TcpEndpoint> decode_tcp_table(std::span<const unsigned char> bytes,
                                                 int world_size, std::string_view from) {
  TRAINKIT_CHECK(world_size >= 1 && world_size <= kTcpMaxWorld, "TcpComm: a table for ", world_size,
                 " ranks");
  std::vector<TcpEndpoint> table;
  std::size_t at = 0;
  for (int r = 0; r < world_size; ++r) {
    TRAINKIT_CHECK(bytes.size() - at >= 8, "TcpComm: ", from,
                   " sent a truncated address table (entry of rank ", r, ")");
    const std::uint32_t port = get_u32(bytes.data() + at);
    const std::uint32_t len = get_u32(bytes.data() + at + 4);
    at += 8;
    TRAINKIT_CHECK(port >= 1 && port <= 65535, "TcpComm: ", from, " lists port ", port,
                   " for rank ", r);
    TRAINKIT_CHECK(len >= 1 && len <= kTcpMaxAddress && len <= bytes.size() - at, "TcpComm: ", from,
                   " lists an address of ", len, " bytes for rank ", r, " (", bytes.size() - at,
                   " left)");
    std::string host(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
    for (const char ch : host)
      TRAINKIT_CHECK(ch > ' ' && ch < 127, "TcpComm: ", from,
                     " lists an address with unprintable characters for rank ", r);
    table.push_back(TcpEndpoint{std::move(host), static_cast<int>(port)});
  }
  TRAINKIT_CHECK(at == bytes.size(), "TcpComm: ", from, " sent ", bytes.size() - at,
                 " bytes after the address table");
  return table;
}

/// "all_gather(100 x F32)", "broadcast(7 x I64, root 2)", "all_reduce(1 x F16, avg)", "barrier".
inline std::string describe_tcp_call(RingOp kind, ReduceOp op, DType dtype, std::int64_t count,
                                     int root) {
  std::string s = ring_op_name(kind);
  if (kind == RingOp::kBarrier) return s;
  s += trainkit::detail::concat("(", count, " x ", dtype_name(dtype));
  if (kind == RingOp::kBroadcast) s += trainkit::detail::concat(", root ", root);
  if (kind == RingOp::kAllReduce || kind == RingOp::kReduceScatter)
    s += trainkit::detail::concat(", ", reduce_op_name(op));
  return s + ")";
}

}  // namespace detail

#if TRAINKIT_DETAIL_HAS_SOCKETS

/// A communicator over TCP between the processes (or threads) of a job: rank `rank` of
/// `world_size`, host buffers only. Collectives run on the communicator's own progress thread, in
/// call order, so they overlap with the caller's work; Work::wait() joins them.
///
/// Bootstrap (the constructor): every rank opens a listening socket on an ephemeral port; rank 0
/// also listens at master_port and waits for the other ranks to say hello (rank, world size,
/// address, port); it checks them (a rank out of range, one that appears twice, or world sizes
/// that disagree are errors naming the ranks, which every rank reports; a hello in another
/// protocol version is one naming both versions and the peer's address) and sends everyone the
/// address table. Each rank then connects to its right neighbour (rank + 1) and accepts its left
/// one. Refused connections and a busy master port are retried until the timeout; a rank that
/// never arrives makes rank 0 fail naming it, and the others with rank 0's message.
///
/// Collectives: the ring algorithms of ThreadComm (detail::ring_chain_start): all_reduce is a
/// reduce-scatter + all-gather over world_size segments, streamed in units of chunk_bytes, and
/// each element is reduced in the same order as by ThreadComm, so the results are bitwise equal.
/// Each collective starts with a header (kind, dtype, count, op, root) to the right neighbour,
/// who compares it with its own call: a mismatch fails the group naming both calls.
///
/// Faults: a neighbour that closes its connection (its process died, its TcpComm was destroyed
/// mid-collective), sends garbage, or moves no byte for the timeout makes this rank fail; the
/// failing rank tells both neighbours why (or closes the connections), so the failure travels
/// around the ring and every rank's Work::wait() throws a trainkit::Error with the first failure's
/// message. After a failure every collective fails at once. Buffers must stay valid until their
/// Work completed, also when it failed.
class TcpComm final : public Comm {
 public:
  /// Joins the group of `world_size` ranks whose rank 0 listens at master_addr:master_port
  /// (rank 0 binds the port on every local interface). Blocks until the ring is formed. Throws
  /// trainkit::Error for bad arguments (among them a timeout outside (0, 10^7 s], an address
  /// with blanks or control bytes), or when the group cannot be formed within options.timeout
  /// (see the class comment). world_size == 1 needs no address and no socket.
  TRAINKIT_INLINE TcpComm(std::string master_addr, int master_port, int rank, int world_size,
                          TcpCommOptions options = {});
  TcpComm(const TcpComm&) = delete;
  TcpComm& operator=(const TcpComm&) = delete;

  /// Leaves the group. With collectives still queued or running they fail, and the neighbours
  /// are told (their collectives fail naming this rank); between collectives the neighbours are
  /// told this rank left, so their next collective fails naming it.
  TRAINKIT_INLINE ~TcpComm() override;

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  std::string_view backend() const noexcept override { return "TcpComm"; }
  Space space() const noexcept override { return Space::kHost; }
  const TcpCommOptions& options() const noexcept { return options_; }
  /// The port of this rank's ring listener (0 for a group of one).
  int listen_port() const noexcept { return listen_port_; }
  /// True once a collective failed: every later one fails at once.
  bool broken() const noexcept { return broken_.load(std::memory_order_acquire); }

  TRAINKIT_INLINE Work all_reduce(Buffer buf, ReduceOp op) override;
  TRAINKIT_INLINE Work broadcast(Buffer buf, int root) override;
  TRAINKIT_INLINE Work all_gather(Buffer send, Buffer recv) override;
  TRAINKIT_INLINE Work reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override;
  Work barrier() override {
    detail::RingDesc d;
    d.kind = detail::RingOp::kBarrier;
    return enqueue(d);
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Task {
    detail::RingDesc desc;
    std::shared_ptr<detail::HostWork> work;
  };

  // One collective as this rank runs it: `steps` ring steps of `chunks` units each.
  struct Coll {
    detail::RingDesc d;
    std::uint64_t seq = 0;
    std::int64_t es = 1;
    std::int64_t ce = 1;
    std::int64_t chunks = 1;
    std::int64_t steps = 0;
    int pos = 0;  // broadcast: (rank - root) mod world_size
  };

  // The bytes of one unit: what is sent, or where received bytes go (combine: dst = a op bytes).
  struct Piece {
    char* dst = nullptr;
    const char* a = nullptr;
    std::int64_t bytes = 0;
    bool combine = false;
    int divisor = 1;
  };

  // A TcpComm collective failed; `root` is the first failure's message (sent to the neighbours).
  struct Failure {
    std::string message;
    std::string root;
  };

  TRAINKIT_INLINE Work enqueue(const detail::RingDesc& d);
  TRAINKIT_INLINE void worker_loop();
  TRAINKIT_INLINE void execute(Task& task);
  TRAINKIT_INLINE void run(const detail::RingDesc& d, std::uint64_t seq);
  TRAINKIT_INLINE Coll plan(const detail::RingDesc& d, std::uint64_t seq) const;
  TRAINKIT_INLINE bool has_send(const Coll& c, std::int64_t g) const;
  TRAINKIT_INLINE bool has_recv(const Coll& c, std::int64_t g) const;
  TRAINKIT_INLINE Piece send_piece(const Coll& c, std::int64_t g, std::int64_t k) const;
  TRAINKIT_INLINE Piece recv_piece(const Coll& c, std::int64_t g, std::int64_t k) const;
  TRAINKIT_INLINE void bootstrap(const std::string& master_addr, int master_port);
  TRAINKIT_INLINE void break_group(const std::string& root) noexcept;
  TRAINKIT_INLINE void send_goodbye(detail::TcpFrameType type, const std::string& text,
                                    std::uint64_t seq) noexcept;

  std::string what(const Coll& c) const {
    std::string s = trainkit::detail::concat(detail::ring_op_name(c.d.kind), " #", c.seq);
    if (c.d.kind != detail::RingOp::kBarrier)
      s += trainkit::detail::concat(" (", c.d.count, " x ", dtype_name(c.d.dtype), ")");
    return s;
  }
  // Throws this rank's failure: `message` is what went wrong here (it becomes the root cause).
  [[noreturn]] void fail(const std::string& message) const {
    const std::string full = trainkit::detail::concat("TcpComm rank ", rank_, ": ", message);
    throw Failure{full, full};
  }

  int rank_;
  int world_size_;
  TcpCommOptions options_;
  int listen_port_ = 0;
  int left_ = 0;
  int right_ = 0;
  detail::Socket left_sock_;    // from the left neighbour: headers and data in, aborts out
  detail::Socket right_sock_;   // to the right neighbour: headers and data out, aborts in
  bool right_partial_ = false;  // a frame to the right is half written (no abort frame fits)
  bool right_gone_ = false;     // the right neighbour closed or left (progress thread only)
  std::string right_gone_why_;
  // The right neighbour's half-read abort or leave frame (it may arrive between collectives).
  unsigned char rev_head_[detail::kTcpFrameBytes] = {};
  std::size_t rev_done_ = 0;
  bool rev_in_text_ = false;
  std::string rev_text_;
  detail::TcpFrame rev_frame_;
  std::vector<char> staging_;
  std::vector<char> scratch_;
  std::uint64_t seq_ = 0;  // collectives started (progress thread only)

  std::atomic<bool> broken_{false};
  std::string broken_reason_;  // the first failure (progress thread, then read-only)
  std::atomic<bool> stop_now_{false};

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  std::uint64_t queued_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

namespace detail {

/// The numeric address in `addr` ("" when it is neither IPv4 nor IPv6). An IPv4 peer seen
/// through a dual-stack socket ("::ffff:10.0.0.7") is written as IPv4 ("10.0.0.7").
inline std::string numeric_address(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  int family = addr.ss_family;
  const void* where = nullptr;
  if (family == AF_INET) {
    where = &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr;
  } else if (family == AF_INET6) {
    const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    where = &a6;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      family = AF_INET;
      where = a6.s6_addr + 12;
    }
  }
  if (where == nullptr || ::inet_ntop(family, where, text, sizeof text) == nullptr) return {};
  return text;
}

/// The numeric address of the local end of a connected socket ("" when unknown).
inline std::string local_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  return numeric_address(addr);
}

/// The numeric address of the remote end of a connected socket ("" when unknown).
inline std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  return numeric_address(addr);
}

/// The port a bound socket listens on (0 when unknown).
inline int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

/// Sends a frame and its payload before the deadline.
inline bool send_tcp_frame(int fd, const TcpFrame& f, const void* payload,
                           RdvClock::time_point deadline) {
  unsigned char head[kTcpFrameBytes];
  encode_tcp_frame(f, head);
  return send_all(fd, head, sizeof head, deadline) &&
         (f.length == 0 || send_all(fd, payload, static_cast<std::size_t>(f.length), deadline));
}

inline void set_nodelay(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Reads and drops what has arrived on a non-blocking socket (before closing it, so that the
/// close does not reset the connection and discard what the peer has not read yet).
inline void drain(int fd) noexcept {
  char sink[4096];
  for (int i = 0; i < 4096; ++i)
    if (::recv(fd, sink, sizeof sink, 0) <= 0) return;
}

}  // namespace detail

#if TRAINKIT_IMPL

TRAINKIT_INLINE TcpComm::TcpComm(std::string master_addr, int master_port, int rank, int world_size,
                                 TcpCommOptions options)
    : rank_(rank), world_size_(world_size), options_(std::move(options)) {
  TRAINKIT_CHECK(world_size >= 1 && world_size <= detail::kTcpMaxWorld,
                 "TcpComm: world_size must be in [1, ", detail::kTcpMaxWorld, "], got ",
                 world_size);
  TRAINKIT_CHECK(rank >= 0 && rank < world_size, "TcpComm: rank ", rank, " is not in [0, ",
                 world_size, ")");
  TRAINKIT_CHECK(options_.chunk_bytes >= 1 &&
                     static_cast<std::uint64_t>(options_.chunk_bytes) <= detail::kTcpMaxUnit,
                 "TcpComm: chunk_bytes must be in [1, 2^31], got ", options_.chunk_bytes);
  detail::check_timeout("TcpComm", options_.timeout);
  TRAINKIT_CHECK(options_.announce_addr.size() <= detail::kTcpMaxAddress,
                 "TcpComm: announce_addr is longer than ", detail::kTcpMaxAddress, " bytes");
  TRAINKIT_CHECK(options_.job_key.size() <= detail::kRendezvousMaxKey, "TcpComm: the job key has ",
                 options_.job_key.size(), " bytes, at most ", detail::kRendezvousMaxKey,
                 " are allowed");
  // The hello carries both in at most kTcpMaxAddress bytes (a local address has at most 45).
  TRAINKIT_CHECK(options_.announce_addr.size() + options_.job_key.size() <= detail::kTcpMaxAddress,
                 "TcpComm: announce_addr and job_key have ",
                 options_.announce_addr.size() + options_.job_key.size(),
                 " bytes together, at most ", detail::kTcpMaxAddress, " are allowed");
  left_ = (rank + world_size - 1) % world_size;
  right_ = (rank + 1) % world_size;
  if (world_size > 1) {
    TRAINKIT_CHECK(master_port >= 1 && master_port <= 65535, "TcpComm rank ", rank,
                   ": the master port ", master_port, " is not in [1, 65535]");
    TRAINKIT_CHECK(!master_addr.empty(), "TcpComm rank ", rank,
                   ": no master address (MASTER_ADDR) to meet rank 0 at");
    // Checked here, where the mistake is made: a rank 0 that lists an address no rank can use
    // makes the others fail naming rank 0, while rank 0 itself waits for the ring until its
    // timeout.
    TRAINKIT_CHECK(detail::is_tcp_address(master_addr), "TcpComm rank ", rank,
                   ": the master address (MASTER_ADDR) '",
                   ::trainkit::detail::printable_bytes(master_addr),
                   "' is not a host name or address (1 to ", detail::kTcpMaxAddress,
                   " printable characters, no blanks)");
    TRAINKIT_CHECK(options_.announce_addr.empty() || detail::is_tcp_address(options_.announce_addr),
                   "TcpComm rank ", rank, ": TcpCommOptions::announce_addr '",
                   ::trainkit::detail::printable_bytes(options_.announce_addr),
                   "' is not a host name or address (1 to ", detail::kTcpMaxAddress,
                   " printable characters, no blanks)");
    try {
      bootstrap(master_addr, master_port);
    } catch (const Failure& f) {
      TRAINKIT_FAIL(f.message);
    }
  }
  worker_ = std::thread([this] { worker_loop(); });
}

TRAINKIT_INLINE void TcpComm::bootstrap(const std::string& master_addr, int master_port) {
  using detail::RdvClock;
  const auto start = RdvClock::now();
  const auto deadline = start + options_.timeout;
  const std::string seconds = detail::format_seconds(options_.timeout);
  const std::string master = trainkit::detail::concat(master_addr, ":", master_port);
  const int n = world_size_;
  std::string error;

  detail::Socket ring_listener = detail::listen_on(0, error);
  if (!ring_listener.valid())
    fail(trainkit::detail::concat("cannot open a listening socket: ", error));
  listen_port_ = detail::bound_port(ring_listener.fd());
  if (listen_port_ == 0)
    fail(trainkit::detail::concat("cannot read the port of this rank's listening socket: ",
                                  detail::errno_text(errno)));

  std::vector<detail::TcpEndpoint> table;
  std::uint64_t group_id = 0;

  if (rank_ == 0) {
    detail::Socket listener;
    for (;;) {  // the port may still be held by a job that just ended: retry until the deadline
      listener = detail::listen_on(master_port, error);
      if (listener.valid()) break;
      if (RdvClock::now() >= deadline)
        fail(trainkit::detail::concat("cannot listen on port ", master_port, " within ", seconds,
                                      ": ", error,
                                      " (is another job using it? set MASTER_PORT or "
                                      "TRAINKIT_RDZV_PORT)"));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::random_device rd;
    group_id = (std::uint64_t{rd()} << 32) ^ rd() ^
               static_cast<std::uint64_t>(start.time_since_epoch().count());
    table.resize(static_cast<std::size_t>(n));
    table[0] = detail::TcpEndpoint{
        options_.announce_addr.empty() ? master_addr : options_.announce_addr, listen_port_};
    std::vector<detail::Socket> peers(static_cast<std::size_t>(n));
    // Rank 0's verdict reaches every rank that already said hello, then rank 0 throws it.
    auto refuse = [&](const std::string& message) {
      const std::string full = trainkit::detail::concat("TcpComm rank 0: ", message);
      detail::TcpFrame f;
      f.type = detail::TcpFrameType::kAbort;
      f.length = std::min<std::uint64_t>(full.size(), detail::kTcpMaxText);
      const auto until = RdvClock::now() + std::chrono::milliseconds(500);
      for (const detail::Socket& s : peers)
        if (s.valid()) (void)detail::send_tcp_frame(s.fd(), f, full.data(), until);
      throw Failure{full, full};
    };
    int joined = 0;
    while (joined < n - 1) {
      if (!detail::wait_fd(listener.fd(), POLLIN, deadline)) {
        std::string missing;
        int listed = 0;
        for (int r = 1; r < n; ++r) {
          if (peers[static_cast<std::size_t>(r)].valid()) continue;
          if (listed == 16) {
            missing += ", ...";
            break;
          }
          missing += trainkit::detail::concat(listed == 0 ? "" : ", ", r);
          ++listed;
        }
        refuse(trainkit::detail::concat(
            "waited ", seconds, " on port ", master_port, " but ", n - 1 - joined, " of the ",
            n - 1, " other ranks never connected (missing: rank ", missing, ")"));
      }
      int accept_error = 0;
      detail::Socket s = detail::accept_connection(listener.fd(), accept_error);
      if (accept_error != 0) refuse(detail::accept_error_text(master_port, accept_error));
      if (!s.valid()) continue;
      detail::set_nonblocking(s.fd());
      detail::set_nodelay(s.fd());
      unsigned char head[detail::kTcpFrameBytes];
      const auto hello_deadline = std::min(deadline, RdvClock::now() + std::chrono::seconds(5));
      // A connection that does not speak the protocol (a port scanner, a health check) is
      // dropped; one that does but disagrees is an error. The magic and version are read first,
      // since a hello of another version may be shorter than ours.
      if (!detail::recv_all(s.fd(), head, 5, hello_deadline)) continue;
      if (std::memcmp(head, detail::kTcpMagic, 4) == 0 && head[4] != detail::kTcpVersion) {
        // A rank of another trainkit build: dropping it would leave it retrying and rank 0
        // waiting for it until their timeouts. It hears the verdict in this build's frame, or at
        // least fails at once on this build's version.
        const std::string address = detail::peer_address(s.fd());
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat(
            "a peer", address.empty() ? std::string() : " at " + address,
            " speaks TcpComm protocol version ", static_cast<int>(head[4]),
            ", rank 0 speaks version ", static_cast<int>(detail::kTcpVersion),
            " (are all ranks the same trainkit build?)"));
      }
      if (!detail::recv_all(s.fd(), head + 5, sizeof head - 5, hello_deadline)) continue;
      detail::TcpFrame f;
      try {
        f = detail::decode_tcp_frame(head, sizeof head, "a peer");
      } catch (const Error&) {
        continue;
      }
      if (f.type != detail::TcpFrameType::kHello) continue;
      std::string host(static_cast<std::size_t>(f.length), '\0');
      if (!detail::recv_all(s.fd(), host.data(), host.size(), hello_deadline)) continue;
      const auto peer = static_cast<std::int64_t>(f.a);
      const std::uint64_t key_length = f.seq >> 32;
      if (key_length > std::min<std::uint64_t>(f.length, detail::kRendezvousMaxKey)) {
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat("rank ", peer, " sent a hello with a job key of ",
                                        key_length, " bytes in ", f.length, " (at most ",
                                        detail::kRendezvousMaxKey, ")"));
      }
      const std::string key = host.substr(host.size() - static_cast<std::size_t>(key_length));
      host.resize(host.size() - static_cast<std::size_t>(key_length));
      if (key != options_.job_key) {
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat(
            "rank ", peer, " of ", f.b, " belongs to job '",
            ::trainkit::detail::printable_bytes(key), "', rank 0 expects job '",
            ::trainkit::detail::printable_bytes(options_.job_key),
            "' (ranks of two jobs, or of an earlier group, on one port: give each job its own "
            "MASTER_PORT or TRAINKIT_RDZV_PORT)"));
      }
      if (f.b != static_cast<std::uint32_t>(n)) {
        peers[0] = std::move(s);  // so that it hears the verdict too
        refuse(trainkit::detail::concat("rank ", peer, " was started for a world of ", f.b,
                                        " ranks, rank 0 for ", n,
                                        " (ranks of two jobs on one port, or a wrong WORLD_SIZE)"));
      }
      if (peer < 1 || peer >= n) {
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat("a peer claims rank ", peer, ", which is not in [1, ", n,
                                        ")"));
      }
      if (peers[static_cast<std::size_t>(peer)].valid()) {
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat("rank ", peer,
                                        " connected twice (two processes started with RANK=", peer,
                                        ", or two jobs on one port)"));
      }
      if (host.empty()) host = detail::peer_address(s.fd());  // as rank 0 sees the peer
      const auto port = static_cast<std::int64_t>(f.seq & 0xffffffffU);
      if (port < 1 || port > 65535 || !detail::is_tcp_address(host)) {
        peers[0] = std::move(s);
        refuse(trainkit::detail::concat("rank ", peer, " announced an unusable address '",
                                        ::trainkit::detail::printable_bytes(host), "' port ", port,
                                        " (an address is 1 to ", detail::kTcpMaxAddress,
                                        " printable characters, no blanks)"));
      }
      table[static_cast<std::size_t>(peer)] =
          detail::TcpEndpoint{std::move(host), static_cast<int>(port)};
      peers[static_cast<std::size_t>(peer)] = std::move(s);
      ++joined;
    }
    const std::vector<unsigned char> payload = detail::encode_tcp_table(table);
    detail::TcpFrame f;
    f.type = detail::TcpFrameType::kTable;
    f.b = static_cast<std::uint32_t>(n);
    f.seq = group_id;
    f.length = payload.size();
    for (int r = 1; r < n; ++r)
      if (!detail::send_tcp_frame(peers[static_cast<std::size_t>(r)].fd(), f, payload.data(),
                                  deadline))
        fail(trainkit::detail::concat("could not send the address table to rank ", r,
                                      " (it closed its connection: did it fail?)"));
  } else {
    // Connect (retrying while rank 0 is not up, and when a connection is closed before any
    // answer: the port's previous owner), say hello, wait for the table. The wait lasts a little
    // longer than rank 0's, so that rank 0's verdict (which rank is missing) arrives.
    const auto answer_deadline = deadline + std::chrono::seconds(1);
    const std::string from = trainkit::detail::concat("rank 0 at ", master);
    detail::Socket s;
    detail::TcpFrame f;
    unsigned char head[detail::kTcpFrameBytes];
    error = "connection refused";
    for (;;) {
      s = detail::connect_once(master_addr, master_port, deadline, error);
      if (s.valid()) {
        std::string host = options_.announce_addr;
        if (host.empty()) host = detail::local_address(s.fd());
        detail::TcpFrame hello;
        hello.type = detail::TcpFrameType::kHello;
        hello.a = static_cast<std::uint32_t>(rank_);
        hello.b = static_cast<std::uint32_t>(n);
        hello.seq = static_cast<std::uint64_t>(listen_port_) |
                    (static_cast<std::uint64_t>(options_.job_key.size()) << 32);
        host += options_.job_key;
        hello.length = host.size();
        if (detail::send_tcp_frame(s.fd(), hello, host.data(), deadline) &&
            detail::recv_all(s.fd(), head, sizeof head, answer_deadline))
          break;
        if (RdvClock::now() >= answer_deadline)
          fail(trainkit::detail::concat("connected to rank 0 at ", master,
                                        " but got no answer within ", seconds,
                                        " (not every rank joined, or rank 0 failed: see its log)"));
        error = "the connection was closed before any answer";
      }
      if (RdvClock::now() >= deadline)
        fail(trainkit::detail::concat("could not reach rank 0 at ", master, " within ", seconds,
                                      " (last error: ", error,
                                      "); check MASTER_ADDR/MASTER_PORT and that rank 0 runs"));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    f = detail::decode_tcp_frame(head, sizeof head, from);
    if (f.type == detail::TcpFrameType::kAbort) {
      std::string text(static_cast<std::size_t>(f.length), '\0');
      // A reason cut short would show as zero bytes where the rest should be: say so instead.
      if (!detail::recv_all(s.fd(), text.data(), text.size(), answer_deadline))
        text = "(no reason: rank 0 closed the connection before its whole message came)";
      const std::string full = trainkit::detail::concat(
          "TcpComm rank ", rank_,
          ": rank 0 refused the group: ", ::trainkit::detail::printable_bytes(text));
      throw Failure{full, text};
    }
    if (f.type != detail::TcpFrameType::kTable || f.b != static_cast<std::uint32_t>(n))
      fail(trainkit::detail::concat(from, " answered with a frame of type ",
                                    static_cast<int>(f.type), " for ", f.b,
                                    " ranks instead of the address table of ", n));
    std::vector<unsigned char> payload(static_cast<std::size_t>(f.length));
    if (!detail::recv_all(s.fd(), payload.data(), payload.size(), answer_deadline))
      fail(trainkit::detail::concat(from, " closed before the whole table came"));
    table = detail::decode_tcp_table(payload, n, from);
    group_id = f.seq;
  }

  // The ring: connect to the right neighbour (its listener queues us even before it accepts),
  // then accept the left one.
  const detail::TcpEndpoint& to = table[static_cast<std::size_t>(right_)];
  error = "connection refused";
  for (;;) {
    right_sock_ = detail::connect_once(to.host, to.port, deadline, error);
    if (right_sock_.valid()) break;
    if (RdvClock::now() >= deadline)
      fail(trainkit::detail::concat("could not connect to rank ", right_, " at ", to.host, ":",
                                    to.port, " within ", seconds, " (last error: ", error, ")"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  detail::TcpFrame link;
  link.type = detail::TcpFrameType::kLink;
  link.a = static_cast<std::uint32_t>(rank_);
  link.b = static_cast<std::uint32_t>(n);
  link.seq = group_id;
  if (!detail::send_tcp_frame(right_sock_.fd(), link, nullptr, deadline))
    fail(trainkit::detail::concat("rank ", right_, " at ", to.host, ":", to.port,
                                  " closed the connection of the ring at once"));
  while (!left_sock_.valid()) {
    if (!detail::wait_fd(ring_listener.fd(), POLLIN, deadline))
      fail(trainkit::detail::concat("rank ", left_, " did not connect within ", seconds,
                                    " to form the ring (it failed or stalled after the "
                                    "bootstrap: see its log)"));
    int accept_error = 0;
    detail::Socket s = detail::accept_connection(ring_listener.fd(), accept_error);
    if (accept_error != 0) fail(detail::accept_error_text(listen_port_, accept_error));
    if (!s.valid()) continue;
    detail::set_nonblocking(s.fd());
    detail::set_nodelay(s.fd());
    unsigned char head[detail::kTcpFrameBytes];
    if (!detail::recv_all(s.fd(), head, sizeof head,
                          std::min(deadline, RdvClock::now() + std::chrono::seconds(5))))
      continue;
    detail::TcpFrame f;
    try {
      f = detail::decode_tcp_frame(head, sizeof head, "a peer");
    } catch (const Error&) {
      continue;
    }
    if (f.type != detail::TcpFrameType::kLink || f.seq != group_id) continue;  // not our group
    if (f.a != static_cast<std::uint32_t>(left_))
      fail(trainkit::detail::concat("rank ", f.a,
                                    " connected as the left neighbour, expected rank ", left_));
    left_sock_ = std::move(s);
  }
}

TRAINKIT_INLINE TcpComm::~TcpComm() {
  bool in_flight = false;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    in_flight = busy_ || !queue_.empty();
    stop_ = true;
  }
  if (in_flight) stop_now_.store(true, std::memory_order_release);
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (world_size_ > 1 && !broken_.load(std::memory_order_acquire))
    send_goodbye(detail::TcpFrameType::kLeave,
                 trainkit::detail::concat("rank ", rank_,
                                          " left the group (its TcpComm was destroyed) after ",
                                          seq_, " collectives"),
                 seq_);
  if (left_sock_.valid()) detail::drain(left_sock_.fd());
  if (right_sock_.valid()) detail::drain(right_sock_.fd());
}

TRAINKIT_INLINE void TcpComm::send_goodbye(detail::TcpFrameType type, const std::string& text,
                                           std::uint64_t seq) noexcept {
  detail::TcpFrame f;
  f.type = type;
  f.seq = seq;
  f.length = std::min<std::uint64_t>(text.size(), detail::kTcpMaxText);
  const auto until = detail::RdvClock::now() + std::chrono::milliseconds(200);
  // Half-close after the frame (no RST that could discard it); the descriptors close later.
  if (right_sock_.valid()) {
    if (!right_partial_) (void)detail::send_tcp_frame(right_sock_.fd(), f, text.data(), until);
    (void)::shutdown(right_sock_.fd(), SHUT_WR);
  }
  if (left_sock_.valid()) {
    (void)detail::send_tcp_frame(left_sock_.fd(), f, text.data(), until);
    (void)::shutdown(left_sock_.fd(), SHUT_WR);
  }
}

TRAINKIT_INLINE void TcpComm::break_group(const std::string& root) noexcept {
  if (broken_.load(std::memory_order_relaxed)) return;
  broken_reason_ = root;
  broken_.store(true, std::memory_order_release);
  if (world_size_ > 1) send_goodbye(detail::TcpFrameType::kAbort, root, seq_);
}

TRAINKIT_INLINE Work TcpComm::all_reduce(Buffer buf, ReduceOp op) {
  return enqueue(detail::all_reduce_desc(*this, buf, op));
}

TRAINKIT_INLINE Work TcpComm::broadcast(Buffer buf, int root) {
  return enqueue(detail::broadcast_desc(*this, buf, root));
}

TRAINKIT_INLINE Work TcpComm::all_gather(Buffer send, Buffer recv) {
  return enqueue(detail::all_gather_desc(*this, send, recv));
}

TRAINKIT_INLINE Work TcpComm::reduce_scatter(Buffer send, Buffer recv, ReduceOp op) {
  return enqueue(detail::reduce_scatter_desc(*this, send, recv, op));
}

TRAINKIT_INLINE Work TcpComm::enqueue(const detail::RingDesc& d) {
  auto work = std::make_shared<detail::HostWork>();
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(Task{d, work});
    ++queued_;
  }
  queue_cv_.notify_one();
  return Work(std::move(work));
}

TRAINKIT_INLINE void TcpComm::worker_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return !queue_.empty() || stop_; });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    execute(task);
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      busy_ = false;
    }
  }
}

TRAINKIT_INLINE void TcpComm::execute(Task& task) {
  std::exception_ptr error;
  const std::uint64_t seq = ++seq_;
  try {
    if (broken_.load(std::memory_order_acquire))
      TRAINKIT_FAIL("TcpComm rank ", rank_, ": ", detail::ring_op_name(task.desc.kind), " #", seq,
                    " refused: the group failed earlier: ", broken_reason_);
    try {
      run(task.desc, seq);
    } catch (const Failure& f) {
      break_group(f.root);
      TRAINKIT_FAIL(f.message);
    } catch (const std::exception& e) {  // fault injection, allocation
      const std::string full = trainkit::detail::concat("TcpComm rank ", rank_, ": ",
                                                        detail::ring_op_name(task.desc.kind), " #",
                                                        seq, " failed: ", e.what());
      break_group(full);
      TRAINKIT_FAIL(full);
    } catch (...) {  // a fault injection hook that throws something else
      // Still a failure of the group: this rank stopped mid-collective, so its neighbours must
      // hear it now (not at their timeout) and its next collective must not read the rest of
      // this one's stream as its own.
      const std::string full = trainkit::detail::concat(
          "TcpComm rank ", rank_, ": ", detail::ring_op_name(task.desc.kind), " #", seq,
          " failed: an exception that is not a std::exception");
      break_group(full);
      TRAINKIT_FAIL(full);
    }
  } catch (...) {
    error = std::current_exception();
  }
  task.work->complete(error);
}

TRAINKIT_INLINE TcpComm::Coll TcpComm::plan(const detail::RingDesc& d, std::uint64_t seq) const {
  const int n = world_size_;
  Coll c;
  c.d = d;
  c.seq = seq;
  c.es = static_cast<std::int64_t>(dtype_size(d.dtype));
  c.ce = std::max<std::int64_t>(1, options_.chunk_bytes / std::max<std::int64_t>(c.es, 1));
  c.pos = ((rank_ - d.root) % n + n) % n;
  std::int64_t longest = 0;
  switch (d.kind) {
    case detail::RingOp::kAllReduce:
    case detail::RingOp::kBarrier:
      longest = (d.count + n - 1) / n;
      c.steps = 2 * (n - 1);
      break;
    case detail::RingOp::kReduceScatter:
    case detail::RingOp::kAllGather:
      longest = d.count;
      c.steps = n - 1;
      break;
    case detail::RingOp::kBroadcast:
      longest = d.count;
      c.steps = 2;
      break;
  }
  // At least one unit per step even for empty buffers: every collective synchronises its ranks
  // (a barrier is an empty all_reduce).
  c.chunks = std::max<std::int64_t>(1, (longest + c.ce - 1) / c.ce);
  return c;
}

TRAINKIT_INLINE bool TcpComm::has_send(const Coll& c, std::int64_t g) const {
  if (c.d.kind != detail::RingOp::kBroadcast) return true;
  return g == 0 ? c.pos == 0 : (c.pos != 0 && c.pos != world_size_ - 1);
}

TRAINKIT_INLINE bool TcpComm::has_recv(const Coll& c, std::int64_t g) const {
  if (c.d.kind != detail::RingOp::kBroadcast) return true;
  return g == 0 && c.pos != 0;
}

// The unit schedules mirror ThreadComm::run: what ThreadComm's rank r reads from its left
// neighbour's memory at (step, chunk) is what our left neighbour sends at that (step, chunk).
TRAINKIT_INLINE TcpComm::Piece TcpComm::send_piece(const Coll& c, std::int64_t g,
                                                   std::int64_t k) const {
  const int n = world_size_;
  auto mod = [n](std::int64_t x) { return ((x % n) + n) % n; };
  const std::int64_t es = c.es, ce = c.ce;
  Piece p;
  std::int64_t sb = 0, se = 0;
  const char* base = nullptr;
  switch (c.d.kind) {
    case detail::RingOp::kAllReduce:
    case detail::RingOp::kBarrier: {
      const std::int64_t seg = g < n - 1 ? mod(rank_ - g - 1) : mod(rank_ - (g - (n - 1)));
      sb = seg * c.d.count / n;
      se = (seg + 1) * c.d.count / n;
      base = static_cast<const char*>(c.d.data);
      break;
    }
    case detail::RingOp::kReduceScatter: {
      const std::int64_t seg = mod(rank_ - g - 1);
      sb = seg * c.d.count;
      se = sb + c.d.count;
      base = g == 0 ? static_cast<const char*>(c.d.send) : scratch_.data();
      break;
    }
    case detail::RingOp::kAllGather: {
      const std::int64_t seg = mod(rank_ - g);
      sb = seg * c.d.count;
      se = sb + c.d.count;
      base = static_cast<const char*>(c.d.data);
      break;
    }
    case detail::RingOp::kBroadcast:
      sb = 0;
      se = c.d.count;
      base = static_cast<const char*>(c.d.data);
      break;
  }
  const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
  p.a = base == nullptr ? nullptr : base + b * es;
  p.bytes = (e - b) * es;
  return p;
}

TRAINKIT_INLINE TcpComm::Piece TcpComm::recv_piece(const Coll& c, std::int64_t g,
                                                   std::int64_t k) const {
  const int n = world_size_;
  auto mod = [n](std::int64_t x) { return ((x % n) + n) % n; };
  const std::int64_t es = c.es, ce = c.ce;
  char* mine = static_cast<char*>(c.d.data);
  Piece p;
  switch (c.d.kind) {
    case detail::RingOp::kAllReduce:
    case detail::RingOp::kBarrier: {
      if (g < n - 1) {  // reduce-scatter step g: mine = mine op left's partial
        const std::int64_t seg = mod(rank_ - g - 2);
        const std::int64_t sb = seg * c.d.count / n, se = (seg + 1) * c.d.count / n;
        const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
        p.dst = mine + b * es;
        p.a = mine + b * es;
        p.bytes = (e - b) * es;
        p.combine = true;
        p.divisor = (g == n - 2 && c.d.op == ReduceOp::kAvg) ? n : 1;
      } else {  // all-gather step: a finished segment
        const std::int64_t seg = mod(rank_ - 1 - (g - (n - 1)));
        const std::int64_t sb = seg * c.d.count / n, se = (seg + 1) * c.d.count / n;
        const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
        p.dst = mine + b * es;
        p.bytes = (e - b) * es;
      }
      return p;
    }
    case detail::RingOp::kReduceScatter: {
      const std::int64_t m = c.d.count;
      const std::int64_t seg = mod(rank_ - g - 2);
      const std::int64_t sb = seg * m, se = sb + m;
      const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
      const bool last = g == n - 2;
      p.dst = last ? mine + (b - sb) * es : const_cast<char*>(scratch_.data()) + b * es;
      p.a = static_cast<const char*>(c.d.send) + b * es;
      p.bytes = (e - b) * es;
      p.combine = true;
      p.divisor = (last && c.d.op == ReduceOp::kAvg) ? n : 1;
      return p;
    }
    case detail::RingOp::kAllGather: {
      const std::int64_t m = c.d.count;
      const std::int64_t seg = mod(rank_ - 1 - g);
      const std::int64_t sb = seg * m, se = sb + m;
      const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
      p.dst = mine + b * es;
      p.bytes = (e - b) * es;
      return p;
    }
    case detail::RingOp::kBroadcast: {
      const std::int64_t b = std::min(c.d.count, k * ce), e = std::min(c.d.count, b + ce);
      p.dst = mine + b * es;
      p.bytes = (e - b) * es;
      return p;
    }
  }
  return p;
}

TRAINKIT_INLINE void TcpComm::run(const detail::RingDesc& desc, std::uint64_t seq) {
  const int n = world_size_;
  const Coll c = plan(desc, seq);
  if (n == 1) {  // a group of one: local copies
    if (options_.fault_injection) options_.fault_injection(rank_, seq, 0);
    if (desc.kind == detail::RingOp::kAllGather || desc.kind == detail::RingOp::kReduceScatter)
      detail::copy_bytes(desc.data, desc.send, static_cast<std::size_t>(desc.count * c.es));
    return;
  }
  if (right_gone_) fail(trainkit::detail::concat(what(c), " refused: ", right_gone_why_));
  if (desc.kind == detail::RingOp::kReduceScatter) {
    const auto need = static_cast<std::size_t>(desc.count * n * c.es);
    if (scratch_.size() < need) scratch_.resize(need);
  }
  if (desc.kind == detail::RingOp::kAllGather)
    detail::copy_bytes(static_cast<char*>(desc.data) + rank_ * desc.count * c.es, desc.send,
                       static_cast<std::size_t>(desc.count * c.es));
  if (staging_.size() < static_cast<std::size_t>(c.ce * c.es))
    staging_.resize(static_cast<std::size_t>(c.ce * c.es));

  const std::string left_name = trainkit::detail::concat("rank ", left_);
  const std::string right_name = trainkit::detail::concat("rank ", right_);
  const int lfd = left_sock_.fd(), rfd = right_sock_.fd();

  // Outgoing (to the right): the header, then every send unit in (step, chunk) order.
  unsigned char out_head[detail::kTcpFrameBytes];
  const char* out_payload = nullptr;
  std::size_t out_total = 0, out_done = 0;
  bool out_active = false, header_sent = false;
  std::int64_t send_g = 0, send_k = 0;
  while (send_g < c.steps && !has_send(c, send_g)) ++send_g;

  // Incoming (from the left): the header, then every receive unit in (step, chunk) order.
  enum class In : std::uint8_t { kHead, kPayload, kText };
  In in_phase = In::kHead;
  unsigned char in_head[detail::kTcpFrameBytes];
  std::size_t in_done = 0;
  bool header_received = false;
  std::int64_t recv_g = 0, recv_k = 0;
  while (recv_g < c.steps && !has_recv(c, recv_g)) ++recv_g;
  Piece in_piece;
  char* in_dst = nullptr;
  std::string in_text;
  detail::TcpFrame in_frame;

  // Data frames are numbered in the order they travel (both ends count the same frames).
  std::int64_t frames_in = 0, frames_out = 0;
  auto recv_unit_number = [&]() { return frames_in; };
  auto applied = [&](std::int64_t g, std::int64_t k) {
    return g < recv_g || (g == recv_g && k < recv_k);
  };
  auto advance_recv = [&] {
    ++frames_in;
    if (++recv_k == c.chunks) {
      recv_k = 0;
      do {
        ++recv_g;
      } while (recv_g < c.steps && !has_recv(c, recv_g));
    }
  };
  auto sending = [&] { return !header_sent || out_active || send_g < c.steps; };
  auto receiving = [&] { return !header_received || recv_g < c.steps; };
  auto remote_failure = [&](const std::string& who, const detail::TcpFrame& f,
                            const std::string& text) {
    // The text is the peer's: shown escaped, passed on as it came (escaped once, where shown).
    const std::string shown = ::trainkit::detail::printable_bytes(text);
    if (f.type == detail::TcpFrameType::kLeave)
      fail(trainkit::detail::concat(what(c), " failed: ", shown, ", before this collective"));
    throw Failure{
        trainkit::detail::concat("TcpComm rank ", rank_, ": ", what(c),
                                 " failed because the group failed (told by ", who, "): ", shown),
        text};
  };
  auto closed = [&](const std::string& who, int err) {
    fail(trainkit::detail::concat(
        what(c), ": ", who, " closed its connection",
        err != 0 ? trainkit::detail::concat(" (", detail::errno_text(err), ")") : std::string(),
        " before finishing its part (its process died, or its TcpComm was destroyed or "
        "failed: see its log)"));
  };

  // Reads from the left until it would block or this collective needs nothing more from it.
  auto read_left = [&]() -> bool {
    bool progress = false;
    while (receiving() || in_phase != In::kHead) {
      char* dst = nullptr;
      std::size_t want = 0;
      if (in_phase == In::kHead) {
        dst = reinterpret_cast<char*>(in_head) + in_done;
        want = detail::kTcpFrameBytes - in_done;
      } else if (in_phase == In::kPayload) {
        dst = in_dst + in_done;
        want = static_cast<std::size_t>(in_piece.bytes) - in_done;
      } else {
        dst = in_text.data() + in_done;
        want = in_text.size() - in_done;
      }
      if (want > 0) {
        const ssize_t got = ::recv(lfd, dst, want, 0);
        if (got == 0) closed(left_name, 0);
        if (got < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return progress;
          closed(left_name, errno);
        }
        progress = true;
        in_done += static_cast<std::size_t>(got);
        if (static_cast<std::size_t>(got) < want) continue;
      }
      // The current piece is complete.
      if (in_phase == In::kHead) {
        in_frame = detail::decode_tcp_frame(in_head, sizeof in_head, left_name);
        in_done = 0;
        if (in_frame.type == detail::TcpFrameType::kAbort ||
            in_frame.type == detail::TcpFrameType::kLeave) {
          in_text.assign(static_cast<std::size_t>(in_frame.length), '\0');
          in_phase = In::kText;
          continue;
        }
        if (!header_received) {
          const int their_root = static_cast<int>(in_frame.a);
          const auto their_count = static_cast<std::int64_t>(in_frame.length);
          if (in_frame.type != detail::TcpFrameType::kHeader || in_frame.seq != c.seq)
            fail(trainkit::detail::concat(what(c), ": ", left_name, " sent a frame of type ",
                                          static_cast<int>(in_frame.type), " for collective #",
                                          in_frame.seq, " where the header of #", c.seq,
                                          " belongs (a protocol error)"));
          bool same = in_frame.kind == desc.kind;
          if (same && desc.kind != detail::RingOp::kBarrier)
            same = their_count == desc.count && in_frame.dtype == desc.dtype;
          if (same && (desc.kind == detail::RingOp::kAllReduce ||
                       desc.kind == detail::RingOp::kReduceScatter))
            same = in_frame.op == desc.op;
          if (same && desc.kind == detail::RingOp::kBroadcast) same = their_root == desc.root;
          if (!same)
            fail(trainkit::detail::concat(
                "collective #", c.seq, " does not match: rank ", rank_, " called ",
                detail::describe_tcp_call(desc.kind, desc.op, desc.dtype, desc.count, desc.root),
                ", rank ", left_, " called ",
                detail::describe_tcp_call(in_frame.kind, in_frame.op, in_frame.dtype, their_count,
                                          their_root),
                " (every rank must issue the same collectives in the same order)"));
          if (in_frame.b != static_cast<std::uint32_t>(options_.chunk_bytes))
            fail(trainkit::detail::concat(what(c), ": ", left_name, " streams units of ",
                                          in_frame.b, " bytes, this rank of ", options_.chunk_bytes,
                                          " (every rank must pass the same chunk_bytes)"));
          header_received = true;
          continue;
        }
        in_piece = recv_piece(c, recv_g, recv_k);
        if (in_frame.type != detail::TcpFrameType::kData || in_frame.seq != c.seq ||
            in_frame.a != static_cast<std::uint32_t>(recv_unit_number()) ||
            in_frame.length != static_cast<std::uint64_t>(in_piece.bytes))
          fail(trainkit::detail::concat(what(c), ": ", left_name, " sent a frame of type ",
                                        static_cast<int>(in_frame.type), " (collective #",
                                        in_frame.seq, ", unit ", in_frame.a, ", ", in_frame.length,
                                        " bytes) where unit ", recv_unit_number(), " of ",
                                        in_piece.bytes, " bytes belongs (a protocol error)"));
        in_dst = in_piece.combine ? staging_.data() : in_piece.dst;
        in_phase = In::kPayload;
        continue;
      }
      if (in_phase == In::kText) remote_failure(left_name, in_frame, in_text);
      // A unit arrived: reduce it into place.
      if (in_piece.combine)
        detail::combine(desc.dtype, desc.op == ReduceOp::kAvg ? ReduceOp::kSum : desc.op,
                        in_piece.dst, in_piece.a, staging_.data(), in_piece.bytes / c.es,
                        in_piece.divisor);
      in_phase = In::kHead;
      in_done = 0;
      advance_recv();
    }
    return progress;
  };

  // Reads the right neighbour's abort or leave frame, or notices it closed. Its closing is an
  // error only while this rank still has something to send it; a leave frame says how many
  // collectives it completed.
  auto read_right = [&]() -> bool {
    bool progress = false;
    while (!right_gone_) {
      char* dst = rev_in_text_ ? rev_text_.data() + rev_done_
                               : reinterpret_cast<char*>(rev_head_) + rev_done_;
      const std::size_t want =
          rev_in_text_ ? rev_text_.size() - rev_done_ : detail::kTcpFrameBytes - rev_done_;
      if (want > 0) {
        const ssize_t got = ::recv(rfd, dst, want, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return progress;
        if (got <= 0) {
          const int err = got < 0 ? errno : 0;
          right_gone_ = true;
          right_gone_why_ = trainkit::detail::concat(right_name, " closed its connection");
          if (sending()) closed(right_name, err);
          return true;
        }
        progress = true;
        rev_done_ += static_cast<std::size_t>(got);
        if (static_cast<std::size_t>(got) < want) continue;
      }
      if (!rev_in_text_) {
        rev_frame_ = detail::decode_tcp_frame(rev_head_, sizeof rev_head_, right_name);
        if (rev_frame_.type != detail::TcpFrameType::kAbort &&
            rev_frame_.type != detail::TcpFrameType::kLeave)
          fail(trainkit::detail::concat(what(c), ": ", right_name, " sent a frame of type ",
                                        static_cast<int>(rev_frame_.type),
                                        " against the ring's direction (a protocol error)"));
        rev_text_.assign(static_cast<std::size_t>(rev_frame_.length), '\0');
        rev_in_text_ = true;
        rev_done_ = 0;
        continue;
      }
      if (rev_frame_.type == detail::TcpFrameType::kAbort)
        remote_failure(right_name, rev_frame_, rev_text_);
      right_gone_ = true;
      right_gone_why_ = ::trainkit::detail::printable_bytes(rev_text_);
      if (rev_frame_.seq < c.seq) remote_failure(right_name, rev_frame_, rev_text_);
      return true;
    }
    return progress;
  };

  // Writes to the right until it would block or nothing is ready to go.
  auto write_right = [&]() -> bool {
    bool progress = false;
    for (;;) {
      if (!out_active) {
        if (!header_sent) {
          detail::TcpFrame f;
          f.type = detail::TcpFrameType::kHeader;
          f.kind = desc.kind;
          f.op = desc.op;
          f.dtype = desc.dtype;
          f.a = static_cast<std::uint32_t>(desc.root);
          f.b = static_cast<std::uint32_t>(options_.chunk_bytes);
          f.seq = c.seq;
          f.length = static_cast<std::uint64_t>(desc.count);
          detail::encode_tcp_frame(f, out_head);
          out_payload = nullptr;
          out_total = detail::kTcpFrameBytes;
          header_sent = true;
        } else if (send_g < c.steps) {
          // A unit goes once the unit it depends on (same chunk, previous step) arrived.
          if (send_g > 0 && has_recv(c, send_g - 1) && !applied(send_g - 1, send_k))
            return progress;
          const std::int64_t unit = send_g * c.chunks + send_k;
          if (options_.fault_injection) options_.fault_injection(rank_, c.seq, unit);
          const Piece p = send_piece(c, send_g, send_k);
          detail::TcpFrame f;
          f.type = detail::TcpFrameType::kData;
          f.seq = c.seq;
          f.a = static_cast<std::uint32_t>(frames_out++);
          f.length = static_cast<std::uint64_t>(p.bytes);
          detail::encode_tcp_frame(f, out_head);
          out_payload = p.a;
          out_total = detail::kTcpFrameBytes + static_cast<std::size_t>(p.bytes);
          if (++send_k == c.chunks) {
            send_k = 0;
            do {
              ++send_g;
            } while (send_g < c.steps && !has_send(c, send_g));
          }
        } else {
          return progress;
        }
        out_active = true;
        out_done = 0;
      }
      iovec iov[2];
      int parts = 0;
      if (out_done < detail::kTcpFrameBytes) {
        iov[parts++] = iovec{out_head + out_done, detail::kTcpFrameBytes - out_done};
        if (out_total > detail::kTcpFrameBytes)
          iov[parts++] = iovec{const_cast<char*>(out_payload), out_total - detail::kTcpFrameBytes};
      } else {
        iov[parts++] = iovec{const_cast<char*>(out_payload) + (out_done - detail::kTcpFrameBytes),
                             out_total - out_done};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<decltype(msg.msg_iovlen)>(parts);
      const ssize_t put = ::sendmsg(rfd, &msg, MSG_NOSIGNAL);
      if (put < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return progress;
        const int err = errno;
        (void)read_right();  // an abort frame that came before the connection broke says why
        right_gone_ = true;
        right_gone_why_ = trainkit::detail::concat(right_name, " closed its connection");
        closed(right_name, err);
      }
      progress = true;
      out_done += static_cast<std::size_t>(put);
      right_partial_ = out_done < out_total;
      if (out_done == out_total) out_active = false;
    }
  };

  (void)read_right();  // a leave or abort frame that came between collectives
  auto last_progress = Clock::now();
  const auto timeout = options_.timeout;
  // After the timeout a rank listens a little longer before blaming its neighbour: when a stall
  // further round the ring timed out a neighbour first, its abort (naming the culprit) arrives.
  const auto grace = std::min<Clock::duration>(timeout / 2, std::chrono::milliseconds(500));
  for (;;) {
    bool progress = write_right();
    if (!sending() && !receiving()) break;
    if (stop_now_.load(std::memory_order_acquire))
      fail(trainkit::detail::concat(what(c),
                                    " failed: this rank's TcpComm was destroyed with "
                                    "collectives in flight"));
    pollfd fds[2];
    fds[0] = pollfd{receiving() ? lfd : -1, POLLIN, 0};
    const short right_events =
        static_cast<short>((out_active ? POLLOUT : 0) | (right_gone_ ? 0 : POLLIN));
    fds[1] = pollfd{right_events != 0 ? rfd : -1, right_events, 0};
    const int rc = ::poll(fds, 2, 50);
    if (rc < 0 && errno != EINTR)
      fail(trainkit::detail::concat("poll failed: ", detail::errno_text(errno)));
    if (rc > 0) {
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!right_gone_) progress |= read_right();
        if (right_gone_ && sending()) closed(right_name, 0);
      }
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) progress |= read_left();
    }
    const auto now = Clock::now();
    if (progress) {
      last_progress = now;
    } else if (now - last_progress >= timeout + grace) {
      std::string why;
      if (!header_received)
        why = trainkit::detail::concat(left_name, " has not started collective #", c.seq,
                                       " (it has not called it, stalled, or waits for a rank "
                                       "before it)");
      else if (receiving())
        why = trainkit::detail::concat(left_name, " stopped sending after ", recv_unit_number(),
                                       " of its units (it stalled, or waits for a rank before it)");
      else
        why = trainkit::detail::concat(right_name,
                                       " stopped reading what this rank sends "
                                       "(it stalled)");
      fail(trainkit::detail::concat(what(c), " made no progress for ",
                                    detail::format_seconds(timeout), ": ", why));
    }
  }
}

#endif  // TRAINKIT_IMPL

#endif  // TRAINKIT_DETAIL_HAS_SOCKETS

}  // namespace dist
TRAINKIT_NAMESPACE_END
