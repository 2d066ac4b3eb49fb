// SPDX-License-Identifier: MIT
// trainkit/monitor/tensorboard.hpp: TensorBoardWriter, the C++ counterpart of PyTorch's
// torch.utils.tensorboard.SummaryWriter — add_scalar, add_histogram, add_text and add_hparams
// write the same records (see io/tfevents.hpp) into an event file that `tensorboard --logdir`
// reads. In multi-process runs, rank 0 writes by default; every rank can write its own run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/protobuf.hpp"
#include "trainkit/io/tfevents.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Which ranks write TensorBoard files.
enum class RankMode : std::uint8_t {
  kRank0Only,  ///< rank 0 writes into log_dir; other ranks' writers do nothing (enabled() false)
  kPerRank,    ///< rank r writes into log_dir/rank<r>/, so TensorBoard shows one run per rank
};

/// Options of TensorBoardWriter.
struct TensorBoardOptions {
  int rank = 0;                               ///< this process's rank
  RankMode rank_mode = RankMode::kRank0Only;  ///< see RankMode
  double flush_secs = 10.0;  ///< a write flushes the buffer once its oldest record is this old
  std::size_t max_buffer_bytes = 1u << 20;  ///< ...or when this many bytes are buffered
  std::string filename_suffix{};            ///< appended to the event file name
  /// As SummaryWriter(purge_step=N): the new file starts with a SessionLog START at step N, and
  /// TensorBoard then discards the points of earlier files in log_dir at steps >= N. A run resumed
  /// from the checkpoint of step S passes S + 1, superseding what a crashed run logged past it.
  /// -1 = none (a fresh run).
  std::int64_t purge_step = -1;
};

/// Writes TensorBoard summaries for one run directory. Records are buffered (see
/// io::EventFileWriter) and flushed by the first write flush_secs after the oldest buffered one,
/// on flush(), close() and destruction (no timer thread: monitor::Monitor flushes at every
/// summary and log_metrics); a killed process leaves a readable file up to the last flush.
/// `wall_time` arguments are seconds since the Unix epoch (default: now). Not thread-safe.
/// Move-only.
class TensorBoardWriter {
 public:
  /// Creates the run directory and its event file (on ranks that write). Throws trainkit::Error
  /// when the directory or file cannot be created.
  TRAINKIT_INLINE explicit TensorBoardWriter(std::string log_dir, TensorBoardOptions options = {});

  /// False on ranks that do not write (then every add_* returns at once) and after close().
  bool enabled() const noexcept { return file_.has_value() && file_->is_open(); }
  /// The run directory this writer writes into.
  const std::string& log_dir() const noexcept { return log_dir_; }
  /// The event file's path (empty when disabled).
  std::string path() const { return file_ ? file_->path() : std::string(); }

  /// A scalar (stored as float32 `simple_value`, as SummaryWriter.add_scalar does).
  void add_scalar(std::string_view tag, double value, std::int64_t step,
                  std::optional<double> wall_time = std::nullopt) {
    if (!enabled()) return;
    io::encode_scalar_event(scratch_, wall(wall_time), step, tag, static_cast<float>(value));
    file_->write_event(scratch_.bytes());
  }

  /// A histogram of `values` with SummaryWriter's default bins (see io::make_histogram).
  /// Throws trainkit::Error naming the tag when `values` holds no finite number.
  void add_histogram(std::string_view tag, std::span<const float> values, std::int64_t step,
                     std::optional<double> wall_time = std::nullopt) {
    if (!enabled()) return;
    add_histogram(tag, io::make_histogram(values, io::default_histogram_bins(), tag), step,
                  wall_time);
  }
  void add_histogram(std::string_view tag, std::span<const double> values, std::int64_t step,
                     std::optional<double> wall_time = std::nullopt) {
    if (!enabled()) return;
    add_histogram(tag, io::make_histogram(values, io::default_histogram_bins(), tag), step,
                  wall_time);
  }
  /// A histogram computed by the caller (custom bins).
  void add_histogram(std::string_view tag, const io::Histogram& histogram, std::int64_t step,
                     std::optional<double> wall_time = std::nullopt) {
    if (!enabled()) return;
    io::encode_histogram_event(scratch_, wall(wall_time), step, tag, histogram);
    file_->write_event(scratch_.bytes());
  }

