// Precision tests of nn::SoftmaxCrossEntropy at large logit offsets: loss and gradient against a
// float64 reference computed from the same f32 logits, on random shapes, targets (int32 and
// int64, ignore_index rows), dloss and logit offsets 0, 1e2, 1e4 and 1e6, where PyTorch keeps
// ~1e-7 relative precision.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/cross_entropy.hpp>

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

struct Reference {
  double loss = 0.0;
  std::vector<double> grad;
};

// float64 cross-entropy of the f32 logits (mean over valid rows) and its gradient times dloss.
template <class I>
Reference reference(const std::vector<float>& logits, const std::vector<I>& targets, std::int64_t n,
                    std::int64_t v, std::int64_t ignore, double dloss) {
  Reference r;
  r.grad.assign(logits.size(), 0.0);
  std::int64_t valid = 0;
  for (std::int64_t i = 0; i < n; ++i) valid += targets[std::size_t(i)] != ignore ? 1 : 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto t = static_cast<std::int64_t>(targets[std::size_t(i)]);
    if (t == ignore) continue;
    const float* l = logits.data() + i * v;
    double m = -INFINITY;
    for (std::int64_t j = 0; j < v; ++j) m = std::max(m, double(l[j]));
    double s = 0.0;
    for (std::int64_t j = 0; j < v; ++j) s += std::exp(double(l[j]) - m);
    const double log_sum = std::log(s);
    r.loss += log_sum - (double(l[t]) - m);
    for (std::int64_t j = 0; j < v; ++j)
      r.grad[std::size_t(i * v + j)] =
          (std::exp((double(l[j]) - m) - log_sum) - (j == t ? 1.0 : 0.0)) * dloss / double(valid);
  }
  r.loss /= double(valid);
  return r;
}

