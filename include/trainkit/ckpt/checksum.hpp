// SPDX-License-Identifier: MIT
// trainkit/ckpt/checksum.hpp: content checksums for checkpoint files. XXH64 (the xxHash 64-bit
// hash, ~10x faster than table CRC32C, so verifying a checkpoint costs little next to reading
// it) and safetensors files that carry their own checksum in `__metadata__["trainkit.xxh64"]`:
// the hash of the whole file with those 16 hex digits read as '0'. Python tools ignore the key;
// a truncated, bit-flipped or half-written file fails verification with an error naming it.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/mmap.hpp"
#include "trainkit/io/safetensors.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// Streaming XXH64 (xxHash, Y. Collet; seed 0 unless given). `update` any number of pieces,
/// then `digest`: the result equals the one-shot hash of their concatenation.
/// `Xxh64::hash("abc", 3) == 0x44BC2CF5AD770999`.
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0) noexcept { reset(seed); }

  TRAINKIT_INLINE void reset(std::uint64_t seed = 0) noexcept;

  TRAINKIT_INLINE void update(const void* data, std::size_t size) noexcept;
  void update(std::span<const std::byte> bytes) noexcept { update(bytes.data(), bytes.size()); }
  void update(std::string_view text) noexcept { update(text.data(), text.size()); }

  /// The hash of everything updated so far (the state is unchanged; more updates may follow).
  TRAINKIT_INLINE std::uint64_t digest() const noexcept;

  /// One-shot hash.
  static std::uint64_t hash(const void* data, std::size_t size, std::uint64_t seed = 0) noexcept {
    Xxh64 h(seed);
    h.update(data, size);
    return h.digest();
  }

 private:
  static constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
  static constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr std::uint64_t kP3 = 0x165667B19E3779F9ULL;
  static constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ULL;

  static std::uint64_t rotl(std::uint64_t x, int r) noexcept { return std::rotl(x, r); }
  TRAINKIT_INLINE static std::uint64_t read64(const unsigned char* p) noexcept;
  static std::uint32_t read32(const unsigned char* p) noexcept {
    return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
           std::uint32_t(p[3]) << 24;
  }
  static std::uint64_t byteswap64(std::uint64_t v) noexcept {
    std::uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r = (r << 8) | ((v >> (8 * i)) & 0xff);
    return r;
  }
  static std::uint64_t round(std::uint64_t acc, std::uint64_t input) noexcept {
    acc += input * kP2;
    acc = rotl(acc, 31);
    return acc * kP1;
  }
  static std::uint64_t merge(std::uint64_t acc, std::uint64_t v) noexcept {
    acc ^= round(0, v);
    return acc * kP1 + kP4;
  }
  TRAINKIT_INLINE void stripe(const unsigned char* p) noexcept;

  std::uint64_t seed_ = 0;
  std::uint64_t v_[4] = {};
  std::uint64_t total_ = 0;
  std::size_t buffered_ = 0;
  unsigned char buffer_[32] = {};
};

/// The `__metadata__` key of a checksummed safetensors file; its value is 16 lower-case hex
/// digits.
inline constexpr std::string_view kChecksumKey = "trainkit.xxh64";

/// 16 lower-case hex digits.
TRAINKIT_INLINE std::string hex64(std::uint64_t v);

/// Parses exactly 16 hex digits (either case); nullopt otherwise.
TRAINKIT_INLINE std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept;

/// What a checksummed write produced.
struct FileDigest {
  std::uint64_t bytes = 0;  ///< file size
  std::uint64_t xxh64 = 0;  ///< the embedded checksum
};

namespace detail {

/// `"trainkit.xxh64":"` as it appears in a compact header: unique, because a string value that
/// contains it would have its quotes escaped.
TRAINKIT_INLINE std::string checksum_pattern();

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::string checksum_pattern() {
  std::string p = "\"";
  p += kChecksumKey;
  p += "\":\"";
  return p;
}

#endif  // TRAINKIT_IMPL

}  // namespace detail

