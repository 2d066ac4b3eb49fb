// SPDX-License-Identifier: MIT
// trainkit/data/token_shards.hpp: TokenShardDataset, language-model windows over llm.c token
// shards (a 256 x int32 header: magic, version, token count; then the tokens). Sample i is a
// window of T+1 consecutive tokens split into (input = tokens[0..T), target = tokens[1..T]), the
// shift-by-one pairs llm.c trains on. Shards are memory-mapped; windows never span two shards.
// write_token_shard writes such shards (tools/write_token_shard.py from Python).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/checked.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/data/shard_pattern.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/mmap.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// llm.c shard formats (dev/data/data_common.py HEADERS_INFO).
inline constexpr std::int32_t kTokenShardMagicGpt2 = 20240520;    ///< version 1, uint16 tokens
inline constexpr std::int32_t kTokenShardMagicLlama3 = 20240801;  ///< version 7, uint32 tokens
inline constexpr std::size_t kTokenShardHeaderBytes = 256 * 4;

struct TokenShardOptions {
  std::size_t seq_len = 1024;       ///< T: tokens per input (each window reads T + 1)
  std::size_t stride = 0;           ///< tokens between window starts; 0 means T (no overlap)
  DType token_dtype = DType::kI32;  ///< dtype of "input"/"target": I32, I64, U16 or U32
};

/// Windows over one or more llm.c token shards. Fields: "input" and "target", both [T] of
/// options.token_dtype. Thread-safe reads; satisfies `Dataset`.
class TokenShardDataset {
 public:
  /// Opens the shards of `pattern` (brace-expanded, `::`-separated; see expand_shard_pattern).
  TokenShardDataset(std::string_view pattern, const TokenShardOptions& options)
      : TokenShardDataset(to_paths(expand_shard_pattern(pattern)), options) {}

  /// Maps and validates every shard. Throws trainkit::Error naming the shard for a wrong magic,
  /// version or size (a truncated shard), and when no shard holds a whole window.
  TRAINKIT_INLINE TokenShardDataset(const std::vector<std::filesystem::path>& shards,
                                    const TokenShardOptions& options);

  /// Number of windows over all shards.
  std::size_t size() const noexcept { return size_; }
  const std::vector<FieldSpec>& fields() const noexcept { return fields_; }
  std::size_t num_shards() const noexcept { return shards_.size(); }
  /// Tokens in shard k (from its header).
  std::size_t shard_tokens(std::size_t k) const { return shards_.at(k).tokens; }

  /// Writes window i as input = tokens[s, s+T), target = tokens[s+1, s+T+1). Throws
  /// trainkit::Error for i >= size() and for an `out` whose fields differ from fields().
  TRAINKIT_INLINE void read(std::size_t i, const SampleRef& out) const;

  std::string describe(std::size_t i) const {
    if (i >= size_) return "window " + std::to_string(i) + " (out of range)";
    const Shard& s = shard_of(i);
    return "'" + s.file.path() + "' tokens from " + std::to_string((i - s.first) * options_.stride);
  }

 private:
  struct Shard {
    io::MappedFile file;
    std::size_t tokens = 0;
    std::size_t windows = 0;
    std::size_t first = 0;  // global index of its first window
    bool wide = false;      // uint32 tokens (llama-3 format)
  };

  static std::vector<std::filesystem::path> to_paths(const std::vector<std::string>& names) {
    return {names.begin(), names.end()};
  }

  TRAINKIT_INLINE void open_shard(Shard& s) const;

  TRAINKIT_INLINE const Shard& shard_of(std::size_t i) const;

  template <class Src>
  void convert(const Src* src, std::size_t n, const SampleRef& out, std::size_t field) const {
    const std::span<std::byte> dst = out[field];
    TRAINKIT_CHECK(dst.size() == n * dtype_size(options_.token_dtype),
                   "TokenShardDataset: destination for field '", fields_[field].name, "' has ",
                   dst.size(), " bytes, expected ", n * dtype_size(options_.token_dtype));
    switch (options_.token_dtype) {
      case DType::kI32: copy_as<std::int32_t>(src, n, dst); break;
      case DType::kI64: copy_as<std::int64_t>(src, n, dst); break;
      case DType::kU16: copy_as<std::uint16_t>(src, n, dst); break;
      default: copy_as<std::uint32_t>(src, n, dst); break;
    }
  }

