// SPDX-License-Identifier: MIT
// trainkit/data/shard_pattern.hpp: shard lists written the WebDataset way,
// `data-{000000..000099}.tar`, expanded with bash brace semantics (numeric and letter ranges with
// optional step, zero padding when an endpoint has a leading zero, comma lists, nesting) and `::`
// joining several patterns.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// The most names a shard pattern may expand to (the largest public WebDataset corpora have a
/// few hundred thousand shards), and the most characters all of them may hold together: a
/// pattern such as `{0..9999}{0..9999}` is refused with an error instead of taking the memory.
inline constexpr std::size_t kMaxShardNames = 1'000'000;
inline constexpr std::size_t kMaxShardNameBytes = std::size_t{64} << 20;

namespace detail {

/// Parses a (possibly signed) decimal integer that is the whole of `s`.
TRAINKIT_INLINE bool parse_brace_int(std::string_view s, long long& v);

/// The alternatives of one brace body ("a,b,c" or "1..10..2"), or false if it is neither (bash
/// then leaves the braces as they are).
TRAINKIT_INLINE bool brace_alternatives(std::string_view body, std::vector<std::string>& out);

/// Appends the expansion of `s` to `out`, counting their characters in `bytes` and every word
/// produced, empty ones included, in `words`; false (and `out` incomplete) as soon as the words
/// or the bytes pass kMaxShardNames / kMaxShardNameBytes.
TRAINKIT_INLINE bool expand_braces_into(const std::string& s, std::vector<std::string>& out,
                                        std::size_t& bytes, std::size_t& words);

#if TRAINKIT_IMPL

TRAINKIT_INLINE bool parse_brace_int(std::string_view s, long long& v) {
  if (s.empty() || s.size() > 18) return false;
  std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  long long r = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    r = r * 10 + (s[i] - '0');
  }
  v = s[0] == '-' ? -r : r;
  return true;
}

TRAINKIT_INLINE bool brace_alternatives(std::string_view body, std::vector<std::string>& out) {
  // Top-level commas (nested braces are expanded later, as part of each alternative).
  std::vector<std::string> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '{') ++depth;
    if (body[i] == '}') --depth;
    if (body[i] == ',' && depth == 0) {
      parts.emplace_back(body.substr(start, i - start));
      start = i + 1;
    }
  }
  if (!parts.empty()) {
    parts.emplace_back(body.substr(start));
    out = std::move(parts);
    return true;
  }
  // Ranges: a..b or a..b..step.
  const std::size_t dots = body.find("..");
  if (dots == std::string_view::npos) return false;
  const std::string_view a = body.substr(0, dots);
  std::string_view b = body.substr(dots + 2);
  long long step = 1;
  const std::size_t dots2 = b.find("..");
  if (dots2 != std::string_view::npos) {
    if (!parse_brace_int(b.substr(dots2 + 2), step)) return false;
    b = b.substr(0, dots2);
  }
  if (step < 0) step = -step;
  if (step == 0) step = 1;
  long long lo = 0, hi = 0;
  if (parse_brace_int(a, lo) && parse_brace_int(b, hi)) {
    // Zero-pad to the widest endpoint when either has a leading zero (bash: "01".."10").
    auto leading_zero = [](std::string_view s) {
      const std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
      return s.size() > i + 1 && s[i] == '0';
    };
    const std::size_t width =
        (leading_zero(a) || leading_zero(b)) ? std::max(a.size(), b.size()) : 0;
    const long long count = (lo <= hi ? hi - lo : lo - hi) / step + 1;
    TRAINKIT_CHECK(std::uint64_t(count) <= kMaxShardNames, "shard pattern range {", body, "} has ",
                   count, " elements; more than ", kMaxShardNames, " shards is surely a typo");
    for (long long k = 0; k < count; ++k) {
      const long long v = lo <= hi ? lo + k * step : lo - k * step;
      std::string digits = std::to_string(v < 0 ? -v : v);
      const std::size_t w = width > 0 ? width - (v < 0 ? 1 : 0) : 0;
      if (digits.size() < w) digits.insert(0, w - digits.size(), '0');
      out.push_back((v < 0 ? "-" : "") + digits);
    }
    return true;
  }
  // Letter range {a..e}: both ends letters, as bash requires ({1..a} or {/..a} stay literal,
  // rather than spanning the digits and punctuation between them).
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (a.size() == 1 && b.size() == 1 && letter(a[0]) && letter(b[0])) {
    const int c0 = static_cast<unsigned char>(a[0]), c1 = static_cast<unsigned char>(b[0]);
    const long long span = c0 <= c1 ? c1 - c0 : c0 - c1;  // step >= 1: k * step <= span
    for (long long k = 0; k <= span / step; ++k) {
      const long long c = c0 <= c1 ? c0 + k * step : c0 - k * step;
      out.push_back(std::string(1, static_cast<char>(c)));
    }
    return true;
  }
  return false;
}

