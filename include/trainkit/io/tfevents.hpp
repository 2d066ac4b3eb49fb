// SPDX-License-Identifier: MIT
// trainkit/io/tfevents.hpp: TensorBoard event files without TensorFlow or libprotobuf. TFRecord
// framing (u64 length, masked CRC-32C of it, data, masked CRC-32C of data), encoders for the
// tensorboard.Event records PyTorch's SummaryWriter writes (scalar, histogram, text, hparams),
// byte-identical to it for the same inputs, and a buffered, crash-safe event file writer.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/crc32c.hpp"
#include "trainkit/io/protobuf.hpp"
#include "trainkit/io/utf8.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

// ---- TFRecord framing --------------------------------------------------------------------------

/// Appends one TFRecord holding `data` to `out`: 8-byte little-endian length, masked CRC-32C of
/// those 8 bytes, the data, masked CRC-32C of the data (all little-endian).
TRAINKIT_INLINE void append_tfrecord(std::string& out, std::string_view data);

/// The records of an event file, as read back by `split_tfrecords` / `read_tfrecords`.
struct TfRecords {
  std::vector<std::string> records;  ///< the payloads (serialized Events), in file order
  bool truncated = false;            ///< the file ends inside a record (normal while writing)
  std::size_t valid_bytes = 0;       ///< bytes covered by complete, checked records
};

