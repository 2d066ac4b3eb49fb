// SPDX-License-Identifier: MIT
// trainkit/dist/thread_comm.hpp: ThreadComm, a communicator whose ranks are threads of one process:
// the CPU data-parallel engine on one machine and the test bed for everything distributed.
// Collectives are rings over shared memory (each rank reads its left neighbour's buffer chunk by
// chunk: all_reduce is a pipelined reduce-scatter + all-gather) with a summation order fixed by
// (segment, world_size), so results are bitwise reproducible. Every wait has a timeout: a rank that
// stalls, throws or leaves makes the others fail with a trainkit::Error naming it, not a hang.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/dist/host_reduce.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Options of a ThreadGroup (shared by its ranks).
struct ThreadCommOptions {
  /// A rank that waits this long without seeing the awaited rank make progress fails (and with it
  /// the whole group). Default: default_timeout() ($TRAINKIT_DIST_TIMEOUT or 300 s).
  std::chrono::milliseconds timeout = default_timeout();
  /// Pipelining granularity of the ring, in bytes: a rank starts on a chunk as soon as its left
  /// neighbour finished that chunk of the previous step.
  std::int64_t chunk_bytes = std::int64_t{256} << 10;
  /// Fault injection for tests: called on rank `rank`'s progress thread before each unit of work
  /// of its collective number `op` (counted from 1); it may sleep (a stall) or throw (a crash).
  std::function<void(int rank, std::uint64_t op, std::int64_t unit)> fault_injection;
};

namespace detail {

enum class RingOp : std::uint8_t { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };

inline constexpr const char* ring_op_name(RingOp op) noexcept {
  switch (op) {
    case RingOp::kAllReduce: return "all_reduce";
    case RingOp::kBroadcast: return "broadcast";
    case RingOp::kAllGather: return "all_gather";
    case RingOp::kReduceScatter: return "reduce_scatter";
    case RingOp::kBarrier: return "barrier";
  }
  return "?";
}

/// ThreadComm's fixed summation order. all_reduce splits the buffer into `world_size` segments
/// (segment c = elements [c*n/world_size, (c+1)*n/world_size)), reduce_scatter's send buffer is its
/// `world_size` segments of recv.count. Element i of segment c is reduced, in every run, as
///   acc = x[s]; for j in 1..world_size-1: acc = x[(s + j) % world_size] (op) acc;
/// with s = ring_chain_start(c)
/// where x[r] is rank r's value (16-bit floats: each step in f32, rounded to the type).
inline constexpr int ring_chain_start(int segment, int world_size) noexcept {
  return (segment + 1) % world_size;
}

/// What a rank publishes about its current collective. Written by the owner before `seq` is
/// released; read by the right neighbour after acquiring `seq`.
struct RingDesc {
  RingOp kind = RingOp::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kF32;
  int root = 0;
  /// all_reduce/broadcast: the buffer; all_gather: send count; reduce_scatter: recv count.
  std::int64_t count = 0;
  void* data = nullptr;        // all_reduce/broadcast buffer, all_gather/reduce_scatter recv
  const void* send = nullptr;  // all_gather/reduce_scatter send
  void* scratch = nullptr;     // reduce_scatter partial sums (world_size * count elements)
};

/// The RingDesc of each ring collective, its arguments checked against `c` first (ThreadComm and
/// TcpComm run the same four).
inline RingDesc all_reduce_desc(const Comm& c, const Buffer& buf, ReduceOp op) {
  check_all_reduce(c, buf);
  return {.kind = RingOp::kAllReduce,
          .op = op,
          .dtype = buf.dtype,
          .count = buf.count,
          .data = buf.data};
}
inline RingDesc broadcast_desc(const Comm& c, const Buffer& buf, int root) {
  check_broadcast(c, buf, root);
  return {.kind = RingOp::kBroadcast,
          .dtype = buf.dtype,
          .root = root,
          .count = buf.count,
          .data = buf.data};
}
inline RingDesc all_gather_desc(const Comm& c, const Buffer& send, const Buffer& recv) {
  check_all_gather(c, send, recv);
  return {.kind = RingOp::kAllGather,
          .dtype = send.dtype,
          .count = send.count,
          .data = recv.data,
          .send = send.data};
}
inline RingDesc reduce_scatter_desc(const Comm& c, const Buffer& send, const Buffer& recv,
                                    ReduceOp op) {
  check_reduce_scatter(c, send, recv);
  return {.kind = RingOp::kReduceScatter,
          .op = op,
          .dtype = send.dtype,
          .count = recv.count,
          .data = recv.data,
          .send = send.data};
}

/// Per-rank shared state, one cache line apart. `progress` counts finished units of work over
/// the life of the group (monotonic); `base`/`units` describe collective `seq` for diagnostics.
struct alignas(64) RingSlot {
  std::atomic<std::int64_t> progress{0};
  alignas(64) std::atomic<std::uint64_t> seq{0};
  std::atomic<std::int64_t> base{0};
  std::atomic<std::int64_t> units{0};
  std::atomic<int> waiting_on{-1};
  std::atomic<bool> left{false};
  std::atomic<bool> claimed{false};
  std::atomic<bool> accessing{false};  // reading a neighbour's buffers right now
  RingDesc desc;
};

inline std::string format_seconds(std::chrono::milliseconds ms) {
  return trainkit::detail::concat(static_cast<double>(ms.count()) / 1000.0, " s");
}

}  // namespace detail

