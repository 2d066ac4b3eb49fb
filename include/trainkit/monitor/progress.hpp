// SPDX-License-Identifier: MIT
// trainkit/monitor/progress.hpp: console progress. On a terminal, one progress bar redrawn in place
// (carriage return) with rate, ETA and the latest loss; when output goes to a file or a pipe
// (batch jobs, `| tee`), plain periodic lines instead, so logs stay readable and greppable.
// Other messages (step summaries, warnings) go through message(), which keeps the bar intact.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/monitor/timeline.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// How progress is shown. kAuto picks kBar on a terminal and kPlain otherwise.
enum class ProgressStyle : std::uint8_t { kAuto, kBar, kPlain, kOff };

/// Options of Progress.
struct ProgressOptions {
  std::int64_t total = 0;                      ///< steps in the run; 0 = unknown (no %, no ETA)
  std::int64_t initial = 0;                    ///< steps done at the start (resumed run); rate/ETA
                                               ///< count only the steps made since
  ProgressStyle style = ProgressStyle::kAuto;  ///< see ProgressStyle
  std::FILE* stream = stdout;                  ///< where output goes
  double bar_interval_secs = 0.1;              ///< least time between two bar redraws
  double line_interval_secs = 30.0;            ///< plain mode: a line at least this often...
  std::int64_t line_every_steps = 0;           ///< ...and every this many steps (0 = by time only)
  int bar_width = 30;                          ///< characters between the bar's '|'
  std::string label = "train";                 ///< first word of every line
  std::string unit = "it";                     ///< rate unit: "it" prints "12.3 it/s"
  ClockFn clock = steady_now_ns;               ///< time source (tests use a fake clock)
};

/// "mm:ss", or "h:mm:ss" from one hour on; "--:--" for unknown.
TRAINKIT_INLINE std::string format_duration(double seconds);

/// A progress display. Not thread-safe; call it from the training loop.
class Progress {
 public:
  TRAINKIT_INLINE explicit Progress(ProgressOptions options = {});
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { finish(); }

  /// The style in use (kAuto resolved).
  ProgressStyle style() const noexcept { return options_.style; }

  /// Reports `step` completed steps (counting from 0 at the start of the run, so a run resumed
  /// at step N reports N + 1 after its first step; see ProgressOptions::initial) and, if finite,
  /// the latest loss. Draws when the bar's redraw interval passed or, in plain mode, when a line is
  /// due; always on reaching the total (once: steps past it draw by the interval). `now_ns` is the
  /// time on options.clock when the caller already read it (saves a clock read per step); -1 reads
  /// the clock.
  TRAINKIT_INLINE void update(std::int64_t step, double loss = NAN, std::int64_t now_ns = -1);

  /// Prints a whole line (a summary, a warning) without corrupting the bar: the bar is erased,
  /// the line printed, and the bar redrawn below it.
  TRAINKIT_INLINE void message(std::string_view line);

  /// Ends the display: the bar is drawn one last time and the line ended; plain mode prints a
  /// final line when steps were made since the last one. Idempotent.
  TRAINKIT_INLINE void finish();

  /// The current rate in steps per second (smoothed); 0 before the second update.
  double rate() const noexcept { return rate_; }

 private:
  /// Updates the smoothed rate at `now` and returns the seconds since start.
  TRAINKIT_INLINE double measure_rate(std::int64_t now);

  TRAINKIT_INLINE std::string stats_text(double elapsed) const;

  TRAINKIT_INLINE void draw_bar(std::int64_t now);

  TRAINKIT_INLINE void write_line(std::int64_t now);

  void emit(std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), options_.stream);
    std::fflush(options_.stream);
  }

  ProgressOptions options_;
  std::int64_t start_ns_ = 0;
  std::int64_t last_output_ns_ = 0;
  std::int64_t step_ = 0;
  std::int64_t last_line_step_ = 0;
  std::int64_t rate_ns_ = 0;
  std::int64_t rate_step_ = 0;
  double rate_ = 0.0;
  double loss_ = NAN;
  bool drawn_ = false;
  bool finished_ = false;
  std::string bar_text_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string format_duration(double seconds) {
  // Not a time, or more than a century (an estimate from a huge step count): no estimate.
  if (!(seconds >= 0.0) || !(seconds < 3.2e9)) return "--:--";
  const auto total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", total / 3600, (total / 60) % 60,
                  total % 60);
  } else {
    std::snprintf(text, sizeof text, "%02lld:%02lld", total / 60, total % 60);
  }
  return text;
}

TRAINKIT_INLINE Progress::Progress(ProgressOptions options) : options_(std::move(options)) {
  if (options_.stream == nullptr) options_.style = ProgressStyle::kOff;
  if (options_.style == ProgressStyle::kAuto) {
    options_.style =
        ::isatty(::fileno(options_.stream)) != 0 ? ProgressStyle::kBar : ProgressStyle::kPlain;
  }
  start_ns_ = last_output_ns_ = rate_ns_ = options_.clock();
  step_ = last_line_step_ = rate_step_ = options_.initial;
}

