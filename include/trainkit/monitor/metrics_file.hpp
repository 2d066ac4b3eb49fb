// SPDX-License-Identifier: MIT
// trainkit/monitor/metrics_file.hpp: a JSON-lines metrics log — one JSON object per line, e.g.
// {"step":100,"time":1700000000.5,"loss":2.31,"tokens_per_s":81234.5}. Every line is handed to
// the kernel whole, so a crashed run leaves complete lines, and `pandas.read_json(path,
// lines=True)`, `jq` or grep read it directly. A run resumed from a checkpoint appends to it, after
// dropping the lines an earlier run wrote past the checkpoint's step (see
// keep_metrics_through_step).
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/monitor/json_writer.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Prepares the metrics file of a run resumed at step `resume_step`: keeps, in order and byte for
/// byte, the lines that are JSON objects with an integer "step" of at most `resume_step`, and drops
/// the rest: what a crashed or superseded run logged past the checkpoint (so a run resumed twice
/// from one checkpoint shows each step once) and a torn last line (a kill inside write(2)). The
/// file is replaced atomically (a temp file renamed over it), so a crash here leaves the old or the
/// new content, never a mix. Returns the number of lines dropped; a missing file is not an error
/// (0). Throws trainkit::Error naming the path when it cannot be read or replaced.
TRAINKIT_INLINE std::size_t keep_metrics_through_step(const std::string& path,
                                                      std::int64_t resume_step);

