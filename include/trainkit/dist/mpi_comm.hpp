// SPDX-License-Identifier: MIT
// trainkit/dist/mpi_comm.hpp: MpiComm, the communicator over MPI (Open MPI, MPICH) for CPU
// processes on one or many machines (`mpirun -np N ./train`, `srun --mpi=pmix`). RAII: MPI is
// initialised by the first MpiComm and finalized by the last. Errors come back as trainkit::Error
// (the communicator uses MPI_ERRORS_RETURN, and so does MPI_COMM_WORLD when MpiComm initialised
// MPI), and a watchdog bounds every collective: see MpiComm
// for what happens when a peer stalls or dies. Needs TRAINKIT_WITH_MPI (the body is empty without).
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_MPI
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/dist/host_reduce.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Options of an MpiComm.
struct MpiOptions {
  /// A collective that has not completed this long after it started fails with trainkit::Error
  /// and breaks the communicator. Default: default_timeout() ($TRAINKIT_DIST_TIMEOUT or 300 s).
  std::chrono::milliseconds timeout = default_timeout();
  /// When the communicator is broken (a collective failed or timed out), its destructor calls
  /// MPI_Abort(MPI_COMM_WORLD, 1) (true, the default): MPI_Finalize would wait forever for the
  /// missing peer, and the abort makes mpirun end the whole job. With false the destructor
  /// returns without finalizing MPI; the process must then exit on its own.
  bool abort_on_failure = true;
};

namespace detail {

/// MPI reduction callbacks for what MPI has no built-in type or semantics for: BF16/F16 (as a
/// 2-byte type), and NaN-propagating max/min for floats (MPI_MAX's NaN handling is unspecified).
/// MPI's contract: inout[i] = in[i] op inout[i].
template <class T, ReduceOp Op>
inline void mpi_user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_typed<T>(Op, static_cast<T*>(inout), static_cast<const T*>(inout),
                   static_cast<const T*>(in), *len, 1);
}

