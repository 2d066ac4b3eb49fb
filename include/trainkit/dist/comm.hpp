// SPDX-License-Identifier: MIT
// trainkit/dist/comm.hpp: what a communicator is. `Comm` is the interface ThreadComm, MpiComm and
// NcclComm implement (rank, world_size, all_reduce with sum/avg/max/min, broadcast, all_gather,
// reduce_scatter, barrier on f32/bf16/f16/f64/i32/i64 buffers); `Communicator` is the same as a
// concept. Every collective is asynchronous and returns a `Work` handle: `wait()` blocks until it
// finished and throws trainkit::Error when it failed, a peer died or the timeout passed.
#pragma once

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// The reductions of all_reduce and reduce_scatter. kAvg is the sum divided by the number of
/// ranks (truncating for integers), as NCCL's ncclAvg. kMax/kMin propagate NaN.
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax, kMin };

// A switch, not a table, like the other enum-name functions: -Wswitch flags a new enumerator.
inline constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

/// True for the element types all_reduce and reduce_scatter can reduce: F32, BF16, F16, F64,
/// I32, I64. broadcast and all_gather move any element type.
inline constexpr bool is_reducible(DType t) noexcept {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64 ||
         t == DType::kI32 || t == DType::kI64;
}

/// A contiguous run of `count` elements of `dtype` at `data` in memory `space`: what collectives
/// read and write. Non-owning; the memory must stay valid (and, for sources, unchanged) until the
/// collective's Work has completed. Converts implicitly from std::span and contiguous TensorViews.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::kF32;
  Space space = Space::kHost;

  constexpr Buffer() noexcept = default;
  constexpr Buffer(void* data_, std::int64_t count_, DType dtype_,
                   Space space_ = Space::kHost) noexcept
      : data(data_), count(count_), dtype(dtype_), space(space_) {}

  /// A host buffer over a span (a const span is fine for the read-only operand of all_gather and
  /// reduce_scatter; collectives never write through it).
  template <class T>
  Buffer(std::span<T> s) noexcept  // NOLINT: implicit, like a view
      : data(const_cast<std::remove_const_t<T>*>(s.data())),
        count(static_cast<std::int64_t>(s.size())),
        dtype(dtype_of<T>),
        space(Space::kHost) {}

  /// The elements of a contiguous view. Throws trainkit::Error for a strided view.
  template <class T, int R, Space S>
  Buffer(const TensorView<T, R, S>& v)  // NOLINT: implicit, like a view
      : data(const_cast<std::remove_const_t<T>*>(v.data())),
        count(v.numel()),
        dtype(dtype_of<T>),
        space(S) {
    TRAINKIT_CHECK(v.is_contiguous(),
                   "dist::Buffer: collectives need a contiguous view, got a strided one of ",
                   v.numel(), " elements");
  }

  /// Size in bytes.
  constexpr std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(count) * dtype_size(dtype);
  }
  /// Elements [offset, offset + n) of this buffer.
  constexpr Buffer slice(std::int64_t offset, std::int64_t n) const noexcept {
    return Buffer(static_cast<char*>(data) + static_cast<std::size_t>(offset) * dtype_size(dtype),
                  n, dtype, space);
  }
};

/// A host buffer of `count` elements at `data`.
template <class T>
constexpr Buffer host_buffer(T* data, std::int64_t count) noexcept {
  return Buffer(const_cast<std::remove_const_t<T>*>(data), count, dtype_of<T>, Space::kHost);
}
/// A device buffer of `count` elements at `data` (a CUDA device pointer).
template <class T>
constexpr Buffer device_buffer(T* data, std::int64_t count) noexcept {
  return Buffer(const_cast<std::remove_const_t<T>*>(data), count, dtype_of<T>, Space::kDevice);
}