  /// Text, rendered as Markdown in TensorBoard's TEXT tab under `tag`/text_summary. Bytes of
  /// `text` that are not UTF-8 are written as U+FFFD (see io::encode_text_event).
  void add_text(std::string_view tag, std::string_view text, std::int64_t step,
                std::optional<double> wall_time = std::nullopt) {
    if (!enabled()) return;
    io::encode_text_event(scratch_, wall(wall_time), step, tag, text);
    file_->write_event(scratch_.bytes());
  }

  /// Hyper-parameters for TensorBoard's HPARAMS tab: writes the experiment (names, types and the
  /// metric tags to tabulate) and this run's session start/end records, at step 0. Unlike
  /// SummaryWriter.add_hparams (which starts a separate sub-run holding only final metric values)
  /// the session is this run itself, so the table shows the last value of scalars this writer
  /// logs under `metric_tags`, like TensorFlow's hp.hparams().
  TRAINKIT_INLINE void add_hparams(std::span<const io::HParam> hparams,
                                   std::span<const std::string> metric_tags,
                                   std::optional<double> wall_time = std::nullopt);

  /// Appends an already serialized tensorboard.Event (advanced: other plugins).
  void write_event(std::string_view serialized_event) {
    if (enabled()) file_->write_event(serialized_event);
  }

  /// Writes buffered records to the file now. Throws trainkit::Error on a write error.
  void flush() {
    if (enabled()) file_->flush();
  }
  /// Flushes and closes the event file; later add_* calls do nothing.
  void close() {
    if (file_) file_->close();
  }

 private:
  static double wall(std::optional<double> wall_time) noexcept {
    return wall_time ? *wall_time : io::unix_time_now();
  }

  std::string log_dir_;
  std::optional<io::EventFileWriter> file_;
  io::ProtoWriter scratch_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE TensorBoardWriter::TensorBoardWriter(std::string log_dir,
                                                     TensorBoardOptions options)
    : log_dir_(std::move(log_dir)) {
  TRAINKIT_CHECK(!log_dir_.empty(), "TensorBoardWriter needs a log directory");
  if (options.rank_mode == RankMode::kRank0Only && options.rank != 0) return;
  if (options.rank_mode == RankMode::kPerRank) {
    log_dir_ += "/rank" + std::to_string(options.rank);
  }
  file_.emplace(log_dir_, io::EventFileOptions{.flush_secs = options.flush_secs,
                                               .max_buffer_bytes = options.max_buffer_bytes,
                                               .filename_suffix = options.filename_suffix});
  if (options.purge_step >= 0) {
    // What torch.utils.tensorboard's SummaryWriter writes for purge_step: a second
    // file_version event and a SessionLog START, both at the purge step.
    const double now = io::unix_time_now();
    io::encode_file_version_event(scratch_, now, options.purge_step);
    file_->write_event(scratch_.bytes());
    io::encode_session_start_event(scratch_, now, options.purge_step);
    file_->write_event(scratch_.bytes());
    file_->flush();
  }
}

TRAINKIT_INLINE void TensorBoardWriter::add_hparams(std::span<const io::HParam> hparams,
                                                    std::span<const std::string> metric_tags,
                                                    std::optional<double> wall_time) {
  if (!enabled()) return;
  const double t = wall(wall_time);
  io::encode_hparams_experiment_event(scratch_, t, 0, hparams, metric_tags);
  file_->write_event(scratch_.bytes());
  io::encode_hparams_session_start_event(scratch_, t, 0, hparams);
  file_->write_event(scratch_.bytes());
  io::encode_hparams_session_end_event(scratch_, t, 0, 1);
  file_->write_event(scratch_.bytes());
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
