// SPDX-License-Identifier: MIT
// trainkit/monitor/timeline.hpp: where a training step's time goes. Spans for data-wait, forward,
// backward, exposed communication, optimizer and checkpoint are timed with the host's steady clock
// and, in the CUDA tier, with CUDA events around the device work — resolved lazily when a window is
// summarized, so the hot path never waits for the GPU. Spans also become NVTX ranges (Nsight) and
// can be exported as a Chrome trace (chrome://tracing, ui.perfetto.dev).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/monitor/json_writer.hpp"
#include "trainkit/monitor/nvtx.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/cuda/event.hpp"
#include "trainkit/cuda/stream.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// The phases of a training step. Spans of one phase may occur several times per step (gradient
/// accumulation); their durations add up. Phases are meant to be sequential: a span nested inside
/// another is counted in both.
enum class Phase : std::uint8_t {
  kDataWait,       ///< waiting for the next batch (loader, host-to-device copy not overlapped)
  kForward,        ///< forward pass and loss
  kBackward,       ///< backward pass
  kCommunication,  ///< exposed communication: waiting for all-reduce not hidden behind backward
  kOptimizer,      ///< unscale, clipping, optimizer update, LR schedule
  kCheckpoint,     ///< saving state (the synchronous part)
};
inline constexpr std::size_t kPhaseCount = 6;

/// Short snake_case name of a phase, used in logs, TensorBoard tags and traces.
inline constexpr const char* phase_name(Phase phase) noexcept {
  constexpr const char* kNames[kPhaseCount] = {"data_wait",    "forward",   "backward",
                                               "comm_exposed", "optimizer", "checkpoint"};
  return kNames[static_cast<std::size_t>(phase)];
}

/// A monotonic clock in nanoseconds. Tests substitute a fake one.
using ClockFn = std::int64_t (*)() noexcept;

/// std::chrono::steady_clock in nanoseconds: the default clock of every monitor component.
inline std::int64_t steady_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Options of Timeline.
struct TimelineOptions {
  std::size_t trace_capacity = 0;  ///< spans kept (newest) for chrome_trace(); 0 = no trace
  bool nvtx = true;                ///< also emit NVTX ranges (CUDA tier only; free otherwise)
  int rank = 0;                    ///< the trace's process id, so merged rank traces stay apart
  ClockFn clock = steady_now_ns;   ///< host clock
};

/// What a window of steps spent, returned by Timeline::take_window(). Seconds throughout.
struct TimelineWindow {
  std::int64_t steps = 0;       ///< steps ended in the window
  std::int64_t first_step = 0;  ///< step number passed to the window's first begin_step
  std::int64_t last_step = 0;   ///< step number of the window's last ended step
  double elapsed_s = 0.0;       ///< from the window's first begin_step to its last end_step
  double in_step_s = 0.0;       ///< sum of begin_step..end_step durations (excludes gaps)
  std::array<double, kPhaseCount> host_s{};    ///< host time per phase
  std::array<double, kPhaseCount> device_s{};  ///< CUDA-event time per phase (resolved spans)
  std::array<std::int64_t, kPhaseCount> device_spans{};  ///< resolved device spans per phase
  std::int64_t device_pending = 0;  ///< device spans not finished yet (counted in a later window)

  /// Mean wall time per step, gaps between steps (logging, evaluation) included.
  double step_s() const noexcept {
    return steps > 0 ? elapsed_s / static_cast<double>(steps) : 0.0;
  }
  /// The time of `phase` this window: the device time when the phase had device spans, since
  /// host time only measures kernel launches then; the host time otherwise.
  double phase_s(Phase phase) const noexcept {
    const auto i = static_cast<std::size_t>(phase);
    return device_spans[i] > 0 ? device_s[i] : host_s[i];
  }
  /// phase_s(phase) / elapsed_s (0 when nothing elapsed).
  double fraction(Phase phase) const noexcept {
    return elapsed_s > 0.0 ? phase_s(phase) / elapsed_s : 0.0;
  }
  /// Elapsed time in no phase (host overhead, logging, unmeasured work); never negative.
  double other_s() const noexcept {
    double sum = 0.0;
    for (std::size_t i = 0; i < kPhaseCount; ++i) sum += phase_s(static_cast<Phase>(i));
    return elapsed_s > sum ? elapsed_s - sum : 0.0;
  }
};

