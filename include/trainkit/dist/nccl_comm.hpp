// SPDX-License-Identifier: MIT
// trainkit/dist/nccl_comm.hpp: NcclComm, the communicator for device buffers (one GPU per rank,
// any number of nodes). RAII over ncclComm_t: created non-blocking from a unique id that rank 0
// makes and shares out of band (dist::init does it over MPI or a TCP rendezvous at
// MASTER_ADDR:MASTER_PORT), destroyed with ncclCommFinalize/Destroy, or ncclCommAbort after an
// error. Every wait polls ncclCommGetAsyncError against a timeout, so a dead peer becomes a
// trainkit::Error and an abort, not a hang. Needs TRAINKIT_WITH_NCCL (the body is empty without).
#pragma once

#include "trainkit/config.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/error.hpp"

#if TRAINKIT_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/core/dtype.hpp"
#include "trainkit/cuda/device.hpp"
#include "trainkit/cuda/stream.hpp"
#include "trainkit/dist/device_kernels.hpp"

// ncclAvg and ncclBfloat16 appeared in 2.10.3; non-blocking init (ncclConfig_t) and
// ncclCommFinalize in 2.14.
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 3)
#define TRAINKIT_DETAIL_NCCL_HAS_AVG 1
#else
#define TRAINKIT_DETAIL_NCCL_HAS_AVG 0
#endif
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 3)
#define TRAINKIT_DETAIL_NCCL_HAS_CONFIG 1
#else
#define TRAINKIT_DETAIL_NCCL_HAS_CONFIG 0
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Options of an NcclComm.
struct NcclOptions {
  /// Init, and every Work::wait(), fail (and abort the communicator) after this long without
  /// completing. Default: default_timeout() ($TRAINKIT_DIST_TIMEOUT or 300 s).
  std::chrono::milliseconds timeout = default_timeout();
  /// Create the communicator non-blocking (ncclConfig_t::blocking = 0, NCCL >= 2.14), so init is
  /// bounded by the timeout too. Otherwise init blocks until every rank joined.
  bool nonblocking = true;
};

namespace detail {

using NcclClock = std::chrono::steady_clock;

/// The NCCL communicator shared by an NcclComm and its pending Work (the comm must outlive the
/// events that are polled against it). Destroyed with finalize+destroy, or aborted once failed.
class NcclHandle {
 public:
  NcclHandle(int rank, int world_size, std::chrono::milliseconds timeout)
      : rank_(rank), world_size_(world_size), timeout_(timeout) {}
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ~NcclHandle() {
    if (comm_ == nullptr) return;
    if (failed()) return;  // already aborted
#if TRAINKIT_DETAIL_NCCL_HAS_CONFIG
    // Finalize flushes queued work; in non-blocking mode it returns ncclInProgress and we poll.
    bool clean = TRAINKIT_NCCL_CHECK_NOTHROW(ncclCommFinalize(comm_));
    const auto deadline = NcclClock::now() + timeout_;
    while (clean) {
      ncclResult_t state = ncclSuccess;
      if (!TRAINKIT_NCCL_CHECK_NOTHROW(ncclCommGetAsyncError(comm_, &state)) ||
          (state != ncclSuccess && state != ncclInProgress) || NcclClock::now() > deadline) {
        clean = false;
        break;
      }
      if (state == ncclSuccess) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!clean) {
      TRAINKIT_NCCL_CHECK_NOTHROW(ncclCommAbort(comm_));
      return;
    }
#endif
    TRAINKIT_NCCL_CHECK_NOTHROW(ncclCommDestroy(comm_));
  }

  ncclComm_t& comm() noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::string reason() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reason_;
  }