/// The shared state of a ThreadComm group of `world_size` ranks: create one, hand it to
/// `world_size` threads, and construct one ThreadComm per thread from it (or use ThreadComm::run).
class ThreadGroup {
 public:
  /// Throws trainkit::Error unless 1 <= size <= 4096, chunk_bytes >= 1 and the timeout is in
  /// (0, 10^7 s] (detail::check_timeout).
  TRAINKIT_INLINE explicit ThreadGroup(int world_size, ThreadCommOptions options = {});
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int world_size() const noexcept { return world_size_; }
  const ThreadCommOptions& options() const noexcept { return options_; }

  /// True once a rank failed (timeout, mismatch, a rank left mid-collective); every collective
  /// of every rank then fails with abort_reason().
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    return reason_;
  }
  /// Fails the group with `reason` (the first reason is kept) and wakes every waiting rank.
  TRAINKIT_INLINE void abort(const std::string& reason);

 private:
  friend class ThreadComm;

  detail::RingSlot& slot(int rank) const noexcept { return slots_[static_cast<std::size_t>(rank)]; }

  // Wakes sleeping waiters after a store they may wait for. Waker and sleeper each pass
  // handshake() between their store and their load (store-buffer pattern): whichever passes
  // second synchronizes with the other, so either the waker sees the sleeper count or the
  // sleeper sees the store. A read-modify-write on one shared word rather than two seq_cst
  // fences: the same guarantee, and one that ThreadSanitizer models (it ignores fences).
  TRAINKIT_INLINE void notify();
  void handshake() noexcept { handshake_.fetch_add(1, std::memory_order_acq_rel); }

  int world_size_;
  ThreadCommOptions options_;
  std::unique_ptr<detail::RingSlot[]> slots_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;
  std::atomic<int> sleepers_{0};
  std::atomic<std::uint64_t> handshake_{0};
  std::mutex sleep_mutex_;
  std::condition_variable sleep_cv_;
};

/// Rank `rank` of a ThreadGroup. Collectives run on the rank's own progress thread, in call
/// order, so they overlap with whatever the calling thread does next; Work::wait() joins them.
/// Host buffers only. Not movable (the progress thread refers to it).
///
/// Buffers: the other ranks read a rank's buffers directly, so (as with every communicator) a
/// buffer must stay valid until its collective completed, also when the owning thread throws.
///
/// Faults: a rank whose awaited neighbour makes no progress for options().timeout fails with an
/// error naming the rank the waits lead to (the one that stalled); a ThreadComm destroyed with
/// collectives in flight (its thread threw or returned early) aborts the group at once; one
/// destroyed between collectives makes the others fail as soon as they wait for it. After a
/// failure every collective of the group fails (the group is aborted).
class ThreadComm final : public Comm {
 public:
  /// Joins `group` as `rank`. Throws trainkit::Error when rank is out of range or taken.
  TRAINKIT_INLINE ThreadComm(std::shared_ptr<ThreadGroup> group, int rank);
  ThreadComm(const ThreadComm&) = delete;
  ThreadComm& operator=(const ThreadComm&) = delete;