namespace detail {
inline std::uint32_t load_u32le(const unsigned char* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
}  // namespace detail

/// Splits TFRecord-framed bytes into payloads, checking both CRCs of every record. A partial last
/// record sets `truncated` (a killed writer leaves one; readers then stop there, like TensorBoard).
/// Throws trainkit::Error naming `what` (a file name) and the byte offset on a CRC mismatch.
TRAINKIT_INLINE TfRecords split_tfrecords(std::string_view bytes, std::string_view what = "buffer");

/// Reads and checks every record of the file at `path` (see split_tfrecords). Throws
/// trainkit::Error when the file cannot be read or a CRC does not match.
TRAINKIT_INLINE TfRecords read_tfrecords(const std::string& path);

// ---- Event encoders ----------------------------------------------------------------------------
// Field numbers from tensorboard/compat/proto/{event,summary,histogram,tensor,tensor_shape}.proto.
// Each encoder writes the serialized tensorboard.Event into `out` (cleared first), fields in
// ascending order and proto3 defaults omitted, exactly as Python protobuf's SerializeToString.

namespace detail {
/// Event{wall_time=1, step=2, summary=5{value=1{tag=1, ...}}}: opens the Summary.Value; the caller
/// writes the value fields and calls close_event_value with the two marks.
struct ValueMarks {
  std::size_t summary;
  std::size_t value;
};
TRAINKIT_INLINE ValueMarks open_event_value(ProtoWriter& out, double wall_time, std::int64_t step,
                                            std::string_view tag);
inline void close_event_value(ProtoWriter& out, ValueMarks marks) {
  out.end_message(marks.value);
  out.end_message(marks.summary);
}
/// Throws unless `tag` is UTF-8 (protobuf string fields must be; Python's reader refuses others).
/// `what` names it in the message.
TRAINKIT_INLINE void check_tag(std::string_view tag, std::string_view what = "tag");
/// SummaryMetadata{plugin_data=1{plugin_name=1, content=2}} as field 9 of Summary.Value.
TRAINKIT_INLINE void write_plugin_metadata(ProtoWriter& out, std::string_view plugin,
                                           std::string_view content);
#if TRAINKIT_IMPL

TRAINKIT_INLINE void check_tag(std::string_view tag, std::string_view what) {
  std::size_t at = 0;
  TRAINKIT_CHECK(is_valid_utf8(tag, &at), "TensorBoard ", what, " '", printable_bytes(tag),
                 "' is not UTF-8 (at byte ", at, "): TensorBoard could not read the event");
}

TRAINKIT_INLINE ValueMarks open_event_value(ProtoWriter& out, double wall_time, std::int64_t step,
                                            std::string_view tag) {
  check_tag(tag);
  out.clear();
  out.field_double_nonzero(1, wall_time);
  out.field_int64_nonzero(2, step);
  const std::size_t summary = out.begin_message(5);
  const std::size_t value = out.begin_message(1);
  out.field_bytes_nonempty(1, tag);
  return {summary, value};
}

TRAINKIT_INLINE void write_plugin_metadata(ProtoWriter& out, std::string_view plugin,
                                           std::string_view content) {
  const std::size_t metadata = out.begin_message(9);
  const std::size_t plugin_data = out.begin_message(1);
  out.field_bytes_nonempty(1, plugin);
  out.field_bytes_nonempty(2, content);
  out.end_message(plugin_data);
  out.end_message(metadata);
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// The first record of every event file: Event{wall_time, file_version="brain.Event:2"}, plus
/// source_metadata{writer} (field 10) when `writer` is not empty, as tensorboard >= 2.12 writes.
TRAINKIT_INLINE void encode_file_version_event(ProtoWriter& out, double wall_time,
                                               std::string_view writer = {});

/// Event{wall_time, step, file_version="brain.Event:2"}: the record SummaryWriter(purge_step=N)
/// writes at step N after the file's own first record, ahead of the SessionLog START.
TRAINKIT_INLINE void encode_file_version_event(ProtoWriter& out, double wall_time,
                                               std::int64_t step);

/// Event{wall_time, step, session_log=7{status=1 START}}: TensorBoard discards every point read so
/// far at a step >= `step` (its restart purge), which is how SummaryWriter(purge_step=step) makes
/// a resumed run supersede what a crashed one logged past its checkpoint.
TRAINKIT_INLINE void encode_session_start_event(ProtoWriter& out, double wall_time,
                                                std::int64_t step);

/// A scalar as SummaryWriter.add_scalar writes it (new_style=False): Summary.Value{tag,
/// simple_value=float32(value)}, no metadata; TensorBoard files it under the "scalars" plugin.
inline void encode_scalar_event(ProtoWriter& out, double wall_time, std::int64_t step,
                                std::string_view tag, float value) {
  const auto marks = detail::open_event_value(out, wall_time, step, tag);
  out.field_float(2, value);  // a oneof member: written even when 0
  detail::close_event_value(out, marks);
}

/// A text entry as SummaryWriter.add_text writes it: tag + "/text_summary", a DT_STRING tensor of
/// shape [1] holding the UTF-8 text, metadata plugin "text" (TextPluginData version 0 = no bytes).
/// TensorBoard renders the text as Markdown. Each byte of `text` that does not begin a well-formed
/// UTF-8 sequence is written as U+FFFD (TensorBoard's text plugin fails on the whole tag otherwise,
/// and model samples cut between the bytes of a character are common); the tag must be UTF-8.
TRAINKIT_INLINE void encode_text_event(ProtoWriter& out, double wall_time, std::int64_t step,
                                       std::string_view tag, std::string_view text);

// ---- Histograms --------------------------------------------------------------------------------

/// tensorboard.HistogramProto. Bucket i counts values in (bucket_limit[i-1], bucket_limit[i]]
/// (TensorBoard's reading; bucket 0 starts at -DBL_MAX); `num` is the count of values.
struct Histogram {
  double min = 0.0;
  double max = 0.0;
  double num = 0.0;
  double sum = 0.0;
  double sum_squares = 0.0;
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
};

/// SummaryWriter's default ('tensorflow') bin edges: -1e20..-1e-12, 0, 1e-12..1e20 growing by a
/// factor 1.1, generated with the same double arithmetic as torch/utils/tensorboard/writer.py
/// (v = 1e-12; while v < 1e20: push v; v *= 1.1), so the edges are bit-identical. 1549 edges.
TRAINKIT_INLINE const std::vector<double>& default_histogram_bins();

namespace detail {
// numpy's pairwise summation (npy_pairwise_sum): 8 accumulators for blocks of <= 128 values,
// halving above. Equal bits to `numpy.ndarray.sum` whenever numpy also sums in one pass.
template <class Get>
double pairwise_sum(std::size_t begin, std::size_t n, const Get& get) {
  if (n < 8) {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += get(begin + i);
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = get(begin + j);
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (std::size_t j = 0; j < 8; ++j) r[j] += get(begin + i + j);
    }
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += get(begin + i);
    return s;
  }
  std::size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(begin, n2, get) + pairwise_sum(begin + n2, n - n2, get);
}

/// "histogram" or "histogram 'name'" (escaped), how errors of make_histogram start.
inline std::string histogram_label(std::string_view name) {
  return name.empty() ? std::string("histogram") : "histogram '" + printable_bytes(name) + "'";
}

template <class T>
Histogram make_histogram_impl(std::span<const T> values, std::span<const double> edges,
                              std::string_view name) {
  TRAINKIT_CHECK(edges.size() >= 2, histogram_label(name), " needs at least 2 bin edges, got ",
                 edges.size());
  TRAINKIT_CHECK(std::is_sorted(edges.begin(), edges.end()), histogram_label(name),
                 ": the bin edges must be sorted ascending");
  // Non-finite values are left out of every statistic: one NaN must not turn a training run's
  // weight histogram into an exception (PyTorch would raise).
  std::vector<double> finite;
  finite.reserve(values.size());
  for (const T v : values) {
    const auto d = static_cast<double>(v);
    if (std::isfinite(d)) finite.push_back(d);
  }
  TRAINKIT_CHECK(!finite.empty(), histogram_label(name), " of ", values.size(),
                 " values has no finite value to count");
  // numpy.histogram with explicit edges: bin i holds edges[i] <= v < edges[i+1], the last bin
  // also holds v == edges.back(); values outside [edges.front(), edges.back()] are not counted.
  const std::size_t bins = edges.size() - 1;
  std::vector<double> counts(bins, 0.0);
  Histogram h;
  h.min = finite[0];
  h.max = finite[0];
  for (const double v : finite) {
    h.min = std::min(h.min, v);
    h.max = std::max(h.max, v);
    if (v < edges.front() || v > edges.back()) continue;
    auto index =
        static_cast<std::size_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
    index = index == 0 ? 0 : index - 1;
    if (index >= bins) index = bins - 1;
    counts[index] += 1.0;
  }
  h.num = static_cast<double>(finite.size());
  h.sum = pairwise_sum(0, finite.size(), [&](std::size_t i) { return finite[i]; });
  h.sum_squares =
      pairwise_sum(0, finite.size(), [&](std::size_t i) { return finite[i] * finite[i]; });
  // torch make_histogram: keep from the first to the last non-empty bin, labelled by right edges,
  // plus one empty bin on the left so the left edge of the first non-empty bin is kept too.
  std::size_t first = bins;
  std::size_t last = 0;
  for (std::size_t i = 0; i < bins; ++i) {
    if (counts[i] > 0.0) {
      first = std::min(first, i);
      last = i;
    }
  }
  TRAINKIT_CHECK(first < bins, histogram_label(name), ": the values lie outside the bin edges [",
                 edges.front(), ", ", edges.back(), "]");
  if (first > 0) {
    h.bucket.assign(counts.begin() + static_cast<std::ptrdiff_t>(first - 1),
                    counts.begin() + static_cast<std::ptrdiff_t>(last + 1));
  } else {
    h.bucket.push_back(0.0);
    h.bucket.insert(h.bucket.end(), counts.begin(),
                    counts.begin() + static_cast<std::ptrdiff_t>(last + 1));
  }
  h.bucket_limit.assign(edges.begin() + static_cast<std::ptrdiff_t>(first),
                        edges.begin() + static_cast<std::ptrdiff_t>(last + 2));
  return h;
}
}  // namespace detail

/// The histogram SummaryWriter.add_histogram(tag, values, bins='tensorflow') writes: numpy
/// histogram over `edges` (default: default_histogram_bins()), trimmed to the non-empty range,
/// with min, max, num, sum and sum of squares. Sums use numpy's pairwise order (bit-equal to
/// PyTorch whenever numpy sums in one pass; PyTorch's sum of squares comes from BLAS `dot`, whose
/// rounding may differ in the last bit). Differences from PyTorch: non-finite values are skipped
/// instead of poisoning min/max/sum. Throws trainkit::Error when no finite value lies inside the
/// edges (PyTorch raises too) or the edges are not sorted; the message names `name` (e.g. the
/// tag) when it is given.
inline Histogram make_histogram(std::span<const double> values,
                                std::span<const double> edges = default_histogram_bins(),
                                std::string_view name = {}) {
  return detail::make_histogram_impl(values, edges, name);
}
/// Float input is widened to double first, as PyTorch's `values.astype(float)` does.
inline Histogram make_histogram(std::span<const float> values,
                                std::span<const double> edges = default_histogram_bins(),
                                std::string_view name = {}) {
  return detail::make_histogram_impl(values, edges, name);
}

/// A histogram as SummaryWriter.add_histogram writes it: Summary.Value{tag, histo=HistogramProto}.
TRAINKIT_INLINE void encode_histogram_event(ProtoWriter& out, double wall_time, std::int64_t step,
                                            std::string_view tag, const Histogram& h);

// ---- Hyper-parameters (the TensorBoard "HPARAMS" dashboard) ------------------------------------

/// One hyper-parameter: a number (integers are stored as double, as TensorBoard does), a string
/// or a bool: `{"lr", 3e-4}`, `{"batch_size", 64}`, `{"optimizer", "adamw"}`, `{"amp", true}`.
struct HParam {
  std::string name;
  std::variant<double, std::string, bool> value;

