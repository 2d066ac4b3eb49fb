// SPDX-License-Identifier: MIT
// trainkit/monitor/monitor.hpp: Monitor, the one object a training loop talks to. It times each
// step's phases (Timeline), and every `log_every` steps summarizes them: step time, samples/s,
// tokens/s, achieved TFLOP/s and MFU, where the time went (data-wait % with an input-bound
// warning), peak memory and GPU health — on the console (progress bar or plain lines), in
// TensorBoard, in a JSON-lines file, and at the end as a Chrome trace.
//
// Step numbers: every output (console lines, progress, TensorBoard, metrics.jsonl, the trace)
// numbers a step by the optimizer steps completed when it ends, the number a checkpoint written
// after it carries: begin_step(s) starts the step of 0-based loop index s, which is reported as
// step s + 1. Step 0 is "before training" (e.g. the initial validation loss, see log_metrics). A
// run resumed from the checkpoint of step N (MonitorOptions::resume_step = N) continues at N + 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/monitor/gpu_monitor.hpp"
#include "trainkit/monitor/json_writer.hpp"
#include "trainkit/monitor/memory.hpp"
#include "trainkit/monitor/metrics_file.hpp"
#include "trainkit/monitor/progress.hpp"
#include "trainkit/monitor/tensorboard.hpp"
#include "trainkit/monitor/throughput.hpp"
#include "trainkit/monitor/timeline.hpp"

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainkit/cuda/stream.hpp"
#endif

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Options of Monitor. Per-step quantities are per rank.
struct MonitorOptions {
  std::int64_t total_steps = 0;  ///< for the progress bar's % and ETA; 0 = unknown
  std::int64_t log_every = 50;   ///< steps per summary
  /// A run resumed from the checkpoint of step N passes N (-1 = a fresh run): metrics_file keeps
  /// its lines up to step N and is appended to (later lines, from a run that went past the
  /// checkpoint, are dropped), TensorBoard supersedes the points past N (SessionLog START at N + 1,
  /// as SummaryWriter(purge_step=N + 1)), and the progress rate and ETA count from step N.
  std::int64_t resume_step = -1;
  int rank = 0;            ///< this process's rank: only rank 0 prints
  int world_size = 1;      ///< ranks in the job (global tokens/s = per-rank x world_size)
  bool all_ranks = false;  ///< every rank writes TensorBoard/metrics/trace (suffix per rank)

  std::string log_dir{};  ///< TensorBoard run directory; empty = no TensorBoard
  /// JSON-lines file of summaries; empty = none. Like log_dir and chrome_trace, its directory is
  /// created (with parents) by the constructor.
  std::string metrics_file{};
  std::string chrome_trace{};          ///< Chrome trace written at close(); empty = none
  std::size_t trace_capacity = 50000;  ///< newest spans kept for the trace

  ProgressStyle progress = ProgressStyle::kAuto;  ///< console style (kOff: summaries still print)
  std::FILE* console = stdout;  ///< where progress and summaries go; nullptr = silent

  double samples_per_step = 0.0;  ///< default samples per step (StepMetrics may override)
  double tokens_per_step = 0.0;   ///< default tokens per step
  double flops_per_step = 0.0;    ///< model FLOPs per step (e.g. transformer_flops_per_step)
  double peak_flops = 0.0;        ///< peak FLOP/s for MFU; 0 = device table (CUDA) or measured
  /// Where peak_flops comes from, shown next to MFU: e.g. "measured: f32 gemm" when the caller
  /// measured it; empty = "configured" (a number from a spec sheet or the user).
  std::string peak_label{};
  Precision precision = Precision::kBf16;  ///< selects the table peak (CUDA tier)
  bool measure_cpu_peak = false;  ///< CPU tier without peak_flops: measure it (0.2 s at start)

  double input_bound_threshold = 0.10;  ///< warn when data-wait exceeds this fraction of a step

  bool gpu_monitor = TRAINKIT_WITH_CUDA != 0;  ///< sample the GPU with NVML
  double gpu_interval_secs = 1.0;              ///< NVML sampling period
  bool nvtx = true;                            ///< NVTX ranges around spans (CUDA tier)
  ClockFn clock = steady_now_ns;               ///< time source (tests use a fake clock)
};

