// SPDX-License-Identifier: MIT
// trainkit/dist/bucketer.hpp: GradBucketer, data parallelism with PyTorch DDP's semantics over a
// ParamArena. Buckets are slices of its flat gradient buffer in reverse registration order (1 MiB
// first, then 25 MiB); a bucket's all-reduce (the average over ranks, optionally in bf16) starts
// as soon as backward marked its last gradient ready and overlaps the rest of backward. no_sync()
// skips it for gradient accumulation; construction checks the ranks' layouts, broadcasts rank 0's.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/dist/device_kernels.hpp"
#include "trainkit/dist/nccl_comm.hpp"
#include "trainkit/error.hpp"
#include "trainkit/nn/param_arena.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/cuda/stream.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace dist {

/// Options of a GradBucketer (PyTorch DDP's defaults).
struct BucketOptions {
  /// Size cap of the first bucket (the last parameters registered): kDefaultFirstBucketBytes.
  std::int64_t first_bucket_bytes = std::int64_t{1} << 20;
  /// Size cap of the other buckets: bucket_cap_mb = 25. A bucket closes once it holds at least
  /// its cap, so a large parameter makes a bucket of its own.
  std::int64_t bucket_bytes = std::int64_t{25} << 20;
  /// All-reduce the gradients as bf16 (half the bytes on the wire; Horovod's Compression.fp16 with
  /// bf16's range), averaged in f32 steps where the backend allows; stored back as f32.
  bool bf16_compression = false;
  /// Broadcast rank 0's parameters to every rank at construction (DDP does).
  bool broadcast_parameters = true;
  /// Check at construction that every rank registered the same names, shapes and dtypes in the
  /// same order; the first difference is reported on every rank.
  bool check_layout = true;
};

/// One bucket: elements [offset, offset + count) of the arena's gradient buffer (the parameters
/// and the alignment padding between them).
struct Bucket {
  std::int64_t offset = 0;
  std::int64_t count = 0;
  /// Its parameters in the order backward produces them (reverse registration order).
  std::vector<nn::ParamId> params;
};

namespace detail {

/// "'fc.weight' [64, 32] F32": one parameter of a layout, as compared across ranks.
inline std::string layout_record(const nn::ParamInfo& p) {
  return trainkit::detail::concat("'", p.name, "' ", p.shape.to_string(), " F32");
}

}  // namespace detail