  HParam(std::string n, double v) : name(std::move(n)), value(v) {}
  template <std::integral I>
  requires(!std::same_as<I, bool>) HParam(std::string n, I v)
      : name(std::move(n)), value(static_cast<double>(v)) {}
  HParam(std::string n, bool v) : name(std::move(n)), value(v) {}
  HParam(std::string n, std::string v) : name(std::move(n)), value(std::move(v)) {}
  HParam(std::string n, const char* v) : name(std::move(n)), value(std::string(v)) {}
};

namespace detail {
// plugin_data content = HParamsPluginData{version=1 (0, omitted), experiment=2 |
// session_start_info=3 | session_end_info=4}; tensorboard/plugins/hparams/{api,plugin_data}.proto.
TRAINKIT_INLINE int hparam_data_type(const HParam& p);
#if TRAINKIT_IMPL

TRAINKIT_INLINE int hparam_data_type(const HParam& p) {
  // tensorboard.hparams.DataType: STRING 1, BOOL 2, FLOAT64 3.
  if (std::holds_alternative<std::string>(p.value)) return 1;
  if (std::holds_alternative<bool>(p.value)) return 2;
  return 3;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// `_hparams_/experiment`: declares the hyper-parameter names and types and the metric tags the
/// HPARAMS dashboard tabulates, as torch.utils.tensorboard.summary.hparams builds it (HParamInfo
/// {name, type}, MetricInfo{name{tag}}). Unlike PyTorch, a bool is typed DATA_TYPE_BOOL.
TRAINKIT_INLINE void encode_hparams_experiment_event(ProtoWriter& out, double wall_time,
                                                     std::int64_t step,
                                                     std::span<const HParam> hparams,
                                                     std::span<const std::string> metric_tags);

/// `_hparams_/session_start_info`: this run's hyper-parameter values (a map<string,
/// google.protobuf.Value>; number_value=2, string_value=3, bool_value=4). Map entries are written
/// in the order given (protobuf leaves map order unspecified; readers do not care).
TRAINKIT_INLINE void encode_hparams_session_start_event(ProtoWriter& out, double wall_time,
                                                        std::int64_t step,
                                                        std::span<const HParam> hparams);

/// `_hparams_/session_end_info` with status (tensorboard.hparams.Status): 1 SUCCESS, 2 FAILURE,
/// 3 RUNNING.
TRAINKIT_INLINE void encode_hparams_session_end_event(ProtoWriter& out, double wall_time,
                                                      std::int64_t step, int status = 1);

// ---- Event files -------------------------------------------------------------------------------

/// `events.out.tfevents.<%010d seconds>.<host>.<pid>.<uid><suffix>`: the name tensorboard's Python
/// writer (used by PyTorch) gives, so files sort chronologically and several writers of one
/// process (uid 0, 1, ...) never collide. TensorBoard reads any file whose name contains
/// "tfevents".
TRAINKIT_INLINE std::string event_file_name(std::int64_t unix_seconds, std::string_view host,
                                            long pid, long uid, std::string_view suffix = {});

/// Seconds since the Unix epoch as a double, the wall_time of every Event (Python's time.time()).
inline double unix_time_now() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Options of EventFileWriter.
struct EventFileOptions {
  double flush_secs = 10.0;  ///< a write flushes when the oldest buffered record is this old
  std::size_t max_buffer_bytes = 1u << 20;  ///< flush when the buffer grows past this
  std::string filename_suffix{};            ///< appended to the file name (e.g. ".rank3")
  std::string writer_name = "trainkit";     ///< source_metadata.writer of the first record
};

namespace detail {
inline std::atomic<long>& event_file_uid() noexcept {
  static std::atomic<long> uid{0};
  return uid;
}
inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}
}  // namespace detail

/// Appends framed event records to a new file in a log directory. Records are buffered in memory
/// and written with write(2) by the first write_event() at least `flush_secs` after the oldest
/// unflushed record (there is no timer thread: records written before a pause stay buffered
/// until the next write or flush()), when the buffer exceeds `max_buffer_bytes`, on flush(),
/// close() and destruction. Whole records are
/// written in order, so a killed process leaves a file that readers accept up to the last flushed
/// record (at worst one partial record at the end, which TensorBoard treats as "still being
/// written"). Not thread-safe: one writer per thread, or lock around it. Move-only.
class EventFileWriter {
 public:
  /// Creates `log_dir` (with parents) and the event file, writes the file_version record and
  /// flushes it, so even an empty run shows up. Throws trainkit::Error naming the path on failure.
  TRAINKIT_INLINE explicit EventFileWriter(const std::string& log_dir,
                                           EventFileOptions options = {});

  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  EventFileWriter(EventFileWriter&& other) noexcept { swap(other); }
  EventFileWriter& operator=(EventFileWriter&& other) noexcept {
    if (this != &other) {
      close_nothrow();
      swap(other);
    }
    return *this;
  }
  ~EventFileWriter() { close_nothrow(); }

