// SPDX-License-Identifier: MIT
// trainkit/monitor/json_writer.hpp: a tiny append-only JSON text builder for the monitor's outputs
// (JSON-lines metrics, Chrome trace files). Numbers use the shortest round-trip form, and NaN or
// infinity become null, because JSON has no spelling for them and Python's json would choke.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"
#include "trainkit/io/utf8.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace monitor {

/// Builds JSON text into a string. The caller keeps the structure valid; the writer only inserts
/// commas and escapes: `JsonWriter w; w.begin_object(); w.key("step"); w.value(3); w.end_object();`
/// Each byte of a string that does not begin a well-formed UTF-8 sequence is written as U+FFFD,
/// so the text always parses (Python's errors="replace" gives one U+FFFD per maximal ill-formed
/// subsequence instead, so a truncated multi-byte character may count differently there).
class JsonWriter {
 public:
  const std::string& str() const noexcept { return out_; }
  std::string take() noexcept { return std::move(out_); }
  void clear() noexcept {
    out_.clear();
    need_comma_ = false;
  }

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  /// An object key; the next call writes its value.
  TRAINKIT_INLINE JsonWriter& key(std::string_view name);
  TRAINKIT_INLINE JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  TRAINKIT_INLINE JsonWriter& value(bool b);
  TRAINKIT_INLINE JsonWriter& value(std::int64_t v);
  JsonWriter& value(int v) { return value(static_cast<std::int64_t>(v)); }
  /// Shortest text that parses back to the same double; NaN and infinities become null.
  TRAINKIT_INLINE JsonWriter& value(double v);
  /// Pre-formatted JSON (a number printed with a chosen precision, a nested document).
  TRAINKIT_INLINE JsonWriter& raw(std::string_view json);

 private:
  TRAINKIT_INLINE JsonWriter& open(char bracket);
  JsonWriter& close(char bracket) {
    out_.push_back(bracket);
    need_comma_ = true;
    return *this;
  }
  void separate() {
    if (need_comma_) out_.push_back(',');
  }
  TRAINKIT_INLINE void append_string(std::string_view s);

  std::string out_;
  bool need_comma_ = false;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE JsonWriter& JsonWriter::key(std::string_view name) {
  separate();
  append_string(name);
  out_.push_back(':');
  need_comma_ = false;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::value(std::string_view text) {
  separate();
  append_string(text);
  need_comma_ = true;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::value(bool b) {
  separate();
  out_.append(b ? "true" : "false");
  need_comma_ = true;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::value(std::int64_t v) {
  separate();
  char buffer[24];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, v);
  out_.append(buffer, r.ptr);
  need_comma_ = true;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::value(double v) {
  separate();
  if (!std::isfinite(v)) {
    out_.append("null");
  } else {
    char buffer[32];
    const auto r = std::to_chars(buffer, buffer + sizeof buffer, v);
    out_.append(buffer, r.ptr);
  }
  need_comma_ = true;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::raw(std::string_view json) {
  separate();
  out_.append(json);
  need_comma_ = true;
  return *this;
}

TRAINKIT_INLINE JsonWriter& JsonWriter::open(char bracket) {
  separate();
  out_.push_back(bracket);
  need_comma_ = false;
  return *this;
}

TRAINKIT_INLINE void JsonWriter::append_string(std::string_view s) {
  out_.push_back('"');
  std::size_t run = 0;  // start of the pending run of characters that need no escaping
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {  // well-formed UTF-8 passes through; other bytes become U+FFFD
      const std::size_t len = io::utf8_sequence_length(s, i);
      if (len != 0) {
        i += len - 1;
        continue;
      }
      out_.append(s.data() + run, i - run);
      out_.append("\xef\xbf\xbd");
      run = i + 1;
      continue;
    }
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out_.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out_.append("\\\""); break;
      case '\\': out_.append("\\\\"); break;
      case '\n': out_.append("\\n"); break;
      case '\r': out_.append("\\r"); break;
      case '\t': out_.append("\\t"); break;
      default: {
        char buffer[8];
        std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
        out_.append(buffer);
      }
    }
  }
  out_.append(s.data() + run, s.size() - run);
  out_.push_back('"');
}

#endif  // TRAINKIT_IMPL

}  // namespace monitor
TRAINKIT_NAMESPACE_END
