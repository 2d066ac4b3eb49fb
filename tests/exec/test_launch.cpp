// Tests for exec/launch.hpp on the Host: every index of [0, n) is visited exactly once for
// awkward n and thread counts, the split follows its documented rules, exceptions propagate.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include <trainkit/exec/launch.hpp>

namespace {

namespace exec = trainkit::exec;

struct Axpy {
  float a;
  const float* x;
  float* y;
  TRAINKIT_HOST_DEVICE void operator()(std::int64_t i) const { y[i] = a * x[i] + y[i]; }
};

}  // namespace

TEST_CASE("launch(Host): each index exactly once for n = 0, 1, primes and 10^7") {
  const std::vector<std::int64_t> sizes = {0, 1, 7, 8191, 65537, 1000003, 10000000};
  for (int threads : {1, 2, 3, 8}) {
    const exec::Host host(threads);
    for (const std::int64_t n : sizes) {
      std::vector<std::uint8_t> hits(static_cast<std::size_t>(n) + 1, 0);  // +1: an overrun guard
      std::uint8_t* h = hits.data();
      exec::launch(host, n, [=](std::int64_t i) {
        std::atomic_ref<std::uint8_t>(h[i]).fetch_add(1, std::memory_order_relaxed);
      });
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < n; ++i) wrong += hits[static_cast<std::size_t>(i)] != 1;
      CHECK_MESSAGE(wrong == 0, "n=", n, " threads=", threads);
      CHECK(hits.back() == 0);
    }
  }
}

TEST_CASE("launch(Host): the split into tasks") {
  using exec::detail::host_split;
  CHECK(host_split(100, 8).num_tasks == 1);
  CHECK(host_split(2 * exec::kHostMinTaskElements - 1, 8).num_tasks == 1);
  CHECK(host_split(std::int64_t{1} << 30, 1).num_tasks == 1);
  for (int threads : {2, 3, 8, 64}) {
    for (std::int64_t n : {std::int64_t{2} * exec::kHostMinTaskElements, std::int64_t{1000003},
                           std::int64_t{10000000}, std::int64_t{64} << 20}) {
      const auto split = host_split(n, threads);
      CAPTURE(n);
      CAPTURE(threads);
      CHECK(split.num_tasks >= 2);
      CHECK(split.num_tasks <= 4 * threads);
      CHECK(split.per_task % exec::kHostTaskAlignment == 0);
      CHECK(split.per_task >= exec::kHostMinTaskElements);
      CHECK(split.num_tasks * split.per_task >= n);       // covers [0, n)
      CHECK((split.num_tasks - 1) * split.per_task < n);  // no empty task
    }
  }
  // Near 2^63 (ceil_div formed a + b - 1 and overflowed: -15 tasks, nothing run).
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  CHECK(exec::detail::ceil_div(kMax, 16) == (std::int64_t{1} << 59));
  CHECK(exec::detail::ceil_div(kMax - 15, 16) == (std::int64_t{1} << 59) - 1);
  for (const std::int64_t n : {kMax, kMax - 15, kMax - 16, (std::int64_t{1} << 62) + 3}) {
    for (int threads : {2, 4, 7}) {
      CAPTURE(n);
      CAPTURE(threads);
      const auto split = host_split(n, threads);
      CHECK(split.num_tasks >= 2);
      CHECK(split.num_tasks <= 4 * threads);
      const auto covered = static_cast<__int128>(split.num_tasks) * split.per_task;
      CHECK(covered >= n);
      CHECK(covered - split.per_task < n);
    }
  }
}

TEST_CASE("launch(Host): axpy with a functor on the default executor") {
  const std::int64_t n = 3000017;
  std::vector<float> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    x[static_cast<std::size_t>(i)] = static_cast<float>(i % 1024);
    y[static_cast<std::size_t>(i)] = static_cast<float>(i % 7);
  }
  exec::launch(exec::Host::default_instance(), n, Axpy{0.5f, x.data(), y.data()});
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i)  // small integers and halves: exact in f32
    wrong += y[static_cast<std::size_t>(i)] !=
             0.5f * static_cast<float>(i % 1024) + static_cast<float>(i % 7);
  CHECK(wrong == 0);
}

