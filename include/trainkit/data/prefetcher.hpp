// SPDX-License-Identifier: MIT
// trainkit/data/prefetcher.hpp: the Prefetcher, trainkit's DataLoader. `num_workers` threads read
// samples straight into a ring of `depth` batch slots (pinned when a GPU exists); in device mode
// each finished slot is copied to the device on a copy stream and the consumer's stream waits on
// an event (no host sync). Batch k is a pure function of (sampler, epoch, k), so the order never
// depends on thread timing, state()/restore() resume mid-epoch exactly, and memory is bounded by
// depth x batch. Threads, not processes: nothing is pickled or copied per worker.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/cuda/device.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/cuda/event.hpp"
#include "trainkit/cuda/stream.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// Where a sample sits, handed to transforms (augmentations key their randomness on it).
struct SampleInfo {
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;  ///< sample number within the epoch (batch * batch_size + row)
  std::int64_t index = 0;      ///< dataset index (streaming datasets: equal to position)
};

/// A per-sample host transform run by the workers: reads `in` (the dataset's fields), writes
/// `out` (the batch fields). With PrefetchOptions::output_fields empty, `in` and `out` are the
/// same memory (transform in place). Must be deterministic in (info, in) and thread-safe.
using SampleTransform =
    std::function<void(const SampleInfo&, const SampleRef& in, const SampleRef& out)>;

struct PrefetchOptions {
  std::size_t batch_size = 1;
  std::size_t num_workers = 2;  ///< reader threads (streaming datasets always use one)
  std::size_t depth = 4;  ///< batch slots, 2 to 4096; memory = depth x one batch (x2 on device)
  /// Drop each epoch's final partial batch. A streaming dataset then reads one batch ahead (one
  /// more batch of memory) to know which full batch is its epoch's last.
  bool drop_last = false;
  bool pin_memory = true;           ///< pinned slots when a CUDA device exists (else plain memory)
  std::uint64_t epoch = 0;          ///< the first epoch
  std::string name = "Prefetcher";  ///< used in error messages
  SampleTransform transform{};      ///< optional per-sample transform (augmentation)
  std::vector<FieldSpec> output_fields{};  ///< batch fields when `transform` changes them
};

/// The position of the next batch next() returns: save it with a checkpoint, restore() it to
/// resume at exactly that batch.
struct PrefetchState {
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;  ///< batch index within the epoch
  friend bool operator==(const PrefetchState&, const PrefetchState&) = default;
};

/// Time the consumer spent blocked in next() (data-wait): the loader is keeping up when this
/// stays a small fraction of the step time.
struct PrefetchStats {
  std::uint64_t batches = 0;  ///< batches returned since construction / reset_stats()
  double wait_seconds = 0;    ///< total time blocked in next()
  double last_wait_seconds = 0;
};

/// One batch. Valid until the next call to next(), restore() or the Prefetcher's destruction;
/// each field is `size()` rows of its FieldSpec. In device mode device pointers/views refer to
/// device memory that is ready for work queued on the consumer's stream after next() returned;
/// host pointers/views stay valid in both modes.
class Batch {
 public:
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// Batch index within the epoch.
  std::uint64_t index() const noexcept { return index_; }
  /// Rows in this batch (batch_size except possibly the last batch of an epoch).
  std::size_t size() const noexcept { return size_; }
  bool last_in_epoch() const noexcept { return last_; }
  bool on_device() const noexcept { return !device_.empty(); }
  const std::vector<FieldSpec>& fields() const noexcept { return *fields_; }

  /// The dataset index of every row (host).
  std::span<const std::int64_t> indices() const noexcept { return {indices_, size_}; }
  /// The row indices in device memory (device mode; null otherwise), for device augmentations.
  const std::int64_t* device_indices() const noexcept { return device_indices_; }

  /// Field k's rows on the host (pinned or plain memory).
  std::span<std::byte> host_bytes(std::size_t k) const {
    return {host_.at(k), size_ * (*fields_)[k].bytes()};
  }
  /// Field k's rows in device memory (device mode only; throws otherwise).
  std::byte* device_bytes(std::size_t k) const {
    TRAINKIT_CHECK(on_device(), "Batch::device_bytes: the Prefetcher runs in host mode");
    return device_.at(k);
  }

  /// A host view of field `name` as [rows, sample dims...]; R = 1 + sample rank. Throws when T
  /// or R do not match the field.
  template <class T, int R>
  HostView<T, R> host(std::string_view name) const {
    const std::size_t k = check_view<T, R>(name);
    return HostView<T, R>(reinterpret_cast<T*>(host_[k]), extents<R>(k));
  }
  /// A device view of field `name` (device mode only).
  template <class T, int R>
  DeviceView<T, R> device(std::string_view name) const {
    const std::size_t k = check_view<T, R>(name);
    return DeviceView<T, R>(reinterpret_cast<T*>(device_bytes(k)), extents<R>(k));
  }

 private:
  friend class Prefetcher;

