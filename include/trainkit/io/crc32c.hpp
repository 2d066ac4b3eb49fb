// SPDX-License-Identifier: MIT
// trainkit/io/crc32c.hpp: CRC-32C (Castagnoli), the checksum of TFRecord framing (TensorBoard event
// files) and LevelDB, plus the "masked" form those formats store. Portable slice-by-8 tables built
// at compile time: no SSE4.2/ARMv8 intrinsics, so every tier and compiler gets the same bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace io {
namespace detail {

// Reflected polynomial 0x82F63B78 (normal form 0x1EDC6F41). Table k maps a byte that is k
// positions ahead of the current one, which lets the loop consume 8 bytes per iteration.
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> tables{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    tables[0][i] = crc;
  }
  for (std::size_t k = 1; k < 8; ++k) {
    for (std::size_t i = 0; i < 256; ++i) {
      const std::uint32_t prev = tables[k - 1][i];
      tables[k][i] = (prev >> 8) ^ tables[0][prev & 0xFFu];
    }
  }
  return tables;
}

inline constexpr std::array<std::array<std::uint32_t, 256>, 8> kCrc32cTables = make_crc32c_tables();

}  // namespace detail

/// CRC-32C of `size` bytes at `data`. Pass a previous result as `crc` to continue a running
/// checksum over several pieces: `crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b)`.
/// `crc32c("123456789", 9) == 0xE3069283`.
inline std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0) noexcept {
  const auto& t = detail::kCrc32cTables;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  while (size >= 8) {
    // Byte-wise loads keep this independent of alignment and host endianness.
    const std::uint32_t lo =
        c ^ (static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
             static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
        t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

/// CRC-32C of a byte string.
inline std::uint32_t crc32c(std::string_view bytes, std::uint32_t crc = 0) noexcept {
  return crc32c(bytes.data(), bytes.size(), crc);
}

/// The masked CRC stored by TFRecord and LevelDB: rotate right by 15, add 0xA282EAD8. Masking keeps
/// a CRC of data that itself contains CRCs from being trivially predictable.
inline constexpr std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

/// Inverse of mask_crc32c.
inline constexpr std::uint32_t unmask_crc32c(std::uint32_t masked) noexcept {
  const std::uint32_t rot = masked - 0xA282EAD8u;
  return (rot >> 17) | (rot << 15);
}

/// mask_crc32c(crc32c(data)): the value a TFRecord stores after its length and after its data.
inline std::uint32_t masked_crc32c(const void* data, std::size_t size) noexcept {
  return mask_crc32c(crc32c(data, size));
}

}  // namespace io
TRAINKIT_NAMESPACE_END