  /// Aborts the communicator (once) and remembers why. Never throws.
  void abort(const std::string& reason) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      reason_ = reason;
    } catch (...) {
    }
    failed_.store(true, std::memory_order_release);
    if (comm_ != nullptr) TRAINKIT_NCCL_CHECK_NOTHROW(ncclCommAbort(comm_));
  }

  /// Aborts with `reason` and throws it as trainkit::Error (library "NCCL", `code`).
  [[noreturn]] void fail(const std::string& reason, int code = 0) {
    const std::string full = trainkit::detail::concat("NcclComm rank ", rank_, ": ", reason);
    abort(full);
    throw Error(trainkit::detail::concat("trainkit: ", full), "NCCL", code);
  }

  /// Throws (after aborting) when NCCL reports an asynchronous error; true while an operation is
  /// still being enqueued (ncclInProgress of a non-blocking communicator).
  bool poll(const std::string& what) {
    if (failed())
      throw Error(trainkit::detail::concat("trainkit: NcclComm rank ", rank_, ": ", what,
                                           " refused: the communicator was aborted: ", reason()),
                  "NCCL");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
    if (status != ncclSuccess)
      fail(trainkit::detail::concat(
               what, ": ncclCommGetAsyncError failed: ", trainkit::detail::nccl_message(status)),
           status);
    if (state == ncclInProgress) return true;
    if (state != ncclSuccess)
      fail(trainkit::detail::concat(what, ": asynchronous NCCL error (a peer failed or exited?): ",
                                    trainkit::detail::nccl_message(state)),
           state);
    return false;
  }

  /// Waits until a non-blocking communicator finished enqueueing (init, a collective, a group);
  /// fails after the timeout.
  void wait_ready(const std::string& what, NcclClock::time_point start) {
    while (poll(what)) {
      if (NcclClock::now() - start > timeout_)
        fail(trainkit::detail::concat(what, " did not finish within ",
                                      static_cast<double>(timeout_.count()) / 1000.0,
                                      " s: not every rank joined (check the unique-id exchange, "
                                      "MASTER_ADDR/MASTER_PORT, NCCL_SOCKET_IFNAME); "
                                      "the communicator was aborted"));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::string reason_;
};

/// A collective on the device: done when its event completed. wait() polls the event and
/// ncclCommGetAsyncError and aborts the communicator when the timeout passes.
class NcclWork final : public WorkState {
 public:
  NcclWork(std::shared_ptr<NcclHandle> handle, std::string what)
      : handle_(std::move(handle)), what_(std::move(what)), start_(NcclClock::now()) {
    TRAINKIT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~NcclWork() override {
    if (event_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
  }

  cudaEvent_t event() const noexcept { return event_; }

  /// Records the event on `stream`, after the collective (and its follow-up kernels).
  void record(cudaStream_t stream) {
    TRAINKIT_CUDA_CHECK(cudaEventRecord(event_, stream));
    recorded_ = true;
  }
  /// False while the collective waits, inside an open group(), for ncclGroupEnd to enqueue it.
  bool recorded() const noexcept { return recorded_; }
  /// Throws when the collective is not enqueued yet: an event never recorded counts as complete
  /// for CUDA, so a wait on it would return (or order a stream) before the collective ran.
  void check_recorded(const char* who) const {
    if (!recorded_ && handle_->failed()) (void)handle_->poll(what_);  // throws why it aborted
    TRAINKIT_CHECK(recorded_, "NcclComm rank ", handle_->rank(), ": ", who, " on ", what_,
                   " inside the group() that issued it: the collective starts only when the "
                   "group ends; wait after the group");
  }

  void wait() override {
    check_recorded("Work::wait()");
    for (unsigned i = 0;; ++i) {
      if (test()) return;
      if (NcclClock::now() - start_ > handle_->timeout())
        handle_->fail(trainkit::detail::concat(
            what_, " did not complete within ",
            static_cast<double>(handle_->timeout().count()) / 1000.0,
            " s: a peer is stalled or dead; the communicator was aborted"));
      if (i > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  bool test() override {
    if (!recorded_) {  // in an open group (not started), or its group failed (throws)
      (void)handle_->poll(what_);
      return false;
    }
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) TRAINKIT_CUDA_CHECK(status);
    (void)cudaGetLastError();
    (void)handle_->poll(what_);
    return false;
  }

 private:
  std::shared_ptr<NcclHandle> handle_;
  std::string what_;
  NcclClock::time_point start_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

/// NCCL's element type for a reducible dtype.
inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
#if TRAINKIT_DETAIL_NCCL_HAS_AVG
    case DType::kBF16: return ncclBfloat16;
#endif
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    default: break;
  }
  TRAINKIT_FAIL("NcclComm: NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, " cannot reduce ", dtype_name(t));
}

}  // namespace detail

/// A communicator over NCCL: rank `rank` of `world_size`, on the CUDA device that was current when
/// it was created. Device buffers only.
///
/// Streams: collectives run on the communicator's own stream (stream()), after the work queued
/// so far on the caller stream (set_stream(); default: the legacy default stream), so they are
/// asynchronous with respect to the caller's stream. Work::wait() blocks the host (polling with
/// the timeout); wait_on(work, s) orders stream s after it without blocking the host.
/// group() fuses the collectives issued while it lives into one NCCL group.
/// kAvg is ncclAvg (NCCL >= 2.10.3), else a sum and a division kernel. Max/min follow NCCL's
/// NaN handling.
class NcclComm final : public Comm {
 public:
  /// A fresh unique id (call on one rank and share the 128 bytes with the others).
  static ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    TRAINKIT_NCCL_CHECK(ncclGetUniqueId(&id));
    return id;
  }

  /// NCCL's runtime version code (e.g. 22809 for 2.28.9).
  static int version() {
    int v = 0;
    TRAINKIT_NCCL_CHECK(ncclGetVersion(&v));
    return v;
  }

  /// Joins the communicator `id` as `rank` of `world_size` on the current CUDA device. Every rank
  /// must call it with the same id. Throws trainkit::Error (after aborting) when init fails or
  /// does not finish within the timeout.
  NcclComm(int rank, int world_size, const ncclUniqueId& id, NcclOptions options = {})
      : options_(std::move(options)) {
    TRAINKIT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "NcclComm: rank ", rank,
                   " is not in [0, ", world_size, ")");
    detail::check_timeout("NcclComm", options_.timeout);
    TRAINKIT_CUDA_CHECK(cudaGetDevice(&device_));
    TRAINKIT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    handle_ = std::make_shared<detail::NcclHandle>(rank, world_size, options_.timeout);
    const auto start = detail::NcclClock::now();
#if TRAINKIT_DETAIL_NCCL_HAS_CONFIG
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = options_.nonblocking ? 0 : 1;
    const ncclResult_t status =
        ncclCommInitRankConfig(&handle_->comm(), world_size, id, rank, &config);
#else
    const ncclResult_t status = ncclCommInitRank(&handle_->comm(), world_size, id, rank);
#endif
    if (status != ncclSuccess && status != ncclInProgress)
      handle_->fail(
          trainkit::detail::concat("ncclCommInitRank(world_size ", world_size, ", device ", device_,
                                   ") failed: ", trainkit::detail::nccl_message(status)),
          status);
    handle_->wait_ready("ncclCommInitRank", start);
#if TRAINKIT_DETAIL_NCCL_HAS_AVG
    has_avg_ = version() >= 21003;
#endif
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// Finalizes and destroys the communicator once no Work refers to it any more (aborts it after
  /// an error). Never throws.
  ~NcclComm() override {
    if (ready_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaEventDestroy(ready_));
    if (barrier_buf_ != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(barrier_buf_));
  }

  int rank() const noexcept override { return handle_->rank(); }
  int world_size() const noexcept override { return handle_->world_size(); }
  std::string_view backend() const noexcept override { return "NcclComm"; }
  Space space() const noexcept override { return Space::kDevice; }

  ncclComm_t native() const noexcept { return handle_->comm(); }
  /// The CUDA device of this communicator.
  int device() const noexcept { return device_; }
  /// The stream the collectives run on.
  cuda::StreamRef stream() const noexcept { return stream_.ref(); }
  /// Later collectives start after the work queued on `caller` at the time of the call.
  void set_stream(cuda::StreamRef caller) noexcept { caller_ = caller; }
  cuda::StreamRef caller_stream() const noexcept { return caller_; }
  /// True once the communicator was aborted after an error; every collective then fails.
  bool failed() const noexcept { return handle_->failed(); }

  /// Makes `stream` wait (on the device, no host block) for the collective behind `work`.
  void wait_on(const Work& work, cuda::StreamRef stream) const {
    if (!work.valid()) return;
    auto* nccl = dynamic_cast<const detail::NcclWork*>(work.state().get());
    TRAINKIT_CHECK(nccl != nullptr, "NcclComm::wait_on: the Work is not from an NcclComm");
    nccl->check_recorded("wait_on()");
    stream.wait(nccl->event());
  }

  /// Throws trainkit::Error (and aborts) when NCCL reports an asynchronous error. Cheap: call it
  /// once per step to turn a dead peer into an error before the next host synchronisation.
  void check_async_error() { (void)handle_->poll("check_async_error"); }

  /// Aborts the communicator: pending and later collectives fail. Never throws.
  void abort() noexcept { handle_->abort("aborted by the program"); }

  /// RAII NCCL group: collectives issued while it lives are fused (ncclGroupStart/End); their
  /// Work completes after the group ended (before that, test() is false and wait() or wait_on()
  /// throw: the collective has not started). Nest freely.
  class Group {
   public:
    explicit Group(NcclComm& comm) : comm_(&comm) { comm.group_start(); }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    /// Ends the group. Errors are reported by the collectives' Work (and check_async_error()).
    ~Group() {
      try {
        comm_->group_end();
      } catch (const std::exception& e) {
        trainkit::detail::log_error(e.what(), "ncclGroupEnd", __FILE__, __LINE__);
      }
    }

   private:
    NcclComm* comm_;
  };
  [[nodiscard]] Group group() { return Group(*this); }

  Work all_reduce(Buffer buf, ReduceOp op) override {
    detail::check_all_reduce(*this, buf);
    const bool avg_by_hand = op == ReduceOp::kAvg && !has_avg_;
    if (avg_by_hand) check_avg_fallback();
    const ncclDataType_t type = detail::nccl_type(buf.dtype);
    const ncclRedOp_t red = nccl_op(op);
    Work work = issue(describe("all_reduce", buf), [&](cudaStream_t s) {
      return ncclAllReduce(buf.data, buf.data, static_cast<std::size_t>(buf.count), type, red,
                           handle_->comm(), s);
    });
    if (avg_by_hand) divide_after(work, buf);
    return work;
  }

  Work broadcast(Buffer buf, int root) override {
    detail::check_broadcast(*this, buf, root);
    const auto [type, n] = move_type(buf);
    return issue(describe("broadcast", buf), [&](cudaStream_t s) {
      return ncclBroadcast(buf.data, buf.data, n, type, root, handle_->comm(), s);
    });
  }

  Work all_gather(Buffer send, Buffer recv) override {
    detail::check_all_gather(*this, send, recv);
    const auto [type, n] = move_type(send);
    return issue(describe("all_gather", send), [&](cudaStream_t s) {
      return ncclAllGather(send.data, recv.data, n, type, handle_->comm(), s);
    });
  }

  Work reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    detail::check_reduce_scatter(*this, send, recv);
    const bool avg_by_hand = op == ReduceOp::kAvg && !has_avg_;
    if (avg_by_hand) check_avg_fallback();
    const ncclDataType_t type = detail::nccl_type(recv.dtype);
    const ncclRedOp_t red = nccl_op(op);
    Work work = issue(describe("reduce_scatter", recv), [&](cudaStream_t s) {
      return ncclReduceScatter(send.data, recv.data, static_cast<std::size_t>(recv.count), type,
                               red, handle_->comm(), s);
    });
    if (avg_by_hand) divide_after(work, recv);
    return work;
  }

  /// An all_reduce of one int32 on a small device buffer (NCCL has no barrier).
  Work barrier() override {
    if (barrier_buf_ == nullptr) {
      // On the communicator's device, whichever device the calling thread has current.
      cuda::DeviceGuard guard(device_);
      TRAINKIT_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(std::int32_t)));
    }
    return issue("barrier", [&](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, handle_->comm(), s);
    });
  }

 private:
  friend class Group;

  ncclRedOp_t nccl_op(ReduceOp op) const noexcept {
    switch (op) {
      case ReduceOp::kSum: return ncclSum;
      case ReduceOp::kMax: return ncclMax;
      case ReduceOp::kMin: return ncclMin;
      case ReduceOp::kAvg:
#if TRAINKIT_DETAIL_NCCL_HAS_AVG
        return has_avg_ ? ncclAvg : ncclSum;
#else
        return ncclSum;
#endif
    }
    return ncclSum;
  }

  // Data movement of any dtype: reducible types as themselves, the others as bytes.
  static std::pair<ncclDataType_t, std::size_t> move_type(const Buffer& b) {
    if (is_reducible(b.dtype) && (b.dtype != DType::kBF16 || TRAINKIT_DETAIL_NCCL_HAS_AVG))
      return {detail::nccl_type(b.dtype), static_cast<std::size_t>(b.count)};
    return {ncclUint8, b.bytes()};
  }

  std::string describe(const char* op, const Buffer& b) const {
    return trainkit::detail::concat(op, " #", seq_ + 1, " (", b.count, " x ", dtype_name(b.dtype),
                                    ")");
  }

  template <class Call>
  Work issue(const std::string& what, Call&& call) {
    cuda::DeviceGuard guard(device_);
    const auto start = detail::NcclClock::now();
    (void)handle_->poll(what);  // refuses at once when aborted
    ++seq_;
    TRAINKIT_CUDA_CHECK(cudaEventRecord(ready_, caller_.get()));
    TRAINKIT_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), ready_, 0));
    auto work = std::make_shared<detail::NcclWork>(handle_, what);
    const ncclResult_t status = call(stream_.get());
    if (status != ncclSuccess && status != ncclInProgress)
      handle_->fail(
          trainkit::detail::concat(what, " failed: ", trainkit::detail::nccl_message(status)),
          status);
    if (group_depth_ > 0) {
      grouped_.push_back(work);  // enqueued only at ncclGroupEnd
    } else {
      handle_->wait_ready(what, start);
      work->record(stream_.get());
    }
    return Work(std::move(work));
  }

  // Without ncclAvg an average is a sum and a division kernel after it.
  void check_avg_fallback() const {
    TRAINKIT_CHECK(group_depth_ == 0,
                   "NcclComm: kAvg inside a group() needs ncclAvg (NCCL >= 2.10.3); this NCCL is ",
                   NCCL_MAJOR, ".", NCCL_MINOR, ": use kSum and scale");
    (void)detail::require_device_kernels("NcclComm kAvg on NCCL < 2.10.3");
  }

  void divide_after(Work& work, const Buffer& b) {
    const auto& kernels = detail::device_kernels();
    cuda::DeviceGuard guard(device_);
    kernels.divide(b.dtype, b.data, b.count, world_size(), stream_.get());
    static_cast<detail::NcclWork*>(work.state().get())->record(stream_.get());
  }

  void group_start() {
    TRAINKIT_NCCL_CHECK(ncclGroupStart());
    ++group_depth_;
  }

  void group_end() {
    cuda::DeviceGuard guard(device_);
    const auto start = detail::NcclClock::now();
    --group_depth_;
    const ncclResult_t status = ncclGroupEnd();
    if (group_depth_ > 0) {
      TRAINKIT_NCCL_CHECK(status);
      return;
    }
    std::vector<std::shared_ptr<detail::NcclWork>> works = std::move(grouped_);
    grouped_.clear();
    if (status != ncclSuccess && status != ncclInProgress)
      handle_->fail(
          trainkit::detail::concat("ncclGroupEnd failed: ", trainkit::detail::nccl_message(status)),
          status);
    handle_->wait_ready("ncclGroupEnd", start);
    for (const auto& w : works) w->record(stream_.get());
  }

  NcclOptions options_;
  std::shared_ptr<detail::NcclHandle> handle_;
  int device_ = 0;
  cuda::Stream stream_;
  cuda::StreamRef caller_;
  cudaEvent_t ready_ = nullptr;
  void* barrier_buf_ = nullptr;
  bool has_avg_ = false;
  int group_depth_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::shared_ptr<detail::NcclWork>> grouped_;
};

}  // namespace dist
TRAINKIT_NAMESPACE_END

#endif  // TRAINKIT_WITH_NCCL