  template <class T, int R>
  std::size_t check_view(std::string_view name) const {
    const std::size_t k = field_index(*fields_, name);
    const FieldSpec& f = (*fields_)[k];
    TRAINKIT_CHECK(dtype_of<std::remove_const_t<T>> == f.dtype, "Batch: field '", name, "' is ",
                   dtype_name(f.dtype), ", not ", dtype_name(dtype_of<std::remove_const_t<T>>));
    TRAINKIT_CHECK(static_cast<std::size_t>(R) == f.shape.size() + 1, "Batch: field '", name,
                   "' has rank ", f.shape.size() + 1, " (rows + sample dims), not ", R);
    return k;
  }
  template <int R>
  Extents<R> extents(std::size_t k) const {
    Extents<R> e;
    e[0] = static_cast<std::int64_t>(size_);
    for (int d = 1; d < R; ++d) e[d] = (*fields_)[k].shape[static_cast<std::size_t>(d - 1)];
    return e;
  }

  const std::vector<FieldSpec>* fields_ = nullptr;
  std::vector<std::byte*> host_;
  std::vector<std::byte*> device_;
  const std::int64_t* indices_ = nullptr;
  const std::int64_t* device_indices_ = nullptr;
  std::uint64_t epoch_ = 0;
  std::uint64_t index_ = 0;
  std::size_t size_ = 0;
  bool last_ = false;
};

/// The asynchronous batch loader. Typical use:
/// ```
/// data::NpyDataset ds({{"x", "x.npy"}, {"y", "y.npy"}});
/// data::Prefetcher loader(ds, data::RandomSampler(ds.size(), seed), {.batch_size = 256});
/// for (;;) { data::Batch b = loader.next(); ...; if (b.last_in_epoch()) break; }
/// ```
/// next() runs forever, epoch after epoch. The dataset must outlive the Prefetcher. Not
/// thread-safe: one consumer thread calls next()/state()/restore().
class Prefetcher {
 public:
  /// Host mode over a random-access dataset. Throws trainkit::Error for bad options or a
  /// sampler that yields no batch.
  template <Dataset D, Sampler S>
  Prefetcher(const D& dataset, S sampler, PrefetchOptions options) : options_(std::move(options)) {
    init_indexed(dataset, std::move(sampler));
    setup(false);
  }

  /// Host mode over a streaming dataset (read by one worker thread).
  template <StreamingDataset D>
  Prefetcher(D& dataset, PrefetchOptions options) : options_(std::move(options)) {
    init_streaming(dataset);
    setup(false);
  }

#if TRAINKIT_WITH_CUDA
  /// Device mode: batches are copied to the current device on an internal copy stream; work
  /// that `stream` runs after next() returns sees the batch (it waits on an event, on the
  /// device). Throws trainkit::Error when no CUDA device is usable.
  template <Dataset D, Sampler S>
  Prefetcher(const D& dataset, S sampler, PrefetchOptions options, cuda::StreamRef stream)
      : options_(std::move(options)), consumer_stream_(stream) {
    init_indexed(dataset, std::move(sampler));
    setup(true);
  }
  /// Device mode over a streaming dataset.
  template <StreamingDataset D>
  Prefetcher(D& dataset, PrefetchOptions options, cuda::StreamRef stream)
      : options_(std::move(options)), consumer_stream_(stream) {
    init_streaming(dataset);
    setup(true);
  }
#endif

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// Stops the workers (they abandon partial batches) and frees the slots. Never throws.
  ~Prefetcher() { stop_workers(); }

  /// The next batch, blocking until it is ready (the wait is added to stats()). Releases the
  /// previous batch. Rethrows a worker's exception as trainkit::Error naming the dataset, the
  /// file and the sample; after that, next() keeps throwing until restore().
  TRAINKIT_INLINE Batch next();

  /// The position of the batch the next call to next() returns.
  PrefetchState state() const noexcept { return next_state_; }

  /// Continues from `state` (from state(), possibly of another run with the same dataset,
  /// sampler and options): the batches that follow are exactly those an uninterrupted run would
  /// have produced from that point. Invalidates the current batch; clears a worker error. When
  /// its workers cannot be started it throws trainkit::Error, and next() throws that error until
  /// a restore() succeeds.
  TRAINKIT_INLINE void restore(const PrefetchState& state);