  /// Leaves the group. With collectives still queued or running (the owning thread threw, or
  /// returned without waiting), the group is aborted so the other ranks fail now, not at their
  /// timeout; those collectives fail too.
  TRAINKIT_INLINE ~ThreadComm() override;

  /// Runs f(ThreadComm&) on `world_size` new threads, one per rank of a fresh group, and joins
  /// them. Rethrows the first exception a rank threw (the others then fail with errors naming it).
  template <class F>
  static void run(int world_size, F&& f, ThreadCommOptions options = {}) {
    auto group = std::make_shared<ThreadGroup>(world_size, std::move(options));
    std::mutex mutex;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(world_size));
    try {
      for (int r = 0; r < world_size; ++r) {
        threads.emplace_back([&, r] {
          try {
            ThreadComm comm(group, r);
            f(comm);
          } catch (...) {
            std::lock_guard<std::mutex> lock(mutex);
            if (!first) first = std::current_exception();
          }
        });
      }
    } catch (const std::system_error& e) {
      // The ranks that started would wait for the missing ones: fail them now, then report.
      const std::string reason =
          ::trainkit::detail::concat("ThreadComm::run: cannot start the thread of rank ",
                                     threads.size(), " of ", world_size, " (", e.what(), ")");
      group->abort(reason);
      for (std::thread& t : threads) t.join();
      TRAINKIT_FAIL(reason);
    }
    for (std::thread& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return group_->world_size(); }
  std::string_view backend() const noexcept override { return "ThreadComm"; }
  Space space() const noexcept override { return Space::kHost; }
  const std::shared_ptr<ThreadGroup>& group() const noexcept { return group_; }

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
  // Waits spin this long before sleeping: enough to bridge a neighbour's chunk on a busy ring,
  // short enough not to starve the threads that share a core with us.
  static constexpr std::chrono::microseconds kSpin{50};

  struct Task {
    detail::RingDesc desc;
    std::shared_ptr<detail::HostWork> work;
  };

  // The shape of one collective: `steps` ring steps of `chunks` units each.
  struct Plan {
    std::int64_t chunk_elems = 1;
    std::int64_t chunks = 1;
    std::int64_t steps = 0;
    std::int64_t units() const noexcept { return steps * chunks; }
  };

  // The Work of a ThreadComm collective: a thread that waits for it before the progress thread
  // started it runs it (and the ones queued before it) itself, saving two thread hand-offs.
  class ThreadWork final : public detail::HostWork {
   public:
    explicit ThreadWork(ThreadComm& comm) : comm_(&comm) {}

   protected:
    bool help() override { return comm_->help(); }

   private:
    ThreadComm* comm_;
  };

  TRAINKIT_INLINE Work enqueue(const detail::RingDesc& d);

  // Takes the next collective if none is running (call with queue_mutex_ held).
  TRAINKIT_INLINE bool take(Task& task);

  // Runs a taken collective and completes its Work.
  TRAINKIT_INLINE void execute(Task& task);

  // Work::wait() on the waiting thread: runs the next queued collective if none is running.
  TRAINKIT_INLINE bool help();

  TRAINKIT_INLINE void worker_loop();

  TRAINKIT_INLINE Plan plan_for(const detail::RingDesc& d) const;

  TRAINKIT_INLINE std::string what(std::uint64_t seq, const detail::RingDesc& d) const;

  [[noreturn]] void fail(const std::string& message, bool abort_group) {
    const std::string full = trainkit::detail::concat("ThreadComm rank ", rank_, ": ", message);
    if (abort_group) group_->abort(full);
    TRAINKIT_FAIL(full);
  }

  // Follows the chain of waits from `peer` to the rank that is not waiting for anyone: the one
  // that stalled (or left without saying so), and says where it is.
  TRAINKIT_INLINE std::string diagnose(int peer, std::uint64_t seq) const;

