// Tests of nn::count_correct (top-1 accuracy on the host): random logits against a plain argmax,
// ties resolved to the first index as torch.argmax does, out-of-range targets never counted, and
// a size mismatch is an error.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <trainkit/error.hpp>
#include <trainkit/nn/cross_entropy.hpp>

namespace {
namespace tk = trainkit;

TEST_CASE("count_correct: random batches against argmax, ties and bad targets") {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t rows = rng() % 40, classes = 1 + rng() % 12;
    std::vector<float> logits(static_cast<std::size_t>(rows * classes));
    for (float& v : logits) v = float(int(rng() % 5));  // few values: many ties
    std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
    std::int64_t want = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < classes; ++k)
        if (logits[std::size_t(r * classes + k)] > logits[std::size_t(r * classes + best)])
          best = k;
      targets[std::size_t(r)] =
          rng() % 3 == 0 ? std::int32_t(best) : std::int32_t(int(rng() % (classes + 2)) - 1);
      want += targets[std::size_t(r)] == best;
    }
    const auto l = tk::make_view(logits.data(), {rows, classes});
    const auto t = tk::make_view(targets.data(), {rows});
    CHECK(tk::nn::count_correct(l, t) == want);
    std::vector<tk::bf16> lb(logits.begin(), logits.end());
    CHECK(tk::nn::count_correct(tk::make_view(lb.data(), {rows, classes}), t) == want);
  }
  std::vector<float> l(6, 0.0f);
  std::vector<std::int64_t> t(2, 0);
  CHECK_THROWS_WITH_AS(
      tk::nn::count_correct(tk::make_view(l.data(), {3, 2}), tk::make_view(t.data(), {2})),
      doctest::Contains("2 targets for 3 rows"), tk::Error);

  // NaN is the largest value, as torch.argmax has it: the first NaN of a row is its argmax.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> rows = {1,   nan, 0, nan,  //
                                   nan, 5,   7, 1,    //
                                   2,   9,   9, 3};
  for (const auto& [row, target, hit] :
       {std::tuple{0, 1, 1}, std::tuple{0, 3, 0}, std::tuple{1, 0, 1}, std::tuple{1, 2, 0},
        std::tuple{2, 1, 1}, std::tuple{2, 2, 0}}) {
    CAPTURE(row);
    CAPTURE(target);
    const std::int64_t want_target = target;
    CHECK(tk::nn::count_correct(tk::make_view(rows.data() + 4 * row, {1, 4}),
                                tk::make_view(&want_target, {1})) == hit);
  }
}

}  // namespace