  /// The position of the next batch ("epoch", "batch") plus "batch_size", "batches_per_epoch"
  /// and "samples_per_epoch" (the sampler's size; 0 for streaming datasets), which must match on
  /// load (another batching or sample count changes what batch k is).
  TRAINKIT_INLINE StateDict state_dict() const;
  /// Checks the batching, then restore()s the saved position: the next next() returns exactly
  /// the batch an uninterrupted run would have returned.
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd);

  /// Batches per epoch for a random-access dataset; 0 for streaming datasets (unknown ahead).
  std::size_t batches_per_epoch() const noexcept { return per_epoch_; }
  /// The fields of every batch.
  const std::vector<FieldSpec>& fields() const noexcept { return out_fields_; }
  const PrefetchOptions& options() const noexcept { return options_; }
  bool device_mode() const noexcept { return device_mode_; }
  /// True when the host slots are page-locked.
  bool pinned() const noexcept {
    return !host_slots_.empty() && host_slots_[0].kind() == MemoryKind::kPinned;
  }
  /// Bytes of one batch slot (host; the device holds the same again in device mode).
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  PrefetchStats stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

 private:
  struct Slot {
    std::uint64_t done_gen = 0;  // g + 1 once batch g is in the slot (0: never filled)
    std::exception_ptr error;
    std::uint64_t epoch = 0, batch = 0;
    std::size_t rows = 0;
    bool last = false;
  };

  // ---- type-erased dataset -------------------------------------------------------------------
  template <class D, class S>
  void init_indexed(const D& dataset, S sampler) {
    const auto& fields = dataset.fields();  // once: fields() may return its list by value
    in_fields_.assign(std::begin(fields), std::end(fields));
    read_ = [&dataset](std::size_t i, const SampleRef& out) { dataset.read(i, out); };
    describe_ = [&dataset](std::size_t i) { return std::string(dataset.describe(i)); };
    auto shared = std::make_shared<S>(std::move(sampler));
    indices_of_ = [shared](std::uint64_t epoch) {
      return std::vector<std::int64_t>(shared->indices(epoch));
    };
    per_epoch_samples_ = shared->size();
    dataset_size_ = static_cast<std::size_t>(dataset.size());
    const std::size_t b = std::max<std::size_t>(options_.batch_size, 1);
    per_epoch_ = per_epoch_samples_ / b + (!options_.drop_last && per_epoch_samples_ % b != 0);
    TRAINKIT_CHECK(per_epoch_ > 0, options_.name, ": the sampler yields ", per_epoch_samples_,
                   " samples per epoch, not enough for one batch of ", b,
                   options_.drop_last ? " with drop_last" : "");
  }

  template <class D>
  void init_streaming(D& dataset) {
    const auto fields = dataset.fields();
    in_fields_.assign(std::begin(fields), std::end(fields));
    streaming_ = true;
    // A dataset whose start() takes a stop flag gives up a long skip when the workers stop.
    start_ = [this, &dataset](std::uint64_t epoch, std::uint64_t skip) {
      if constexpr (requires { dataset.start(epoch, skip, stop_); })
        (void)dataset.start(epoch, skip, stop_);
      else dataset.start(epoch, skip);
    };
    next_ = [&dataset](const SampleRef& out) { return dataset.next(out); };
    if constexpr (requires {
                    { dataset.stream_settings() } -> std::convertible_to<std::string>;
                  })
      stream_settings_ = dataset.stream_settings();
    describe_current_ = [&dataset] { return std::string(dataset.describe_current()); };
  }

  // ---- setup ---------------------------------------------------------------------------------
  TRAINKIT_INLINE void setup(bool device);

  static std::size_t align(std::size_t n) noexcept { return (n + 255) / 256 * 256; }

  /// (Re)starts the workers at `state`.
  TRAINKIT_INLINE void begin(const PrefetchState& state);

  TRAINKIT_INLINE void stop_workers() noexcept;

  TRAINKIT_INLINE void release_held();

  // ---- workers -------------------------------------------------------------------------------
  TRAINKIT_INLINE std::shared_ptr<const std::vector<std::int64_t>> indices_for(std::uint64_t epoch);

  TRAINKIT_INLINE void work(std::size_t worker);

  const std::vector<FieldSpec>& out_or_in() const noexcept {
    return separate_input_ ? in_fields_ : out_fields_;
  }
  static std::size_t sample_bytes_of(const std::vector<FieldSpec>& fields) noexcept {
    std::size_t n = 0;
    for (const FieldSpec& f : fields) n += f.bytes();
    return n;
  }

  /// Spans of row `row` of the slot at `base` (batch fields).
  TRAINKIT_INLINE void row_spans(std::byte* base, std::size_t row,
                                 std::vector<std::span<std::byte>>& spans) const;
  /// Spans of a packed sample of `fields` at `p`.
  TRAINKIT_INLINE static void packed_spans(std::byte* p, const std::vector<FieldSpec>& fields,
                                           std::vector<std::span<std::byte>>& spans);

  [[noreturn]] TRAINKIT_INLINE void rethrow_with(const std::string& context) const;

  TRAINKIT_INLINE void fill_indexed(std::uint64_t g, std::size_t worker, std::byte* base,
                                    Slot& result, std::vector<std::byte>& scratch);

  TRAINKIT_INLINE void fill_streaming(std::byte* base, Slot& result,
                                      std::vector<std::byte>& lookahead);

  PrefetchOptions options_;
  std::vector<FieldSpec> in_fields_;
  std::vector<FieldSpec> out_fields_;
  bool separate_input_ = false;
  std::size_t in_sample_bytes_ = 0;

  // indexed datasets
  std::function<void(std::size_t, const SampleRef&)> read_;
  std::function<std::string(std::size_t)> describe_;
  std::function<std::vector<std::int64_t>(std::uint64_t)> indices_of_;
  std::size_t per_epoch_samples_ = 0;
  std::size_t dataset_size_ = 0;
  std::size_t per_epoch_ = 0;  // batches per epoch (0 = streaming)
  std::mutex indices_mutex_;
  std::map<std::uint64_t, std::shared_ptr<const std::vector<std::int64_t>>> epoch_indices_;

  // streaming datasets (touched only by the single worker while it runs)
  bool streaming_ = false;
  std::function<void(std::uint64_t, std::uint64_t)> start_;
  std::function<bool(const SampleRef&)> next_;
  std::function<std::string()> describe_current_;
  std::string stream_settings_;  // the dataset's stream_settings(), when it has them
  PrefetchState stream_cursor_;
  bool stream_started_ = false;
  // Samples read ahead, in a ring of stream_lookahead() samples: a batch is the last of its
  // epoch when fewer than one more batch (drop_last) or no sample follows it.
  std::size_t look_begin_ = 0, look_count_ = 0;
  bool stream_ended_ = false;
  // A failed read ahead: it belongs to the batch of the sample that failed, so it is thrown
  // once the samples read before it are used up, not with the batch that read ahead.
  std::exception_ptr stream_error_;
  // describe_current() of each sample read ahead, kept when a transform runs (its errors name
  // the sample; the dataset has read further by then).
  std::vector<std::string> look_described_;
  std::size_t stream_lookahead() const noexcept {
    return options_.drop_last ? options_.batch_size : 1;
  }

  // slots
  std::size_t depth_ = 0;
  std::size_t num_workers_ = 0;
  std::vector<std::size_t> offsets_;
  std::size_t indices_offset_ = 0;
  std::size_t slot_bytes_ = 0;
  std::vector<Allocation> host_slots_;
  std::vector<Allocation> device_slots_;
  std::vector<Slot> slots_;
  bool device_mode_ = false;

  // coordination (mutex_ guards claimed_, released_count_, slots_, fatal_)
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable ready_cv_;
  std::atomic<bool> stop_{false};
  std::exception_ptr fatal_;
  std::uint64_t claimed_ = 0;
  std::uint64_t released_count_ = 0;
  std::uint64_t consumed_ = 0;  // consumer only
  bool held_ = false;           // consumer only
  PrefetchState origin_;
  PrefetchState next_state_;
  PrefetchStats stats_;
  std::vector<std::thread> workers_;