  // Blocks until ready() holds. Fails (and aborts the group) when the group is aborted, when
  // `peer` left, or when `peer` shows no progress for the timeout.
  template <class Ready>
  void await(int peer, const Ready& ready, std::uint64_t seq, const detail::RingDesc& d) {
    if (ready()) return;
    detail::RingSlot& me = group_->slot(rank_);
    me.waiting_on.store(peer, std::memory_order_release);
    struct Clear {
      detail::RingSlot& slot;
      ~Clear() { slot.waiting_on.store(-1, std::memory_order_release); }
    } clear{me};

    // Poll briefly, then yield the core while polling (on an oversubscribed machine the rank we
    // wait for may need it), then sleep.
    const auto spin_end = Clock::now() + kSpin;
    for (unsigned i = 1;; ++i) {
      if (ready()) return;
      if ((i & 63) == 0 && Clock::now() > spin_end) break;
      if (i < 64) {
        exec::detail::cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }

    const detail::RingSlot& p = group_->slot(peer);
    const auto timeout = group_->options().timeout;
    auto snapshot = [&p] {
      return std::pair(p.progress.load(std::memory_order_acquire),
                       p.seq.load(std::memory_order_acquire));
    };
    auto seen = snapshot();
    auto deadline = Clock::now() + timeout;
    for (;;) {
      if (ready()) return;
      if (group_->aborted())
        fail(trainkit::detail::concat(what(seq, d),
                                      " failed: the group was aborted: ", group_->abort_reason()),
             false);
      if (p.left.load(std::memory_order_acquire))
        fail(trainkit::detail::concat(what(seq, d), ": rank ", peer,
                                      " left the group "
                                      "(its ThreadComm was destroyed) before finishing its part"),
             true);
      const auto now = Clock::now();
      if (const auto current = snapshot(); current != seen) {
        seen = current;
        deadline = now + timeout;
      }
      if (now >= deadline)
        fail(trainkit::detail::concat(what(seq, d), " made no progress for ",
                                      detail::format_seconds(timeout), ": ", diagnose(peer, seq)),
             true);
      std::unique_lock<std::mutex> lock(group_->sleep_mutex_);
      group_->sleepers_.fetch_add(1, std::memory_order_relaxed);
      group_->handshake();
      // The 100 ms cap only bounds how late a missed wake-up could be noticed.
      group_->sleep_cv_.wait_until(
          lock, std::min(deadline, now + std::chrono::milliseconds(100)), [&] {
            return ready() || group_->aborted() || p.left.load(std::memory_order_acquire) ||
                   snapshot() != seen;
          });
      group_->sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  // Marks this rank as reading a neighbour's buffers. Paired with quiesce(): once the group is
  // aborted no rank starts such an access (store-buffer pattern on `accessing` and the abort
  // flag), so a failed rank can wait for the ones in progress before its caller frees memory.
  class Access {
   public:
    Access(ThreadComm& comm, std::uint64_t seq, const detail::RingDesc& d)
        : slot_(comm.group_->slot(comm.rank_)) {
      slot_.accessing.store(true, std::memory_order_seq_cst);
      if (comm.group_->aborted_.load(std::memory_order_seq_cst)) {
        slot_.accessing.store(false, std::memory_order_release);
        comm.fail(trainkit::detail::concat(comm.what(seq, d), " failed: the group was aborted: ",
                                           comm.group_->abort_reason()),
                  false);
      }
    }
    Access(const Access&) = delete;
    Access& operator=(const Access&) = delete;
    ~Access() { slot_.accessing.store(false, std::memory_order_release); }

   private:
    detail::RingSlot& slot_;
  };

  // After a failure: wait (bounded by the timeout) until no other rank is in the middle of
  // reading buffers, ours included, so the caller may free them once its Work failed.
  TRAINKIT_INLINE void quiesce() noexcept;

  void publish(std::int64_t progress) {
    group_->slot(rank_).progress.store(progress, std::memory_order_release);
    group_->notify();
  }

  void inject(std::uint64_t seq, std::int64_t unit) const {
    if (group_->options().fault_injection) group_->options().fault_injection(rank_, seq, unit);
  }

  TRAINKIT_INLINE void check_match(std::uint64_t seq, const detail::RingDesc& mine,
                                   const detail::RingDesc& theirs, int peer);

  TRAINKIT_INLINE void run(detail::RingDesc d);

  // A group of one: collectives are local copies.
  void run_alone(const detail::RingDesc& d, std::int64_t es) {
    inject(seq_, 0);
    if (d.kind == detail::RingOp::kAllGather || d.kind == detail::RingOp::kReduceScatter)
      detail::copy_bytes(d.data, d.send, static_cast<std::size_t>(d.count * es));
  }

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::uint64_t seq_ = 0;  // collectives started by this rank (progress thread only)
  std::int64_t base_ = 0;  // progress units of the finished collectives (progress thread only)
  std::vector<std::byte> scratch_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  std::atomic<std::uint64_t> queued_{0};  // collectives ever enqueued
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE ThreadGroup::ThreadGroup(int world_size, ThreadCommOptions options)
    : world_size_(world_size), options_(std::move(options)) {
  TRAINKIT_CHECK(world_size >= 1 && world_size <= 4096,
                 "ThreadGroup: world_size must be in [1, 4096], got ", world_size);
  TRAINKIT_CHECK(options_.chunk_bytes >= 1, "ThreadGroup: chunk_bytes must be >= 1, got ",
                 options_.chunk_bytes);
  detail::check_timeout("ThreadGroup", options_.timeout);
  slots_ = std::make_unique<detail::RingSlot[]>(static_cast<std::size_t>(world_size));
}

TRAINKIT_INLINE void ThreadGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (!aborted_.load(std::memory_order_relaxed)) {
      reason_ = reason;
      aborted_.store(true, std::memory_order_seq_cst);
    }
  }
  notify();
}

TRAINKIT_INLINE void ThreadGroup::notify() {
  handshake();
  if (sleepers_.load(std::memory_order_relaxed) > 0) {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    sleep_cv_.notify_all();
  }
}

TRAINKIT_INLINE ThreadComm::ThreadComm(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  TRAINKIT_CHECK(group_ != nullptr, "ThreadComm: null ThreadGroup");
  TRAINKIT_CHECK(rank >= 0 && rank < group_->world_size(), "ThreadComm: rank ", rank,
                 " is not in [0, ", group_->world_size(), ")");
  TRAINKIT_CHECK(!group_->slot(rank).claimed.exchange(true), "ThreadComm: rank ", rank,
                 " of this ThreadGroup already has a ThreadComm");
  worker_ = std::thread([this] { worker_loop(); });
}

TRAINKIT_INLINE ThreadComm::~ThreadComm() {
  bool in_flight = false;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    in_flight = busy_ || !queue_.empty();
    stop_ = true;
  }
  group_->slot(rank_).left.store(true, std::memory_order_release);
  if (in_flight) {
    group_->abort(trainkit::detail::concat(
        "rank ", rank_,
        " left the group (its ThreadComm was destroyed) with collectives still in flight "
        "(it issued ",
        queued_.load(std::memory_order_relaxed), ")"));
  } else {
    group_->notify();
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

TRAINKIT_INLINE Work ThreadComm::all_reduce(Buffer buf, ReduceOp op) {
  return enqueue(detail::all_reduce_desc(*this, buf, op));
}

TRAINKIT_INLINE Work ThreadComm::broadcast(Buffer buf, int root) {
  return enqueue(detail::broadcast_desc(*this, buf, root));
}

TRAINKIT_INLINE Work ThreadComm::all_gather(Buffer send, Buffer recv) {
  return enqueue(detail::all_gather_desc(*this, send, recv));
}

TRAINKIT_INLINE Work ThreadComm::reduce_scatter(Buffer send, Buffer recv, ReduceOp op) {
  return enqueue(detail::reduce_scatter_desc(*this, send, recv, op));
}

TRAINKIT_INLINE Work ThreadComm::enqueue(const detail::RingDesc& d) {
  auto work = std::make_shared<ThreadWork>(*this);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(Task{d, work});
    queued_.fetch_add(1, std::memory_order_release);
  }
  queue_cv_.notify_one();
  return Work(std::move(work));
}

TRAINKIT_INLINE bool ThreadComm::take(Task& task) {
  if (busy_ || queue_.empty()) return false;
  task = std::move(queue_.front());
  queue_.pop_front();
  busy_ = true;
  return true;
}

TRAINKIT_INLINE void ThreadComm::execute(Task& task) {
  std::exception_ptr error;
  try {
    run(task.desc);
  } catch (const std::exception& e) {
    error = std::current_exception();
    // A failure on one rank fails the group (the first reason is kept), so the other ranks
    // stop waiting for this one now instead of at their timeout.
    group_->abort(trainkit::detail::concat("rank ", rank_, " failed: ", e.what()));
    quiesce();
  } catch (...) {
    error = std::current_exception();
    group_->abort(trainkit::detail::concat("rank ", rank_, " failed: unknown exception"));
    quiesce();
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    busy_ = false;
  }
  queue_cv_.notify_all();
  task.work->complete(error);
}

TRAINKIT_INLINE bool ThreadComm::help() {
  Task task;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!take(task)) return false;
  }
  execute(task);
  return true;
}