  template <class Dst, class Src>
  static void copy_as(const Src* src, std::size_t n, std::span<std::byte> dst) {
    if constexpr (std::is_same_v<Dst, Src>) {
      std::memcpy(dst.data(), src, n * sizeof(Src));
    } else {
      Dst* d = reinterpret_cast<Dst*>(dst.data());
      for (std::size_t k = 0; k < n; ++k) d[k] = static_cast<Dst>(src[k]);
    }
  }

  TokenShardOptions options_;
  std::size_t window_ = 0;  // seq_len + 1
  std::vector<Shard> shards_;
  std::vector<FieldSpec> fields_;
  std::size_t size_ = 0;
};

/// Writes `tokens` as one llm.c shard at `path`, replacing it atomically: the GPT-2 format
/// (magic 20240520, version 1, uint16 tokens). Throws when the count does not fit the header.
TRAINKIT_INLINE void write_token_shard(const std::filesystem::path& path,
                                       std::span<const std::uint16_t> tokens);

#if TRAINKIT_IMPL

TRAINKIT_INLINE TokenShardDataset::TokenShardDataset(
    const std::vector<std::filesystem::path>& shards, const TokenShardOptions& options)
    : options_(options) {
  TRAINKIT_CHECK(options_.seq_len > 0, "TokenShardDataset: seq_len must be > 0");
  if (options_.stride == 0) options_.stride = options_.seq_len;
  const DType t = options_.token_dtype;
  TRAINKIT_CHECK(t == DType::kI32 || t == DType::kI64 || t == DType::kU16 || t == DType::kU32,
                 "TokenShardDataset: token_dtype must be I32, I64, U16 or U32, not ",
                 dtype_name(t));
  TRAINKIT_CHECK(!shards.empty(), "TokenShardDataset: no shards given");
  // A window is seq_len + 1 tokens, and a field holds seq_len of token_dtype: both (and the
  // int64 extent) must be representable. No shard can hold more than 2^31 - 1 tokens anyway.
  const std::size_t field_bytes =
      checked_mul(options_.seq_len, dtype_size(t), "TokenShardDataset: seq_len ", options_.seq_len,
                  " tokens of ", dtype_name(t));
  TRAINKIT_CHECK(
      options_.seq_len < static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) &&
          field_bytes <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()),
      "TokenShardDataset: seq_len ", options_.seq_len, " is too large");
  window_ = checked_add(options_.seq_len, std::size_t{1}, "TokenShardDataset: seq_len + 1");
  const std::vector<std::int64_t> shape{static_cast<std::int64_t>(options_.seq_len)};
  fields_ = {FieldSpec{"input", t, shape}, FieldSpec{"target", t, shape}};
  std::size_t total = 0;
  for (const std::filesystem::path& path : shards) {
    Shard s;
    s.file = io::MappedFile(path, io::MapAccess::kNormal);
    open_shard(s);
    const std::size_t window = window_;
    s.windows = s.tokens >= window ? (s.tokens - window) / options_.stride + 1 : 0;
    total = checked_add(total, s.windows, "TokenShardDataset: total window count");
    s.first = total - s.windows;
    shards_.push_back(std::move(s));
  }
  size_ = total;
  TRAINKIT_CHECK(size_ > 0, "TokenShardDataset: no shard of '", shards_[0].file.path(),
                 "'... holds a window of seq_len + 1 = ", window_, " tokens");
}