/// Records step and phase spans. Single-threaded: call it from the training loop's thread.
/// Typical use: `tl.begin_step(s); { auto sp = tl.span(Phase::kForward); ... } tl.end_step();`
class Timeline {
 public:
  explicit Timeline(TimelineOptions options = {}) : options_(options), origin_ns_(options.clock()) {
    open_ns_.fill(-1);
    if (options_.trace_capacity > 0) trace_.reserve(options_.trace_capacity);
  }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  /// RAII span: ends its phase when destroyed (or at end()).
  class Span {
   public:
    Span(Span&& other) noexcept
        : timeline_(std::exchange(other.timeline_, nullptr)), phase_(other.phase_) {
#if TRAINKIT_WITH_CUDA
      stream_ = other.stream_;
      device_ = other.device_;
#endif
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    Span& operator=(Span&&) = delete;
    ~Span() { end(); }
    /// Ends the span early (idempotent).
    void end() noexcept {
      if (timeline_ == nullptr) return;
#if TRAINKIT_WITH_CUDA
      if (device_) {
        timeline_->end_device_nothrow(phase_, stream_);
        timeline_ = nullptr;
        return;
      }
#endif
      timeline_->end(phase_);
      timeline_ = nullptr;
    }

   private:
    friend class Timeline;
    Span(Timeline* timeline, Phase phase) noexcept : timeline_(timeline), phase_(phase) {}
    Timeline* timeline_;
    Phase phase_;
#if TRAINKIT_WITH_CUDA
    cudaStream_t stream_ = nullptr;
    bool device_ = false;
#endif
  };

  /// Starts step `step`. A step still open is ended first.
  TRAINKIT_INLINE void begin_step(std::int64_t step);

  /// Ends the current step (no-op when none is open).
  TRAINKIT_INLINE void end_step();

  /// Forgets the current step without counting it (a step that did not complete; no-op when
  /// none is open). Its spans stay in the window's phase times.
  TRAINKIT_INLINE void abandon_step();

  /// Starts a host span of `phase`. A span of the same phase still open is ended first.
  TRAINKIT_INLINE void begin(Phase phase) noexcept;

  /// Ends the host span of `phase` (no-op when none is open).
  TRAINKIT_INLINE void end(Phase phase) noexcept;

  /// A host span that ends when the returned object goes out of scope.
  [[nodiscard]] Span span(Phase phase) noexcept {
    begin(phase);
    return Span(this, phase);
  }

#if TRAINKIT_WITH_CUDA
  /// A span of host time plus device time: CUDA events recorded on `stream` at both ends measure
  /// the device work queued in between. Never synchronizes; take_window() reads the events once
  /// they completed (typically one step later). Throws trainkit::Error when recording fails.
  [[nodiscard]] Span span(Phase phase, cuda::StreamRef stream) {
    begin_device(phase, stream);
    Span s(this, phase);
    s.stream_ = stream.get();
    s.device_ = true;
    return s;
  }
  void begin_device(Phase phase, cuda::StreamRef stream) {
    begin(phase);
    const auto i = static_cast<std::size_t>(phase);
    if (!anchor_) make_anchor();
    open_events_[i].emplace(acquire_event());
    open_events_[i]->record(stream);
  }
  void end_device(Phase phase, cuda::StreamRef stream) {
    const auto i = static_cast<std::size_t>(phase);
    end(phase);
    if (!open_events_[i]) return;
    cuda::Event start = std::move(*open_events_[i]);
    open_events_[i].reset();
    cuda::Event stop = acquire_event();
    stop.record(stream);
    pending_.push_back(DeviceSpan{phase, step_, std::move(start), std::move(stop)});
  }
#endif

  /// Aggregates everything since the previous call (or construction) and starts a new window.
  /// Device spans whose events have completed are included now, the others in a later window.
  TimelineWindow take_window() {
#if TRAINKIT_WITH_CUDA
    resolve_device(false);
    window_.device_pending = static_cast<std::int64_t>(pending_.size());
#endif
    TimelineWindow out = window_;
    out.steps = window_steps_;
    out.elapsed_s =
        window_steps_ > 0 ? 1e-9 * static_cast<double>(window_end_ns_ - window_begin_ns_) : 0.0;
    window_ = TimelineWindow{};
    window_steps_ = 0;
    window_open_ = false;
    // A step in progress belongs to the next window, which then starts at its begin_step.
    if (in_step_) {
      window_open_ = true;
      window_begin_ns_ = step_begin_ns_;
      window_.first_step = step_;
    }
    return out;
  }

  /// Blocks until every recorded device span has finished and resolves it (for the end of a run).
  void synchronize_device() {
#if TRAINKIT_WITH_CUDA
    resolve_device(true);
#endif
  }

  /// The kept spans as Chrome trace-event JSON ("X" complete events, microseconds since the
  /// timeline started; tid 0 = steps, 1 = host phases, 2 = device phases). Opens in
  /// chrome://tracing and ui.perfetto.dev.
  TRAINKIT_INLINE std::string chrome_trace_json() const;