#if TRAINKIT_WITH_CUDA
  cuda::StreamRef consumer_stream_{};
  int device_id_ = 0;
  std::unique_ptr<cuda::Stream> copy_stream_;
  std::vector<cuda::Event> copy_done_;
  std::vector<cuda::Event> released_;
#endif
};

/// A Prefetcher feeding work on `exec`: host batches for exec::Host; for exec::Cuda, device mode
/// (batches copied to the current device on a side stream that exec's stream waits on).
template <class E, Dataset D, Sampler S>
std::unique_ptr<Prefetcher> make_prefetcher(const E& exec, const D& dataset, S sampler,
                                            PrefetchOptions options) {
  if constexpr (exec::is_cuda_executor_v<E>) {
    return std::make_unique<Prefetcher>(dataset, std::move(sampler), std::move(options),
                                        exec.stream());
  } else {
    return std::make_unique<Prefetcher>(dataset, std::move(sampler), std::move(options));
  }
}

#if TRAINKIT_IMPL

TRAINKIT_INLINE Batch Prefetcher::next() {
  release_held();
  const std::uint64_t g = consumed_;
  const std::size_t s = static_cast<std::size_t>(g % depth_);
  Slot& slot = slots_[s];
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // After a failure nothing more is claimed: batches claimed before it still arrive.
    ready_cv_.wait(lock, [&] { return slot.done_gen == g + 1 || (fatal_ && g >= claimed_); });
    if (slot.done_gen != g + 1) std::rethrow_exception(fatal_);
    if (slot.error) std::rethrow_exception(slot.error);
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.batches += 1;
  stats_.wait_seconds += waited;
  stats_.last_wait_seconds = waited;
#if TRAINKIT_WITH_CUDA
  if (device_mode_) consumer_stream_.wait(copy_done_[s].get());
#endif
  Batch b;
  b.fields_ = &out_fields_;
  b.epoch_ = slot.epoch;
  b.index_ = slot.batch;
  b.size_ = slot.rows;
  b.last_ = slot.last;
  auto* host = static_cast<std::byte*>(host_slots_[s].get());
  b.host_.resize(out_fields_.size());
  for (std::size_t k = 0; k < out_fields_.size(); ++k) b.host_[k] = host + offsets_[k];
  b.indices_ = reinterpret_cast<const std::int64_t*>(host + indices_offset_);
  if (device_mode_) {
    auto* dev = static_cast<std::byte*>(device_slots_[s].get());
    b.device_.resize(out_fields_.size());
    for (std::size_t k = 0; k < out_fields_.size(); ++k) b.device_[k] = dev + offsets_[k];
    b.device_indices_ = reinterpret_cast<const std::int64_t*>(dev + indices_offset_);
  }
  next_state_ =
      slot.last ? PrefetchState{slot.epoch + 1, 0} : PrefetchState{slot.epoch, slot.batch + 1};
  held_ = true;
  ++consumed_;
  return b;
}

TRAINKIT_INLINE void Prefetcher::restore(const PrefetchState& state) {
  // Checked first: a refused state leaves the loader running where it was.
  TRAINKIT_CHECK(per_epoch_ == 0 || state.batch < per_epoch_, options_.name,
                 ": restore() to batch ", state.batch, " of epoch ", state.epoch,
                 " but an epoch has ", per_epoch_, " batches");
  stop_workers();
  try {
    release_held();
    begin(state);
  } catch (...) {
    // No worker runs now, so a next() that waited for a batch would wait forever: it throws
    // this error instead, until a restore() starts the workers.
    held_ = false;
    claimed_ = consumed_ = released_count_ = 0;
    for (Slot& s : slots_) s = Slot{};
    next_state_ = state;
    try {
      rethrow_with(::trainkit::detail::concat(
          "restore() to batch ", state.batch, " of epoch ", state.epoch,
          " failed, and the loader has no workers until a restore() succeeds"));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      fatal_ = std::current_exception();
    }
    std::rethrow_exception(fatal_);
  }
}