/// What end_step() is told about the step. Negative counts mean "use the MonitorOptions default".
struct StepMetrics {
  /// The step's loss if the host has it (reading it may sync a GPU); empty: not read this step.
  /// A NaN or infinite loss is reported as it is: the summary shows it, TensorBoard gets it.
  std::optional<double> loss = std::nullopt;
  double samples = -1.0;
  double tokens = -1.0;
  double flops = -1.0;
};

/// One summary: the window of steps since the previous one. Rates are per rank.
struct StepSummary {
  std::int64_t step = 0;     ///< last step of the window
  std::int64_t steps = 0;    ///< steps in the window
  double step_time_s = 0.0;  ///< mean wall time per step (gaps between steps included)
  double samples_per_s = 0.0;
  double tokens_per_s = 0.0;
  double tokens_per_s_global = 0.0;  ///< tokens_per_s x world_size (assumes balanced ranks)
  double flops_per_s = 0.0;          ///< achieved model FLOP/s
  double mfu = NAN;                  ///< flops_per_s / peak_flops; NaN without a peak
  double peak_flops = 0.0;
  std::string peak_label;   ///< where the peak came from, e.g. "H100 SXM bf16"
  TimelineWindow timeline;  ///< phase times
  double data_wait_fraction = 0.0;
  bool input_bound = false;         ///< data_wait_fraction > input_bound_threshold
  std::optional<double> loss_last;  ///< the last loss reported in the window (NaN, inf as they are)
  double loss_mean = NAN;           ///< mean of the finite losses reported in the window
  HostMemory host_memory;
  std::size_t device_memory_used = 0;       ///< now (CUDA tier)
  std::size_t device_memory_used_peak = 0;  ///< largest seen at any summary so far
  GpuStats gpu;                             ///< samples == 0 without NVML
};

namespace detail {
/// "81.2k", "5.20M": three significant digits with an SI suffix.
TRAINKIT_INLINE std::string si(double v);
/// "512 MiB", "1.23 GiB": binary units, three significant digits. (cuda::format_bytes scales the
/// same way but prints two decimals and exists only with CUDA; this one is the summary's format.)
TRAINKIT_INLINE std::string bytes(std::size_t n);
/// Creates the directory that will hold `path` (with parents), as the TensorBoard writer does
/// for log_dir. Throws trainkit::Error naming `option` and the path when it cannot.
TRAINKIT_INLINE void create_parent_directory(const std::string& path, std::string_view option);
#if TRAINKIT_IMPL

TRAINKIT_INLINE void create_parent_directory(const std::string& path, std::string_view option) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  TRAINKIT_CHECK(!ec, "monitor::Monitor: cannot create the directory '", parent.string(), "' of ",
                 option, " '", path, "': ", ec.message());
}

