// SPDX-License-Identifier: MIT
// trainkit/exec/host.hpp: exec::Host, the CPU executor, a persistent pool of worker threads.
// `parallel_for(num_tasks, f)` runs f(task) for every task, the calling thread taking part.
//
// Why our own pool and not OpenMP: it needs nothing but <thread> (no -fopenmp, no libgomp/libomp,
// the same definition under g++, clang++ and nvcc, so mixing TUs with and without -fopenmp cannot
// break the ODR); an exception thrown by a task reaches the caller instead of std::terminate;
// nested calls run inline instead of oversubscribing; and an idle worker spins ~0.5 ms and then
// sleeps, where libgomp's default spin (GOMP_SPINCOUNT) or KMP_BLOCKTIME (200 ms) burn cores that
// data loaders need. Results never depend on it: reductions use chunking fixed by the problem size.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace exec {
namespace detail {

/// Tells the core we are spinning (frees pipeline resources for the sibling hyper-thread).
TRAINKIT_INLINE void cpu_relax() noexcept;

/// True on a thread that is running tasks of a pool (always on workers; on the calling thread
/// while its job runs). A parallel_for issued from such a thread runs inline: no deadlock, no
/// oversubscription.
inline bool& in_host_task() noexcept {
  thread_local bool flag = false;
  return flag;
}

/// The most threads an exec::Host runs.
inline constexpr int kMaxHostThreads = 4096;

/// Threads for `Host()`: $TRAINKIT_NUM_THREADS if set, else hardware_concurrency() (>= 1).
TRAINKIT_INLINE int default_num_threads();

/// What `Host()` uses for `hardware` hardware threads (std::thread::hardware_concurrency()): all
/// of them, at least 1 (0 means unknown) and at most kMaxHostThreads.
constexpr int threads_for_hardware(unsigned hardware) noexcept {
  return hardware == 0 ? 1 : hardware > unsigned(kMaxHostThreads) ? kMaxHostThreads : int(hardware);
}

/// The pool behind exec::Host. One job at a time; a job is `run(ctx, task)` for tasks claimed
/// one by one from an atomic counter by the caller and every worker that joins in time.
///
/// Protocol: `state_` packs (epoch << 32 | open bit | number of workers inside the job). A worker
/// joins by CAS-incrementing the count only while the epoch it saw is current and the job open;
/// the caller, once it has claimed all tasks, closes the job by CAS-clearing the open bit when the
/// count is zero. After that no worker can touch the job, so the caller's functor (on its stack)
/// may die. Workers that wake late simply find the job closed: the caller never waits for them.
class HostPool {
 public:
  using RunFn = void (*)(void* ctx, std::int64_t task);

  TRAINKIT_INLINE explicit HostPool(int num_threads);
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  ~HostPool() { stop_and_join(); }

  int num_threads() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  /// Runs the job on the pool and returns true, or returns false at once when another thread's
  /// job occupies the pool (the caller then runs inline). Rethrows the first task exception.
  TRAINKIT_INLINE bool try_run(std::int64_t num_tasks, RunFn run, void* ctx);

 private:
  static constexpr std::uint64_t kOpenBit = std::uint64_t{1} << 31;
  static constexpr std::uint64_t kInsideMask = kOpenBit - 1;
  // Idle workers (and a caller waiting for stragglers) spin this long before blocking: long
  // enough to bridge the serial work between the launches of a training step and between steps
  // (zeroing gradients, reading the loss, the next batch: a few hundred microseconds), short
  // enough not to steal a core from other processes when the program pauses. Waking a sleeping
  // thread costs far more on a virtual machine whose idle vCPU was halted: with 50 us, one
  // GPT-block step at 2 threads after 50 ms of idling took 37 ms instead of 22.
  static constexpr std::chrono::microseconds kSpin{500};

  static std::uint32_t epoch_of(std::uint64_t state) noexcept {
    return static_cast<std::uint32_t>(state >> 32);
  }

  TRAINKIT_INLINE void run_tasks() noexcept;

  TRAINKIT_INLINE void worker_loop() noexcept;

  TRAINKIT_INLINE std::uint64_t wait_for_job(std::uint32_t seen);

  TRAINKIT_INLINE void leave_job();

  // Called by the submitting thread once it found no task left to claim.
  TRAINKIT_INLINE void close_job();

  TRAINKIT_INLINE void stop_and_join() noexcept;