TRAINKIT_INLINE StateDict Prefetcher::state_dict() const {
  StateDict sd;
  sd.set_u64("epoch", next_state_.epoch);
  sd.set_u64("batch", next_state_.batch);
  sd.set_u64("batch_size", options_.batch_size);
  sd.set_u64("batches_per_epoch", per_epoch_);
  sd.set_u64("samples_per_epoch", per_epoch_samples_);
  if (!stream_settings_.empty()) sd.values["stream_settings"] = stream_settings_;
  return sd;
}

TRAINKIT_INLINE void Prefetcher::load_state_dict(const StateDict& sd) {
  const std::string who = "restoring Prefetcher '" + options_.name + "'";
  check_saved_setting<std::uint64_t>(who, "batch_size", sd.get_u64("batch_size"),
                                     options_.batch_size);
  check_saved_setting<std::uint64_t>(who, "batches_per_epoch", sd.get_u64("batches_per_epoch"),
                                     per_epoch_);
  if (sd.contains("samples_per_epoch"))  // (states saved before it was recorded lack it)
    check_saved_setting<std::uint64_t>(who, "samples_per_epoch", sd.get_u64("samples_per_epoch"),
                                       per_epoch_samples_);
  const auto saved = sd.values.find("stream_settings");
  TRAINKIT_CHECK(
      saved == sd.values.end() || stream_settings_.empty() || saved->second == stream_settings_,
      who, ": the checkpoint's position is one in a stream of ", saved->second,
      "; this run's dataset has ", stream_settings_,
      " (the same position would hold other samples)");
  restore({sd.get_u64("epoch"), sd.get_u64("batch")});
}

TRAINKIT_INLINE void Prefetcher::setup(bool device) {
  TRAINKIT_CHECK(options_.batch_size >= 1, options_.name, ": batch_size must be >= 1");
  TRAINKIT_CHECK(options_.depth >= 2 && options_.depth <= 4096, options_.name,
                 ": depth must be 2 (one batch in use, one being filled) to 4096, got ",
                 options_.depth);
  TRAINKIT_CHECK(!options_.output_fields.empty() ? static_cast<bool>(options_.transform) : true,
                 options_.name, ": output_fields given without a transform to fill them");
  depth_ = options_.depth;
  num_workers_ = streaming_ ? 1 : std::max<std::size_t>(options_.num_workers, 1);
  out_fields_ = options_.output_fields.empty() ? in_fields_ : options_.output_fields;
  separate_input_ = !options_.output_fields.empty();
  const std::size_t B = options_.batch_size;
  // A slot's size in checked arithmetic (below 2^56 bytes, so that align() cannot wrap).
  const auto room = [&](std::optional<std::size_t> bytes) {
    TRAINKIT_CHECK(bytes && *bytes < (std::size_t{1} << 56), options_.name, ": batch_size ", B,
                   " makes a batch larger than any memory (its fields and indices overflow 2^56 "
                   "bytes)");
    return *bytes;
  };
  // A field's bytes per sample in checked arithmetic, its extents >= 0 (a shape comes from
  // the dataset or the options: one that wraps would give a slot too small for its rows).
  const auto field_bytes = [&](const FieldSpec& f, const char* which) {
    std::optional<std::size_t> n = dtype_size(f.dtype);
    for (std::int64_t d : f.shape) {
      TRAINKIT_CHECK(d >= 0, options_.name, ": ", which, " field '", f.name,
                     "' has a negative extent ", d);
      n = n ? checked_mul(*n, static_cast<std::size_t>(d)) : n;
    }
    TRAINKIT_CHECK(n && *n < (std::size_t{1} << 48), options_.name, ": ", which, " field '", f.name,
                   "' has ", f.shape.size(), " extents whose product is too large for ",
                   "one sample (2^48 bytes or more)");
    return *n;
  };
  std::size_t off = 0;
  for (const FieldSpec& f : out_fields_) {
    offsets_.push_back(off);
    off = align(room(checked_add(off, room(checked_mul(B, field_bytes(f, "output"))))));
  }
  indices_offset_ = off;
  slot_bytes_ = room(checked_add(off, room(checked_mul(B, sizeof(std::int64_t)))));
  in_sample_bytes_ = 0;
  for (const FieldSpec& f : in_fields_)
    in_sample_bytes_ = room(checked_add(in_sample_bytes_, field_bytes(f, "input")));
  if (streaming_) (void)room(checked_mul(stream_lookahead(), sample_bytes_of(out_or_in())));

  device_mode_ = device;
#if TRAINKIT_WITH_CUDA
  if (device_mode_) {
    TRAINKIT_CHECK(cuda::device_count() > 0, options_.name,
                   ": device mode needs a CUDA device, and none is visible");
    device_id_ = cuda::current_device();
    copy_stream_ = std::make_unique<cuda::Stream>();
    for (std::size_t s = 0; s < depth_; ++s) {
      copy_done_.emplace_back();
      released_.emplace_back();
    }
  }
#endif
  const bool pin = (options_.pin_memory || device_mode_) && cuda::device_count() > 0;
  try {
    for (std::size_t s = 0; s < depth_; ++s) {
      host_slots_.emplace_back(slot_bytes_, pin ? MemoryKind::kPinned : MemoryKind::kHost);
      if (device_mode_) device_slots_.emplace_back(slot_bytes_, MemoryKind::kDevice);
    }
  } catch (const Error& e) {
    TRAINKIT_FAIL(options_.name, ": the ", depth_, " batch slots of ", slot_bytes_,
                  " bytes each do not fit in memory (lower depth or batch_size): ", e.what());
  }
  slots_.resize(depth_);
  begin(PrefetchState{options_.epoch, 0});
}