double rel_norm_err(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

template <class I>
void run_case(tk::PhiloxStream& rng, double offset, double& worst_loss, double& worst_grad) {
  const auto n = static_cast<std::int64_t>(1 + rng.next_u32() % 24);
  const auto v = static_cast<std::int64_t>(2 + rng.next_u32() % 600);
  const float spread = (rng.next_u32() % 2 == 0) ? 1.0f : 6.0f;
  const float sign = (rng.next_u32() % 4 == 0) ? -1.0f : 1.0f;
  std::vector<float> logits(static_cast<std::size_t>(n * v));
  for (auto& x : logits)
    x = static_cast<float>(sign * offset + spread * (2.0f * rng.next_uniform() - 1.0f));
  const std::int64_t ignore = -100;
  std::vector<I> targets(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    targets[std::size_t(i)] =
        static_cast<I>(rng.next_u32() % 8 == 0 && i > 0 ? ignore : rng.next_u32() % v);
  const double dloss = 0.5 + rng.next_uniform();
  INFO("offset " << offset << ", N " << n << ", V " << v << ", spread " << spread << ", sign "
                 << sign << ", target bytes " << sizeof(I));

  nn::SoftmaxCrossEntropy ce;
  float loss = 0.0f;
  const tk::HostView<const float, 2> lv(logits.data(), tk::Extents<2>{{n, v}});
  const tk::HostView<const I, 1> tv(targets.data(), tk::Extents<1>{{n}});
  decltype(ce)::Context ctx;
  ce.forward(pool(), ctx, lv, tv, tk::make_view(&loss, {1}));
  std::vector<float> grad(logits.size());
  ce.backward(pool(), ctx, lv, tv, tk::HostView<float, 2>(grad.data(), tk::Extents<2>{{n, v}}),
              static_cast<float>(dloss));

  const Reference ref = reference(logits, targets, n, v, ignore, dloss);
  const double loss_err = std::abs(double(loss) - ref.loss) / std::abs(ref.loss);
  const double grad_err = rel_norm_err(grad, ref.grad);
  worst_loss = std::max(worst_loss, loss_err);
  worst_grad = std::max(worst_grad, grad_err);
  CHECK(loss_err < 1e-6);
  CHECK(grad_err < 1e-6);
}

}  // namespace

TEST_CASE("SoftmaxCrossEntropy keeps f32 precision at logit offsets 0, 1e2, 1e4, 1e6") {
  tk::PhiloxStream rng(20261201, 3);
  for (const double offset : {0.0, 1e2, 1e4, 1e6}) {
    double worst_loss = 0.0, worst_grad = 0.0;
    for (int c = 0; c < 12; ++c) {
      if (c % 2 == 0) run_case<std::int64_t>(rng, offset, worst_loss, worst_grad);
      else run_case<std::int32_t>(rng, offset, worst_loss, worst_grad);
    }
    MESSAGE("offset " << offset << ": worst relative error loss " << worst_loss << ", gradient "
                      << worst_grad);
  }
}

TEST_CASE(
    "SoftmaxCrossEntropy: backward in place (dlogits over logits) gives the bits of its own "
    "buffer; a partial overlap is refused") {
  // llm.c writes dlogits over the logits. Every row must be read before it is written: the
  // target's gradient too, which a second read after the row's store would take from the new
  // values. Random N, V, padded row strides, int32/int64 targets, ignored rows, targets in
  // every column (the first, the last, the 8-lane tails), several threads.
  tk::PhiloxStream rng(20261207, 11);
  for (int c = 0; c < 40; ++c) {
    const auto n = static_cast<std::int64_t>(1 + rng.next_u32() % 20);
    const auto v = static_cast<std::int64_t>(1 + rng.next_u32() % 70);
    const std::int64_t ld = v + static_cast<std::int64_t>(rng.next_u32() % 3) * 5;
    const float dloss = 0.25f + rng.next_uniform();
    CAPTURE(n);
    CAPTURE(v);
    CAPTURE(ld);
    std::vector<float> logits(static_cast<std::size_t>(n * ld), std::nanf(""));  // NaN padding
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < v; ++j)
        logits[std::size_t(i * ld + j)] = 4.0f * (2.0f * rng.next_uniform() - 1.0f);
    std::vector<std::int64_t> targets(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t k = rng.next_u32() % 6;
      targets[std::size_t(i)] = k == 0 ? -100 : k == 1 ? 0 : k == 2 ? v - 1 : rng.next_u32() % v;
    }
    const std::vector<std::int32_t> targets32(targets.begin(), targets.end());
    const tk::Extents<2> shape{{n, v}}, strides{{ld, 1}};
    nn::SoftmaxCrossEntropy ce;
    decltype(ce)::Context ctx;
    float loss = 0.0f;
    const tk::HostView<const float, 2> lv(logits.data(), shape, strides);
    const tk::HostView<const std::int64_t, 1> tv(targets.data(), tk::Extents<1>{{n}});
    ce.forward(pool(), ctx, lv, tv, tk::make_view(&loss, {1}));
    std::vector<float> separate(logits.size(), std::nanf(""));
    ce.backward(pool(), ctx, lv, tv, tk::HostView<float, 2>(separate.data(), shape, strides),
                dloss);
    std::vector<float> in_place = logits;
    const tk::HostView<float, 2> ip(in_place.data(), shape, strides);
    if (c % 2 == 0) {
      ce.backward(pool(), ctx, tk::HostView<const float, 2>(ip), tv, ip, dloss);
    } else {
      const tk::HostView<const std::int32_t, 1> tv32(targets32.data(), tk::Extents<1>{{n}});
      ce.backward(pool(), ctx, tk::HostView<const float, 2>(ip), tv32, ip, dloss);
    }
    for (std::size_t k = 0; k < logits.size(); ++k) {  // the padding stays NaN in both
      CAPTURE(k);
      if (std::isnan(separate[k])) {
        CHECK(std::isnan(in_place[k]));
      } else {
        CHECK(in_place[k] == separate[k]);
      }
    }
  }

  // dlogits one row below the logits in the same buffer: row r's gradient would overwrite the
  // logits of row r + 1 before they are read. Refused before anything is written.
  const std::int64_t n = 3, v = 4;
  std::vector<float> buf(static_cast<std::size_t>((n + 1) * v), 0.5f);
  const std::vector<std::int64_t> targets = {0, 1, 2};
  const tk::HostView<const std::int64_t, 1> tv(targets.data(), tk::Extents<1>{{n}});
  const tk::HostView<const float, 2> lv(buf.data(), tk::Extents<2>{{n, v}});
  nn::SoftmaxCrossEntropy ce;
  decltype(ce)::Context ctx;
  float loss = 0.0f;
  ce.forward(pool(), ctx, lv, tv, tk::make_view(&loss, {1}));
  const std::vector<float> before = buf;
  CHECK_THROWS_WITH_AS(ce.backward(pool(), ctx, lv, tv,
                                   tk::HostView<float, 2>(buf.data() + v, tk::Extents<2>{{n, v}})),
                       doctest::Contains("dlogits [3, 4] partly overlaps logits [3, 4]"),
                       tk::Error);
  CHECK(buf == before);
}