  /// The file being written.
  const std::string& path() const noexcept { return path_; }
  bool is_open() const noexcept { return fd_ >= 0; }

  /// Frames and buffers one serialized tensorboard.Event; may flush (see the class comment).
  void write_event(std::string_view event) {
    TRAINKIT_CHECK(fd_ >= 0, "write to closed event file '", path_, "'");
    if (buffer_.empty()) first_pending_ = std::chrono::steady_clock::now();
    append_tfrecord(buffer_, event);
    if (buffer_.size() >= options_.max_buffer_bytes ||
        std::chrono::steady_clock::now() - first_pending_ >=
            std::chrono::duration<double>(options_.flush_secs)) {
      flush();
    }
  }

  /// Writes every buffered record to the file (the OS page cache; survives a process crash).
  /// Throws trainkit::Error when a write fails (a full disk: ENOSPC, EFBIG). The bytes that did
  /// reach the file are dropped from the buffer and the rest stays buffered, so the next flush
  /// resumes at the first byte not yet written: once space is back the file holds every record
  /// whole and in order, and until then it ends at worst in one partial record, which readers
  /// treat as "still being written".
  void flush() {
    if (fd_ < 0 || buffer_.empty()) return;
    std::size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        const std::size_t total = buffer_.size();
        buffer_.erase(0, done);
        TRAINKIT_FAIL("writing event file '", path_, "' failed after ", done, " of ", total,
                      " bytes: ", std::strerror(err), " (the ", buffer_.size(),
                      " bytes not written stay buffered for the next flush)");
      }
      done += static_cast<std::size_t>(n);
    }
    buffer_.clear();
  }

