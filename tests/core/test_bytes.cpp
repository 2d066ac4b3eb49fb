// Tests of core/bytes.hpp: byte copies and zero fills between memory spaces. On the host they are
// memcpy/memset for every size and offset; in a build without CUDA every path that touches device
// memory throws the one "built without CUDA" error naming the caller, and never touches memory.
// Also core/host_copy.hpp: the streaming and parallel host copies of checkpoint snapshots.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <trainkit/core/bytes.hpp>
#include <trainkit/core/host_copy.hpp>
#include <trainkit/core/shape.hpp>
#include <trainkit/error.hpp>

namespace {
namespace tk = trainkit;

TEST_CASE("copy_bytes / zero_bytes on the host: random sizes and offsets") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = rng() % 300, at = rng() % 17, len = n == 0 ? 0 : rng() % (n + 1);
    std::vector<std::uint8_t> src(n + 17), dst(n + 17, 0xAB), want(n + 17, 0xAB);
    for (auto& b : src) b = static_cast<std::uint8_t>(rng());
    for (std::size_t i = 0; i < len; ++i) want[at + i] = src[i];
    tk::copy_bytes(dst.data() + at, tk::Space::kHost, src.data(), tk::Space::kHost, len);
    REQUIRE(dst == want);
    for (std::size_t i = 0; i < len; ++i) want[at + i] = 0;
    tk::zero_bytes(dst.data() + at, tk::Space::kHost, len);
    REQUIRE(dst == want);
  }
}

TEST_CASE("copy_bytes / zero_bytes: zero bytes never touch either pointer") {
  CHECK_NOTHROW(tk::copy_bytes(nullptr, tk::Space::kDevice, nullptr, tk::Space::kHost, 0));
  CHECK_NOTHROW(tk::zero_bytes(nullptr, tk::Space::kDevice, 0));
}

#if !TRAINKIT_WITH_CUDA
TEST_CASE("copy_bytes / zero_bytes without CUDA: device memory is a named error") {
  std::vector<std::uint8_t> host(8, 1);
  const auto check = [&](auto&& call, const char* what) {
    CHECK_THROWS_WITH_AS(call(), doctest::Contains(what), tk::Error);
    CHECK_THROWS_WITH_AS(call(), doctest::Contains("built without CUDA"), tk::Error);
    CHECK(host == std::vector<std::uint8_t>(8, 1));
  };
  check(
      [&] {
        tk::copy_bytes(host.data(), tk::Space::kDevice, host.data(), tk::Space::kHost, 8,
                       "upload test");
      },
      "upload test");
  check(
      [&] {
        tk::copy_bytes(host.data(), tk::Space::kHost, host.data(), tk::Space::kDevice, 8,
                       "download test");
      },
      "download test");
  check([&] { tk::zero_bytes(host.data(), tk::Space::kDevice, 8, "zero test"); }, "zero test");
}
#endif

}  // namespace

TEST_CASE("copy_streaming and parallel_copy: the bytes of memcpy, random sizes and alignments") {
  std::mt19937_64 gen(1205);
  // Sizes around the streaming threshold (1 MiB) and the parallel one (64 MiB in all), at every
  // misalignment of source and destination, with tails that are not a multiple of 64 bytes.
  const std::size_t cap = (std::size_t(3) << 20) + 512;
  std::vector<unsigned char> src(cap), dst(cap), want(cap);
  for (auto& b : src) b = static_cast<unsigned char>(gen());
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    const std::size_t so = gen() % 64, d_o = gen() % 64;
    const std::size_t n = trial < 4 ? static_cast<std::size_t>(trial)
                                    : (std::size_t(1) << 20) - 4096 + gen() % (2u << 20);
    std::fill(dst.begin(), dst.end(), 0xA5);
    want = dst;
    std::memcpy(want.data() + d_o, src.data() + so, n);
    tk::detail::copy_streaming(dst.data() + d_o, src.data() + so, n);
    CHECK(dst == want);  // nothing written outside [d_o, d_o + n)
  }
  // Pieces totalling more than 64 MiB go through the threads, in 8 MiB chunks with ragged ends.
  std::vector<unsigned char> big_src((std::size_t(70) << 20) + 77), big_dst(big_src.size(), 0);
  for (std::size_t i = 0; i < big_src.size(); ++i)
    big_src[i] = static_cast<unsigned char>(i * 131 + (i >> 13));
  std::vector<tk::detail::CopyPiece> pieces;
  for (std::size_t off = 0; off < big_src.size();) {
    const std::size_t len = std::min(big_src.size() - off, std::size_t(1 + gen() % (20u << 20)));
    pieces.push_back({big_dst.data() + off, big_src.data() + off, len});
    off += len;
  }
  pieces.push_back({big_dst.data(), big_src.data(), 0});
  tk::detail::parallel_copy(pieces);
  CHECK(big_dst == big_src);
}