namespace detail {

/// The state behind a Work handle; each backend derives its own.
class WorkState {
 public:
  WorkState() = default;
  WorkState(const WorkState&) = delete;
  WorkState& operator=(const WorkState&) = delete;
  virtual ~WorkState() = default;
  /// Blocks until the collective finished; throws trainkit::Error if it failed.
  virtual void wait() = 0;
  /// True when the collective finished (never blocks); throws trainkit::Error if it failed.
  virtual bool test() = 0;
};

/// Completion of a collective run by a host thread (ThreadComm's and MpiComm's progress
/// threads): the thread calls complete(), waiters block on a condition variable. The timeout is
/// enforced by the thread running the collective, which then completes it with an error.
class HostWork : public WorkState {
 public:
  void complete(std::exception_ptr error = nullptr) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::move(error);
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  void wait() override {
    while (!done_.load(std::memory_order_acquire) && help()) {
    }
    // Small collectives finish within microseconds: poll a little (yielding the core after a
    // few rounds) before sleeping, which would add a wake-up to each of them.
    const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(30);
    for (unsigned i = 1; !done_.load(std::memory_order_acquire); ++i) {
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > spin_end) break;
      if (i > 64) std::this_thread::yield();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_relaxed); });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    if (!done_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 protected:
  /// Called by wait() while the collective has not finished: a backend may run pending work on
  /// the waiting thread instead of handing it over (ThreadComm does). False when there is none.
  virtual bool help() { return false; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

}  // namespace detail

/// Handle to an asynchronous collective. Copyable (copies share the state). A default-constructed
/// Work is complete. wait()/test() rethrow the collective's error every time they are called.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkState> state) noexcept : state_(std::move(state)) {}

  /// Blocks until the collective finished (for device communicators: until the device finished
  /// it). Throws trainkit::Error when it failed, timed out or a peer left.
  void wait() const {
    if (state_) state_->wait();
  }
  /// True when finished; never blocks. Throws trainkit::Error when it failed.
  bool test() const { return !state_ || state_->test(); }
  /// False for a default-constructed Work.
  bool valid() const noexcept { return state_ != nullptr; }
  /// The backend's state (NcclComm::wait_on reads its event).
  const std::shared_ptr<detail::WorkState>& state() const noexcept { return state_; }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

namespace detail {

/// The longest timeout the communicators accept: 10^7 s (about 115 days). Deadlines are the
/// clock's time plus the timeout, which would overflow for much longer ones (such as
/// std::chrono::milliseconds::max() meant as "never").
inline constexpr std::chrono::milliseconds kMaxTimeout{std::int64_t{10000000} * 1000};

/// Throws trainkit::Error naming `who` unless 0 < timeout <= kMaxTimeout.
inline void check_timeout(std::string_view who, std::chrono::milliseconds timeout) {
  TRAINKIT_CHECK(timeout.count() > 0 && timeout <= kMaxTimeout, who,
                 ": the timeout must be positive and at most 10^7 s (about 115 days), got ",
                 timeout.count(), " ms");
}

}  // namespace detail

namespace detail {

/// True when `text` is a plain decimal number: digits with at most one '.', at least one digit,
/// then optionally 'e' or 'E', an optional sign and digits ("2", "2.5", ".5", "5.", "1e3").
/// Refuses what strtod would also take: blanks, a leading sign, hex ("0x10", "0x1p3"), "inf",
/// "nan", and a decimal comma of the C locale.
inline bool is_plain_decimal(std::string_view text) noexcept {
  std::size_t i = 0, digits = 0;
  const auto is_digit = [&](std::size_t at) {
    return at < text.size() && text[at] >= '0' && text[at] <= '9';
  };
  for (; is_digit(i); ++i) ++digits;
  if (i < text.size() && text[i] == '.')
    for (++i; is_digit(i); ++i) ++digits;
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!is_digit(i)) return false;
    while (is_digit(i)) ++i;
  }
  return i == text.size();
}

}  // namespace detail

/// The collective timeout when none is given: $TRAINKIT_DIST_TIMEOUT seconds (fractions allowed,
/// e.g. "2.5" or "1e3"; at least 0.001, below 10^7) or 300 s. A collective that makes no progress
/// for this long fails with trainkit::Error instead of hanging. Throws trainkit::Error for a
/// value that is not a plain decimal number (see detail::is_plain_decimal: no blanks, sign, hex,
/// "inf" or "nan"; read with '.' whatever the locale) or is out of range.
inline std::chrono::milliseconds default_timeout() {
  const char* env = std::getenv("TRAINKIT_DIST_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::milliseconds(300000);
  const std::string_view text(env);
  double seconds = 0.0;
  bool ok = detail::is_plain_decimal(text);
  if (ok) {
    // from_chars ignores the locale (strtod would read "2.5" as 2 under a decimal comma).
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds,
                                           std::chars_format::general);
    ok = ec == std::errc() && end == text.data() + text.size();
  }
  TRAINKIT_CHECK(ok && seconds >= 0.001 && seconds < 1e7, "TRAINKIT_DIST_TIMEOUT='",
                 ::trainkit::detail::printable_bytes(env),
                 "' is not a decimal number of seconds from 0.001 (the timeouts count "
                 "milliseconds) below 10^7");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

/// A communicator: `world_size()` ranks, this process or thread being `rank()`. Collectives must be
/// called by every rank in the same order with matching arguments; each returns at once with a
/// Work handle (the transfer proceeds on the backend's thread or stream). Argument errors (wrong
/// memory space, counts that do not fit, a dtype that cannot be reduced) throw trainkit::Error at
/// the call; failures of the collective itself surface from Work::wait().
///
/// Operations (count = elements; all buffers of one call have the same dtype):
///  - all_reduce(buf, op): in place; every rank ends with op over all ranks' buf.
///  - broadcast(buf, root): every rank ends with root's buf.
///  - all_gather(send, recv): recv.count == world_size * send.count; rank r's send lands in
///    recv[r * send.count, (r + 1) * send.count). In place when send is that slice of recv.
///  - reduce_scatter(send, recv, op): send.count == world_size * recv.count; rank r receives
///    op over all ranks of send[r * recv.count, (r + 1) * recv.count).
///  - barrier(): completes once every rank has called it.
// Non-copyable polymorphic base: the same four special members as WorkState.
class Comm {
 public:
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  virtual ~Comm() = default;

  /// This rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks.
  virtual int world_size() const noexcept = 0;
  /// "ThreadComm", "MpiComm" or "NcclComm" (error messages start with it).
  virtual std::string_view backend() const noexcept = 0;
  /// Where the buffers must live: host for ThreadComm and MpiComm, device for NcclComm.
  virtual Space space() const noexcept = 0;

  virtual Work all_reduce(Buffer buf, ReduceOp op) = 0;
  virtual Work broadcast(Buffer buf, int root) = 0;
  virtual Work all_gather(Buffer send, Buffer recv) = 0;
  virtual Work reduce_scatter(Buffer send, Buffer recv, ReduceOp op) = 0;
  virtual Work barrier() = 0;
};

/// Anything with Comm's members (every Comm, and duck-typed communicators of your own).
template <class C>
concept Communicator = requires(C& c, const C& cc, Buffer b, ReduceOp op, int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.world_size() } -> std::convertible_to<int>;
  { c.all_reduce(b, op) } -> std::same_as<Work>;
  { c.broadcast(b, root) } -> std::same_as<Work>;
  { c.all_gather(b, b) } -> std::same_as<Work>;
  { c.reduce_scatter(b, b, op) } -> std::same_as<Work>;
  { c.barrier() } -> std::same_as<Work>;
};
static_assert(Communicator<Comm>);