/// Data-parallel gradient averaging with DDP's semantics for a ParamArena in memory space S.
///
/// Per step: zero the gradients, run forward and backward, call mark_ready(p) for each parameter
/// as soon as its gradient is final (typically after each layer's backward), then finish(),
/// which waits for the remaining all-reduces: every rank then holds the average of all ranks'
/// gradients. Buckets are all-reduced strictly in index order, so every rank issues the same
/// collectives in the same order whatever order its backward marks parameters in.
///
/// Host arenas: the all-reduces run on the communicator's progress thread (ThreadComm, MpiComm),
/// overlapping the rest of backward on the calling thread. Device arenas need an NcclComm: each
/// bucket's all-reduce runs on the communicator's stream after the work queued on the stream
/// given to mark_ready; finish(stream) orders `stream` after all of them without a host sync.
///
/// The arena must outlive the bucketer and keep its layout; the bucketer must outlive its
/// in-flight all-reduces (its destructor waits for them).
template <Space S = Space::kHost>
class GradBucketer {
 public:
  /// Splits the arena into buckets, checks the layout across ranks and broadcasts rank 0's
  /// parameters (options permitting). Collective: every rank constructs its bucketer together.
  /// Throws trainkit::Error when the layouts differ (naming the first difference), when the
  /// arena is not finalized, or when the communicator does not move S memory.
  GradBucketer(nn::ParamArena<S>& arena, Comm& comm, BucketOptions options = {})
      : arena_(&arena), comm_(&comm), options_(options) {
    TRAINKIT_CHECK(arena.finalized(), "GradBucketer: finalize() the ParamArena first");
    TRAINKIT_CHECK(comm.space() == S, "GradBucketer: a ", space_name(S), " arena needs a ",
                   "communicator of ", space_name(S), " memory; ", comm.backend(), " moves ",
                   space_name(comm.space()), " memory");
    TRAINKIT_CHECK(options_.first_bucket_bytes > 0 && options_.bucket_bytes > 0,
                   "GradBucketer: bucket sizes must be positive");
    if constexpr (S == Space::kDevice) {
#if TRAINKIT_WITH_NCCL
      nccl_ = dynamic_cast<NcclComm*>(&comm);
#endif
      TRAINKIT_CHECK(nccl_ != nullptr, "GradBucketer: device arenas need an NcclComm");
    }
    assign_buckets();
    if (options_.check_layout) check_layout();
    if (options_.broadcast_parameters && arena.buffer_numel() > 0)
      comm.broadcast(Buffer(arena.params_data(), arena.buffer_numel(), DType::kF32, S), 0).wait();
    if (options_.bf16_compression) {
      staging_ = Tensor<bf16, S>(Shape{std::max<std::int64_t>(arena.buffer_numel(), 1)});
#if TRAINKIT_WITH_CUDA
      if constexpr (S == Space::kDevice)
        (void)detail::require_device_kernels("GradBucketer bf16 compression on the device");
#endif
    }
#if TRAINKIT_WITH_CUDA
    if constexpr (S == Space::kDevice) {
      events_.resize(buckets_.size(), nullptr);
      for (auto& e : events_)
        TRAINKIT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
#endif
    reset_iteration();
  }
  GradBucketer(const GradBucketer&) = delete;
  GradBucketer& operator=(const GradBucketer&) = delete;

  /// Waits for in-flight all-reduces (their errors are logged, not thrown).
  ~GradBucketer() {
    for (Work& w : works_) {
      try {
        w.wait();
      } catch (const std::exception& e) {
        trainkit::detail::log_error(e.what(), "GradBucketer: in-flight all-reduce", __FILE__,
                                    __LINE__);
      }
    }
#if TRAINKIT_WITH_CUDA
    for (auto& e : events_)
      if (e != nullptr) TRAINKIT_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
#endif
  }

  /// Host arenas: the gradient of `id` is final for this backward pass. Starts every bucket that
  /// is now complete and whose predecessors have started. Under no_sync() it does nothing.
  /// Throws trainkit::Error for an invalid id or a parameter marked twice in one pass.
  void mark_ready(nn::ParamId id) {
    static_assert(S == Space::kHost,
                  "GradBucketer<device>::mark_ready needs the stream that produced the gradient: "
                  "mark_ready(id, stream)");
    if (!mark(id)) return;
    while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) launch(next_launch_++);
  }

#if TRAINKIT_WITH_CUDA
  /// Device arenas: the gradient of `id` is final once the work queued on `stream` so far has
  /// run. The bucket's all-reduce is ordered after it on the communicator's stream.
  void mark_ready(nn::ParamId id, cuda::StreamRef stream) {
    static_assert(S == Space::kDevice, "GradBucketer<host>::mark_ready takes no stream");
    if (!mark(id)) return;
    while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0)
      launch_device(next_launch_++, stream);
  }

  /// Device arenas: makes `stream` wait (on the device) for every bucket of this pass; the
  /// gradients are averaged for work queued on `stream` afterwards. No host synchronisation;
  /// NCCL's asynchronous errors are checked. Throws when a parameter was never marked ready.
  void finish(cuda::StreamRef stream) {
    static_assert(S == Space::kDevice, "GradBucketer<host>::finish takes no stream");
    if (!syncing_) return;
    check_all_launched([this, stream](std::size_t b) {
      // All bits set: a NaN in every f32 gradient of the bucket.
      TRAINKIT_CUDA_CHECK(cudaMemsetAsync(arena_->grads_data() + buckets_[b].offset, 0xFF,
                                          static_cast<std::size_t>(buckets_[b].count) * 4,
                                          stream.get()));
      launch_device(b, stream);
    });
#if TRAINKIT_WITH_NCCL
    nccl_->check_async_error();
#endif
    for (cudaEvent_t e : events_) stream.wait(e);
    reset_iteration();
  }