TRAINKIT_INLINE std::string si(double v) {
  constexpr const char* kSuffix[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.3g%s", v, kSuffix[i]);
  return text;
}

TRAINKIT_INLINE std::string bytes(std::size_t n) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int i = 0;
  while (v >= 1024.0 && i < 4) {
    v /= 1024.0;
    ++i;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.3g %s", v, kUnits[i]);
  return text;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// One greppable line describing a summary, e.g.
/// `[trainkit] step 100/1000 | 12.3 ms/step | 5.2k samples/s | 81.2k tok/s | 45.1 TFLOP/s |
///  MFU 4.6% of 989 TFLOP/s (H200 SXM bf16) | data 3.1% fwd 30.2% bwd 55.0% opt 8.1%
///  other 3.6% | loss 2.346 | host peak 1.23 GiB | gpu 98% 65C 512W 1980MHz`
TRAINKIT_INLINE std::string format_summary(const StepSummary& s, std::int64_t total_steps);

/// The training-loop facade. Usage:
/// ```
/// monitor::Monitor mon({.total_steps = 1000, .log_dir = "runs/exp1", .tokens_per_step = 8192,
///                       .flops_per_step = monitor::transformer_flops_per_step(...)});
/// for (std::int64_t step = 0; step < 1000; ++step) {
///   mon.begin_step(step);
///   { auto s = mon.span(monitor::Phase::kDataWait); batch = loader.next(); }
///   { auto s = mon.span(monitor::Phase::kForward); loss = model.forward(batch); }
///   { auto s = mon.span(monitor::Phase::kBackward); model.backward(); }
///   { auto s = mon.span(monitor::Phase::kOptimizer); opt.step(); }
///   mon.end_step({.loss = loss});
/// }
/// ```
/// Not thread-safe: call it from the training loop's thread (the GPU sampler has its own).
class Monitor {
 public:
  /// Opens the configured outputs. Throws trainkit::Error when a log file cannot be created.
  TRAINKIT_INLINE explicit Monitor(MonitorOptions options = {});
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  TRAINKIT_INLINE ~Monitor();

  /// Starts the step of 0-based loop index `step`; every output reports it as step `step` + 1,
  /// the optimizer steps completed when it ends (see the top of this file).
  void begin_step(std::int64_t step) {
    TRAINKIT_CHECK(step >= 0 && step < std::numeric_limits<std::int64_t>::max(),
                   "monitor::Monitor::begin_step(", step,
                   "): a step index is at least 0 and below 2^63 - 1");
    step_ = step + 1;
    timeline_.begin_step(step_);
  }

  /// A host-timed span of `phase` that ends with the returned object's scope.
  [[nodiscard]] Timeline::Span span(Phase phase) noexcept { return timeline_.span(phase); }
#if TRAINKIT_WITH_CUDA
  /// A span that also times the device work queued on `stream` (CUDA events, no host sync).
  [[nodiscard]] Timeline::Span span(Phase phase, cuda::StreamRef stream) {
    return timeline_.span(phase, stream);
  }
#endif

  /// Ends the current step; every `log_every` steps produces a summary (see summarize()).
  void end_step(const StepMetrics& metrics = {}) {
    timeline_.end_step();
    ++window_steps_;
    window_samples_ += metrics.samples >= 0.0 ? metrics.samples : options_.samples_per_step;
    window_tokens_ += metrics.tokens >= 0.0 ? metrics.tokens : options_.tokens_per_step;
    window_flops_ += metrics.flops >= 0.0 ? metrics.flops : options_.flops_per_step;
    if (metrics.loss) {
      const double loss = *metrics.loss;
      loss_last_ = loss;
      if (std::isfinite(loss)) {
        loss_sum_ += loss;
        ++loss_count_;
      }
      if (tensorboard_) tensorboard_->add_scalar("train/loss", loss, step_);
    }
    if (progress_)
      progress_->update(step_, metrics.loss.value_or(NAN), timeline_.last_step_end_ns());
    // At multiples of log_every, so a resumed run summarizes at the steps an uninterrupted one
    // does (its first window is shorter).
    const std::int64_t every = std::max<std::int64_t>(1, options_.log_every);
    if (step_ % every == 0 || window_steps_ >= every) summarize();
  }

  /// Logs a scalar to TensorBoard (when configured) at the current step (begin_step's index + 1).
  void log_scalar(std::string_view tag, double value) {
    if (tensorboard_) tensorboard_->add_scalar(tag, value, step_);
  }

  /// Logs scalars at an explicit `step` (optimizer steps completed; 0 = before training, e.g. the
  /// initial validation loss) to TensorBoard and as one line of the metrics file:
  /// {"step":0,"time":...,"val/loss":5.5}. Both are flushed, like a summary.
  void log_metrics(std::int64_t step,
                   std::initializer_list<std::pair<std::string_view, double>> values) {
    log_metrics_range(step, values);
  }
  /// The same for a map of names to values (e.g. an evaluation's ckpt::Metrics).
  template <class Map>
  requires requires(const Map& m) {
    std::string_view(m.begin()->first);
    double(m.begin()->second);
  }
  void log_metrics(std::int64_t step, const Map& values) { log_metrics_range(step, values); }

  /// Prints a line on rank 0's console without breaking the progress bar.
  TRAINKIT_INLINE void print(std::string_view line);

  /// Summarizes the steps since the previous summary now (end_step calls it every log_every
  /// steps; close() for the remainder). Returns the summary, also kept as last_summary().
  TRAINKIT_INLINE const StepSummary& summarize();

  /// The latest summary, if any.
  const std::optional<StepSummary>& last_summary() const noexcept { return last_; }
  /// The TensorBoard writer, or nullptr when none is configured.
  TensorBoardWriter* tensorboard() noexcept { return tensorboard_ ? &*tensorboard_ : nullptr; }
  Timeline& timeline() noexcept { return timeline_; }
  /// Peak FLOP/s used for MFU (0 = none) and where it came from.
  double peak_flops() const noexcept { return peak_flops_; }
  const std::string& peak_label() const noexcept { return peak_label_; }
  /// The GPU sampler, or nullptr when disabled by option.
  GpuMonitor* gpu_monitor() noexcept { return gpu_.get(); }

  /// Hands TensorBoard's buffered records to the file now (the metrics file keeps no buffer):
  /// train::Loop calls it after each checkpoint, so a run killed later still has every point up
  /// to the checkpoint it resumes from.
  void flush() {
    if (tensorboard_ && tensorboard_->enabled()) tensorboard_->flush();
  }

  /// Summarizes the remaining steps, writes the Chrome trace, finishes the progress bar and
  /// flushes and closes the files. Idempotent; the destructor calls it.
  TRAINKIT_INLINE void close();

 private:
  template <class Range>
  void log_metrics_range(std::int64_t step, const Range& values) {
    // Names that the line's own keys or another value would repeat make a line that JSON
    // readers take differently (or, on resume, not at all): refused before anything is written.
    for (auto a = std::begin(values); a != std::end(values); ++a) {
      const std::string_view name = a->first;
      TRAINKIT_CHECK(name != "step" && name != "time", "monitor::log_metrics: the metric name '",
                     name, "' is taken by the line's own ", name, "; choose another");
      // Not UTF-8: TensorBoard refuses it, and the JSON line would hold it with its bad bytes
      // replaced, where two different names can meet.
      std::size_t bad = 0;
      TRAINKIT_CHECK(io::is_valid_utf8(name, &bad), "monitor::log_metrics: the metric name '",
                     io::printable_bytes(name), "' is not UTF-8 (at byte ", bad,
                     "); TensorBoard and JSON readers need UTF-8 names");
      for (auto b = std::begin(values); b != a; ++b)
        TRAINKIT_CHECK(std::string_view(b->first) != name, "monitor::log_metrics: the metric '",
                       io::printable_bytes(name), "' is given twice at step ", step);
    }
    if (tensorboard_ && tensorboard_->enabled()) {
      for (const auto& [tag, value] : values) tensorboard_->add_scalar(tag, value, step);
      tensorboard_->flush();
    }
    if (metrics_) {
      JsonWriter w;
      w.begin_object().key("step").value(step).key("time").value(io::unix_time_now());
      for (const auto& [tag, value] : values) w.key(tag).value(value);
      w.end_object();
      metrics_->write_json(w.str());
    }
  }

  TRAINKIT_INLINE void resolve_peak();

  TRAINKIT_INLINE void report(const StepSummary& s);

  TRAINKIT_INLINE void write_tensorboard(const StepSummary& s);

  TRAINKIT_INLINE void write_metrics(const StepSummary& s);

  MonitorOptions options_;
  Timeline timeline_;
  std::optional<Progress> progress_;
  std::optional<TensorBoardWriter> tensorboard_;
  std::optional<MetricsFile> metrics_;
  std::unique_ptr<GpuMonitor> gpu_;
  std::string trace_path_;
  double peak_flops_ = 0.0;
  std::string peak_label_;
  std::int64_t step_ = 0;
  std::int64_t window_steps_ = 0;
  double window_samples_ = 0.0;
  double window_tokens_ = 0.0;
  double window_flops_ = 0.0;
  std::optional<double> loss_last_;
  double loss_sum_ = 0.0;
  std::int64_t loss_count_ = 0;
  std::size_t device_peak_ = 0;
  int summaries_since_warning_ = 10;
  bool mfu_warned_ = false;
  std::optional<StepSummary> last_;
  bool closed_ = false;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string format_summary(const StepSummary& s, std::int64_t total_steps) {
  std::string out = "[trainkit] step " + std::to_string(s.step);
  if (total_steps > 0) out += "/" + std::to_string(total_steps);
  char text[160];
  std::snprintf(text, sizeof text, " | %.4g ms/step", 1e3 * s.step_time_s);
  out += text;
  if (s.samples_per_s > 0.0) out += " | " + detail::si(s.samples_per_s) + " samples/s";
  if (s.tokens_per_s > 0.0) out += " | " + detail::si(s.tokens_per_s) + " tok/s";
  if (s.flops_per_s > 0.0) {
    std::snprintf(text, sizeof text, " | %.4g TFLOP/s", 1e-12 * s.flops_per_s);
    out += text;
    if (std::isfinite(s.mfu)) {
      std::snprintf(text, sizeof text, " | MFU %.1f%% of %.4g TFLOP/s (%s)", 100.0 * s.mfu,
                    1e-12 * s.peak_flops, s.peak_label.c_str());
      out += text;
    }
  }
  out += " |";
  constexpr const char* kShort[kPhaseCount] = {"data", "fwd", "bwd", "comm", "opt", "ckpt"};
  for (std::size_t i = 0; i < kPhaseCount; ++i) {
    const double f = s.timeline.fraction(static_cast<Phase>(i));
    if (f <= 0.0 && i != 0) continue;
    std::snprintf(text, sizeof text, " %s %.1f%%", kShort[i], 100.0 * f);
    out += text;
  }
  if (s.timeline.elapsed_s > 0.0) {
    std::snprintf(text, sizeof text, " other %.1f%%",
                  100.0 * s.timeline.other_s() / s.timeline.elapsed_s);
    out += text;
  }
  if (s.loss_last) {  // "loss nan" / "loss inf" for a diverged step
    std::snprintf(text, sizeof text, " | loss %.4g", *s.loss_last);
    out += text;
  }
  if (s.host_memory.peak_rss > 0) out += " | host peak " + detail::bytes(s.host_memory.peak_rss);
  if (s.device_memory_used_peak > 0) out += " | device " + detail::bytes(s.device_memory_used_peak);
  if (s.gpu.samples > 0) {
    std::snprintf(text, sizeof text, " | gpu %.0f%% %uC %.0fW %uMHz", s.gpu.util_gpu_mean,
                  s.gpu.temperature_max, s.gpu.power_mean_w, s.gpu.sm_clock_mean);
    out += text;
    if (s.gpu.throttle_reasons != 0)
      out += " throttle " + throttle_reason_string(s.gpu.throttle_reasons);
  }
  return out;
}

TRAINKIT_INLINE Monitor::Monitor(MonitorOptions options)
    : options_(std::move(options)),
      timeline_(TimelineOptions{
          .trace_capacity = options_.chrome_trace.empty() ? 0 : options_.trace_capacity,
          .nvtx = options_.nvtx,
          .rank = options_.rank,
          .clock = options_.clock}) {
  TRAINKIT_CHECK(options_.log_every > 0, "Monitor log_every must be positive, got ",
                 options_.log_every);
  const bool writes = options_.rank == 0 || options_.all_ranks;
  const std::string suffix =
      options_.all_ranks && options_.world_size > 1 ? ".rank" + std::to_string(options_.rank) : "";
  if (options_.rank == 0 && options_.console != nullptr) {
    progress_.emplace(ProgressOptions{.total = options_.total_steps,
                                      .initial = std::max<std::int64_t>(0, options_.resume_step),
                                      .style = options_.progress,
                                      .stream = options_.console,
                                      .clock = options_.clock});
  }
  if (!options_.log_dir.empty()) {
    tensorboard_.emplace(
        options_.log_dir,
        TensorBoardOptions{
            .rank = options_.rank,
            .rank_mode = options_.all_ranks ? RankMode::kPerRank : RankMode::kRank0Only,
            .purge_step = options_.resume_step >= 0 ? options_.resume_step + 1 : -1});
  }
  if (writes && !options_.metrics_file.empty()) {
    detail::create_parent_directory(options_.metrics_file + suffix, "metrics_file");
    if (options_.resume_step >= 0) {
      metrics_.emplace(MetricsFile::resumed(options_.metrics_file + suffix, options_.resume_step));
    } else {
      metrics_.emplace(options_.metrics_file + suffix);
    }
  }
  if (!options_.chrome_trace.empty()) trace_path_ = options_.chrome_trace + suffix;
  if (!writes) trace_path_.clear();
  // The trace is written at close(): a directory missing then would fail the run at its end.
  if (!trace_path_.empty()) detail::create_parent_directory(trace_path_, "chrome_trace");
  resolve_peak();
  if (options_.gpu_monitor) {
    gpu_ = std::make_unique<GpuMonitor>(
        GpuMonitorOptions{.interval_secs = options_.gpu_interval_secs,
                          .log = options_.rank == 0 ? options_.console : nullptr});
  }
}

TRAINKIT_INLINE Monitor::~Monitor() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainkit: closing the monitor failed: %s\n", e.what());
  }
}

TRAINKIT_INLINE void Monitor::print(std::string_view line) {
  if (progress_) {
    progress_->message(line);
  } else if (options_.rank == 0 && options_.console != nullptr) {
    std::fprintf(options_.console, "%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(options_.console);
  }
}

TRAINKIT_INLINE const StepSummary& Monitor::summarize() {
  StepSummary s;
  s.timeline = timeline_.take_window();
  s.step = s.timeline.last_step;
  s.steps = s.timeline.steps;
  s.step_time_s = s.timeline.step_s();
  const double elapsed = s.timeline.elapsed_s;
  if (elapsed > 0.0) {
    s.samples_per_s = window_samples_ / elapsed;
    s.tokens_per_s = window_tokens_ / elapsed;
    s.flops_per_s = window_flops_ / elapsed;
  }
  s.tokens_per_s_global = s.tokens_per_s * options_.world_size;
  s.peak_flops = peak_flops_;
  s.peak_label = peak_label_;
  if (peak_flops_ > 0.0 && s.flops_per_s > 0.0) s.mfu = s.flops_per_s / peak_flops_;
  s.data_wait_fraction = s.timeline.fraction(Phase::kDataWait);
  s.input_bound = s.steps > 0 && s.data_wait_fraction > options_.input_bound_threshold;
  s.loss_last = loss_last_;
  s.loss_mean = loss_count_ > 0 ? loss_sum_ / static_cast<double>(loss_count_) : NAN;
  s.host_memory = host_memory();
  s.device_memory_used = device_memory_used();
  device_peak_ = std::max(device_peak_, s.device_memory_used);
  s.device_memory_used_peak = device_peak_;
  if (gpu_) s.gpu = gpu_->take_window();
  window_steps_ = 0;
  window_samples_ = window_tokens_ = window_flops_ = 0.0;
  loss_sum_ = 0.0;
  loss_count_ = 0;
  loss_last_.reset();
  if (s.steps > 0) report(s);
  last_ = std::move(s);
  return *last_;
}

TRAINKIT_INLINE void Monitor::close() {
  if (closed_) return;
  closed_ = true;
  // A step begun and never ended (its task threw, or the loss diverged) did not complete: it is
  // not counted, timed or reported.
  timeline_.abandon_step();
  timeline_.synchronize_device();
  if (window_steps_ > 0) summarize();
  if (progress_) progress_->finish();
  gpu_.reset();
  if (!trace_path_.empty()) timeline_.write_chrome_trace(trace_path_);
  if (tensorboard_) tensorboard_->close();
  if (metrics_) metrics_->close();
}

TRAINKIT_INLINE void Monitor::resolve_peak() {
  if (options_.peak_flops > 0.0) {
    peak_flops_ = options_.peak_flops;
    peak_label_ = options_.peak_label.empty() ? "configured" : options_.peak_label;
    return;
  }
#if TRAINKIT_WITH_CUDA
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    if (const DevicePeak* entry = find_device_peak(prop.name)) {
      peak_flops_ = device_peak_flops(prop.name, options_.precision);
      peak_label_ = std::string(entry->label) + " " + precision_name(options_.precision);
      return;
    }
  }
  (void)cudaGetLastError();
#endif
  if (options_.measure_cpu_peak) {
    peak_flops_ = measure_cpu_peak_flops();
    peak_label_ = "measured CPU fp32";
  }
}

TRAINKIT_INLINE void Monitor::report(const StepSummary& s) {
  const std::string line = format_summary(s, options_.total_steps);
  if (options_.rank == 0) print(line);
  if (s.input_bound && options_.rank == 0 && summaries_since_warning_ >= 10) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "[trainkit] warning: input-bound: data-wait is %.1f%% of step time "
                  "(threshold %.0f%%); use more loader workers or prefetch deeper",
                  100.0 * s.data_wait_fraction, 100.0 * options_.input_bound_threshold);
    print(text);
    summaries_since_warning_ = 0;
  } else {
    ++summaries_since_warning_;
  }
  // MFU is never capped: above 100% the peak is wrong, and the line says so once.
  if (std::isfinite(s.mfu) && s.mfu > 1.0 && !mfu_warned_ && options_.rank == 0) {
    char text[400];
    std::snprintf(text, sizeof text,
                  "[trainkit] warning: MFU %.1f%% exceeds 100%% of the %.4g TFLOP/s peak (%s): "
                  "the peak is too low "
                  "(a measured one may have been taken while the machine was busy); "
                  "pass the hardware's peak to get a true MFU",
                  100.0 * s.mfu, 1e-12 * s.peak_flops, s.peak_label.c_str());
    print(text);
    mfu_warned_ = true;
  }
  if (tensorboard_ && tensorboard_->enabled()) write_tensorboard(s);
  if (metrics_) write_metrics(s);
}

