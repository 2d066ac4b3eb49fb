// SPDX-License-Identifier: MIT
// libFuzzer target: TcpComm's wire decoders on arbitrary bytes, dist::detail::decode_tcp_frame
// on the first 40 bytes and decode_tcp_table on the bytes after the first (1 + byte 0 % 8
// ranks). What peers send is untrusted: any input must decode into a frame or table within the
// protocol's limits that encodes back to the same bytes, or throw trainkit::Error; no allocation
// may exceed the input's size plus a small constant.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <trainkit/dist/tcp_comm.hpp>

#include "fuzz_alloc_bound.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = trainkit::dist::detail;
  const fuzz_alloc::Scope scope;
  const std::size_t head = std::min(size, d::kTcpFrameBytes);
  try {
    const d::TcpFrame f = d::decode_tcp_frame(data, head, "fuzz");
    if (head != d::kTcpFrameBytes) std::abort();
    std::uint64_t limit = 0;
    switch (f.type) {
      case d::TcpFrameType::kHello: limit = d::kTcpMaxAddress; break;
      case d::TcpFrameType::kTable:
        if (f.b < 1 || f.b > static_cast<std::uint32_t>(d::kTcpMaxWorld)) std::abort();
        limit = std::uint64_t{f.b} * (8 + d::kTcpMaxAddress);
        break;
      case d::TcpFrameType::kLink: limit = 0; break;
      case d::TcpFrameType::kHeader: limit = std::uint64_t{1} << 62; break;
      case d::TcpFrameType::kData: limit = d::kTcpMaxUnit; break;
      case d::TcpFrameType::kAbort:
      case d::TcpFrameType::kLeave: limit = d::kTcpMaxText; break;
      default: std::abort();
    }
    if (f.length > limit) std::abort();
    if (static_cast<unsigned>(f.dtype) > static_cast<unsigned>(trainkit::DType::kBool))
      std::abort();
    unsigned char again[d::kTcpFrameBytes];
    d::encode_tcp_frame(f, again);
    if (std::memcmp(again, data, d::kTcpFrameBytes) != 0) std::abort();
  } catch (const trainkit::Error&) {
  }
  if (size > 0) {
    const int world = 1 + data[0] % 8;
    const std::span<const unsigned char> rest(data + 1, size - 1);
    try {
      const std::vector<d::TcpEndpoint> table = d::decode_tcp_table(rest, world, "fuzz");
      if (table.size() != static_cast<std::size_t>(world)) std::abort();
      for (const d::TcpEndpoint& e : table) {
        if (e.port < 1 || e.port > 65535 || e.host.empty() || e.host.size() > d::kTcpMaxAddress)
          std::abort();
      }
      const std::vector<unsigned char> again = d::encode_tcp_table(table);
      if (again.size() != rest.size() || !std::equal(again.begin(), again.end(), rest.begin()))
        std::abort();
    } catch (const trainkit::Error&) {
    }
  }
  if (scope.largest() > size + (64 << 10)) std::abort();
  return 0;
}