/// Process-wide MPI state. The first acquire() initialises MPI (requesting MPI_THREAD_MULTIPLE;
/// MpiComm's progress thread needs at least MPI_THREAD_SERIALIZED) unless the program already
/// did; the last release finalizes it when we initialised it. Also owns the BF16/F16 datatype and
/// the user-defined reduction ops.
class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> acquire() {
    static std::mutex mutex;
    static std::weak_ptr<MpiRuntime> current;
    std::lock_guard<std::mutex> lock(mutex);
    if (auto existing = current.lock()) return existing;
    std::shared_ptr<MpiRuntime> runtime(new MpiRuntime());
    current = runtime;
    return runtime;
  }
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op& op : ops_)
      if (op != MPI_OP_NULL) TRAINKIT_MPI_CHECK_NOTHROW(MPI_Op_free(&op));
    if (half_ != MPI_DATATYPE_NULL) TRAINKIT_MPI_CHECK_NOTHROW(MPI_Type_free(&half_));
    if (owns_) TRAINKIT_MPI_CHECK_NOTHROW(MPI_Finalize());
  }

  /// The thread support level MPI provides.
  int thread_level() const noexcept { return thread_level_; }

  /// The MPI datatype that moves one element of `t` in a reduction.
  MPI_Datatype datatype(DType t) const {
    switch (t) {
      case DType::kF32: return MPI_FLOAT;
      case DType::kF64: return MPI_DOUBLE;
      case DType::kI32: return MPI_INT32_T;
      case DType::kI64: return MPI_INT64_T;
      case DType::kBF16:
      case DType::kF16: return half_;
      default: break;
    }
    TRAINKIT_FAIL("MpiComm: cannot reduce ", dtype_name(t));
  }

  /// The MPI reduction op for (dtype, op); kAvg reduces with the sum (MpiComm divides after).
  MPI_Op op(DType t, ReduceOp op) const {
    const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAvg;
    if (t == DType::kI32 || t == DType::kI64)
      return sum ? MPI_SUM : op == ReduceOp::kMax ? MPI_MAX : MPI_MIN;
    if (sum && (t == DType::kF32 || t == DType::kF64)) return MPI_SUM;
    const int which = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;
    switch (t) {
      case DType::kBF16: return ops_[which];
      case DType::kF16: return ops_[3 + which];
      case DType::kF32: return ops_[6 + which - 1];
      case DType::kF64: return ops_[8 + which - 1];
      default: break;
    }
    TRAINKIT_FAIL("MpiComm: cannot reduce ", dtype_name(t));
  }

 private:
  MpiRuntime() {
    int initialized = 0, finalized = 0;
    TRAINKIT_MPI_CHECK(MPI_Initialized(&initialized));
    TRAINKIT_MPI_CHECK(MPI_Finalized(&finalized));
    TRAINKIT_CHECK(!finalized,
                   "MpiComm: MPI has already been finalized in this process "
                   "(MPI cannot be initialised twice: keep one MpiComm for the whole run)");
    if (!initialized) {
      TRAINKIT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_));
      owns_ = true;
      // Open MPI reports some errors of non-blocking collectives (a truncated message) through
      // MPI_COMM_WORLD's handler, which aborts the job by default; MPI initialised here is ours
      // to configure, so they come back as trainkit::Error too. (A program that initialised MPI
      // keeps its own handler.)
      TRAINKIT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    } else {
      TRAINKIT_MPI_CHECK(MPI_Query_thread(&thread_level_));
    }
    TRAINKIT_CHECK(
        thread_level_ >= MPI_THREAD_SERIALIZED,
        "MpiComm needs MPI_THREAD_SERIALIZED or better (its progress thread calls MPI); "
        "this MPI provides level ",
        thread_level_,
        (initialized ? " (MPI was initialised by the program: use MPI_Init_thread)" : ""));
    TRAINKIT_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &half_));
    TRAINKIT_MPI_CHECK(MPI_Type_commit(&half_));
    MPI_User_function* const fns[kNumOps] = {
        &mpi_user_reduce<bf16, ReduceOp::kSum>,   &mpi_user_reduce<bf16, ReduceOp::kMax>,
        &mpi_user_reduce<bf16, ReduceOp::kMin>,   &mpi_user_reduce<f16, ReduceOp::kSum>,
        &mpi_user_reduce<f16, ReduceOp::kMax>,    &mpi_user_reduce<f16, ReduceOp::kMin>,
        &mpi_user_reduce<float, ReduceOp::kMax>,  &mpi_user_reduce<float, ReduceOp::kMin>,
        &mpi_user_reduce<double, ReduceOp::kMax>, &mpi_user_reduce<double, ReduceOp::kMin>};
    for (int i = 0; i < kNumOps; ++i) TRAINKIT_MPI_CHECK(MPI_Op_create(fns[i], 1, &ops_[i]));
  }

  static constexpr int kNumOps = 10;
  bool owns_ = false;
  int thread_level_ = 0;
  MPI_Datatype half_ = MPI_DATATYPE_NULL;
  MPI_Op ops_[kNumOps] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                          MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace detail

/// A communicator over MPI: its ranks are the processes of an MPI communicator (MPI_COMM_WORLD by
/// default, duplicated so our traffic never matches the program's own). Collectives run on the
/// communicator's progress thread as MPI non-blocking collectives, one at a time in call order,
/// so they overlap with the caller's computation (the thread drives MPI's progress). Host
/// buffers; device buffers too when the MPI is CUDA-aware (cuda_aware()), except for kAvg.
///
/// Faults, honestly: MPI cannot cancel a collective or tell which rank is missing. A collective
/// that has not completed within options.timeout fails with a trainkit::Error saying so, and the
/// communicator is broken from then on (every later collective fails at once); the destructor then
/// calls MPI_Abort (see MpiOptions::abort_on_failure), which makes mpirun end every process. A
/// rank that *exits* is normally handled by the launcher first: Open MPI's mpirun ends the whole
/// job when a process exits without MPI_Finalize. A rank that *stalls* (alive, not calling the
/// collective) is what the timeout catches: every other rank fails within the timeout.
class MpiComm final : public Comm {
 public:
  /// Initialises MPI if needed and uses a duplicate of MPI_COMM_WORLD.
  explicit MpiComm(MpiOptions options = {}) : MpiComm(MPI_COMM_WORLD, std::move(options)) {}