TRAINKIT_INLINE void Monitor::write_tensorboard(const StepSummary& s) {
  TensorBoardWriter& tb = *tensorboard_;
  const std::int64_t step = s.step;
  tb.add_scalar("perf/step_time_ms", 1e3 * s.step_time_s, step);
  if (s.samples_per_s > 0.0) tb.add_scalar("perf/samples_per_s", s.samples_per_s, step);
  if (s.tokens_per_s > 0.0) tb.add_scalar("perf/tokens_per_s", s.tokens_per_s, step);
  if (s.flops_per_s > 0.0) tb.add_scalar("perf/tflops", 1e-12 * s.flops_per_s, step);
  if (std::isfinite(s.mfu)) tb.add_scalar("perf/mfu_pct", 100.0 * s.mfu, step);
  for (std::size_t i = 0; i < kPhaseCount; ++i) {
    const auto phase = static_cast<Phase>(i);
    tb.add_scalar(std::string("time/") + phase_name(phase) + "_pct",
                  100.0 * s.timeline.fraction(phase), step);
  }
  if (s.host_memory.peak_rss > 0) {
    tb.add_scalar("memory/host_peak_rss_gib",
                  static_cast<double>(s.host_memory.peak_rss) / (1u << 30), step);
  }
  if (s.device_memory_used_peak > 0) {
    tb.add_scalar("memory/device_used_peak_gib",
                  static_cast<double>(s.device_memory_used_peak) / (1u << 30), step);
  }
  if (s.gpu.samples > 0) {
    tb.add_scalar("gpu/utilization_pct", s.gpu.util_gpu_mean, step);
    tb.add_scalar("gpu/temperature_c", s.gpu.temperature_max, step);
    tb.add_scalar("gpu/power_w", s.gpu.power_mean_w, step);
    tb.add_scalar("gpu/sm_clock_mhz", s.gpu.sm_clock_mean, step);
    tb.add_scalar("gpu/throttle_reasons", static_cast<double>(s.gpu.throttle_reasons), step);
  }
  // Summaries are rare (every log_every steps): putting them on disk at once keeps the
  // dashboard current and a crashed run's file complete up to its last summary.
  tb.flush();
}