TEST_CASE("launch(Host): non-copyable functors and mutable lambdas work") {
  const exec::Host host(4);
  auto counter = std::make_unique<std::atomic<std::int64_t>>(0);
  struct Owning {
    std::unique_ptr<std::atomic<std::int64_t>>* sum;
    std::unique_ptr<int> not_copyable = std::make_unique<int>(1);
    void operator()(std::int64_t i) const { (*sum)->fetch_add(i, std::memory_order_relaxed); }
  };
  const std::int64_t n = 200000;
  exec::launch(host, n, Owning{&counter});
  CHECK(counter->load() == n * (n - 1) / 2);
  std::vector<int> out(static_cast<std::size_t>(n));
  int* o = out.data();
  exec::launch(host, n, [o](std::int64_t i) mutable { o[i] = static_cast<int>(i % 3); });
  CHECK(out[100000] == 100000 % 3);
}

TEST_CASE("launch(Host): exceptions propagate, inline and parallel") {
  for (int threads : {1, 4}) {
    const exec::Host host(threads);
    for (std::int64_t n : {std::int64_t{100}, std::int64_t{1000000}}) {
      CHECK_THROWS_WITH_AS(exec::launch(host, n,
                                        [n](std::int64_t i) {
                                          if (i == n - 3) throw std::out_of_range("bad index");
                                        }),
                           "bad index", std::out_of_range);
    }
  }
}

TEST_CASE("launch wrappers' grids: x blocks cover n within 2^31 - 1, y is capped at 65535") {
  using exec::detail::grid_blocks_x;
  using exec::detail::grid_dim_yz;
  CHECK(grid_blocks_x(0, 256, "k") == 0u);
  CHECK(grid_blocks_x(-5, 256, "k") == 0u);
  CHECK(grid_blocks_x(1, 256, "k") == 1u);
  CHECK(grid_blocks_x(256, 256, "k") == 1u);
  CHECK(grid_blocks_x(257, 256, "k") == 2u);
  // GPT-2 124M at B = 64: 65,536 rows of cross-entropy (a block each), 786,432 attention rows.
  CHECK(grid_blocks_x(65536, 1, "k") == 65536u);
  CHECK(grid_blocks_x(std::int64_t{64} * 12 * 1024, 256, "k") == 3072u);
  // Random n and block sizes: the fewest blocks that cover n.
  std::uint64_t state = 12345;
  for (int trial = 0; trial < 1000; ++trial) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto n = static_cast<std::int64_t>(state >> 24);  // up to 2^40
    const std::int64_t per = std::int64_t{1} << (trial % 11);
    CAPTURE(n);
    CAPTURE(per);
    if ((n + per - 1) / per > exec::detail::kMaxGridX) {
      CHECK_THROWS_AS(grid_blocks_x(n, per, "k"), trainkit::Error);
      continue;
    }
    const std::int64_t b = grid_blocks_x(n, per, "k");
    CHECK(b * per >= n);
    CHECK((b - 1) * per < n);
  }
  // The largest grid, and one block more: a clear error naming the kernel, not a wrapped cast.
  const std::int64_t kMaxX = 0x7fffffff;
  CHECK(grid_blocks_x(kMaxX, 1, "k") == 0x7fffffffu);
  CHECK(grid_blocks_x(kMaxX * 256, 256, "k") == 0x7fffffffu);
  CHECK_THROWS_WITH_AS(grid_blocks_x(kMaxX + 1, 1, "nn::Thing forward"),
                       doctest::Contains("nn::Thing forward: 2147483648 items in blocks of 1"),
                       trainkit::Error);
  CHECK_THROWS_AS(grid_blocks_x(std::numeric_limits<std::int64_t>::max(), 1, "k"), trainkit::Error);
  CHECK(grid_blocks_x(std::numeric_limits<std::int64_t>::max(), std::int64_t{1} << 40, "k") ==
        (1u << 23));
  CHECK_THROWS_AS(grid_blocks_x(10, 0, "k"), trainkit::Error);
  CHECK(grid_dim_yz(0) == 0u);
  CHECK(grid_dim_yz(1) == 1u);
  CHECK(grid_dim_yz(65535) == 65535u);
  CHECK(grid_dim_yz(65536) == 65535u);
  CHECK(grid_dim_yz(std::int64_t{1} << 40) == 65535u);
}