  // Hot atomics on their own cache lines: workers hammer next_ while joiners CAS state_.
  alignas(64) std::atomic<std::uint64_t> state_{0};
  alignas(64) std::atomic<std::int64_t> next_{0};
  alignas(64) std::atomic<bool> failed_{false};
  RunFn run_ = nullptr;
  void* ctx_ = nullptr;
  std::int64_t num_tasks_ = 0;
  std::exception_ptr error_;
  std::uint32_t epoch_ = 0;  // written by the submitter only (under submit_mutex_)

  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stopping_{false};
  std::mutex submit_mutex_;
  std::mutex mutex_;  // guards sleeping workers
  std::condition_variable wake_;
  std::mutex done_mutex_;  // guards a sleeping submitter
  std::condition_variable done_;
  std::vector<std::thread> workers_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

TRAINKIT_INLINE int default_num_threads() {
  const char* env = std::getenv("TRAINKIT_NUM_THREADS");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(env, &end, 10);
    // Digits only: strtol would also take leading blanks and a sign.
    TRAINKIT_CHECK(*env >= '0' && *env <= '9' && end != env && *end == '\0' && errno == 0 &&
                       value >= 1 && value <= kMaxHostThreads,
                   "TRAINKIT_NUM_THREADS='", ::trainkit::detail::printable_bytes(env),
                   "' is not a thread count (expected 1..4096)");
    return static_cast<int>(value);
  }
  return threads_for_hardware(std::thread::hardware_concurrency());
}

TRAINKIT_INLINE HostPool::HostPool(int num_threads) {
  workers_.reserve(static_cast<std::size_t>(num_threads - 1));
  try {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::system_error& e) {
    stop_and_join();
    TRAINKIT_FAIL("exec::Host: cannot start worker thread ", workers_.size() + 1, " of ",
                  num_threads - 1, " (", e.what(), "); use fewer threads");
  } catch (...) {
    stop_and_join();
    throw;
  }
}

TRAINKIT_INLINE bool HostPool::try_run(std::int64_t num_tasks, RunFn run, void* ctx) {
  std::unique_lock<std::mutex> submit(submit_mutex_, std::try_to_lock);
  if (!submit.owns_lock()) return false;

  run_ = run;
  ctx_ = ctx;
  num_tasks_ = num_tasks;
  next_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  ++epoch_;
  // seq_cst store + seq_cst load of sleepers_ pairs with the worker's increment-then-check:
  // either we see the sleeper and notify, or it sees the new epoch before sleeping.
  state_.store((static_cast<std::uint64_t>(epoch_) << 32) | kOpenBit, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }

  {
    bool& flag = in_host_task();
    flag = true;
    run_tasks();
    flag = false;
  }
  close_job();
  std::exception_ptr error = std::exchange(error_, nullptr);
  submit.unlock();
  if (error) std::rethrow_exception(error);
  return true;
}

TRAINKIT_INLINE void HostPool::run_tasks() noexcept {
  for (;;) {
    const std::int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_ || failed_.load(std::memory_order_relaxed)) return;
    try {
      run_(ctx_, task);
    } catch (...) {
      // The first failure wins; later tasks are skipped. Published by leave()/close_job().
      if (!failed_.exchange(true, std::memory_order_relaxed)) error_ = std::current_exception();
    }
  }
}

TRAINKIT_INLINE void HostPool::worker_loop() noexcept {
  in_host_task() = true;
  std::uint32_t seen = 0;
  for (;;) {
    std::uint64_t state = wait_for_job(seen);
    if (stopping_.load(std::memory_order_acquire)) return;
    seen = epoch_of(state);
    while ((state & kOpenBit) != 0 && epoch_of(state) == seen) {
      if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        run_tasks();
        leave_job();
        break;
      }
    }
  }
}