  /// Uses a duplicate of `parent` (the program's communicator, e.g. from MPI_Comm_split).
  /// Initialises MPI first if needed (then `parent` must be MPI_COMM_WORLD or MPI_COMM_SELF).
  MpiComm(MPI_Comm parent, MpiOptions options)
      : options_(std::move(options)), runtime_(detail::MpiRuntime::acquire()) {
    detail::check_timeout("MpiComm", options_.timeout);
    TRAINKIT_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    TRAINKIT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TRAINKIT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    TRAINKIT_MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    cuda_aware_ = MPIX_Query_cuda_support() == 1;
#endif
    worker_ = std::thread([this] { worker_loop(); });
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  /// Joins the progress thread and frees the communicator; MPI is finalized with the last
  /// MpiComm (when trainkit initialised it). A broken communicator aborts the job instead (see
  /// MpiOptions::abort_on_failure). Never throws.
  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (busy_ || !queue_.empty())
        mark_broken("the MpiComm was destroyed with collectives in flight");
      stop_ = true;
    }
    queue_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    if (broken()) {
      if (options_.abort_on_failure) {
        std::fprintf(stderr, "trainkit: MpiComm rank %d: calling MPI_Abort: %s\n", rank_,
                     broken_reason().c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      // A pending collective still references comm_: freeing it or finalizing could hang, so
      // both are deliberately leaked.
      new std::shared_ptr<detail::MpiRuntime>(std::move(runtime_));
      return;
    }
    TRAINKIT_MPI_CHECK_NOTHROW(MPI_Comm_free(&comm_));
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_size_; }
  std::string_view backend() const noexcept override { return "MpiComm"; }
  Space space() const noexcept override { return Space::kHost; }

  /// The duplicated MPI communicator (do not issue collectives on it concurrently with ours).
  MPI_Comm native() const noexcept { return comm_; }
  /// True when the MPI library reports CUDA support (device buffers are then accepted).
  bool cuda_aware() const noexcept { return cuda_aware_; }
  /// True after a collective failed or timed out; every later collective fails.
  bool broken() const noexcept { return broken_flag_.load(std::memory_order_acquire); }
  /// Why the communicator is broken ("" when it is not).
  std::string broken_reason() const {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    return broken_reason_;
  }

  Work all_reduce(Buffer buf, ReduceOp op) override {
    check_space(buf, "all_reduce", op);
    TRAINKIT_CHECK(is_reducible(buf.dtype), "MpiComm rank ", rank_, ": all_reduce cannot reduce ",
                   dtype_name(buf.dtype), " (supported: F32, BF16, F16, F64, I32, I64)");
    return enqueue({Kind::kAllReduce, op, buf, Buffer(), 0});
  }
  Work broadcast(Buffer buf, int root) override {
    check_space(buf, "broadcast", ReduceOp::kSum);
    detail::check_broadcast(*this, with_host_space(buf), root);
    return enqueue({Kind::kBroadcast, ReduceOp::kSum, buf, Buffer(), root});
  }
  Work all_gather(Buffer send, Buffer recv) override {
    check_space(send, "all_gather", ReduceOp::kSum);
    check_space(recv, "all_gather", ReduceOp::kSum);
    detail::check_all_gather(*this, with_host_space(send), with_host_space(recv));
    check_int_count(send.bytes(), "all_gather");
    return enqueue({Kind::kAllGather, ReduceOp::kSum, recv, send, 0});
  }
  Work reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    check_space(send, "reduce_scatter", op);
    check_space(recv, "reduce_scatter", op);
    detail::check_reduce_scatter(*this, with_host_space(send), with_host_space(recv));
    check_int_count(static_cast<std::size_t>(recv.count), "reduce_scatter");
    return enqueue({Kind::kReduceScatter, op, recv, send, 0});
  }
  Work barrier() override {
    return enqueue({Kind::kBarrier, ReduceOp::kSum, Buffer(), Buffer(), 0});
  }

 private:
  using Clock = std::chrono::steady_clock;
  // all_reduce and broadcast of more elements than an int holds are split into pieces this big.
  static constexpr std::int64_t kMaxPiece = std::int64_t{1} << 30;

  enum class Kind : std::uint8_t { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };
  struct Op {
    Kind kind;
    ReduceOp op;
    Buffer data;  // all_reduce/broadcast buffer, all_gather/reduce_scatter recv
    Buffer send;  // all_gather/reduce_scatter send
    int root;
  };
  struct Task {
    Op op;
    std::shared_ptr<detail::HostWork> work;
  };