/// Writes `tensors` as a safetensors file at `path` (crash-safe: temp file, fsync, rename,
/// directory fsync when options.durable) whose `__metadata__` carries kChecksumKey: XXH64 of
/// the whole file with the 16 digits as '0'. The hash is computed in a pass over the tensors
/// before writing (the header must hold it). Throws trainkit::Error naming the file (bad input,
/// ENOSPC, EFBIG, ...), leaving `path` as it was.
TRAINKIT_INLINE FileDigest save_checksummed_safetensors(
    const std::filesystem::path& path, std::span<const io::NamedTensor> tensors,
    io::SafetensorsMetadata metadata = {}, const io::SafetensorsWriteOptions& options = {});

/// The checksum a checksummed safetensors image claims (nullopt when it has none). Reads only
/// the header. Throws trainkit::Error naming `source` when the header length is invalid.
TRAINKIT_INLINE std::optional<std::uint64_t> embedded_checksum(std::span<const std::byte> file,
                                                               std::string_view source);

/// Verifies a checksummed safetensors image: recomputes the hash and compares it with the
/// embedded one. Returns the digest; throws trainkit::Error naming `source` when the file has
/// no checksum (unless `require` is false: then the digest's xxh64 is 0) or it does not match.
TRAINKIT_INLINE FileDigest verify_checksum(std::span<const std::byte> file, std::string_view source,
                                           bool require = true);

/// verify_checksum over a file on disk, read with pread in pieces (the page cache then serves the
/// load after it). A file truncated or rewritten in place while it is read (by another process)
/// gives trainkit::Error naming it, never a signal.
TRAINKIT_INLINE FileDigest verify_checksum_file(const std::filesystem::path& path,
                                                bool require = true);

namespace detail {

/// The first 8 + N bytes of a safetensors file (N: its header length, checked against the file's
/// size as safetensors_header_length does). Throws trainkit::Error naming the file.
TRAINKIT_INLINE std::vector<std::byte> read_safetensors_prefix(const io::detail::PreadFile& file);

/// Hashes the bytes of `file` from `offset` to its size when opened, in pieces read with pread
/// (one buffer, reused: it stays in cache while it is hashed).
TRAINKIT_INLINE void hash_file_from(const io::detail::PreadFile& file, std::uint64_t offset,
                                    Xxh64& h);

/// XXH64 of a whole file read with pread; throws trainkit::Error naming the file when it cannot be
/// read or changes size while it is read.
TRAINKIT_INLINE std::uint64_t hash_file(const std::filesystem::path& path);

/// verify_checksum given the file's first 8 + N bytes (`prefix`, N its checked header length)
/// and `hash_rest(Xxh64&)`, which hashes the `file_bytes - prefix.size()` bytes after them.
template <class HashRest>
FileDigest verify_checksum_parts(std::span<const std::byte> prefix, std::uint64_t file_bytes,
                                 std::string_view source, bool require, HashRest&& hash_rest) {
  const std::size_t n = prefix.size() - 8;
  const std::string_view header(reinterpret_cast<const char*>(prefix.data()) + 8, n);
  const std::size_t at = header.find(checksum_pattern());
  if (at == std::string_view::npos) {
    // A checksum written in another layout (spaces, escapes: the header was rewritten by another
    // tool) cannot be checked, and a file that claims one must not load as if it had none.
    const io::SafetensorsHeader parsed = io::parse_safetensors_header(header, file_bytes, source);
    TRAINKIT_CHECK(!parsed.metadata.contains(kChecksumKey), "checkpoint file '", source,
                   "' carries a '", kChecksumKey,
                   "' checksum that cannot be verified: its header is not laid out as trainkit "
                   "writes it (compact JSON), so it was rewritten or edited after the checksum "
                   "was made");
    TRAINKIT_CHECK(!require, "checkpoint file '", source, "' has no '", kChecksumKey,
                   "' checksum in its __metadata__ (not written by trainkit's checkpointer?)");
    return {file_bytes, 0};
  }
  const std::size_t digits = 8 + at + checksum_pattern().size();
  const std::optional<std::uint64_t> stored =
      digits + 16 <= 8 + n ? parse_hex64(header.substr(digits - 8, 16)) : std::nullopt;
  TRAINKIT_CHECK(stored.has_value(), "checkpoint file '", source, "': the '", kChecksumKey,
                 "' value is not 16 hex digits");
  static constexpr char kZeros[16] = {'0', '0', '0', '0', '0', '0', '0', '0',
                                      '0', '0', '0', '0', '0', '0', '0', '0'};
  Xxh64 h;
  h.update(prefix.data(), digits);
  h.update(kZeros, 16);
  h.update(prefix.data() + digits + 16, prefix.size() - digits - 16);
  hash_rest(h);
  const std::uint64_t actual = h.digest();
  TRAINKIT_CHECK(actual == *stored, "checkpoint file '", source,
                 "' is corrupt: its content hashes to ", hex64(actual), " but it was written with ",
                 kChecksumKey, " = ", hex64(*stored), " (", file_bytes,
                 " bytes; bit rot, a torn write or an edited file)");
  return {file_bytes, actual};
}

}  // namespace detail