  /// Flushes and closes the file. Throws trainkit::Error when the final write fails.
  void close() {
    if (fd_ < 0) return;
    flush();
    ::close(fd_);
    fd_ = -1;
  }

 private:
  void close_nothrow() noexcept {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trainkit: closing event file failed: %s\n", e.what());
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    }
  }
  void swap(EventFileWriter& other) noexcept {
    std::swap(options_, other.options_);
    std::swap(path_, other.path_);
    std::swap(fd_, other.fd_);
    std::swap(buffer_, other.buffer_);
    std::swap(first_pending_, other.first_pending_);
    std::swap(scratch_, other.scratch_);
  }

  EventFileOptions options_;
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  std::chrono::steady_clock::time_point first_pending_{};
  ProtoWriter scratch_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE void append_tfrecord(std::string& out, std::string_view data) {
  char header[12];
  const std::uint64_t length = data.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  const std::uint32_t length_crc = masked_crc32c(header, 8);
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<char>((length_crc >> (8 * i)) & 0xFF);
  out.append(header, 12);
  out.append(data);
  const std::uint32_t data_crc = masked_crc32c(data.data(), data.size());
  char footer[4];
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<char>((data_crc >> (8 * i)) & 0xFF);
  out.append(footer, 4);
}

TRAINKIT_INLINE TfRecords split_tfrecords(std::string_view bytes, std::string_view what) {
  TfRecords result;
  std::size_t offset = 0;
  const auto* base = reinterpret_cast<const unsigned char*>(bytes.data());
  while (offset < bytes.size()) {
    if (bytes.size() - offset < 12) {
      result.truncated = true;
      break;
    }
    const unsigned char* p = base + offset;
    std::uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(p[i]) << (8 * i);
    TRAINKIT_CHECK(detail::load_u32le(p + 8) == masked_crc32c(p, 8),
                   "TFRecord length CRC mismatch in '", what, "' at byte ", offset,
                   ": the file is corrupt and cannot be framed further");
    if (bytes.size() - offset - 12 < length || bytes.size() - offset - 12 - length < 4) {
      result.truncated = true;
      break;
    }
    const auto size = static_cast<std::size_t>(length);
    TRAINKIT_CHECK(detail::load_u32le(p + 12 + size) == masked_crc32c(p + 12, size),
                   "TFRecord data CRC mismatch in '", what, "' for the record at byte ", offset,
                   " (", size, " bytes): the record is corrupt");
    result.records.emplace_back(bytes.substr(offset + 12, size));
    offset += 16 + size;
    result.valid_bytes = offset;
  }
  return result;
}

TRAINKIT_INLINE TfRecords read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRAINKIT_CHECK(in.good(), "cannot open event file '", path, "' for reading");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return split_tfrecords(bytes, path);
}

