// SPDX-License-Identifier: MIT
// trainkit/nn/residual.hpp: the residual connection out = a + b of a transformer block, and its
// backward, which hands dout to both branches (written or accumulated). Element-wise, so one
// host/device functor through exec::launch.
#pragma once

#include <cstdint>

#include "trainkit/amp/policy.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/math.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace nn {
namespace detail {

template <class T>
struct AddFunctor {
  const T* a;
  const T* b;
  T* out;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    out[i] = store<T>(load(a[i]) + load(b[i]));
  }
};

template <class T>
struct GradSplit {
  const T* dout;
  T* da;  // may be null
  T* db;  // may be null
  bool accumulate_a;
  bool accumulate_b;
  TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void operator()(std::int64_t i) const {
    const float g = load(dout[i]);
    if (da != nullptr) da[i] = store<T>(accumulate_a ? load(da[i]) + g : g);
    if (db != nullptr) db[i] = store<T>(accumulate_b ? load(db[i]) + g : g);
  }
};

/// The host GradSplit: the same element arithmetic, with the null and accumulate tests hoisted
/// out of the element loop and each destination written in lane_map blocks, which g++ -O2
/// vectorises (the branchy per-element functor stays scalar there).
template <class T>
void grad_split_host(const exec::Host& host, const GradSplit<T>& f, std::int64_t n) {
  for_rows(host, n, 1, [&](std::int64_t b, std::int64_t e) TRAINKIT_INLINE_LAMBDA {
    const T* g = f.dout + b;
    const auto split = [&](T* d, bool accumulate) TRAINKIT_INLINE_LAMBDA {
      if (d == nullptr) return;
      d += b;
      const auto put = [&](std::int64_t j, float v) { d[j] = store<T>(v); };
      if (accumulate) {
        lane_map(
            e - b, [&](std::int64_t j) { return load(d[j]) + load(g[j]); }, put);
      } else {
        lane_map(
            e - b, [&](std::int64_t j) { return load(g[j]); }, put);
      }
    };
    split(f.da, f.accumulate_a);
    split(f.db, f.accumulate_b);
  });
}

/// The host AddFunctor: the same sums in lane_map blocks, which g++ -O2 vectorises (a plain
/// loop over the functor stays scalar there: out may alias a or b).
template <class T>
void add_host(const exec::Host& host, const AddFunctor<T>& f, std::int64_t n) {
  for_rows(host, n, 1, [&](std::int64_t b, std::int64_t e) TRAINKIT_INLINE_LAMBDA {
    const T* a = f.a + b;
    const T* c = f.b + b;
    T* out = f.out + b;
    lane_map(
        e - b, [&](std::int64_t j) { return load(a[j]) + load(c[j]); },
        [&](std::int64_t j, float v) { out[j] = store<T>(v); });
  });
}

}  // namespace detail

/// out = a + b, element-wise (any rank; all three alike; out may alias a or b).
template <amp::Policy P = amp::Fp32, class E, class TA, class TB, class TO, int R, Space S>
void residual_forward(const E& exec, TensorView<TA, R, S> a, TensorView<TB, R, S> b,
                      TensorView<TO, R, S> out) {
  using T = std::remove_const_t<TA>;
  detail::check_call<P, E, S, TA, TB, TO>();
  detail::check_same_shape("nn::residual_forward", "a", a, "b", b);
  detail::check_same_shape("nn::residual_forward", "a", a, "out", out);
  const detail::AddFunctor<T> add{a.data(), b.data(), out.data()};
  if constexpr (S == Space::kHost) {
    detail::add_host(exec, add, a.numel());
  } else {
    exec::launch(exec, a.numel(), add);
  }
}

/// Backward of out = a + b: da = dout and db = dout (each written, or added with
/// Write::kAccumulate). Either gradient may be absent (default view: skipped).
template <amp::Policy P = amp::Fp32, class E, class TD, class TA, class TB, int R, Space S>
void residual_backward(const E& exec, TensorView<TD, R, S> dout, TensorView<TA, R, S> da,
                       TensorView<TB, R, S> db, Write mode_a = Write::kOverwrite,
                       Write mode_b = Write::kOverwrite) {
  using T = std::remove_const_t<TD>;
  detail::check_call<P, E, S, TD, TA, TB>();
  if (!detail::absent(da))
    detail::check_same_shape("nn::residual_backward", "dout", dout, "da", da);
  if (!detail::absent(db))
    detail::check_same_shape("nn::residual_backward", "dout", dout, "db", db);
  const detail::GradSplit<T> split{dout.data(), da.data(), db.data(), mode_a == Write::kAccumulate,
                                   mode_b == Write::kAccumulate};
  if constexpr (S == Space::kHost) {
    detail::grad_split_host(exec, split, dout.numel());
  } else {
    exec::launch(exec, dout.numel(), split);
  }
}

}  // namespace nn
TRAINKIT_NAMESPACE_END