  /// Writes chrome_trace_json() to `path`. Throws trainkit::Error when the file cannot be written.
  TRAINKIT_INLINE void write_chrome_trace(const std::string& path) const;

  /// Host clock reading (ns) at the latest end_step (0 before the first).
  std::int64_t last_step_end_ns() const noexcept { return window_end_ns_; }

  /// Number of spans currently kept for the trace.
  std::size_t trace_size() const noexcept { return trace_.size(); }
  const TimelineOptions& options() const noexcept { return options_; }

 private:
  static constexpr std::uint8_t kStepMarker = 255;
  static constexpr std::uint8_t kStepTrack = 0;
  static constexpr std::uint8_t kHostTrack = 1;
  static constexpr std::uint8_t kDeviceTrack = 2;

  struct TraceSpan {
    std::int64_t begin_ns;
    std::int64_t end_ns;
    std::int64_t step;
    std::uint8_t track;
    std::uint8_t kind;  // a Phase, or kStepMarker
  };

  TRAINKIT_INLINE void record_trace(std::uint8_t track, std::int64_t begin_ns, std::int64_t end_ns,
                                    std::uint8_t kind) noexcept;

#if TRAINKIT_WITH_CUDA
  struct DeviceSpan {
    Phase phase;
    std::int64_t step;
    cuda::Event start;
    cuda::Event stop;
  };

  cuda::Event acquire_event() {
    if (free_events_.empty()) return cuda::Event(/*timing=*/true);
    cuda::Event e = std::move(free_events_.back());
    free_events_.pop_back();
    return e;
  }

  // Device timestamps in the trace are offsets from an anchor event whose host time is known:
  // recorded on an otherwise idle stream and waited for once, when the first device span starts.
  void make_anchor() {
    cudaStream_t idle = nullptr;
    TRAINKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking));
    anchor_ = std::make_unique<cuda::Event>(true);
    const cudaError_t recorded = cudaEventRecord(anchor_->get(), idle);
    const cudaError_t synced =
        recorded == cudaSuccess ? cudaEventSynchronize(anchor_->get()) : recorded;
    anchor_host_ns_ = options_.clock();
    TRAINKIT_CUDA_CHECK_NOTHROW(cudaStreamDestroy(idle));
    TRAINKIT_CUDA_CHECK(synced);
  }

  void end_device_nothrow(Phase phase, cudaStream_t stream) noexcept {
    try {
      end_device(phase, cuda::StreamRef(stream));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trainkit: timeline span end failed: %s\n", e.what());
    }
  }

  void resolve_device(bool wait) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (wait) it->stop.synchronize();
      if (!it->stop.ready()) {
        ++it;
        continue;
      }
      const auto i = static_cast<std::size_t>(it->phase);
      const float ms = cuda::Event::elapsed_ms(it->start, it->stop);
      window_.device_s[i] += 1e-3 * static_cast<double>(ms);
      ++window_.device_spans[i];
      if (options_.trace_capacity > 0 && anchor_) {
        const float begin_ms = cuda::Event::elapsed_ms(*anchor_, it->start);
        const auto begin_ns = anchor_host_ns_ + static_cast<std::int64_t>(1e6 * begin_ms);
        const auto saved_step = step_;
        step_ = it->step;
        record_trace(kDeviceTrack, begin_ns, begin_ns + static_cast<std::int64_t>(1e6 * ms),
                     static_cast<std::uint8_t>(it->phase));
        step_ = saved_step;
      }
      free_events_.push_back(std::move(it->start));
      free_events_.push_back(std::move(it->stop));
      it = pending_.erase(it);
    }
  }

  std::deque<DeviceSpan> pending_;
  std::vector<cuda::Event> free_events_;
  std::array<std::optional<cuda::Event>, kPhaseCount> open_events_{};
  std::unique_ptr<cuda::Event> anchor_;
  std::int64_t anchor_host_ns_ = 0;
#endif

  TimelineOptions options_;
  std::int64_t origin_ns_;
  std::array<std::int64_t, kPhaseCount> open_ns_{};
  bool in_step_ = false;
  bool window_open_ = false;
  std::int64_t step_ = 0;
  std::int64_t step_begin_ns_ = 0;
  std::int64_t window_begin_ns_ = 0;
  std::int64_t window_end_ns_ = 0;
  std::int64_t window_steps_ = 0;
  TimelineWindow window_;
  std::vector<TraceSpan> trace_;
  std::size_t trace_next_ = 0;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE void Timeline::begin_step(std::int64_t step) {
  if (in_step_) end_step();
  const std::int64_t now = options_.clock();
  in_step_ = true;
  step_ = step;
  step_begin_ns_ = now;
  if (window_steps_ == 0 && !window_open_) {
    window_open_ = true;
    window_begin_ns_ = now;
    window_.first_step = step;
  }
#if TRAINKIT_WITH_CUDA
  // Bounded memory when take_window() is called rarely: resolve what has finished.
  if (pending_.size() > 512) resolve_device(false);
#endif
}

