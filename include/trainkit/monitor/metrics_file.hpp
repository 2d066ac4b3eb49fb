// SPDX-License-Identifier: MIT
// trainkit/monitor/metrics_file.hpp: a JSON-lines metrics log — one JSON object per line, e.g.
// {"step":100,"time":1700000000.5,"loss":2.31,"tokens_per_s":81234.5}. Every line is written and
// flushed whole, so a crashed run leaves complete lines, and `pandas.read_json(path, lines=True)`,
// `jq` or grep read it directly.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/monitor/json_writer.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Writes JSON objects, one per line, to a file. Move-only; closing flushes.
class MetricsFile {
 public:
  /// Opens `path` for writing (truncating it), or for appending when `append` (resumed runs).
  /// Throws trainkit::Error naming the path when it cannot be opened.
  explicit MetricsFile(std::string path, bool append = false) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), append ? "ab" : "wb");
    TRAINKIT_CHECK(file_ != nullptr, "cannot open metrics file '", path_,
                   "': ", std::strerror(errno));
  }
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  MetricsFile(MetricsFile&& other) noexcept
      : path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)) {}
  MetricsFile& operator=(MetricsFile&& other) noexcept {
    if (this != &other) {
      close_nothrow();
      path_ = std::move(other.path_);
      file_ = std::exchange(other.file_, nullptr);
    }
    return *this;
  }
  ~MetricsFile() { close_nothrow(); }

  const std::string& path() const noexcept { return path_; }

  /// Writes one complete JSON object (built by the caller) as a line, and flushes it.
  void write_json(std::string_view object) {
    TRAINKIT_CHECK(file_ != nullptr, "write to closed metrics file '", path_, "'");
    std::string line;
    line.reserve(object.size() + 1);
    line.append(object).push_back('\n');
    const bool ok =
        std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
    TRAINKIT_CHECK(ok, "writing metrics file '", path_, "' failed: ", std::strerror(errno));
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

  /// Flushes and closes the file (idempotent).
  void close() {
    if (file_ == nullptr) return;
    const bool ok = std::fclose(file_) == 0;
    file_ = nullptr;
    TRAINKIT_CHECK(ok, "closing metrics file '", path_, "' failed");
  }

 private:
  void close_nothrow() noexcept {
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace monitor
TRAINKIT_NAMESPACE_END
