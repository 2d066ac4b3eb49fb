// SPDX-License-Identifier: MIT
// trainkit/io/protobuf.hpp: a minimal protocol-buffers wire-format writer, enough to serialize the
// TensorBoard messages (Event, Summary, HistogramProto, TensorProto, hparams) without libprotobuf.
// Fields are written in the order the caller gives; callers follow ascending field numbers and
// skip proto3 default values, which is what makes the output byte-identical to Python protobuf.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {

/// Protobuf wire types (the low 3 bits of a field key).
enum class WireType : std::uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5
};

/// Appends protobuf wire-format fields to a byte string it owns. Nested messages are written in
/// place: `begin_message` reserves a one-byte length, `end_message` patches it (shifting the body
/// when the length needs more than one varint byte), so small messages need no extra allocation.
class ProtoWriter {
 public:
  ProtoWriter() = default;
  /// Continues writing at the end of `initial` (e.g. a reused buffer whose capacity is kept).
  explicit ProtoWriter(std::string initial) : bytes_(std::move(initial)) {}

  const std::string& bytes() const noexcept { return bytes_; }
  std::string take() noexcept { return std::move(bytes_); }
  std::size_t size() const noexcept { return bytes_.size(); }
  void clear() noexcept { bytes_.clear(); }

  /// A base-128 varint (little-endian groups of 7 bits, high bit = more).
  TRAINKIT_INLINE void varint(std::uint64_t value);

  void key(int field, WireType type) {
    varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint32_t>(type));
  }

  /// int32/int64/uint/bool/enum field. Negative int32/int64 take 10 bytes (two's complement), as
  /// protobuf specifies for non-zigzag types.
  void field_varint(int field, std::uint64_t value) {
    key(field, WireType::kVarint);
    varint(value);
  }
  void field_int64(int field, std::int64_t value) {
    field_varint(field, static_cast<std::uint64_t>(value));
  }
  void field_double(int field, double value) {
    key(field, WireType::kFixed64);
    fixed64(std::bit_cast<std::uint64_t>(value));
  }
  void field_float(int field, float value) {
    key(field, WireType::kFixed32);
    fixed32(std::bit_cast<std::uint32_t>(value));
  }
  void field_bytes(int field, std::string_view value) {
    key(field, WireType::kLengthDelimited);
    varint(value.size());
    bytes_.append(value);
  }
  /// A `repeated double` field in packed encoding (proto3's default); nothing when empty.
  TRAINKIT_INLINE void field_packed_doubles(int field, std::span<const double> values);

  // proto3 "implicit presence": a field equal to its default is not written at all. Doubles are
  // compared by bit pattern, as protobuf does, so -0.0 is still written.
  void field_varint_nonzero(int field, std::uint64_t value) {
    if (value != 0) field_varint(field, value);
  }
  void field_int64_nonzero(int field, std::int64_t value) {
    if (value != 0) field_int64(field, value);
  }
  void field_double_nonzero(int field, double value) {
    if (std::bit_cast<std::uint64_t>(value) != 0) field_double(field, value);
  }
  void field_float_nonzero(int field, float value) {
    if (std::bit_cast<std::uint32_t>(value) != 0) field_float(field, value);
  }
  void field_bytes_nonempty(int field, std::string_view value) {
    if (!value.empty()) field_bytes(field, value);
  }

  /// Starts a length-delimited sub-message; returns the mark for end_message.
  std::size_t begin_message(int field) {
    key(field, WireType::kLengthDelimited);
    bytes_.push_back('\0');
    return bytes_.size();
  }
  /// Finishes the sub-message started at `mark`, writing its length in front of it.
  TRAINKIT_INLINE void end_message(std::size_t mark);

 private:
  void fixed64(std::uint64_t value) {
    char buffer[8];
    for (int i = 0; i < 8; ++i) buffer[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
    bytes_.append(buffer, 8);
  }
  void fixed32(std::uint32_t value) {
    char buffer[4];
    for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
    bytes_.append(buffer, 4);
  }

  std::string bytes_;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE void ProtoWriter::varint(std::uint64_t value) {
  char buffer[10];
  std::size_t n = 0;
  while (value >= 0x80) {
    buffer[n++] = static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  buffer[n++] = static_cast<char>(value);
  bytes_.append(buffer, n);
}

TRAINKIT_INLINE void ProtoWriter::field_packed_doubles(int field, std::span<const double> values) {
  if (values.empty()) return;
  key(field, WireType::kLengthDelimited);
  varint(values.size() * 8);
  for (double v : values) fixed64(std::bit_cast<std::uint64_t>(v));
}

TRAINKIT_INLINE void ProtoWriter::end_message(std::size_t mark) {
  const std::size_t length = bytes_.size() - mark;
  char buffer[10];
  std::size_t n = 0;
  std::uint64_t value = length;
  while (value >= 0x80) {
    buffer[n++] = static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  buffer[n++] = static_cast<char>(value);
  if (n > 1) bytes_.insert(mark, n - 1, '\0');  // rare: messages of 128 bytes or more
  std::memcpy(bytes_.data() + mark - 1, buffer, n);
}

#endif  // TRAINKIT_IMPL

}  // namespace io
TRAINKIT_NAMESPACE_END