  static const char* kind_name(Kind k) noexcept {
    switch (k) {
      case Kind::kAllReduce: return "all_reduce";
      case Kind::kBroadcast: return "broadcast";
      case Kind::kAllGather: return "all_gather";
      case Kind::kReduceScatter: return "reduce_scatter";
      case Kind::kBarrier: return "barrier";
    }
    return "?";
  }

  static Buffer with_host_space(Buffer b) noexcept {
    b.space = Space::kHost;
    return b;
  }

  void check_space(const Buffer& b, const char* op, ReduceOp reduce) const {
    if (b.space == Space::kHost) return;
    TRAINKIT_CHECK(cuda_aware_, "MpiComm rank ", rank_, ": ", op,
                   ": device buffer, but this MPI is not CUDA-aware "
                   "(use NcclComm for device memory, or copy to the host)");
    TRAINKIT_CHECK(reduce != ReduceOp::kAvg, "MpiComm rank ", rank_, ": ", op,
                   ": kAvg on device buffers is not supported (reduce with kSum and scale)");
  }

  void check_int_count(std::size_t n, const char* op) const {
    TRAINKIT_CHECK(n <= static_cast<std::size_t>(INT_MAX), "MpiComm rank ", rank_, ": ", op, " of ",
                   n, " elements per rank exceeds MPI's int count; split the call");
  }

  void mark_broken(const std::string& reason) {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (broken_flag_.load(std::memory_order_relaxed)) return;
    broken_reason_ = reason;
    broken_flag_.store(true, std::memory_order_release);
  }