TRAINKIT_INLINE void Prefetcher::begin(const PrefetchState& state) {
  origin_ = state;
  next_state_ = state;
  claimed_ = 0;
  released_count_ = 0;
  consumed_ = 0;
  held_ = false;
  fatal_ = nullptr;
  stop_.store(false);
  for (Slot& s : slots_) s = Slot{};
  epoch_indices_.clear();
  stream_cursor_ = state;
  stream_started_ = false;
  stream_error_ = nullptr;
  workers_.clear();
  try {
    workers_.reserve(num_workers_);
    for (std::size_t w = 0; w < num_workers_; ++w) workers_.emplace_back([this, w] { work(w); });
  } catch (const std::system_error& e) {
    const std::size_t started = workers_.size();
    stop_workers();  // joins the ones that started
    TRAINKIT_FAIL(options_.name, ": cannot start worker ", started + 1, " of ", num_workers_, " (",
                  e.what(), "); lower num_workers");
  } catch (...) {
    stop_workers();  // a thread left running (or unjoined) would outlive its loader
    throw;
  }
}

TRAINKIT_INLINE void Prefetcher::stop_workers() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
#if TRAINKIT_WITH_CUDA
  if (copy_stream_) TRAINKIT_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(copy_stream_->get()));
#endif
}

TRAINKIT_INLINE void Prefetcher::release_held() {
  if (!held_) return;
  const std::size_t s = static_cast<std::size_t>((consumed_ - 1) % depth_);
#if TRAINKIT_WITH_CUDA
  // The copy that refills this device slot must wait for the consumer's work on it.
  if (device_mode_) released_[s].record(consumer_stream_);
#endif
  (void)s;
  held_ = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++released_count_;
  }
  work_cv_.notify_all();
}

TRAINKIT_INLINE std::shared_ptr<const std::vector<std::int64_t>> Prefetcher::indices_for(
    std::uint64_t epoch) {
  std::lock_guard<std::mutex> lock(indices_mutex_);
  auto it = epoch_indices_.find(epoch);
  if (it == epoch_indices_.end()) {
    auto v = std::make_shared<const std::vector<std::int64_t>>(indices_of_(epoch));
    TRAINKIT_CHECK(v->size() == per_epoch_samples_, "the sampler returned ", v->size(),
                   " indices for epoch ", epoch, " but its size() is ", per_epoch_samples_);
    // A sampler made for another dataset (RandomSampler(n) with the wrong n) would have the
    // dataset read past its end: refused before any sample of the epoch is read.
    for (std::size_t k = 0; k < v->size(); ++k) {
      const std::int64_t i = (*v)[k];
      TRAINKIT_CHECK(i >= 0 && static_cast<std::uint64_t>(i) < dataset_size_,
                     "the sampler's index ", k, " of epoch ", epoch, " is ", i,
                     ", but the dataset has ", dataset_size_, " samples");
    }
    epoch_indices_.emplace(epoch, v);
    // Keep at most two epochs: the one asked for and the newest other. Workers are normally
    // at most one epoch apart; one that lags further (a slow machine, a restore) gets its
    // epoch recomputed, never an erased entry.
    while (epoch_indices_.size() > 2) {
      auto victim = epoch_indices_.begin();
      if (victim->first == epoch) ++victim;
      epoch_indices_.erase(victim);
    }
    return v;
  }
  return it->second;
}