TRAINKIT_INLINE std::uint64_t HostPool::wait_for_job(std::uint32_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (unsigned spin = 1;; ++spin) {
    const std::uint64_t state = state_.load(std::memory_order_acquire);
    if (epoch_of(state) != seen || stopping_.load(std::memory_order_relaxed)) return state;
    if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    cpu_relax();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  std::uint64_t state = 0;
  wake_.wait(lock, [&] {
    state = state_.load(std::memory_order_seq_cst);
    return epoch_of(state) != seen || stopping_.load(std::memory_order_seq_cst);
  });
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return state;
}

TRAINKIT_INLINE void HostPool::leave_job() {
  const std::uint64_t before = state_.fetch_sub(1, std::memory_order_seq_cst);
  if ((before & kInsideMask) == 1 && caller_sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(done_mutex_);
    done_.notify_one();
  }
}

TRAINKIT_INLINE void HostPool::close_job() {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  std::uint64_t state = state_.load(std::memory_order_acquire);
  for (unsigned spin = 1;; ++spin) {
    if ((state & kInsideMask) == 0) {
      if (state_.compare_exchange_weak(state, state & ~kOpenBit, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
        return;
      continue;
    }
    if (spin % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    cpu_relax();
    state = state_.load(std::memory_order_acquire);
  }
  std::unique_lock<std::mutex> lock(done_mutex_);
  caller_sleeping_.store(true, std::memory_order_seq_cst);
  for (;;) {
    state = state_.load(std::memory_order_seq_cst);
    if ((state & kInsideMask) == 0) {
      if (state_.compare_exchange_strong(state, state & ~kOpenBit, std::memory_order_acq_rel,
                                         std::memory_order_acquire))
        break;
      continue;
    }
    done_.wait(lock);
  }
  caller_sleeping_.store(false, std::memory_order_relaxed);
}

TRAINKIT_INLINE void HostPool::stop_and_join() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true, std::memory_order_seq_cst);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_)
    if (worker.joinable()) worker.join();
  workers_.clear();
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// The CPU executor: a persistent thread pool (num_threads - 1 workers plus the calling thread).
/// Move-only; pass it by reference. Most code uses `Host::default_instance()`.
class Host {
 public:
  /// Uses $TRAINKIT_NUM_THREADS threads if set, else std::thread::hardware_concurrency().
  /// Throws trainkit::Error when TRAINKIT_NUM_THREADS is not an integer in 1..4096.
  Host() : Host(detail::default_num_threads()) {}

  /// A pool of exactly `num_threads` threads, the caller included (1 = everything inline).
  /// Throws trainkit::Error when num_threads is not in 1..4096 or a thread cannot be started.
  explicit Host(int num_threads) : num_threads_(num_threads) {
    TRAINKIT_CHECK(num_threads >= 1 && num_threads <= detail::kMaxHostThreads,
                   "exec::Host: num_threads must be in 1..4096, got ", num_threads);
    if (num_threads > 1) pool_ = std::make_unique<detail::HostPool>(num_threads);
  }

  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;
  /// A moved-from Host has one thread and runs everything inline.
  Host(Host&& other) noexcept
      : num_threads_(std::exchange(other.num_threads_, 1)), pool_(std::move(other.pool_)) {}
  Host& operator=(Host&& other) noexcept {
    if (this != &other) {
      pool_ = std::move(other.pool_);
      num_threads_ = std::exchange(other.num_threads_, 1);
    }
    return *this;
  }
  /// Joins the workers.
  ~Host() = default;

  /// The threads a parallel_for may use, the calling thread included.
  int num_threads() const noexcept { return num_threads_; }

  /// The process-wide executor (created on first use with `Host()`, joined at exit).
  static Host& default_instance() {
    static Host instance;
    return instance;
  }

  /// Calls f(task) once for every task in [0, num_tasks) and returns when all have finished.
  /// Tasks run concurrently on the pool's threads and the calling thread, in no fixed order, so
  /// f must be safe to call concurrently (it is called through a reference, not copied).
  /// Runs inline, in task order, when num_tasks <= 1, when the pool has one thread, when called
  /// from inside a task (nested parallelism), or when another thread is using the pool.
  /// If tasks throw, the first exception is rethrown here and the tasks not yet started are
  /// skipped.
  template <class F>
  void parallel_for(std::int64_t num_tasks, F&& f) const {
    if (num_tasks <= 0) return;
    if (num_tasks > 1 && pool_ != nullptr && !detail::in_host_task()) {
      using Fn = std::remove_reference_t<F>;
      const detail::HostPool::RunFn run = [](void* ctx, std::int64_t task) {
        (*static_cast<Fn*>(ctx))(task);
      };
      void* ctx = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
      if (pool_->try_run(num_tasks, run, ctx)) return;
    }
    for (std::int64_t task = 0; task < num_tasks; ++task) f(task);
  }

 private:
  int num_threads_ = 1;
  std::unique_ptr<detail::HostPool> pool_;
};

}  // namespace exec
TRAINKIT_NAMESPACE_END