TRAINKIT_INLINE void encode_file_version_event(ProtoWriter& out, double wall_time,
                                               std::string_view writer) {
  out.clear();
  out.field_double_nonzero(1, wall_time);
  out.field_bytes(3, "brain.Event:2");
  if (!writer.empty()) {
    const std::size_t source = out.begin_message(10);
    out.field_bytes(1, writer);
    out.end_message(source);
  }
}

TRAINKIT_INLINE void encode_file_version_event(ProtoWriter& out, double wall_time,
                                               std::int64_t step) {
  out.clear();
  out.field_double_nonzero(1, wall_time);
  out.field_int64_nonzero(2, step);
  out.field_bytes(3, "brain.Event:2");
}

TRAINKIT_INLINE void encode_session_start_event(ProtoWriter& out, double wall_time,
                                                std::int64_t step) {
  out.clear();
  out.field_double_nonzero(1, wall_time);
  out.field_int64_nonzero(2, step);
  const std::size_t session_log = out.begin_message(7);
  out.field_varint(1, 1);  // SessionLog.START
  out.end_message(session_log);
}

TRAINKIT_INLINE void encode_text_event(ProtoWriter& out, double wall_time, std::int64_t step,
                                       std::string_view tag, std::string_view text) {
  std::string full_tag;
  full_tag.reserve(tag.size() + 13);
  full_tag.append(tag).append("/text_summary");
  std::string replaced;
  if (!is_valid_utf8(text)) {
    replaced = replace_invalid_utf8(text);
    text = replaced;
  }
  const auto marks = detail::open_event_value(out, wall_time, step, full_tag);
  const std::size_t tensor = out.begin_message(8);
  out.field_varint(1, 7);  // dtype DT_STRING
  const std::size_t shape = out.begin_message(2);
  const std::size_t dim = out.begin_message(2);
  out.field_int64(1, 1);  // size 1
  out.end_message(dim);
  out.end_message(shape);
  out.field_bytes(8, text);  // string_val
  out.end_message(tensor);
  detail::write_plugin_metadata(out, "text", {});
  detail::close_event_value(out, marks);
}

TRAINKIT_INLINE const std::vector<double>& default_histogram_bins() {
  static const std::vector<double> bins = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    std::vector<double> edges;
    edges.reserve(2 * positive.size() + 1);
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) edges.push_back(-*it);
    edges.push_back(0.0);
    edges.insert(edges.end(), positive.begin(), positive.end());
    return edges;
  }();
  return bins;
}

TRAINKIT_INLINE void encode_histogram_event(ProtoWriter& out, double wall_time, std::int64_t step,
                                            std::string_view tag, const Histogram& h) {
  const auto marks = detail::open_event_value(out, wall_time, step, tag);
  const std::size_t histo = out.begin_message(5);
  out.field_double_nonzero(1, h.min);
  out.field_double_nonzero(2, h.max);
  out.field_double_nonzero(3, h.num);
  out.field_double_nonzero(4, h.sum);
  out.field_double_nonzero(5, h.sum_squares);
  out.field_packed_doubles(6, h.bucket_limit);
  out.field_packed_doubles(7, h.bucket);
  out.end_message(histo);
  detail::close_event_value(out, marks);
}