TRAINKIT_INLINE void ThreadComm::worker_loop() {
  for (;;) {
    // No spinning here: a thread that waits for its collective runs it itself (help()), and
    // on a machine with few cores a spinning progress thread only delays the rank threads.
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] {
        return (!queue_.empty() && !busy_) || (stop_ && queue_.empty() && !busy_);
      });
      if (!take(task)) return;  // stopping, nothing left
    }
    execute(task);
  }
}

TRAINKIT_INLINE ThreadComm::Plan ThreadComm::plan_for(const detail::RingDesc& d) const {
  const int n = world_size();
  Plan p;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(d.dtype));
  p.chunk_elems =
      std::max<std::int64_t>(1, group_->options().chunk_bytes / std::max<std::int64_t>(es, 1));
  if (n == 1) {
    p.steps = 0;
    return p;
  }
  std::int64_t longest = 0;  // the longest segment a step moves
  switch (d.kind) {
    case detail::RingOp::kAllReduce:
    case detail::RingOp::kBarrier:
      longest = (d.count + n - 1) / n;
      p.steps = 2 * (n - 1);
      break;
    case detail::RingOp::kReduceScatter:
      longest = d.count;
      p.steps = n - 1;
      break;
    case detail::RingOp::kAllGather:
      longest = d.count;
      p.steps = n;
      break;
    case detail::RingOp::kBroadcast:
      longest = d.count;
      p.steps = 1;
      break;
  }
  // At least one unit per step even for empty buffers: every collective synchronises, so a
  // barrier is an empty all_reduce and mismatched calls are detected.
  p.chunks = std::max<std::int64_t>(1, (longest + p.chunk_elems - 1) / p.chunk_elems);
  return p;
}