TRAINKIT_INLINE bool expand_braces_into(const std::string& s, std::vector<std::string>& out,
                                        std::size_t& bytes, std::size_t& words) {
  // Find the first '{' whose matching '}' encloses a valid brace expression.
  for (std::size_t open = s.find('{'); open != std::string::npos; open = s.find('{', open + 1)) {
    int depth = 0;
    std::size_t close = std::string::npos;
    for (std::size_t i = open; i < s.size(); ++i) {
      if (s[i] == '{') ++depth;
      if (s[i] == '}' && --depth == 0) {
        close = i;
        break;
      }
    }
    if (close == std::string::npos) continue;  // "x{y{1..3}": an inner brace may still match
    std::vector<std::string> alternatives;
    if (!brace_alternatives(std::string_view(s).substr(open + 1, close - open - 1), alternatives))
      continue;
    const std::string prefix = s.substr(0, open), suffix = s.substr(close + 1);
    for (const std::string& alt : alternatives)
      if (!expand_braces_into(prefix + alt + suffix, out, bytes, words)) return false;
    return true;
  }
  // Empty words count too: they are dropped, but "{,}{,}{,}..." still takes time for each.
  if (++words > kMaxShardNames) return false;
  if (s.empty()) return true;  // "{,a}": bash drops the empty word
  bytes += s.size();
  if (bytes > kMaxShardNameBytes) return false;
  out.push_back(s);
  return true;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Expands a shard pattern into the list of names, in order: "a-{00..02}.tar::b.tar" gives
/// a-00.tar, a-01.tar, a-02.tar, b.tar. Bash brace semantics; text without a valid brace
/// expression is kept literally. Throws trainkit::Error for an empty pattern and for one that
/// expands to more than kMaxShardNames words (the empty words it drops included) or
/// kMaxShardNameBytes of names.
TRAINKIT_INLINE std::vector<std::string> expand_shard_pattern(std::string_view pattern);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::vector<std::string> expand_shard_pattern(std::string_view pattern) {
  std::vector<std::string> out;
  std::size_t bytes = 0, words = 0;
  std::size_t start = 0;
  for (;;) {
    const std::size_t sep = pattern.find("::", start);
    const std::string part(
        pattern.substr(start, sep == std::string_view::npos ? sep : sep - start));
    TRAINKIT_CHECK(part.empty() || detail::expand_braces_into(part, out, bytes, words),
                   "shard pattern '", pattern.substr(0, 200), pattern.size() > 200 ? "...'" : "'",
                   " expands to more than ", kMaxShardNames, " names or ", kMaxShardNameBytes >> 20,
                   " MiB of them; more shards than that is surely a typo");
    if (sep == std::string_view::npos) break;
    start = sep + 2;
  }
  TRAINKIT_CHECK(!out.empty(), "shard pattern '", pattern, "' names no shards");
  return out;
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