TRAINKIT_INLINE void encode_hparams_experiment_event(ProtoWriter& out, double wall_time,
                                                     std::int64_t step,
                                                     std::span<const HParam> hparams,
                                                     std::span<const std::string> metric_tags) {
  ProtoWriter content;
  const std::size_t experiment = content.begin_message(2);
  for (const HParam& p : hparams) {
    detail::check_tag(p.name, "hparam name");
    const std::size_t info = content.begin_message(4);
    content.field_bytes_nonempty(1, p.name);
    content.field_varint(4, static_cast<std::uint64_t>(detail::hparam_data_type(p)));
    content.end_message(info);
  }
  for (const std::string& tag : metric_tags) {
    detail::check_tag(tag, "hparam metric tag");
    const std::size_t info = content.begin_message(5);
    const std::size_t name = content.begin_message(1);
    content.field_bytes_nonempty(2, tag);
    content.end_message(name);
    content.end_message(info);
  }
  content.end_message(experiment);
  const auto marks = detail::open_event_value(out, wall_time, step, "_hparams_/experiment");
  detail::write_plugin_metadata(out, "hparams", content.bytes());
  detail::close_event_value(out, marks);
}

TRAINKIT_INLINE void encode_hparams_session_start_event(ProtoWriter& out, double wall_time,
                                                        std::int64_t step,
                                                        std::span<const HParam> hparams) {
  // Nested messages built like the experiment's above (begin, fields, end); the fields differ.
  ProtoWriter content;
  const std::size_t start = content.begin_message(3);
  for (const HParam& p : hparams) {
    detail::check_tag(p.name, "hparam name");
    if (const auto* text = std::get_if<std::string>(&p.value))
      detail::check_tag(*text, "hparam value of " + printable_bytes(p.name) + ",");
    const std::size_t entry = content.begin_message(1);
    content.field_bytes(1, p.name);
    const std::size_t value = content.begin_message(2);
    if (const auto* number = std::get_if<double>(&p.value)) {
      content.field_double(2, *number);  // oneof member: written even when 0
    } else if (const auto* text = std::get_if<std::string>(&p.value)) {
      content.field_bytes(3, *text);
    } else {
      content.field_varint(4, std::get<bool>(p.value) ? 1 : 0);
    }
    content.end_message(value);
    content.end_message(entry);
  }
  content.end_message(start);
  const auto marks = detail::open_event_value(out, wall_time, step, "_hparams_/session_start_info");
  detail::write_plugin_metadata(out, "hparams", content.bytes());
  detail::close_event_value(out, marks);
}

TRAINKIT_INLINE void encode_hparams_session_end_event(ProtoWriter& out, double wall_time,
                                                      std::int64_t step, int status) {
  ProtoWriter content;
  const std::size_t end = content.begin_message(4);
  content.field_varint_nonzero(1, static_cast<std::uint64_t>(status));
  content.end_message(end);
  const auto marks = detail::open_event_value(out, wall_time, step, "_hparams_/session_end_info");
  detail::write_plugin_metadata(out, "hparams", content.bytes());
  detail::close_event_value(out, marks);
}

TRAINKIT_INLINE std::string event_file_name(std::int64_t unix_seconds, std::string_view host,
                                            long pid, long uid, std::string_view suffix) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_seconds));
  std::string name = "events.out.tfevents.";
  name.append(seconds).append(".").append(host).append(".");
  name.append(std::to_string(pid)).append(".").append(std::to_string(uid)).append(suffix);
  return name;
}

TRAINKIT_INLINE EventFileWriter::EventFileWriter(const std::string& log_dir,
                                                 EventFileOptions options)
    : options_(std::move(options)) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  TRAINKIT_CHECK(!ec, "cannot create the TensorBoard log directory '", log_dir,
                 "': ", ec.message());
  const double now = unix_time_now();
  const auto name = event_file_name(
      static_cast<std::int64_t>(now), detail::host_name(), static_cast<long>(::getpid()),
      detail::event_file_uid().fetch_add(1), options_.filename_suffix);
  path_ = (std::filesystem::path(log_dir) / name).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TRAINKIT_CHECK(fd_ >= 0, "cannot create event file '", path_, "': ", std::strerror(errno));
  encode_file_version_event(scratch_, now, options_.writer_name);
  write_event(scratch_.bytes());
  flush();
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