TRAINKIT_INLINE std::string ThreadComm::what(std::uint64_t seq, const detail::RingDesc& d) const {
  std::string s = trainkit::detail::concat(detail::ring_op_name(d.kind), " #", seq);
  if (d.kind != detail::RingOp::kBarrier)
    s += trainkit::detail::concat(" (", d.count, " x ", dtype_name(d.dtype), ")");
  return s;
}

TRAINKIT_INLINE std::string ThreadComm::diagnose(int peer, std::uint64_t seq) const {
  int p = peer;
  for (int hops = 0; hops < world_size(); ++hops) {
    const int w = group_->slot(p).waiting_on.load(std::memory_order_acquire);
    if (w < 0 || w == rank_) break;
    p = w;
  }
  const detail::RingSlot& s = group_->slot(p);
  const std::uint64_t its_seq = s.seq.load(std::memory_order_acquire);
  std::string where;
  if (its_seq < seq) {
    where = its_seq == 0 ? trainkit::detail::concat("has not entered collective #", seq,
                                                    " (nor any before it)")
                         : trainkit::detail::concat("has not entered collective #", seq,
                                                    " (its last was #", its_seq, ")");
  } else {
    const std::int64_t done =
        s.progress.load(std::memory_order_acquire) - s.base.load(std::memory_order_acquire);
    where = trainkit::detail::concat("is stuck inside collective #", its_seq, " after ", done,
                                     " of its ", s.units.load(std::memory_order_acquire),
                                     " units of work");
  }
  return trainkit::detail::concat("rank ", p, " ", where,
                                  ": it stalled, "
                                  "or its thread ended without destroying its ThreadComm");
}

