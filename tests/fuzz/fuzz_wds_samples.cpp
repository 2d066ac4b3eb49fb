// SPDX-License-Identifier: MIT
// libFuzzer target: WebDataset sample assembly. The input is a tar shard (an in-memory file
// through memfd, opened by path like a real shard) read by data::TarShardDataset, which groups
// members by key into samples and decodes .npy/.cls/.json/raw members into fields; the input's
// last byte picks the fields, the shuffle buffer and max_member_bytes. Any input must give
// samples or a trainkit::Error. Size bounds: no more samples than 512-byte headers in the input,
// and no single allocation beyond the input's size plus a small constant (the dataset must not
// trust a member's declared size).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <trainkit/data/tar_shards.hpp>

#include "fuzz_alloc_bound.hpp"
#include "fuzz_memfile.hpp"

using fuzz_memfile::check;
using fuzz_memfile::MemFile;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = trainkit::data;
  using trainkit::DType;
  const MemFile file(data, size);
  const std::uint8_t knob = size > 0 ? data[size - 1] : 0;
  const d::TarField all[] = {{"x", "npy", DType::kF32, {4}},
                             {"label", "cls", DType::kI64, {}},
                             {"pair", "json", DType::kI32, {2}},
                             {"raw", "bin", DType::kU8, {8}, (knob & 0x20) != 0},
                             {"doc", "txt", DType::kU8, {16}, true}};
  d::TarShardOptions o;
  const unsigned mask = (knob & 31) != 0 ? (knob & 31) : 2;
  for (unsigned k = 0; k < 5; ++k)
    if (mask & (1u << k)) o.fields.push_back(all[k]);
  o.shuffle_shards = false;
  o.shuffle_buffer = (knob & 0x40) ? 3 : 0;
  if (knob & 0x80) o.max_member_bytes = 64;
  std::size_t sample_bytes = 0;
  for (const d::TarField& f : o.fields) {
    std::size_t n = trainkit::dtype_size(f.dtype);
    for (std::int64_t e : f.shape) n *= std::size_t(e);
    sample_bytes += n;
  }
  std::vector<std::byte> sample(sample_bytes);
  std::vector<std::span<std::byte>> spans;
  std::size_t off = 0;
  for (const d::TarField& f : o.fields) {
    std::size_t n = trainkit::dtype_size(f.dtype);
    for (std::int64_t e : f.shape) n *= std::size_t(e);
    spans.emplace_back(sample.data() + off, n);
    off += n;
  }
  const d::SampleRef out(spans);
  std::size_t samples = 0;
  {
    const fuzz_alloc::Scope scope;
    try {
      d::TarShardDataset ds(std::vector<std::string>{file.path()}, o);
      while (ds.next(out)) {
        ++samples;
        check(samples <= size / 512);
        (void)ds.describe_current();
      }
    } catch (const trainkit::Error&) {
    }
    // Shuffle buffer samples, the stdio buffer (the file rounded up to a page), bookkeeping.
    check(scope.largest() <= size + 4096 + 4 * sample_bytes + (64 << 10));
  }
  return 0;
}
