// SPDX-License-Identifier: MIT
// libFuzzer target: io::parse_npy_header and io::check_npy_size on arbitrary bytes. Any input
// must either parse into a self-consistent header or throw trainkit::Error; crashes, hangs,
// sanitizer reports and other exception types are bugs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <trainkit/io/npy.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace io = trainkit::io;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const io::NpyHeader h = io::parse_npy_header(bytes, "fuzz.npy");
    // Invariants of an accepted header.
    if (h.data_offset > size || h.data_offset < 10) std::abort();
    if (h.data_bytes != h.numel * trainkit::dtype_size(h.dtype)) std::abort();
    std::size_t numel = 1;
    for (std::int64_t d : h.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<std::size_t>(d);
    }
    if (numel != h.numel) std::abort();
    io::check_npy_size(h, size, "fuzz.npy");
    // Round trip: our writer's header for the same array parses to the same description.
    const std::string again = io::npy_header_bytes(h.dtype, h.shape);
    const io::NpyHeader h2 = io::parse_npy_header(
        std::span(reinterpret_cast<const std::byte*>(again.data()), again.size()), "again.npy");
    if (h2.dtype != h.dtype || h2.shape != h.shape || h2.data_offset % 64 != 0) std::abort();
  } catch (const trainkit::Error&) {
  }
  return 0;
}