#if TRAINKIT_IMPL

TRAINKIT_INLINE void Xxh64::reset(std::uint64_t seed) noexcept {
  seed_ = seed;
  v_[0] = seed + kP1 + kP2;
  v_[1] = seed + kP2;
  v_[2] = seed;
  v_[3] = seed - kP1;
  total_ = 0;
  buffered_ = 0;
}

TRAINKIT_INLINE void Xxh64::update(const void* data, std::size_t size) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ + size < 32) {
    if (size != 0) std::memcpy(buffer_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_ != 0) {
    const std::size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    stripe(buffer_);
    p += fill;
    size -= fill;
    buffered_ = 0;
  }
  // Four independent lanes: the multiply latency overlaps, ~1 byte per cycle or better.
  std::uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  while (size >= 32) {
    v0 = round(v0, read64(p));
    v1 = round(v1, read64(p + 8));
    v2 = round(v2, read64(p + 16));
    v3 = round(v3, read64(p + 24));
    p += 32;
    size -= 32;
  }
  v_[0] = v0;
  v_[1] = v1;
  v_[2] = v2;
  v_[3] = v3;
  if (size != 0) std::memcpy(buffer_, p, size);
  buffered_ = size;
}

TRAINKIT_INLINE std::uint64_t Xxh64::digest() const noexcept {
  std::uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (std::uint64_t v : v_) h = merge(h, v);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buffer_;
  std::size_t n = buffered_;
  while (n >= 8) {
    h ^= round(0, read64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
    n -= 8;
  }
  if (n >= 4) {
    h ^= std::uint64_t(read32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  while (n-- > 0) {
    h ^= std::uint64_t(*p++) * kP5;
    h = rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

TRAINKIT_INLINE std::uint64_t Xxh64::read64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = byteswap64(v);
  return v;
}

TRAINKIT_INLINE void Xxh64::stripe(const unsigned char* p) noexcept {
  v_[0] = round(v_[0], read64(p));
  v_[1] = round(v_[1], read64(p + 8));
  v_[2] = round(v_[2], read64(p + 16));
  v_[3] = round(v_[3], read64(p + 24));
}

TRAINKIT_INLINE std::string hex64(std::uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[std::size_t(i)] = kDigits[v & 0xf];
  return s;
}

TRAINKIT_INLINE std::optional<std::uint64_t> parse_hex64(std::string_view s) noexcept {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    v = (v << 4) | std::uint64_t(d);
  }
  return v;
}

TRAINKIT_INLINE FileDigest save_checksummed_safetensors(
    const std::filesystem::path& path, std::span<const io::NamedTensor> tensors,
    io::SafetensorsMetadata metadata, const io::SafetensorsWriteOptions& options) {
  metadata.insert_or_assign(std::string(kChecksumKey), std::string(16, '0'));
  io::SafetensorsLayout layout = io::plan_safetensors(tensors, metadata, options);
  const std::size_t at = layout.prefix.find(detail::checksum_pattern());
  TRAINKIT_CHECK(at != std::string::npos, "checksummed safetensors '", path.string(),
                 "': the checksum key is missing from the planned header");
  const std::size_t digits = at + detail::checksum_pattern().size();
  Xxh64 h;
  io::write_safetensors(layout, tensors,
                        [&](const std::byte* p, std::size_t n) { h.update(p, n); });
  const std::uint64_t sum = h.digest();
  layout.prefix.replace(digits, 16, hex64(sum));
  io::AtomicFile file(path, io::AtomicFileOptions{.durable = options.durable});
  io::write_safetensors(layout, tensors,
                        [&](const std::byte* p, std::size_t n) { file.write(p, n); });
  file.commit();
  return {layout.file_bytes(), sum};
}

TRAINKIT_INLINE std::optional<std::uint64_t> embedded_checksum(std::span<const std::byte> file,
                                                               std::string_view source) {
  const std::uint64_t n = io::safetensors_header_length(file, file.size(), source);
  const std::string_view header(reinterpret_cast<const char*>(file.data()) + 8, std::size_t(n));
  const std::size_t at = header.find(detail::checksum_pattern());
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t digits = at + detail::checksum_pattern().size();
  if (digits + 16 > header.size()) return std::nullopt;
  return parse_hex64(header.substr(digits, 16));
}

TRAINKIT_INLINE FileDigest verify_checksum(std::span<const std::byte> file, std::string_view source,
                                           bool require) {
  const std::uint64_t n = io::safetensors_header_length(file, file.size(), source);
  return detail::verify_checksum_parts(
      file.first(8 + std::size_t(n)), file.size(), source, require,
      [&](Xxh64& h) { h.update(file.data() + 8 + n, file.size() - 8 - std::size_t(n)); });
}

TRAINKIT_INLINE FileDigest verify_checksum_file(const std::filesystem::path& path, bool require) {
  const io::detail::PreadFile file(path);
  file.advise_sequential();
  const std::vector<std::byte> prefix = detail::read_safetensors_prefix(file);
  const FileDigest digest = detail::verify_checksum_parts(
      prefix, file.size(), file.path(), require,
      [&](Xxh64& h) { detail::hash_file_from(file, prefix.size(), h); });
  file.check_unchanged();
  return digest;
}

namespace detail {

TRAINKIT_INLINE std::vector<std::byte> read_safetensors_prefix(const io::detail::PreadFile& file) {
  std::byte length[8] = {};
  const bool whole = file.size() >= 8;
  if (whole) file.read_at(length, 8, 0);
  const std::uint64_t n = io::safetensors_header_length(
      std::span<const std::byte>(length, whole ? 8 : 0), file.size(), file.path());
  std::vector<std::byte> prefix(8 + std::size_t(n));
  std::memcpy(prefix.data(), length, 8);
  file.read_at(prefix.data() + 8, std::size_t(n), 8);
  return prefix;
}

TRAINKIT_INLINE void hash_file_from(const io::detail::PreadFile& file, std::uint64_t offset,
                                    Xxh64& h) {
  // 1 MiB: large enough that the calls cost nothing next to the copy, small enough to stay in
  // the L2 cache between the read and the hash.
  constexpr std::uint64_t kPiece = std::uint64_t(1) << 20;
  if (offset >= file.size()) return;
  std::vector<std::byte> buffer(std::size_t(std::min(kPiece, file.size() - offset)));
  while (offset < file.size()) {
    const auto n = std::size_t(std::min<std::uint64_t>(buffer.size(), file.size() - offset));
    file.read_at(buffer.data(), n, offset);
    h.update(buffer.data(), n);
    offset += n;
  }
}

TRAINKIT_INLINE std::uint64_t hash_file(const std::filesystem::path& path) {
  const io::detail::PreadFile file(path);
  file.advise_sequential();
  Xxh64 h;
  hash_file_from(file, 0, h);
  file.check_unchanged();
  return h.digest();
}

}  // namespace detail

#endif  // TRAINKIT_IMPL

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
