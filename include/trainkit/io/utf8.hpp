// SPDX-License-Identifier: MIT
// trainkit/io/utf8.hpp: UTF-8 validation (no overlong forms, surrogates or code points above
// U+10FFFF), shared by the JSON reader and writers and the TensorBoard event encoder: text that
// a Python reader decodes strictly (json.loads, protobuf string fields) must be well formed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// The length (1 to 4) of the well-formed UTF-8 sequence that starts at text[i], or 0 when the
/// bytes there are not one (i < text.size()).
TRAINKIT_INLINE std::size_t utf8_sequence_length(std::string_view text, std::size_t i) noexcept;

/// True when `text` is well-formed UTF-8. On failure `*error_offset` (when given) receives the
/// offset of the bad sequence.
TRAINKIT_INLINE bool is_valid_utf8(std::string_view text,
                                   std::size_t* error_offset = nullptr) noexcept;

/// `text` for an error message: printable ASCII as it is, other bytes as \xNN.
TRAINKIT_INLINE std::string printable_bytes(std::string_view text);

/// `text` as well-formed UTF-8: each byte that does not begin a well-formed sequence becomes
/// U+FFFD (for text from outside, such as a child process's output, stored as a JSON string).
TRAINKIT_INLINE std::string replace_invalid_utf8(std::string_view text);

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::size_t utf8_sequence_length(std::string_view text, std::size_t i) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  const unsigned c = s[i];
  if (c < 0x80) return 1;
  std::size_t len = 0;
  unsigned lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // UTF-16 surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  }
  if (len == 0 || len > n - i || s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (std::size_t k = 2; k < len; ++k)
    if ((s[i + k] & 0xc0) != 0x80) return 0;
  return len;
}

TRAINKIT_INLINE bool is_valid_utf8(std::string_view text, std::size_t* error_offset) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t w = 0;
      for (int k = 0; k < 8; ++k) w |= std::uint64_t(s[i + k]) << (8 * k);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const std::size_t len = utf8_sequence_length(text, i);
    if (len == 0) {
      if (error_offset != nullptr) *error_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

TRAINKIT_INLINE std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t len = utf8_sequence_length(text, i);
    if (len == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

TRAINKIT_INLINE std::string printable_bytes(std::string_view text) {
  return ::trainkit::detail::printable_bytes(text);
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