TRAINKIT_INLINE void Prefetcher::work(std::size_t worker) {
#if TRAINKIT_WITH_CUDA
  if (device_mode_ && cudaSetDevice(device_id_) != cudaSuccess) (void)cudaGetLastError();
#endif
  // The worker's buffers (a sample before the transform; the streaming read-ahead). A failed
  // allocation is this worker's error, reported by next() like a failed read.
  // (setup() checked that the sizes do not overflow.)
  const std::size_t scratch_bytes = separate_input_ ? in_sample_bytes_ : 0;
  const std::size_t lookahead_bytes =
      streaming_ ? stream_lookahead() * sample_bytes_of(out_or_in()) : 0;
  std::vector<std::byte> scratch, lookahead;
  std::exception_ptr no_memory;
  try {
    scratch.resize(scratch_bytes);
    lookahead.resize(lookahead_bytes);
  } catch (const std::bad_alloc&) {
    no_memory = std::make_exception_ptr(Error(::trainkit::detail::concat(
        "trainkit: ", options_.name, ": worker ", worker, " cannot allocate its buffers (",
        scratch_bytes + lookahead_bytes, " bytes); lower batch_size")));
  }
  for (;;) {
    std::uint64_t g = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Batch g goes to slot g % depth, free once batch g - depth was released.
      work_cv_.wait(
          lock, [&] { return stop_.load() || (!fatal_ && claimed_ < released_count_ + depth_); });
      if (stop_.load()) return;
      g = claimed_++;
    }
    const std::size_t s = static_cast<std::size_t>(g % depth_);
    Slot result;
    try {
#if TRAINKIT_WITH_CUDA
      // The previous copy out of this pinned slot must be finished before we overwrite it.
      if (device_mode_) copy_done_[s].synchronize();
#endif
      if (no_memory) std::rethrow_exception(no_memory);
      auto* base = static_cast<std::byte*>(host_slots_[s].get());
      if (streaming_) {
        fill_streaming(base, result, lookahead);
      } else {
        fill_indexed(g, worker, base, result, scratch);
      }
      if (stop_.load()) return;
#if TRAINKIT_WITH_CUDA
      if (device_mode_) {
        cuda::StreamRef copy = copy_stream_->ref();
        copy.wait(released_[s].get());
        TRAINKIT_CUDA_CHECK(cudaMemcpyAsync(device_slots_[s].get(), base, slot_bytes_,
                                            cudaMemcpyHostToDevice, copy.get()));
        copy_done_[s].record(copy);
      }
#endif
    } catch (...) {
      if (stop_.load()) return;
      result.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      result.done_gen = g + 1;
      slots_[s] = std::move(result);
      // A failure stops further claims; batches before it still arrive in order.
      if (slots_[s].error && !fatal_) fatal_ = slots_[s].error;
    }
    ready_cv_.notify_all();
  }
}

TRAINKIT_INLINE void Prefetcher::row_spans(std::byte* base, std::size_t row,
                                           std::vector<std::span<std::byte>>& spans) const {
  spans.clear();
  for (std::size_t k = 0; k < out_fields_.size(); ++k) {
    const std::size_t n = out_fields_[k].bytes();
    spans.emplace_back(base + offsets_[k] + row * n, n);
  }
}

TRAINKIT_INLINE void Prefetcher::packed_spans(std::byte* p, const std::vector<FieldSpec>& fields,
                                              std::vector<std::span<std::byte>>& spans) {
  spans.clear();
  for (const FieldSpec& f : fields) {
    spans.emplace_back(p, f.bytes());
    p += f.bytes();
  }
}

TRAINKIT_INLINE void Prefetcher::rethrow_with(const std::string& context) const {
  try {
    throw;
  } catch (const Error& e) {
    throw Error("trainkit: " + options_.name + ": " + context + ": " + e.what(), e.library(),
                e.code());
  } catch (const std::exception& e) {
    throw Error("trainkit: " + options_.name + ": " + context + ": " + e.what());
  } catch (...) {
    throw Error("trainkit: " + options_.name + ": " + context + ": unknown exception");
  }
}

TRAINKIT_INLINE void Prefetcher::fill_indexed(std::uint64_t g, std::size_t worker, std::byte* base,
                                              Slot& result, std::vector<std::byte>& scratch) {
  const std::uint64_t pos = origin_.batch + g;
  const std::uint64_t epoch = origin_.epoch + pos / per_epoch_;
  const std::uint64_t batch = pos % per_epoch_;
  const std::size_t B = options_.batch_size;
  std::shared_ptr<const std::vector<std::int64_t>> indices;
  try {
    indices = indices_for(epoch);
  } catch (...) {
    // The sampler's own exception, too, reaches next() as a trainkit::Error with the loader.
    rethrow_with(::trainkit::detail::concat("worker ", worker, " failed on the sampler's indices",
                                            " for epoch ", epoch));
  }
  const std::size_t first = static_cast<std::size_t>(batch) * B;
  const std::size_t rows = std::min(B, indices->size() - first);
  auto* idx_out = reinterpret_cast<std::int64_t*>(base + indices_offset_);
  std::vector<std::span<std::byte>> out_spans, in_spans;
  for (std::size_t r = 0; r < rows; ++r) {
    if (stop_.load(std::memory_order_relaxed)) return;
    const std::int64_t i = (*indices)[first + r];
    idx_out[r] = i;
    row_spans(base, r, out_spans);
    try {
      const SampleRef out(out_spans);
      const SampleInfo info{epoch, first + r, i};
      if (separate_input_) {
        packed_spans(scratch.data(), in_fields_, in_spans);
        const SampleRef in(in_spans);
        read_(static_cast<std::size_t>(i), in);
        options_.transform(info, in, out);
      } else {
        read_(static_cast<std::size_t>(i), out);
        if (options_.transform) options_.transform(info, out, out);
      }
    } catch (...) {
      rethrow_with(::trainkit::detail::concat("worker ", worker, " failed on sample ", i, " (",
                                              describe_(static_cast<std::size_t>(i)), "), row ", r,
                                              " of batch ", batch, " of epoch ", epoch));
    }
  }
  result.epoch = epoch;
  result.batch = batch;
  result.rows = rows;
  result.last = batch + 1 == per_epoch_;
}