TRAINKIT_INLINE void Monitor::write_metrics(const StepSummary& s) {
  JsonWriter w;
  w.begin_object().key("step").value(s.step).key("time").value(io::unix_time_now());
  w.key("steps").value(s.steps).key("step_time_s").value(s.step_time_s);
  w.key("loss").value(s.loss_last.value_or(NAN)).key("loss_mean").value(s.loss_mean);
  w.key("samples_per_s").value(s.samples_per_s).key("tokens_per_s").value(s.tokens_per_s);
  w.key("tokens_per_s_global").value(s.tokens_per_s_global);
  w.key("tflops").value(1e-12 * s.flops_per_s).key("mfu").value(s.mfu);
  w.key("peak_tflops").value(1e-12 * s.peak_flops).key("peak").value(s.peak_label);
  for (std::size_t i = 0; i < kPhaseCount; ++i) {
    const auto phase = static_cast<Phase>(i);
    w.key(std::string(phase_name(phase)) + "_s").value(s.timeline.phase_s(phase));
  }
  w.key("other_s").value(s.timeline.other_s()).key("elapsed_s").value(s.timeline.elapsed_s);
  w.key("data_wait_fraction").value(s.data_wait_fraction).key("input_bound").value(s.input_bound);
  w.key("host_rss_bytes").value(static_cast<std::int64_t>(s.host_memory.rss));
  w.key("host_peak_rss_bytes").value(static_cast<std::int64_t>(s.host_memory.peak_rss));
  w.key("device_used_bytes").value(static_cast<std::int64_t>(s.device_memory_used));
  if (s.gpu.samples > 0) {
    w.key("gpu_util_pct").value(s.gpu.util_gpu_mean);
    w.key("gpu_temperature_c").value(static_cast<std::int64_t>(s.gpu.temperature_max));
    w.key("gpu_power_w").value(s.gpu.power_mean_w);
    w.key("gpu_sm_clock_mhz").value(static_cast<std::int64_t>(s.gpu.sm_clock_mean));
    w.key("gpu_throttle").value(throttle_reason_string(s.gpu.throttle_reasons));
  }
  w.end_object();
  metrics_->write_json(w.str());
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
