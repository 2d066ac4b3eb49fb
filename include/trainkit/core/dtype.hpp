// SPDX-License-Identifier: MIT
// trainkit/core/dtype.hpp: the runtime element-type tag used by type-erased tensors, file formats
// and checkpoints, and the compile-time map from C++ types to it. The 16-bit float value types
// themselves live in core/half.hpp; this header only names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN

struct f16;   // IEEE binary16, core/half.hpp
struct bf16;  // bfloat16, core/half.hpp

/// Element types. The order is stable (it is stored in checkpoints' metadata by name, not number).
enum class DType : std::uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool,
};

inline constexpr DType kAllDTypes[] = {DType::kF64,    DType::kF32,    DType::kF16, DType::kBF16,
                                       DType::kF8E4M3, DType::kF8E5M2, DType::kI64, DType::kI32,
                                       DType::kI16,    DType::kI8,     DType::kU64, DType::kU32,
                                       DType::kU16,    DType::kU8,     DType::kBool};

/// Size of one element in bytes.
inline constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64: return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16: return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

/// The safetensors spelling ("F32", "BF16", "F8_E4M3", "BOOL", ...), also used in messages.
inline constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU64: return "U64";
    case DType::kU32: return "U32";
    case DType::kU16: return "U16";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

/// Parses a name written by dtype_name(); throws trainkit::Error naming the unknown string.
inline DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  TRAINKIT_FAIL("unknown dtype '", detail::printable_bytes(name), "'");
}

inline constexpr bool is_floating(DType t) noexcept {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ||
         t == DType::kF8E4M3 || t == DType::kF8E5M2;
}

namespace detail {
template <class... Ts>
struct TypeList {};

/// The C++ element types that have a DType, and their DTypes at the same positions (the f8 types
/// have no C++ element type).
using DTypeElements =
    TypeList<double, float, f16, bf16, std::int64_t, std::int32_t, std::int16_t, std::int8_t,
             std::uint64_t, std::uint32_t, std::uint16_t, std::uint8_t, bool>;
inline constexpr DType kDTypeOfElements[] = {
    DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
    DType::kI8,  DType::kU64, DType::kU32, DType::kU16,  DType::kU8,  DType::kBool};

/// Position of T in the list, -1 when absent.
template <class T, class... Ts>
constexpr int type_index(TypeList<Ts...>) noexcept {
  int i = 0, found = -1;
  ((found = (found < 0 && std::is_same_v<T, Ts>) ? i : found, ++i), ...);
  return found;
}

template <class T>
constexpr DType dtype_of_element() noexcept {
  constexpr int i = type_index<T>(DTypeElements{});
  static_assert(i >= 0, "trainkit: no DType for this element type");
  return kDTypeOfElements[i < 0 ? 0 : i];
}

/// The index of the first byte of a bool array that is neither 0 nor 1 (bytes.size() when there
/// is none). numpy and torch read any nonzero byte as True, and an array made with .view(bool)
/// from other bytes is saved as it is; read as C++ bools such bytes are neither true nor false,
/// so the readers of .npy and safetensors files refuse them.
inline std::size_t first_non_bool_byte(std::span<const std::byte> bytes) noexcept {
  // OR whole blocks together (vectorizes); look for the element only once a block fails.
  constexpr std::size_t kBlock = 4096;
  for (std::size_t start = 0; start < bytes.size(); start += kBlock) {
    const std::size_t end = bytes.size() - start < kBlock ? bytes.size() : start + kBlock;
    unsigned bits = 0;
    for (std::size_t i = start; i < end; ++i) bits |= static_cast<unsigned>(bytes[i]);
    if ((bits & ~1u) == 0) continue;
    for (std::size_t i = start; i < end; ++i)
      if (static_cast<unsigned>(bytes[i]) > 1) return i;
  }
  return bytes.size();
}
}  // namespace detail

/// The DType of a C++ element type: `dtype_of<float> == DType::kF32`.
template <class T>
inline constexpr DType dtype_of = detail::dtype_of_element<std::remove_cv_t<T>>();

TRAINKIT_NAMESPACE_END