TRAINKIT_INLINE void Prefetcher::fill_streaming(std::byte* base, Slot& result,
                                                std::vector<std::byte>& lookahead) {
  const std::size_t B = options_.batch_size, depth = stream_lookahead();
  const std::vector<FieldSpec>& read_fields = out_or_in();
  const std::size_t sample_bytes = lookahead.size() / depth;
  std::vector<std::span<std::byte>> look_spans, out_spans, in_spans;
  auto* idx_out = reinterpret_cast<std::int64_t*>(base + indices_offset_);
  const PrefetchState at = stream_cursor_;
  const std::uint64_t first = at.batch * B;
  // Reads ahead until `depth` samples wait (or the epoch's stream ends, or a read fails); `next`
  // is the position of the first sample read now.
  const auto read_ahead = [&](std::uint64_t next) {
    while (look_count_ < depth && !stream_ended_ && !stream_error_) {
      if (stop_.load(std::memory_order_relaxed)) return;
      const std::size_t k = (look_begin_ + look_count_) % depth;
      packed_spans(lookahead.data() + k * sample_bytes, read_fields, look_spans);
      try {
        if (next_(SampleRef(look_spans))) {
          // The dataset moves on as it reads ahead: a transform's error names the sample by
          // where it was read.
          if (options_.transform) look_described_[k] = describe_current_();
          ++look_count_;
          ++next;
        } else {
          stream_ended_ = true;
        }
      } catch (...) {
        try {
          rethrow_with(::trainkit::detail::concat("failed reading sample ", next, " of epoch ",
                                                  at.epoch, " (", describe_current_(), ")"));
        } catch (...) {
          stream_error_ = std::current_exception();
        }
      }
    }
  };
  if (options_.transform) look_described_.resize(depth);
  if (!stream_started_) {
    try {
      start_(at.epoch, first);
    } catch (...) {
      rethrow_with(::trainkit::detail::concat("starting epoch ", at.epoch, " at sample ", first,
                                              " of ", describe_current_()));
    }
    look_begin_ = look_count_ = 0;
    stream_ended_ = false;
    stream_error_ = nullptr;
    stream_started_ = true;
    read_ahead(first);
  }
  std::size_t rows = 0;
  while (rows < B && (look_count_ > 0 || stream_error_)) {
    if (stop_.load(std::memory_order_relaxed)) return;
    if (look_count_ == 0) std::rethrow_exception(stream_error_);  // this row's sample failed
    const std::uint64_t position = first + rows;
    idx_out[rows] = static_cast<std::int64_t>(position);
    row_spans(base, rows, out_spans);
    const SampleRef out(out_spans);
    std::byte* sample = lookahead.data() + look_begin_ * sample_bytes;
    try {
      const SampleInfo info{at.epoch, position, static_cast<std::int64_t>(position)};
      if (separate_input_) {
        packed_spans(sample, in_fields_, in_spans);
        options_.transform(info, SampleRef(in_spans), out);
      } else {
        packed_spans(sample, read_fields, look_spans);
        for (std::size_t k = 0; k < out.size(); ++k)
          if (!out[k].empty()) std::memcpy(out[k].data(), look_spans[k].data(), out[k].size());
        if (options_.transform) options_.transform(info, out, out);
      }
    } catch (...) {
      rethrow_with(::trainkit::detail::concat(
          "failed on sample ", position, " of epoch ", at.epoch, " (",
          options_.transform ? look_described_[look_begin_] : describe_current_(), ")"));
    }
    ++rows;
    look_begin_ = (look_begin_ + 1) % depth;
    --look_count_;
    read_ahead(position + 1 + look_count_);
  }
  if (stop_.load(std::memory_order_relaxed)) return;
  // With drop_last a shorter remainder is dropped, so this batch is the epoch's last then. A
  // failed read ahead is a sample that exists: the next batch reports it.
  const bool last = !stream_error_ && (options_.drop_last ? look_count_ < B : look_count_ == 0);
  if (last) {
    stream_cursor_ = PrefetchState{at.epoch + 1, 0};
    stream_started_ = false;
  } else {
    stream_cursor_ = PrefetchState{at.epoch, at.batch + 1};
  }
  // A batch that follows one not marked last has samples (with drop_last, a whole batch of
  // them), so only an epoch's first batch, or the first after a restore() to a position past
  // the epoch's last batch, can come up short. A checkpoint taken after an epoch's last batch
  // holds batch 0 of the next epoch, never such a position.
  if (at.batch > 0 && (rows == 0 || (options_.drop_last && rows < B))) {
    const char* after_last =
        "the position after an epoch's last batch is batch 0 of the next epoch";
    if (rows == 0)
      TRAINKIT_FAIL(options_.name, ": restore() to batch ", at.batch, " of epoch ", at.epoch,
                    " is past the epoch's end: the streaming dataset (", describe_current_(),
                    ") has no sample ", first, " (", after_last, ")");
    TRAINKIT_FAIL(options_.name, ": restore() to batch ", at.batch, " of epoch ", at.epoch,
                  " is past the epoch's last batch: the streaming dataset (", describe_current_(),
                  ") has ", rows, " samples from sample ", first, " on, fewer than one batch of ",
                  B, " with drop_last (", after_last, ")");
  }
  TRAINKIT_CHECK(rows > 0, options_.name, ": epoch ", at.epoch, " of the streaming dataset (",
                 describe_current_(), ") has no samples");
  TRAINKIT_CHECK(rows == B || !options_.drop_last, options_.name, ": epoch ", at.epoch, " has ",
                 rows, " samples, fewer than one batch of ", B, " with drop_last");
  result.epoch = at.epoch;
  result.batch = at.batch;
  result.rows = rows;
  result.last = last;
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