TRAINKIT_INLINE void Progress::update(std::int64_t step, double loss, std::int64_t now_ns) {
  if (options_.style == ProgressStyle::kOff || finished_) return;
  // The update that reaches the total draws at once; later ones (a run going past the total it
  // was given) wait for the interval like any other, instead of drawing a line every step.
  const bool at_end = options_.total > 0 && step >= options_.total && step_ < options_.total;
  step_ = step;
  if (std::isfinite(loss)) loss_ = loss;
  const std::int64_t now = now_ns >= 0 ? now_ns : options_.clock();
  const double since = 1e-9 * static_cast<double>(now - last_output_ns_);
  if (options_.style == ProgressStyle::kBar) {
    if (since >= options_.bar_interval_secs || at_end || !drawn_) draw_bar(now);
  } else {
    const bool by_steps =
        options_.line_every_steps > 0 && step - last_line_step_ >= options_.line_every_steps;
    if (since >= options_.line_interval_secs || by_steps || at_end) write_line(now);
  }
}

TRAINKIT_INLINE void Progress::message(std::string_view line) {
  if (options_.stream == nullptr) return;
  std::string out;
  const bool redraw = options_.style == ProgressStyle::kBar && drawn_ && !finished_;
  if (redraw) out.append("\r\x1b[K");
  out.append(line);
  out.push_back('\n');
  if (redraw) out.append(bar_text_);
  emit(out);
}

TRAINKIT_INLINE void Progress::finish() {
  if (finished_ || options_.style == ProgressStyle::kOff) {
    finished_ = true;
    return;
  }
  const std::int64_t now = options_.clock();
  if (options_.style == ProgressStyle::kBar) {
    if (drawn_) {
      draw_bar(now);
      emit("\n");
    }
  } else if (step_ != last_line_step_) {
    write_line(now);
  }
  finished_ = true;
}

TRAINKIT_INLINE double Progress::measure_rate(std::int64_t now) {
  const double dt = 1e-9 * static_cast<double>(now - rate_ns_);
  const auto ds = static_cast<double>(step_ - rate_step_);
  if (dt > 0.0 && ds > 0.0) {
    const double instant = ds / dt;
    // Exponential smoothing (tqdm's 0.3) so one slow step does not swing the ETA.
    rate_ = rate_ > 0.0 ? 0.3 * instant + 0.7 * rate_ : instant;
  }
  if (ds > 0.0 || step_ < rate_step_) {
    rate_ns_ = now;
    rate_step_ = step_;
  }
  return 1e-9 * static_cast<double>(now - start_ns_);
}

TRAINKIT_INLINE std::string Progress::stats_text(double elapsed) const {
  char text[160];
  std::string out;
  const double remaining =
      options_.total > 0 && rate_ > 0.0 ? static_cast<double>(options_.total - step_) / rate_ : NAN;
  std::snprintf(text, sizeof text, "%s<%s, %.3g %s/s", format_duration(elapsed).c_str(),
                format_duration(remaining).c_str(), rate_, options_.unit.c_str());
  out.append(text);
  if (std::isfinite(loss_)) {
    std::snprintf(text, sizeof text, ", loss %.4g", loss_);
    out.append(text);
  }
  return out;
}

TRAINKIT_INLINE void Progress::draw_bar(std::int64_t now) {
  const double elapsed = measure_rate(now);
  std::string line = options_.label;
  char text[96];
  if (options_.total > 0) {
    const double frac = std::min(
        1.0, std::max(0.0, static_cast<double>(step_) / static_cast<double>(options_.total)));
    const int width = std::max(1, options_.bar_width);
    const int filled = static_cast<int>(frac * width);
    std::snprintf(text, sizeof text, " %3d%%|", static_cast<int>(frac * 100.0));
    line.append(text);
    line.append(static_cast<std::size_t>(filled), '#');
    line.append(static_cast<std::size_t>(width - filled), ' ');
    std::snprintf(text, sizeof text, "| %lld/%lld [", static_cast<long long>(step_),
                  static_cast<long long>(options_.total));
  } else {
    std::snprintf(text, sizeof text, " %lld [", static_cast<long long>(step_));
  }
  line.append(text);
  line.append(stats_text(elapsed));
  line.push_back(']');
  bar_text_ = "\r" + line + "\x1b[K";
  emit(bar_text_);
  drawn_ = true;
  last_output_ns_ = now;
}

TRAINKIT_INLINE void Progress::write_line(std::int64_t now) {
  const double elapsed = measure_rate(now);
  std::string line = options_.label;
  char text[96];
  if (options_.total > 0) {
    std::snprintf(text, sizeof text, " step %lld/%lld (%.1f%%) [", static_cast<long long>(step_),
                  static_cast<long long>(options_.total),
                  100.0 * static_cast<double>(step_) / static_cast<double>(options_.total));
  } else {
    std::snprintf(text, sizeof text, " step %lld [", static_cast<long long>(step_));
  }
  line.append(text);
  line.append(stats_text(elapsed));
  line.append("]\n");
  emit(line);
  last_line_step_ = step_;
  last_output_ns_ = now;
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
