// SPDX-License-Identifier: MIT
// libFuzzer target: data::TokenShardDataset over an arbitrary file (an in-memory file through
// memfd, mapped like a real shard), with options taken from the input's last byte. Any input
// must be refused with trainkit::Error or give a dataset whose declared sizes fit the input
// (header + tokens * width == input size, every window inside it) and whose windows equal the
// input's tokens; crashes, sanitizer reports and other exception types are bugs.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <trainkit/data/token_shards.hpp>

#include "fuzz_alloc_bound.hpp"
#include "fuzz_memfile.hpp"

using fuzz_memfile::check;
using fuzz_memfile::MemFile;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = trainkit::data;
  const MemFile file(data, size);
  const std::uint8_t knob = size > 0 ? data[size - 1] : 0;
  const trainkit::DType dtypes[] = {trainkit::DType::kI32, trainkit::DType::kI64,
                                    trainkit::DType::kU16, trainkit::DType::kU32};
  d::TokenShardOptions o;
  o.seq_len = 1 + (knob & 15);
  o.stride = (knob >> 4) & 3;  // 0 = seq_len
  o.token_dtype = dtypes[(knob >> 6) & 3];
  if (knob == 0xff) o.seq_len = ~std::size_t{0};  // the largest seq_len must be refused cleanly
  const fuzz_alloc::Scope scope;  // shards are mapped: nothing sized by the input is allocated
  try {
    const d::TokenShardDataset ds(std::vector<std::filesystem::path>{file.path()}, o);
    // The size-bound property: nothing the dataset reports exceeds what the input holds.
    check(ds.num_shards() == 1);
    std::int32_t header[3];
    std::memcpy(header, data, sizeof header);
    const std::size_t width = header[0] == d::kTokenShardMagicLlama3 ? 4 : 2;
    const std::size_t tokens = ds.shard_tokens(0);
    check(tokens <= size / width);
    check(d::kTokenShardHeaderBytes + tokens * width == size);
    const std::size_t stride = o.stride == 0 ? o.seq_len : o.stride;
    check(ds.size() >= 1 && (ds.size() - 1) * stride + o.seq_len + 1 <= tokens);
    const std::size_t T = o.seq_len;
    const std::size_t esize = trainkit::dtype_size(o.token_dtype);
    std::vector<std::byte> in(T * esize), target(T * esize);
    const std::vector<std::span<std::byte>> spans{std::span<std::byte>(in),
                                                  std::span<std::byte>(target)};
    const d::SampleRef out(spans);
    for (std::size_t i = 0; i < ds.size() && i < 64; ++i) {
      ds.read(i, out);
      // Spot-check the last target token against the input.
      const std::size_t at = d::kTokenShardHeaderBytes + (i * stride + T) * width;
      std::uint64_t want = 0;
      std::memcpy(&want, data + at, width);
      std::uint64_t got = 0;
      std::memcpy(&got, target.data() + (T - 1) * esize, esize);
      if (esize > width) got &= (std::uint64_t{1} << (8 * width)) - 1;
      check(got == (esize < width ? want & ((std::uint64_t{1} << (8 * esize)) - 1) : want));
    }
    (void)ds.describe(ds.size());
  } catch (const trainkit::Error&) {
  }
  check(scope.largest() <= (64 << 10));
  return 0;
}
