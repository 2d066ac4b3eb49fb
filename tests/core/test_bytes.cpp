// Tests of core/bytes.hpp: byte copies and zero fills between memory spaces. On the host they are
// memcpy/memset for every size and offset; in a build without CUDA every path that touches device
// memory throws the one "built without CUDA" error naming the caller, and never touches memory.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <trainkit/core/bytes.hpp>
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