TRAINKIT_INLINE void Timeline::end_step() {
  if (!in_step_) return;
  const std::int64_t now = options_.clock();
  in_step_ = false;
  window_.in_step_s += 1e-9 * static_cast<double>(now - step_begin_ns_);
  window_.last_step = step_;
  window_end_ns_ = now;
  ++window_steps_;
  record_trace(kStepTrack, step_begin_ns_, now, kStepMarker);
}

TRAINKIT_INLINE void Timeline::abandon_step() {
  if (!in_step_) return;
  in_step_ = false;
  if (window_steps_ == 0) window_open_ = false;  // the window began with this step
}

TRAINKIT_INLINE void Timeline::begin(Phase phase) noexcept {
  const auto i = static_cast<std::size_t>(phase);
  if (open_ns_[i] >= 0) end(phase);
  if (options_.nvtx) nvtx_push(phase_name(phase));
  open_ns_[i] = options_.clock();
}

TRAINKIT_INLINE void Timeline::end(Phase phase) noexcept {
  const auto i = static_cast<std::size_t>(phase);
  if (open_ns_[i] < 0) return;
  const std::int64_t now = options_.clock();
  window_.host_s[i] += 1e-9 * static_cast<double>(now - open_ns_[i]);
  record_trace(kHostTrack, open_ns_[i], now, static_cast<std::uint8_t>(phase));
  open_ns_[i] = -1;
  if (options_.nvtx) nvtx_pop();
}

TRAINKIT_INLINE std::string Timeline::chrome_trace_json() const {
  JsonWriter w;
  w.begin_object().key("displayTimeUnit").value("ms").key("traceEvents").begin_array();
  constexpr const char* kTrackNames[3] = {"steps", "host", "device"};
  for (int track = 0; track < 3; ++track) {
    w.begin_object().key("name").value("thread_name").key("ph").value("M");
    w.key("pid").value(options_.rank).key("tid").value(track);
    w.key("args").begin_object().key("name").value(kTrackNames[track]).end_object();
    w.end_object();
  }
  w.begin_object().key("name").value("process_name").key("ph").value("M");
  w.key("pid").value(options_.rank).key("tid").value(0);
  w.key("args").begin_object().key("name").value("rank " + std::to_string(options_.rank));
  w.end_object().end_object();
  const std::size_t n = trace_.size();
  const std::size_t start = n < options_.trace_capacity ? 0 : trace_next_;
  for (std::size_t k = 0; k < n; ++k) {
    const TraceSpan& s = trace_[(start + k) % n];
    w.begin_object();
    if (s.kind == kStepMarker) {
      w.key("name").value("step " + std::to_string(s.step)).key("cat").value("step");
    } else {
      w.key("name").value(phase_name(static_cast<Phase>(s.kind))).key("cat").value("phase");
    }
    w.key("ph").value("X");
    w.key("ts").value(static_cast<double>(s.begin_ns - origin_ns_) / 1000.0);
    w.key("dur").value(static_cast<double>(s.end_ns - s.begin_ns) / 1000.0);
    w.key("pid").value(options_.rank).key("tid").value(static_cast<int>(s.track));
    w.key("args").begin_object().key("step").value(s.step).end_object();
    w.end_object();
  }
  w.end_array().end_object();
  return w.take();
}

TRAINKIT_INLINE void Timeline::write_chrome_trace(const std::string& path) const {
  const std::string json = chrome_trace_json();
  // Written beside the target and renamed: a failed write leaves an earlier trace whole.
  io::AtomicFile f(path, {.durable = false});
  f.write(json);
  f.commit();
}

TRAINKIT_INLINE void Timeline::record_trace(std::uint8_t track, std::int64_t begin_ns,
                                            std::int64_t end_ns, std::uint8_t kind) noexcept {
  if (options_.trace_capacity == 0) return;
  const TraceSpan s{begin_ns, end_ns, step_, track, kind};
  if (trace_.size() < options_.trace_capacity) {
    trace_.push_back(s);  // capacity reserved up front: never reallocates
  } else {
    trace_[trace_next_] = s;
    trace_next_ = (trace_next_ + 1) % options_.trace_capacity;
  }
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