#endif

  /// Waits until every bucket of this backward pass is averaged (device arenas: on the host,
  /// with the communicator's timeout). Records the time spent waiting (last_wait_seconds(): the
  /// communication that backward did not hide). Under no_sync() it does nothing.
  /// Throws trainkit::Error when a parameter was never marked ready or an all-reduce failed.
  void finish() {
    if (!syncing_) return;
    check_all_launched([this](std::size_t b) {
      if constexpr (S == Space::kHost) {
        float* g = arena_->grads_data() + buckets_[b].offset;
        std::fill(g, g + buckets_[b].count, std::numeric_limits<float>::quiet_NaN());
        launch(b);
      } else {
#if TRAINKIT_WITH_NCCL
        // Device gradients cannot be written from the host: the NaN fill and the all-reduce go
        // on the stream the communicator orders its collectives after.
        const cuda::StreamRef stream = nccl_->caller_stream();
        TRAINKIT_CUDA_CHECK(cudaMemsetAsync(arena_->grads_data() + buckets_[b].offset, 0xFF,
                                            static_cast<std::size_t>(buckets_[b].count) * 4,
                                            stream.get()));
        launch_device(b, stream);
#endif
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::exception_ptr first;
    for (Work& w : works_) {
      try {
        w.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) {
      reset_iteration();
      std::rethrow_exception(first);
    }
    if constexpr (S == Space::kHost) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) copy_back(b);
    } else {
#if TRAINKIT_WITH_CUDA
      for (cudaEvent_t e : events_) TRAINKIT_CUDA_CHECK(cudaEventSynchronize(e));
#endif
    }
    last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    reset_iteration();
  }

  /// While a NoSync lives, mark_ready and finish do nothing: gradients accumulate locally in
  /// the arena (DDP's no_sync()). The first backward pass after it synchronises the accumulated
  /// gradients. Start it before a backward pass, not in the middle of one.
  class [[nodiscard]] NoSync {
   public:
    explicit NoSync(GradBucketer& b) : b_(&b), previous_(b.syncing_) {
      TRAINKIT_CHECK(b.marked_count_ == 0,
                     "GradBucketer::no_sync() in the middle of a backward pass (", b.marked_count_,
                     " parameters already marked ready)");
      b.syncing_ = false;
    }
    NoSync(NoSync&& o) noexcept : b_(std::exchange(o.b_, nullptr)), previous_(o.previous_) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync() {
      if (b_ != nullptr) b_->syncing_ = previous_;
    }

   private:
    GradBucketer* b_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  /// False inside no_sync().
  bool syncing() const noexcept { return syncing_; }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  /// The bucket holding parameter `id`.
  std::size_t bucket_of(nn::ParamId id) const { return bucket_of_[check_id(id, "bucket_of")]; }
  /// True once bucket `b` of the current backward pass has been averaged into the arena's
  /// gradients (never blocks; throws when its all-reduce failed). Device arenas: true once it
  /// was enqueued and the device finished it (with bf16 compression, the average's conversion
  /// back to f32 included).
  bool reduced(std::size_t b) {
    TRAINKIT_CHECK(b < buckets_.size(), "GradBucketer::reduced: bucket ", b, " of ",
                   buckets_.size());
    if (b >= next_launch_ || !works_[b].test()) return false;
    if constexpr (S == Space::kHost) {
      copy_back(b);  // bf16 compression: the average to f32
    } else {
#if TRAINKIT_WITH_CUDA
      // With bf16 compression the average reaches the f32 gradients in a kernel queued after the
      // all-reduce: the bucket is done when its event (recorded after that kernel) is.
      if (!event_done(events_[b])) return false;
#endif
    }
    return true;
  }
  /// Seconds the last finish() blocked waiting for all-reduces.
  double last_wait_seconds() const noexcept { return last_wait_; }
  Comm& comm() noexcept { return *comm_; }
  const BucketOptions& options() const noexcept { return options_; }

 private:
  std::size_t check_id(nn::ParamId id, const char* who) const {
    TRAINKIT_CHECK(id.valid() && static_cast<std::size_t>(id.index) < bucket_of_.size(),
                   "GradBucketer::", who, ": invalid parameter id ", id.index, " (",
                   bucket_of_.size(), " registered)");
    return static_cast<std::size_t>(id.index);
  }

  // DDP's _compute_bucket_assignment_by_size over the parameters in reverse registration order:
  // add parameters until the bucket holds at least its cap (1 MiB for the first, then 25 MiB).
  void assign_buckets() {
    const auto& infos = arena_->infos();
    const std::size_t n = infos.size();
    bucket_of_.assign(n, 0);
    std::int64_t cap = options_.first_bucket_bytes, bytes = 0;
    Bucket current;
    auto close = [&] {
      if (current.params.empty()) return;
      const std::size_t lo = static_cast<std::size_t>(current.params.back().index);
      const std::size_t hi = static_cast<std::size_t>(current.params.front().index);
      current.offset = infos[lo].offset;
      const std::int64_t end = hi + 1 < n ? infos[hi + 1].offset : arena_->buffer_numel();
      current.count = end - current.offset;
      buckets_.push_back(std::move(current));
      current = Bucket();
      bytes = 0;
      cap = options_.bucket_bytes;
    };
    for (std::size_t i = n; i-- > 0;) {
      bucket_of_[i] = buckets_.size();
      current.params.push_back(nn::ParamId{static_cast<std::int32_t>(i)});
      bytes += infos[i].numel * static_cast<std::int64_t>(sizeof(float));
      if (bytes >= cap) close();
    }
    close();
    pending_.assign(buckets_.size(), 0);
    works_.assign(buckets_.size(), Work());
  }

  // Host, bf16 compression: bucket b's average from the staging buffer into the gradients, once
  // per backward pass (its all-reduce has completed).
  void copy_back(std::size_t b) {
    if (!options_.bf16_compression || copied_[b]) return;
    const Bucket& bk = buckets_[b];
    const bf16* src = staging_.data() + bk.offset;
    float* dst = arena_->grads_data() + bk.offset;
    for (std::int64_t i = 0; i < bk.count; ++i) dst[i] = static_cast<float>(src[i]);
    copied_[b] = true;
  }

  void reset_iteration() {
    copied_.assign(buckets_.size(), false);
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      pending_[b] = static_cast<std::int64_t>(buckets_[b].params.size());
    marked_.assign(bucket_of_.size(), false);
    marked_count_ = 0;
    next_launch_ = 0;
  }

  // Bookkeeping of mark_ready; false when nothing is to be done (no_sync).
  bool mark(nn::ParamId id) {
    const std::size_t i = check_id(id, "mark_ready");
    if (!syncing_) return false;
    TRAINKIT_CHECK(!marked_[i], "GradBucketer::mark_ready: parameter '", arena_->infos()[i].name,
                   "' marked ready twice in one backward pass (call finish() after each pass)");
    marked_[i] = true;
    ++marked_count_;
    --pending_[bucket_of_[i]];
    return true;
  }

  // A parameter was never marked: this rank throws naming it. So that every rank still issues
  // the same collectives (the next pass would otherwise pair its buckets with another rank's
  // earlier ones), the buckets held back are launched anyway, filled with NaN (`poison_and_launch`
  // fills and launches bucket b): every rank's average of them is NaN, and its step sees
  // non-finite gradients instead of a silently wrong average.
  template <class PoisonAndLaunch>
  void check_all_launched(PoisonAndLaunch&& poison_and_launch) {
    if (next_launch_ == buckets_.size()) return;
    // Name the first parameter (in backward order) that held the buckets back.
    std::string name;
    for (const nn::ParamId p : buckets_[next_launch_].params)
      if (!marked_[static_cast<std::size_t>(p.index)]) {
        name = arena_->infos()[static_cast<std::size_t>(p.index)].name;
        break;
      }
    const std::size_t launched = next_launch_;
    for (std::size_t b = launched; b < buckets_.size(); ++b) poison_and_launch(b);
    next_launch_ = buckets_.size();
    // The started all-reduces still write the gradients: let them finish before the caller
    // touches them again.
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      try {
        works_[b].wait();
      } catch (...) {
      }
    }
#if TRAINKIT_WITH_CUDA
    // Device arenas with bf16 compression: the kernel that stores each average as f32 runs
    // after its all-reduce, on the communicator's stream; it must be done too, or it would
    // overwrite what the caller writes into the gradients next (zeroing them for the next pass).
    if constexpr (S == Space::kDevice)
      for (cudaEvent_t e : events_) TRAINKIT_CUDA_CHECK_NOTHROW(cudaEventSynchronize(e));
#endif
    reset_iteration();
    TRAINKIT_FAIL("GradBucketer::finish: parameter '", name, "' (bucket ", launched,
                  ") was never marked ready in this backward pass, so buckets ", launched, "..",
                  buckets_.size() - 1,
                  " were reduced as NaN on every rank "
                  "(every parameter must get a gradient and be marked on every rank)");
  }

  void launch(std::size_t b) {
    const Bucket& bk = buckets_[b];
    float* grads = arena_->grads_data() + bk.offset;
    if (options_.bf16_compression) {
      bf16* dst = staging_.data() + bk.offset;
      for (std::int64_t i = 0; i < bk.count; ++i) dst[i] = bf16(grads[i]);
      works_[b] = comm_->all_reduce(Buffer(dst, bk.count, DType::kBF16, S), ReduceOp::kAvg);
    } else {
      works_[b] = comm_->all_reduce(Buffer(grads, bk.count, DType::kF32, S), ReduceOp::kAvg);
    }
  }

#if TRAINKIT_WITH_CUDA
  // True once the work before `e` finished (never blocks).
  static bool event_done(cudaEvent_t e) { return cuda::detail::query_done(cudaEventQuery(e)); }

  void launch_device(std::size_t b, cuda::StreamRef stream) {
#if TRAINKIT_WITH_NCCL
    const Bucket& bk = buckets_[b];
    float* grads = arena_->grads_data() + bk.offset;
    // The communicator orders this bucket after `stream`, then goes back to its previous caller
    // stream: it must not keep a reference to a stream that may be destroyed before its next
    // collective.
    struct Restore {
      NcclComm* comm;
      cuda::StreamRef previous;
      ~Restore() { comm->set_stream(previous); }
    } restore{nccl_, nccl_->caller_stream()};
    nccl_->set_stream(stream);
    if (options_.bf16_compression) {
      const auto& k = detail::require_device_kernels("GradBucketer bf16 compression");
      bf16* packed = staging_.data() + bk.offset;
      k.f32_to_bf16(grads, packed, bk.count, stream.get());
      works_[b] = nccl_->all_reduce(Buffer(packed, bk.count, DType::kBF16, S), ReduceOp::kAvg);
      k.bf16_to_f32(packed, grads, bk.count, nccl_->stream().get());
    } else {
      works_[b] = nccl_->all_reduce(Buffer(grads, bk.count, DType::kF32, S), ReduceOp::kAvg);
    }
    TRAINKIT_CUDA_CHECK(cudaEventRecord(events_[b], nccl_->stream().get()));
#else
    (void)b;
    (void)stream;
#endif
  }
#endif

  // Collective check that all ranks registered the same parameters (see BucketOptions).
  void check_layout() {
    const auto& infos = arena_->infos();
    std::vector<std::string> mine;
    mine.reserve(infos.size());
    for (const auto& p : infos) mine.push_back(detail::layout_record(p));
    std::string blob;
    for (const auto& r : mine) blob += r + '\n';

    // Rank 0's layout to everyone.
    std::string root = blob;
    std::vector<std::int64_t> len{static_cast<std::int64_t>(root.size())};
    host_collective(len, [&](Buffer b) { return comm_->broadcast(b, 0); });
    root.resize(static_cast<std::size_t>(len[0]));
    std::vector<std::uint8_t> bytes(root.begin(), root.end());
    host_collective(bytes, [&](Buffer b) { return comm_->broadcast(b, 0); });
    std::vector<std::string> theirs;
    {
      std::string cur;
      for (std::uint8_t c : bytes) {
        if (c == '\n') {
          theirs.push_back(cur);
          cur.clear();
        } else {
          cur += static_cast<char>(c);
        }
      }
    }

    // The first difference on any rank: min over (index * size + rank).
    constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
    std::int64_t index = kNone;
    const std::size_t common = std::min(mine.size(), theirs.size());
    for (std::size_t i = 0; i < common && index == kNone; ++i)
      if (mine[i] != theirs[i]) index = static_cast<std::int64_t>(i);
    if (index == kNone && mine.size() != theirs.size()) index = static_cast<std::int64_t>(common);
    std::vector<std::int64_t> key{index == kNone ? kNone
                                                 : index * comm_->world_size() + comm_->rank()};
    host_collective(key, [&](Buffer b) { return comm_->all_reduce(b, ReduceOp::kMin); });
    if (key[0] == kNone) return;

    const std::int64_t at = key[0] / comm_->world_size();
    const int culprit = static_cast<int>(key[0] % comm_->world_size());
    auto record = [at](const std::vector<std::string>& recs, int who) {
      return static_cast<std::size_t>(at) < recs.size()
                 ? recs[static_cast<std::size_t>(at)]
                 : trainkit::detail::concat("nothing (rank ", who, " registered only ", recs.size(),
                                            " parameters)");
    };
    std::string culprit_record = record(mine, comm_->rank());
    std::vector<std::int64_t> clen{static_cast<std::int64_t>(culprit_record.size())};
    host_collective(clen, [&](Buffer b) { return comm_->broadcast(b, culprit); });
    culprit_record.resize(static_cast<std::size_t>(clen[0]));
    std::vector<std::uint8_t> cbytes(culprit_record.begin(), culprit_record.end());
    host_collective(cbytes, [&](Buffer b) { return comm_->broadcast(b, culprit); });
    TRAINKIT_FAIL("GradBucketer: the ranks registered different parameters: parameter #", at,
                  " is ", record(theirs, 0), " on rank 0 but ",
                  std::string(cbytes.begin(), cbytes.end()), " on rank ", culprit,
                  " (every rank must register the same parameters in the same order)");
  }

  // Runs a collective on a small host vector (through a device copy for device communicators)
  // and waits for it.
  template <class T, class Op>
  void host_collective(std::vector<T>& data, Op&& op) {
    if constexpr (S == Space::kHost) {
      op(Buffer(data.data(), static_cast<std::int64_t>(data.size()), dtype_of<T>, S)).wait();
    } else {
#if TRAINKIT_WITH_NCCL  // (a device arena has an NcclComm: the constructor checked)
      void* dev = nullptr;
      const std::size_t bytes = std::max<std::size_t>(data.size() * sizeof(T), 1);
      TRAINKIT_CUDA_CHECK(cudaMalloc(&dev, bytes));
      struct Free {
        void* p;
        ~Free() { TRAINKIT_CUDA_CHECK_NOTHROW(cudaFree(p)); }
      } guard{dev};
      // Queued on the stream the collective is ordered after: a cudaMemcpy from pageable memory
      // returns before its transfer has landed, and the communicator's stream does not wait for
      // the legacy default stream when set_stream() named another one.
      if (!data.empty())
        TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(dev, data.data(), data.size() * sizeof(T),
                                            cudaMemcpyHostToDevice, nccl_->caller_stream().get()));
      op(Buffer(dev, static_cast<std::int64_t>(data.size()), dtype_of<T>, S)).wait();
      if (!data.empty())
        TRAINKIT_CUDA_CHECK(
            cudaMemcpy(data.data(), dev, data.size() * sizeof(T), cudaMemcpyDeviceToHost));
#endif
    }
  }

  nn::ParamArena<S>* arena_;
  Comm* comm_;
  BucketOptions options_;
#if TRAINKIT_WITH_NCCL
  NcclComm* nccl_ = nullptr;
#else
  void* nccl_ = nullptr;
#endif
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::int64_t> pending_;   // unmarked parameters per bucket
  std::vector<bool> copied_;            // host bf16: bucket's average copied back this pass
  std::vector<bool> marked_;
  std::size_t marked_count_ = 0;
  std::size_t next_launch_ = 0;  // buckets [0, next_launch_) have started
  std::vector<Work> works_;
  Tensor<bf16, S> staging_;
  bool syncing_ = true;
  double last_wait_ = 0.0;
#if TRAINKIT_WITH_CUDA
  std::vector<cudaEvent_t> events_;  // device arenas: bucket b is averaged
#endif
};

}  // namespace dist
TRAINKIT_NAMESPACE_END
