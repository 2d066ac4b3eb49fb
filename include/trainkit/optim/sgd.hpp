// SPDX-License-Identifier: MIT
// trainkit/optim/sgd.hpp: `SGD`, torch.optim.SGD (momentum, dampening, Nesterov, L2 weight
// decay) as one fused pass over a ParamArena, in PyTorch's f32 operation order. The momentum
// buffer starts as a copy of the first applied gradient, as PyTorch's does; a step skipped for
// inf/NaN gradients is not "the first".
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/multi_tensor_apply.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/detail/host_simd.hpp"
#include "trainkit/optim/optimizer.hpp"
#include "trainkit/optim/param_groups.hpp"
#include "trainkit/core/state_dict.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// torch.optim.SGD's arguments (PyTorch requires lr; 1e-3 here).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< L2: g += weight_decay * p
  bool nesterov = false;      ///< needs momentum > 0 and dampening == 0
};

namespace detail {

struct SGDRule {
  struct Hyper {
    double lr;
    double weight_decay;
    double momentum;
    double dampening;
  };
  struct Scalars {
    float neg_lr;
    float weight_decay;
    float momentum;
    float one_minus_dampening;
    std::int32_t has_weight_decay;
    std::int32_t first;  ///< the momentum buffer is initialised from the gradient
  };
  TRAINKIT_HOST_DEVICE static void derive(const Hyper& h, const StepHeader& head, Scalars& s) {
    s.neg_lr = static_cast<float>(-h.lr);
    s.weight_decay = static_cast<float>(h.weight_decay);
    s.has_weight_decay = h.weight_decay != 0.0 ? 1 : 0;
    s.momentum = static_cast<float>(h.momentum);
    s.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
    s.first = head.first;
  }
};

template <class T>
struct SGDCoeffs {
  T a, b, neg_lr, weight_decay, momentum, one_minus_dampening;
};

template <class T>
TRAINKIT_HOST_DEVICE SGDCoeffs<T> sgd_coeffs(const SGDRule::Scalars& s, float a, float b) {
  if constexpr (std::is_same_v<T, float>) {
    return {a, b, s.neg_lr, s.weight_decay, s.momentum, s.one_minus_dampening};
  } else {
    return {T::set1(a),          T::set1(b),
            T::set1(s.neg_lr),   T::set1(s.weight_decay),
            T::set1(s.momentum), T::set1(s.one_minus_dampening)};
  }
}

/// One SGD element update in torch/optim/sgd.py's order: g = g * inv_scale * clip;
/// g = g + wd * p; buf = g (first) or buf * momentum + (1 - dampening) * g;
/// g = nesterov ? g + momentum * buf : buf; p = p + (-lr) * g.
template <bool kMomentum, bool kNesterov, class T>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void sgd_math(T& p, T g, T& buf, bool weight_decay,
                                                        bool first, const SGDCoeffs<T>& c) {
  g = (g * c.a) * c.b;
  if (weight_decay) g = g + c.weight_decay * p;
  if constexpr (kMomentum) {
    if (first) {
      buf = g;
    } else {
      buf = buf * c.momentum;
      buf = buf + c.one_minus_dampening * g;
    }
    if constexpr (kNesterov) {
      g = g + c.momentum * buf;
    } else {
      g = buf;
    }
  }
  p = p + c.neg_lr * g;
}

template <bool kMomentum, bool kNesterov>
void sgd_host_range(float* TRAINKIT_RESTRICT p, const float* TRAINKIT_RESTRICT g,
                    float* TRAINKIT_RESTRICT buf, std::int64_t n, const SGDRule::Scalars& s,
                    float a, float b) {
  const bool wd = s.has_weight_decay != 0;
  const bool first = s.first != 0;
  std::int64_t i = 0;
  // nvcc's device pass must not instantiate the (host-only) vector code through the
  // __host__ __device__ math template; the host pass always compiles it.
#if !defined(__CUDA_ARCH__)
  const SGDCoeffs<VecF> cv = sgd_coeffs<VecF>(s, a, b);
  for (; i + VecF::kWidth <= n; i += VecF::kWidth) {
    VecF pi = VecF::load(p + i);
    VecF bi = pi;
    if constexpr (kMomentum) bi = VecF::load(buf + i);
    sgd_math<kMomentum, kNesterov>(pi, VecF::load(g + i), bi, wd, first, cv);
    pi.store(p + i);
    if constexpr (kMomentum) bi.store(buf + i);
  }
#endif
  const SGDCoeffs<float> cs = sgd_coeffs<float>(s, a, b);
  for (; i < n; ++i) {
    float bi = kMomentum ? buf[i] : 0.0f;
    sgd_math<kMomentum, kNesterov>(p[i], g[i], bi, wd, first, cs);
    if constexpr (kMomentum) buf[i] = bi;
  }
}

/// The CUDA element functor: arity 4 without momentum, 5 with.
template <bool kNesterov>
struct SGDFunctor {
  const StepHeader* header;
  const SGDRule::Scalars* scalars;
  const std::int32_t* segment_group;

  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g) const {
    if (header->skip != 0) return;
    const SGDRule::Scalars s = scalars[segment_group[t]];
    float unused = 0.0f;
    sgd_math<false, false>(p[i], g[i], unused, s.has_weight_decay != 0, false,
                           sgd_coeffs<float>(s, header->grad_mult_a, header->grad_mult_b));
  }
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g,
                                       float* buf) const {
    if (header->skip != 0) return;
    const SGDRule::Scalars s = scalars[segment_group[t]];
    sgd_math<true, kNesterov>(p[i], g[i], buf[i], s.has_weight_decay != 0, s.first != 0,
                              sgd_coeffs<float>(s, header->grad_mult_a, header->grad_mult_b));
  }
};

}  // namespace detail