TRAINKIT_INLINE void ThreadComm::quiesce() noexcept {
  const auto deadline = Clock::now() + group_->options().timeout;
  for (int p = 0; p < world_size(); ++p) {
    if (p == rank_) continue;
    while (group_->slot(p).accessing.load(std::memory_order_seq_cst) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

TRAINKIT_INLINE void ThreadComm::check_match(std::uint64_t seq, const detail::RingDesc& mine,
                                             const detail::RingDesc& theirs, int peer) {
  bool same = mine.kind == theirs.kind;
  if (same && mine.kind != detail::RingOp::kBarrier)
    same = mine.count == theirs.count && mine.dtype == theirs.dtype;
  if (same &&
      (mine.kind == detail::RingOp::kAllReduce || mine.kind == detail::RingOp::kReduceScatter))
    same = mine.op == theirs.op;
  if (same && mine.kind == detail::RingOp::kBroadcast) same = mine.root == theirs.root;
  if (same) return;
  auto describe = [](const detail::RingDesc& x) {
    std::string s = detail::ring_op_name(x.kind);
    if (x.kind == detail::RingOp::kBarrier) return s;
    s += trainkit::detail::concat("(", x.count, " x ", dtype_name(x.dtype));
    if (x.kind == detail::RingOp::kBroadcast) s += trainkit::detail::concat(", root ", x.root);
    if (x.kind == detail::RingOp::kAllReduce || x.kind == detail::RingOp::kReduceScatter)
      s += trainkit::detail::concat(", ", reduce_op_name(x.op));
    return s + ")";
  };
  fail(trainkit::detail::concat("collective #", seq, " does not match: rank ", rank_, " called ",
                                describe(mine), ", rank ", peer, " called ", describe(theirs),
                                " (every rank must issue the same collectives "
                                "in the same order)"),
       true);
}

TRAINKIT_INLINE void ThreadComm::run(detail::RingDesc d) {
  const std::uint64_t seq = ++seq_;
  if (group_->aborted())
    fail(trainkit::detail::concat(
             what(seq, d), " refused: the group was aborted earlier: ", group_->abort_reason()),
         false);
  const int n = world_size();
  const Plan plan = plan_for(d);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(d.dtype));
  if (d.kind == detail::RingOp::kReduceScatter && n > 1) {
    const std::size_t need = static_cast<std::size_t>(d.count * n * es);
    if (scratch_.size() < need) scratch_.assign(need, std::byte{0});
    d.scratch = scratch_.data();
  }
  detail::RingSlot& me = group_->slot(rank_);
  me.desc = d;
  me.base.store(base_, std::memory_order_relaxed);
  me.units.store(plan.units(), std::memory_order_relaxed);
  me.seq.store(seq, std::memory_order_release);
  group_->notify();

  if (n == 1) {
    run_alone(d, es);
    return;
  }
  const int left = (rank_ + n - 1) % n;
  const int right = (rank_ + 1) % n;
  const detail::RingSlot& ls = group_->slot(left);
  const detail::RingSlot& rs = group_->slot(right);
  await(
      left, [&] { return ls.seq.load(std::memory_order_acquire) >= seq; }, seq, d);
  const detail::RingDesc& ld = ls.desc;
  check_match(seq, d, ld, left);

  const std::int64_t base = base_;
  const std::int64_t k_n = plan.chunks;
  const std::int64_t ce = plan.chunk_elems;
  auto left_done = [&](std::int64_t unit) {
    await(
        left, [&] { return ls.progress.load(std::memory_order_acquire) >= base + unit + 1; }, seq,
        d);
  };
  auto right_done = [&](std::int64_t unit) {
    await(
        right, [&] { return rs.progress.load(std::memory_order_acquire) >= base + unit + 1; }, seq,
        d);
  };
  auto mod = [n](std::int64_t x) { return static_cast<int>(((x % n) + n) % n); };
  char* mine = static_cast<char*>(d.data);

  switch (d.kind) {
    case detail::RingOp::kAllReduce:
    case detail::RingOp::kBarrier: {
      const ReduceOp op = d.op == ReduceOp::kAvg ? ReduceOp::kSum : d.op;
      auto segment = [&](int c) { return std::pair(c * d.count / n, (c + 1) * d.count / n); };
      for (std::int64_t g = 0; g < plan.steps; ++g) {
        for (std::int64_t k = 0; k < k_n; ++k) {
          const std::int64_t u = g * k_n + k;
          inject(seq, u);
          if (g < n - 1) {  // reduce-scatter step g
            const auto [sb, se] = segment(mod(rank_ - g - 2));
            const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
            if (g > 0) left_done(u - k_n);
            const int divisor = (g == n - 2 && d.op == ReduceOp::kAvg) ? n : 1;
            const Access access(*this, seq, d);
            detail::combine(d.dtype, op, mine + b * es, mine + b * es,
                            static_cast<const char*>(ld.data) + b * es, e - b, divisor);
          } else {  // all-gather step s
            const std::int64_t s = g - (n - 1);
            const auto [sb, se] = segment(mod(rank_ - 1 - s));
            const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
            left_done(u - k_n);
            right_done(s * k_n + k);  // the right neighbour has read what we overwrite
            const Access access(*this, seq, d);
            detail::copy_bytes(mine + b * es, static_cast<const char*>(ld.data) + b * es,
                               static_cast<std::size_t>((e - b) * es));
          }
          publish(base + u + 1);
        }
      }
      break;
    }
    case detail::RingOp::kReduceScatter: {
      const ReduceOp op = d.op == ReduceOp::kAvg ? ReduceOp::kSum : d.op;
      const std::int64_t m = d.count;
      const char* send = static_cast<const char*>(d.send);
      char* scratch = static_cast<char*>(d.scratch);
      for (std::int64_t s = 0; s < plan.steps; ++s) {
        const std::int64_t c = mod(rank_ - s - 2);
        for (std::int64_t k = 0; k < k_n; ++k) {
          const std::int64_t u = s * k_n + k;
          inject(seq, u);
          const std::int64_t sb = c * m, se = sb + m;
          const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
          if (s > 0) left_done(u - k_n);
          const char* incoming =
              (s == 0 ? static_cast<const char*>(ld.send) : static_cast<const char*>(ld.scratch)) +
              b * es;
          const bool last = s == n - 2;
          char* dst = last ? mine + (b - sb) * es : scratch + b * es;
          const Access access(*this, seq, d);
          detail::combine(d.dtype, op, dst, send + b * es, incoming, e - b,
                          last && d.op == ReduceOp::kAvg ? n : 1);
          publish(base + u + 1);
        }
      }
      break;
    }
    case detail::RingOp::kAllGather: {
      // Its steps have the shape of all_reduce's all-gather phase above; each stays inline with
      // its own unit numbering (a shared step would need both schedules as parameters).
      const std::int64_t m = d.count;
      for (std::int64_t g = 0; g < plan.steps; ++g) {
        const std::int64_t a = g == 0 ? rank_ : mod(rank_ - g);  // segment moved at step g
        for (std::int64_t k = 0; k < k_n; ++k) {
          const std::int64_t u = g * k_n + k;
          inject(seq, u);
          const std::int64_t sb = a * m, se = sb + m;
          const std::int64_t b = std::min(se, sb + k * ce), e = std::min(se, b + ce);
          if (g == 0) {
            detail::copy_bytes(mine + b * es, static_cast<const char*>(d.send) + (b - sb) * es,
                               static_cast<std::size_t>((e - b) * es));
          } else {
            left_done(u - k_n);
            const Access access(*this, seq, d);
            detail::copy_bytes(mine + b * es, static_cast<const char*>(ld.data) + b * es,
                               static_cast<std::size_t>((e - b) * es));
          }
          publish(base + u + 1);
        }
      }
      break;
    }
    case detail::RingOp::kBroadcast: {
      if (rank_ == d.root) {
        inject(seq, 0);
        publish(base + k_n);
        break;
      }
      for (std::int64_t k = 0; k < k_n; ++k) {
        inject(seq, k);
        const std::int64_t b = std::min(d.count, k * ce), e = std::min(d.count, b + ce);
        left_done(k);
        const Access access(*this, seq, d);
        detail::copy_bytes(mine + b * es, static_cast<const char*>(ld.data) + b * es,
                           static_cast<std::size_t>((e - b) * es));
        publish(base + k + 1);
      }
      break;
    }
  }
  // The right neighbour reads our descriptor and buffers until its last unit: only then may
  // the caller reuse them (and we publish the next descriptor).
  right_done(plan.units() - 1);
  base_ += plan.units();
}

#endif  // TRAINKIT_IMPL

}  // namespace dist
TRAINKIT_NAMESPACE_END
