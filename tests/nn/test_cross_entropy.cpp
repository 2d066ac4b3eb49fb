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