/// torch.optim.SGD over a ParamArena. With momentum the arena gets a "momentum_buffer" state.
/// Throws for invalid hyper-parameters (negative lr/momentum/weight_decay, Nesterov without
/// momentum or with dampening).
template <Space S = Space::kHost>
class SGD : public FusedOptimizer<SGD<S>, S, detail::SGDRule> {
  using Base = FusedOptimizer<SGD<S>, S, detail::SGDRule>;
  friend Base;

 public:
  explicit SGD(nn::ParamArena<S>& arena, SGDOptions options = {},
               std::vector<GroupRule> groups = {})
      : Base(arena, hyper_of(validated(options)), std::move(groups), /*merge_segments=*/true),
        options_(options) {
    if (options_.momentum != 0.0) buf_ = this->arena_state("momentum_buffer");
    if constexpr (S == Space::kDevice) {
      float* p = this->arena_->params_data();
      const float* g = this->arena_->grads_data();
      for (const detail::Segment& s : this->segments_) {
        const std::int64_t o = s.begin;
        if (buf_ != nullptr) list3_.add(s.end - o, p + o, g + o, buf_ + o);
        else list2_.add(s.end - o, p + o, g + o);
      }
    }
  }

  const SGDOptions& options() const noexcept { return options_; }

 private:
  bool needs_grad_norm() const noexcept { return false; }

  static SGDOptions validated(const SGDOptions& o) {
    TRAINKIT_CHECK(o.lr >= 0.0, "optim::SGD: invalid learning rate ", o.lr);
    TRAINKIT_CHECK(o.momentum >= 0.0, "optim::SGD: invalid momentum ", o.momentum);
    TRAINKIT_CHECK(o.weight_decay >= 0.0, "optim::SGD: invalid weight_decay ", o.weight_decay);
    TRAINKIT_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
                   "optim::SGD: Nesterov momentum requires a momentum and zero dampening");
    return o;
  }
  static detail::SGDRule::Hyper hyper_of(const SGDOptions& o) {
    return {o.lr, o.weight_decay, o.momentum, o.dampening};
  }

  template <class E>
  void launch_update(const E& exec) {
    if constexpr (exec::is_host_executor_v<E>) {
      const detail::StepHeader& h = this->host_header();
      if (h.skip != 0) return;
      float* p = this->arena_->params_data();
      const float* g = this->arena_->grads_data();
      float* buf = buf_;
      const float a = h.grad_mult_a;
      const float b = h.grad_mult_b;
      const bool momentum = buf_ != nullptr;
      const bool nesterov = options_.nesterov;
      detail::for_each_segment_range(
          exec, this->segments_, this->arena_->buffer_numel(),
          [&](const detail::Segment& s, std::int64_t begin, std::int64_t end) {
            const auto& sc = this->host_scalars(s.group);
            const std::int64_t n = end - begin;
            if (!momentum)
              detail::sgd_host_range<false, false>(p + begin, g + begin, nullptr, n, sc, a, b);
            else if (nesterov)
              detail::sgd_host_range<true, true>(p + begin, g + begin, buf + begin, n, sc, a, b);
            else
              detail::sgd_host_range<true, false>(p + begin, g + begin, buf + begin, n, sc, a, b);
          });
    } else {
      const auto* h = this->header_.data();
      const auto* sc = this->scalars_.data();
      const auto* sg = this->segment_group_.data();
      if (buf_ == nullptr)
        exec::multi_tensor_apply(exec, list2_, detail::SGDFunctor<false>{h, sc, sg});
      else if (options_.nesterov)
        exec::multi_tensor_apply(exec, list3_, detail::SGDFunctor<true>{h, sc, sg});
      else exec::multi_tensor_apply(exec, list3_, detail::SGDFunctor<false>{h, sc, sg});
    }
  }

  std::vector<detail::StateBuffer> state_buffers() const {
    std::vector<detail::StateBuffer> out;
    if (buf_ != nullptr) out.push_back({"momentum_buffer", buf_, DType::kF32});
    return out;
  }
  void save_options(StateDict& sd) const {
    sd.set("optimizer", "SGD");
    sd.set("momentum", options_.momentum);
    sd.set("dampening", options_.dampening);
    sd.set("nesterov", options_.nesterov);
  }
  void load_options(const StateDict& sd) {
    TRAINKIT_CHECK(sd.get_string("optimizer") == "SGD",
                   "optim::SGD::load_state_dict: the state "
                   "is from ",
                   sd.get_string("optimizer"));
    TRAINKIT_CHECK((sd.get_double("momentum") != 0.0) == (options_.momentum != 0.0),
                   "optim::SGD::load_state_dict: momentum on/off differs from this optimizer");
    options_.momentum = sd.get_double("momentum");
    options_.dampening = sd.get_double("dampening");
    options_.nesterov = sd.get_int("nesterov") != 0;
    for (auto& h : this->hyper_) {
      h.momentum = options_.momentum;
      h.dampening = options_.dampening;
    }
  }

  SGDOptions options_;
  float* buf_ = nullptr;
  exec::TensorList<float, const float> list2_;
  exec::TensorList<float, const float, float> list3_;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
