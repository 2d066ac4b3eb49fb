// SPDX-License-Identifier: MIT
// libFuzzer target: io::TarReader over arbitrary bytes, reading every member's data (or part of
// it, then skipping the rest). Any input must end cleanly or throw trainkit::Error, and no
// allocation may exceed the input's size plus a small constant.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include <trainkit/io/tar.hpp>

#include "fuzz_alloc_bound.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace io = trainkit::io;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const fuzz_alloc::Scope scope;
  try {
    io::TarReader tar = io::TarReader::from_memory(bytes, "fuzz.tar");
    std::size_t members = 0;
    while (tar.next()) {
      const io::TarEntry& e = tar.entry();
      if (e.offset >= size) std::abort();
      // A member cannot hold more data than the input has left.
      if (e.size > size) {
        if (members % 3 == 0) {
          (void)tar.read_data();  // must throw "truncated" before allocating e.size bytes
          std::abort();
        }
        std::vector<std::byte> sink(1);
        tar.read(sink);  // must throw "truncated" (or succeed for 1 byte), never read past the end
        continue;
      }
      if (++members % 2 == 0) {
        const std::vector<std::byte> all = tar.read_data();
        if (all.size() != e.size) std::abort();
      } else {
        std::vector<std::byte> part(static_cast<std::size_t>(std::min<std::uint64_t>(e.size, 7)));
        tar.read(part);
      }
    }
    if (tar.next()) std::abort();  // stays at the end
  } catch (const trainkit::Error&) {
  }
  // Whatever the headers declare, no allocation exceeds the input (plus bookkeeping).
  if (scope.largest() > size + (64 << 10)) std::abort();
  return 0;
}