  Work enqueue(const Op& op) {
    auto work = std::make_shared<detail::HostWork>();
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      queue_.push_back(Task{op, work});
    }
    queue_cv_.notify_one();
    return Work(std::move(work));
  }

  void worker_loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::exception_ptr error;
      try {
        execute(task.op, ++seq_);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        busy_ = false;
      }
      task.work->complete(error);
    }
  }

  std::string what(const Op& op, std::uint64_t seq) const {
    std::string s = trainkit::detail::concat(kind_name(op.kind), " #", seq);
    if (op.kind != Kind::kBarrier)
      s += trainkit::detail::concat(" (", op.data.count, " x ", dtype_name(op.data.dtype), ")");
    return s;
  }

  // Completes `request`, polling MPI (which drives its progress) until it finishes or the
  // deadline passes; MPI errors and the timeout break the communicator.
  void complete(MPI_Request& request, const Op& op, std::uint64_t seq, Clock::time_point start) {
    const auto deadline = start + options_.timeout;
    for (unsigned i = 0;; ++i) {
      int done = 0;
      const int status = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (status != MPI_SUCCESS) {
        const std::string reason =
            trainkit::detail::concat("MpiComm rank ", rank_, ": ", what(op, seq),
                                     " failed: ", trainkit::detail::mpi_message(status));
        mark_broken(reason);
        throw Error(trainkit::detail::concat("trainkit: ", reason), "MPI", status);
      }
      if (done) return;
      if (Clock::now() >= deadline) {
        const std::string reason = trainkit::detail::concat(
            "MpiComm rank ", rank_, ": ", what(op, seq), " did not complete within ",
            static_cast<double>(options_.timeout.count()) / 1000.0,
            " s: a rank has not called it, is stalled, or died (MPI cannot say which); "
            "the communicator is broken");
        mark_broken(reason);
        TRAINKIT_FAIL(reason);
      }
      bool stopping = false;
      {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        stopping = stop_;
      }
      if (stopping) {
        mark_broken(trainkit::detail::concat("the MpiComm was destroyed during ", what(op, seq)));
        TRAINKIT_FAIL("MpiComm rank ", rank_, ": destroyed during ", what(op, seq));
      }
      // Poll hard at first (latency), then back off so a waiting rank leaves the core to the
      // computation it overlaps with.
      if (i > 2000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void execute(const Op& op, std::uint64_t seq) {
    if (broken())
      TRAINKIT_FAIL("MpiComm rank ", rank_, ": ", what(op, seq),
                    " refused: the communicator is broken: ", broken_reason());
    const auto start = Clock::now();
    MPI_Request request = MPI_REQUEST_NULL;
    auto check = [&](int status, const char* call) {
      if (status == MPI_SUCCESS) return;
      const std::string reason =
          trainkit::detail::concat("MpiComm rank ", rank_, ": ", call, " for ", what(op, seq),
                                   " failed: ", trainkit::detail::mpi_message(status));
      mark_broken(reason);
      throw Error(trainkit::detail::concat("trainkit: ", reason), "MPI", status);
    };
    const Buffer& b = op.data;
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(b.dtype));
    switch (op.kind) {
      case Kind::kAllReduce: {
        const MPI_Datatype type = runtime_->datatype(b.dtype);
        const MPI_Op mpi_op = runtime_->op(b.dtype, op.op);
        for (std::int64_t at = 0; at < b.count; at += kMaxPiece) {
          const int n = static_cast<int>(std::min(kMaxPiece, b.count - at));
          check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(b.data) + at * es, n, type, mpi_op,
                               comm_, &request),
                "MPI_Iallreduce");
          complete(request, op, seq, start);
        }
        if (op.op == ReduceOp::kAvg) detail::divide(b.dtype, b.data, b.count, world_size_);
        return;
      }
      case Kind::kBroadcast: {
        const std::int64_t bytes = b.count * es;
        // Every rank must pass the root's size: MPI would fill a larger buffer only in part (or
        // fail on a smaller one), so the sizes are compared first, and every rank fails alike.
        std::int64_t sizes[2] = {bytes, -bytes};
        check(MPI_Iallreduce(MPI_IN_PLACE, sizes, 2, MPI_INT64_T, MPI_MAX, comm_, &request),
              "MPI_Iallreduce (the broadcast's sizes)");
        complete(request, op, seq, start);
        if (sizes[0] != bytes || -sizes[1] != bytes) {
          const std::string reason = trainkit::detail::concat(
              "MpiComm rank ", rank_, ": ", what(op, seq), " of ", bytes,
              " bytes, but the ranks passed between ", -sizes[1], " and ", sizes[0],
              " bytes: every rank must broadcast the root's size");
          mark_broken(reason);
          TRAINKIT_FAIL(reason);
        }
        std::int64_t at = 0;
        do {  // at least once: a broadcast of nothing still synchronises like the others
          const int n = static_cast<int>(std::min(kMaxPiece, bytes - at));
          check(MPI_Ibcast(static_cast<char*>(b.data) + at, n, MPI_BYTE, op.root, comm_, &request),
                "MPI_Ibcast");
          complete(request, op, seq, start);
          at += n;
        } while (at < bytes);
        return;
      }
      case Kind::kAllGather: {
        const int n = static_cast<int>(op.send.count * es);
        const bool in_place =
            op.send.data == static_cast<char*>(b.data) + rank_ * op.send.count * es;
        check(MPI_Iallgather(in_place ? MPI_IN_PLACE : op.send.data, n, MPI_BYTE, b.data, n,
                             MPI_BYTE, comm_, &request),
              "MPI_Iallgather");
        complete(request, op, seq, start);
        return;
      }
      case Kind::kReduceScatter: {
        const int n = static_cast<int>(b.count);
        const bool in_place = b.data == static_cast<char*>(op.send.data) + rank_ * b.count * es;
        // MPI's own in-place form would overwrite the start of the send buffer: receive into a
        // temporary instead, so only this rank's slice changes (as with the other backends).
        std::vector<std::byte> staging(in_place ? static_cast<std::size_t>(b.count * es) : 0);
        void* recv = in_place ? static_cast<void*>(staging.data()) : b.data;
        check(MPI_Ireduce_scatter_block(op.send.data, recv, n, runtime_->datatype(b.dtype),
                                        runtime_->op(b.dtype, op.op), comm_, &request),
              "MPI_Ireduce_scatter_block");
        complete(request, op, seq, start);
        if (in_place) detail::copy_bytes(b.data, recv, staging.size());
        if (op.op == ReduceOp::kAvg) detail::divide(b.dtype, b.data, b.count, world_size_);
        return;
      }
      case Kind::kBarrier: {
        check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
        complete(request, op, seq, start);
        return;
      }
    }
  }

  MpiOptions options_;
  std::shared_ptr<detail::MpiRuntime> runtime_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  bool cuda_aware_ = false;
  std::uint64_t seq_ = 0;  // progress thread only

  std::atomic<bool> broken_flag_{false};
  mutable std::mutex broken_mutex_;
  std::string broken_reason_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace dist
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_MPI