TRAINKIT_INLINE void TokenShardDataset::read(std::size_t i, const SampleRef& out) const {
  TRAINKIT_CHECK(i < size_, "TokenShardDataset: sample ", i, " out of range [0, ", size_, ")");
  TRAINKIT_CHECK(out.size() == fields_.size(), "TokenShardDataset: destination has ", out.size(),
                 " fields, expected 2 ('input' and 'target')");
  const Shard& s = shard_of(i);
  const std::size_t start = (i - s.first) * options_.stride;
  const std::size_t T = options_.seq_len;
  const std::byte* base = s.file.data() + kTokenShardHeaderBytes;
  if (s.wide) {
    const auto* tokens = reinterpret_cast<const std::uint32_t*>(base) + start;
    if (options_.token_dtype == DType::kI32) {
      // I32 holds what a real vocabulary needs (< 2^31); a larger token, which it would wrap to
      // a negative id, means a damaged shard.
      std::uint32_t largest = 0;
      for (std::size_t k = 0; k <= T; ++k) largest = std::max(largest, tokens[k]);
      if (largest > 0x7FFFFFFFu) {
        std::size_t k = 0;
        while (tokens[k] <= 0x7FFFFFFFu) ++k;
        TRAINKIT_FAIL("token shard '", s.file.path(), "': token ", start + k, " is ", tokens[k],
                      ", not a vocabulary id (at most 2^31 - 1): the shard is damaged");
      }
    }
    convert(reinterpret_cast<const std::uint32_t*>(base) + start, T, out, 0);
    convert(reinterpret_cast<const std::uint32_t*>(base) + start + 1, T, out, 1);
  } else {
    convert(reinterpret_cast<const std::uint16_t*>(base) + start, T, out, 0);
    convert(reinterpret_cast<const std::uint16_t*>(base) + start + 1, T, out, 1);
  }
}

TRAINKIT_INLINE void TokenShardDataset::open_shard(Shard& s) const {
  const std::string& path = s.file.path();
  TRAINKIT_CHECK(s.file.size() >= kTokenShardHeaderBytes, "token shard '", path,
                 "': truncated: ", s.file.size(), " bytes, shorter than the ",
                 kTokenShardHeaderBytes, "-byte header");
  std::int32_t header[3];
  std::memcpy(header, s.file.data(), sizeof header);
  if (header[0] == kTokenShardMagicGpt2) {
    TRAINKIT_CHECK(header[1] == 1, "token shard '", path, "': version ", header[1],
                   " with the GPT-2 magic; expected version 1");
  } else if (header[0] == kTokenShardMagicLlama3) {
    TRAINKIT_CHECK(header[1] == 7, "token shard '", path, "': version ", header[1],
                   " with the Llama-3 magic; expected version 7");
    s.wide = true;
  } else {
    TRAINKIT_FAIL("token shard '", path, "': bad magic ", header[0], " (expected ",
                  kTokenShardMagicGpt2, " for llm.c GPT-2 shards or ", kTokenShardMagicLlama3,
                  " for Llama-3 shards): not a token shard");
  }
  TRAINKIT_CHECK(header[2] >= 0, "token shard '", path, "': negative token count ", header[2]);
  s.tokens = static_cast<std::size_t>(header[2]);
  const std::size_t width = s.wide ? 4 : 2;
  const std::size_t expected = checked_add(
      kTokenShardHeaderBytes, checked_mul(width, s.tokens, "token shard '", path, "': token bytes"),
      "token shard '", path, "': file size");
  TRAINKIT_CHECK(s.file.size() == expected, "token shard '", path, "': size ", s.file.size(),
                 " bytes but the header says ", s.tokens, " tokens of ", width, " bytes, i.e. ",
                 expected, " bytes (", s.file.size() < expected ? "truncated" : "trailing garbage",
                 ")");
  TRAINKIT_CHECK(!(s.wide && options_.token_dtype == DType::kU16), "token shard '", path,
                 "' holds uint32 tokens, which do not fit token_dtype U16");
}

TRAINKIT_INLINE const TokenShardDataset::Shard& TokenShardDataset::shard_of(std::size_t i) const {
  // The last shard whose first window is <= i (shards with no windows are skipped over).
  auto it = std::upper_bound(shards_.begin(), shards_.end(), i,
                             [](std::size_t v, const Shard& s) { return v < s.first; });
  --it;
  while (it->windows == 0 || i >= it->first + it->windows) ++it;
  return *it;
}

TRAINKIT_INLINE void write_token_shard(const std::filesystem::path& path,
                                       std::span<const std::uint16_t> tokens) {
  TRAINKIT_CHECK(tokens.size() <= std::size_t(std::numeric_limits<std::int32_t>::max()),
                 "write_token_shard '", path.string(), "': ", tokens.size(),
                 " tokens do not fit the header's int32 count");
  std::int32_t header[kTokenShardHeaderBytes / 4] = {kTokenShardMagicGpt2, 1,
                                                     static_cast<std::int32_t>(tokens.size())};
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(header)),
                                               std::as_bytes(tokens)};
  io::write_file_atomic(path, pieces);
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