namespace detail {

/// "1000 x F32 (host)" for messages.
inline std::string describe(const Buffer& b) {
  return trainkit::detail::concat(b.count, " x ", dtype_name(b.dtype), " (", space_name(b.space),
                                  ")");
}

/// Argument checks shared by the backends; messages name the backend, rank and operation.
inline void check_buffer(const Comm& c, const char* op, const char* which, const Buffer& b) {
  TRAINKIT_CHECK(b.count >= 0, c.backend(), " rank ", c.rank(), ": ", op, ": ", which,
                 " has a negative count ", b.count);
  TRAINKIT_CHECK(b.count == 0 || b.data != nullptr, c.backend(), " rank ", c.rank(), ": ", op, ": ",
                 which, " is null with ", b.count, " elements");
  TRAINKIT_CHECK(b.space == c.space(), c.backend(), " rank ", c.rank(), ": ", op, ": ", which,
                 " is ", space_name(b.space), " memory, this communicator moves ",
                 space_name(c.space()), " memory");
}

inline void check_reducible(const Comm& c, const char* op, const Buffer& b) {
  TRAINKIT_CHECK(is_reducible(b.dtype), c.backend(), " rank ", c.rank(), ": ", op,
                 " cannot reduce ", dtype_name(b.dtype),
                 " (supported: F32, BF16, F16, F64, I32, I64)");
}

inline void check_all_reduce(const Comm& c, const Buffer& b) {
  check_buffer(c, "all_reduce", "the buffer", b);
  check_reducible(c, "all_reduce", b);
}

inline void check_broadcast(const Comm& c, const Buffer& b, int root) {
  check_buffer(c, "broadcast", "the buffer", b);
  TRAINKIT_CHECK(root >= 0 && root < c.world_size(), c.backend(), " rank ", c.rank(),
                 ": broadcast root ", root, " is not in [0, ", c.world_size(), ")");
}

inline void check_all_gather(const Comm& c, const Buffer& send, const Buffer& recv) {
  check_buffer(c, "all_gather", "send", send);
  check_buffer(c, "all_gather", "recv", recv);
  TRAINKIT_CHECK(send.dtype == recv.dtype, c.backend(), " rank ", c.rank(),
                 ": all_gather: send is ", dtype_name(send.dtype), " but recv is ",
                 dtype_name(recv.dtype));
  // Divided, not multiplied: a product of a huge count could wrap round to recv.count.
  TRAINKIT_CHECK(recv.count % c.world_size() == 0 && recv.count / c.world_size() == send.count,
                 c.backend(), " rank ", c.rank(),
                 ": all_gather: recv must hold world_size * send.count = ", c.world_size(), " * ",
                 send.count, " elements, it holds ", recv.count);
}

inline void check_reduce_scatter(const Comm& c, const Buffer& send, const Buffer& recv) {
  check_buffer(c, "reduce_scatter", "send", send);
  check_buffer(c, "reduce_scatter", "recv", recv);
  check_reducible(c, "reduce_scatter", send);
  TRAINKIT_CHECK(send.dtype == recv.dtype, c.backend(), " rank ", c.rank(),
                 ": reduce_scatter: send is ", dtype_name(send.dtype), " but recv is ",
                 dtype_name(recv.dtype));
  TRAINKIT_CHECK(send.count % c.world_size() == 0 && send.count / c.world_size() == recv.count,
                 c.backend(), " rank ", c.rank(),
                 ": reduce_scatter: send must hold world_size * recv.count = ", c.world_size(),
                 " * ", recv.count, " elements, it holds ", send.count);
}

/// A Work that has already failed with `error` (for collectives refused by a broken
/// communicator: the error surfaces from wait(), like any failure of the collective).
inline Work failed_work(std::exception_ptr error) {
  auto state = std::make_shared<HostWork>();
  state->complete(std::move(error));
  return Work(std::move(state));
}

}  // namespace detail
}  // namespace dist
TRAINKIT_NAMESPACE_END