/// Writes JSON objects, one per line, to a file. Each line goes to the kernel whole in one
/// append; a line the system refuses part-way (a full disk) is cut off again, so the file never
/// holds a torn line in front of later ones. Move-only.
class MetricsFile {
 public:
  /// Opens `path` for writing (truncating it), or for appending when `append` (resumed runs).
  /// A file that ends inside a line (a writer killed in write(2)) loses that torn line first, so
  /// the next line is not glued to it (a whole last line without its newline gets one). Throws
  /// trainkit::Error naming the path when it cannot be opened.
  explicit MetricsFile(std::string path, bool append = false) : path_(std::move(path)) {
    // Appending reads the end of the file too (cut_torn_tail), where the file may be read.
    bool readable = append;
    fd_ = ::open(path_.c_str(),
                 (append ? O_RDWR : O_WRONLY | O_TRUNC) | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && append && errno == EACCES) {
      readable = false;
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    TRAINKIT_CHECK(fd_ >= 0, "cannot open metrics file '", path_, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      close_nothrow();
      TRAINKIT_FAIL("cannot open metrics file '", path_, "': ", std::strerror(err));
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
    int err = 0;
    try {
      if (readable && S_ISREG(st.st_mode)) err = cut_torn_tail();  // not a pipe or a terminal
    } catch (...) {
      close_nothrow();
      throw;
    }
    if (err != 0) {
      close_nothrow();
      TRAINKIT_FAIL("cannot cut the torn last line off metrics file '", path_,
                    "' to append to it: ", std::strerror(err));
    }
  }
  /// Opens `path` for a run resumed at step `resume_step` (the checkpoint's): drops the lines
  /// past it (keep_metrics_through_step), then appends.
  static MetricsFile resumed(std::string path, std::int64_t resume_step) {
    keep_metrics_through_step(path, resume_step);
    return MetricsFile(std::move(path), true);
  }
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  MetricsFile(MetricsFile&& other) noexcept
      : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  MetricsFile& operator=(MetricsFile&& other) noexcept {
    if (this != &other) {
      close_nothrow();
      path_ = std::move(other.path_);
      fd_ = std::exchange(other.fd_, -1);
      size_ = other.size_;
    }
    return *this;
  }
  ~MetricsFile() { close_nothrow(); }

  const std::string& path() const noexcept { return path_; }

  /// Writes one complete JSON object (built by the caller) as a line. Throws trainkit::Error
  /// naming the file when the system refuses it (ENOSPC, EFBIG, ...); the file then ends with
  /// the line before, and a later write may succeed.
  void write_json(std::string_view object) {
    TRAINKIT_CHECK(fd_ >= 0, "write to closed metrics file '", path_, "'");
    std::string line;
    line.reserve(object.size() + 1);
    line.append(object).push_back('\n');
    for (std::size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      const int err = n < 0 ? errno : EIO;
      // Cut the torn line off (best effort: what the system refused may still let it).
      [[maybe_unused]] const int cut = ::ftruncate(fd_, static_cast<off_t>(size_));
      TRAINKIT_FAIL("writing metrics file '", path_, "' failed: ", io::detail::errno_text(err),
                    "; the line of ", line.size(), " bytes was not written");
    }
    size_ += line.size();
  }

  /// Writes {"step": step, "<name>": value, ...}; NaN and infinities are written as null.
  void write(std::int64_t step,
             std::initializer_list<std::pair<std::string_view, double>> metrics) {
    JsonWriter w;
    w.begin_object().key("step").value(step);
    for (const auto& [name, value] : metrics) w.key(name).value(value);
    w.end_object();
    write_json(w.str());
  }

  /// Closes the file (idempotent).
  void close() {
    if (fd_ < 0) return;
    const bool ok = ::close(std::exchange(fd_, -1)) == 0;
    TRAINKIT_CHECK(ok, "closing metrics file '", path_, "' failed: ", std::strerror(errno));
  }

 private:
  void close_nothrow() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  /// Unless the file ends with a newline: adds one after a last line that is a whole JSON object,
  /// or else truncates the file after its last newline (to 0 without one). Updates size_. Returns
  /// 0 or the errno of the failed read, write or truncate.
  TRAINKIT_INLINE int cut_torn_tail();

  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;  // bytes of whole lines in the file
};

namespace detail {
/// `integer` (a JSON integer of any size) <= `limit`, without as_int(), which throws for the
/// integers past int64 that a line written by another program may hold.
TRAINKIT_INLINE bool integer_at_most(const io::Json& integer, std::int64_t limit);
}  // namespace detail

#if TRAINKIT_IMPL

TRAINKIT_INLINE int MetricsFile::cut_torn_tail() {
  char buffer[4096];
  std::uint64_t end = size_;  // the bytes before `end` are still to be searched
  while (end > 0) {
    const std::uint64_t begin = end > sizeof buffer ? end - sizeof buffer : 0;
    const auto want = static_cast<std::size_t>(end - begin);
    ssize_t n = 0;
    do {
      n = ::pread(fd_, buffer, want, static_cast<off_t>(begin));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return errno;
    if (static_cast<std::size_t>(n) != want) return EIO;  // the file shrank under us
    std::size_t i = want;
    while (i > 0 && buffer[i - 1] != '\n') --i;
    if (i > 0) {
      end = begin + i;
      break;
    }
    end = begin;
  }
  if (end == size_) return 0;  // ends with a newline (or is empty)
  // A last line that is whole but for its newline (keep_metrics_through_step keeps it too) gets
  // the newline; a torn one is cut off.
  std::string tail(static_cast<std::size_t>(size_ - end), '\0');
  for (std::size_t done = 0; done < tail.size();) {
    const ssize_t n =
        ::pread(fd_, tail.data() + done, tail.size() - done, static_cast<off_t>(end + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  const std::optional<io::Json> json = io::Json::try_parse(tail);
  if (json && json->is_object()) {
    ssize_t n = 0;
    do {
      n = ::write(fd_, "\n", 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) return n < 0 ? errno : EIO;
    size_ += 1;
    return 0;
  }
  if (::ftruncate(fd_, static_cast<off_t>(end)) != 0) return errno;
  size_ = end;
  return 0;
}

TRAINKIT_INLINE bool detail::integer_at_most(const io::Json& integer, std::int64_t limit) {
  if (integer.is_unsigned())
    return limit >= 0 && integer.as_uint() <= static_cast<std::uint64_t>(limit);
  const std::string text = integer.dump();  // negative: "-" and the digits
  std::int64_t value = 0;
  const auto parsed = std::from_chars(text.data(), text.data() + text.size(), value);
  return parsed.ec != std::errc() || value <= limit;  // below int64's range: below any limit
}

TRAINKIT_INLINE std::size_t keep_metrics_through_step(const std::string& path,
                                                      std::int64_t resume_step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  TRAINKIT_CHECK(in.good(), "cannot read metrics file '", path, "' to resume it");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TRAINKIT_CHECK(!in.bad(), "reading metrics file '", path, "' failed");
  in.close();
  std::string kept;
  kept.reserve(text.size());
  std::size_t dropped = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t newline = text.find('\n', begin);
    const std::size_t end = newline != std::string::npos ? newline : text.size();
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (line.empty()) continue;
    // A torn line (no newline: killed mid-write) is kept only if it still parses.
    bool keep = false;
    const std::optional<io::Json> json = io::Json::try_parse(line);
    if (json && json->is_object()) {
      const io::Json* step = json->find("step");
      keep = step != nullptr && step->is_integer() && detail::integer_at_most(*step, resume_step);
    }
    if (keep) {
      kept.append(line).push_back('\n');
    } else {
      ++dropped;
    }
  }
  // Compared whole: a blank line dropped and a newline added to a last line keep the size.
  if (kept != text) io::write_file_atomic(path, std::string_view(kept));
  return dropped;
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
