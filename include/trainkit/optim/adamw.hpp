// SPDX-License-Identifier: MIT
// trainkit/optim/adamw.hpp: `AdamW`, torch.optim.AdamW as one fused pass over a ParamArena:
// decoupled weight decay, bias correction, optional AMSGrad, reading PyTorch's 28 bytes per
// parameter (p, g, m, v read; p, m, v written) and nothing else. The element arithmetic is
// PyTorch's single-tensor AdamW in the same f32 operation order (lerp for exp_avg, addcmul for
// exp_avg_sq, addcdiv), except that sqrt(v) is multiplied by 1 / sqrt(bias_correction2) instead
// of divided by its square root (as PyTorch's CUDA scalar division does): one f32 division less,
// which is what keeps the CPU loop at memory speed. Optional bf16 moments with stochastic rounding
// (llm.c) halve the optimizer state.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor.hpp"
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

/// torch.optim.AdamW's arguments, with its defaults.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  ///< decoupled: p *= 1 - lr * weight_decay before the Adam update
  bool amsgrad = false;        ///< keep max_exp_avg_sq and normalise by it
  /// Keep exp_avg / exp_avg_sq (/ max_exp_avg_sq) in bf16, rounded stochastically with Philox
  /// keyed by (seed, step, element): unbiased, deterministic, half the state memory (llm.c #772).
  bool bf16_state = false;
  std::uint64_t seed = 0;  ///< the stochastic-rounding key (bf16_state only)
};

namespace detail {

/// AdamW's per-group hyper-parameters and the f32 scalars the pass reads.
struct AdamWRule {
  struct Hyper {
    double lr;
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
  };
  struct Scalars {
    float decay;         ///< 1 - lr * weight_decay (1 when weight_decay is 0)
    float w1;            ///< lerp weight 1 - beta1
    float one_minus_w1;  ///< 1 - w1 in f32 (lerp's large-weight form)
    float beta2;
    float omb2;          ///< 1 - beta2
    float inv_bc2_sqrt;  ///< 1 / sqrt(1 - beta2^step), rounded once from double
    float eps;
    float neg_step_size;  ///< -lr / (1 - beta1^step)
    std::int32_t lerp_small;
    std::int32_t pad;
  };
  /// Python-float (double) arithmetic of torch/optim/adam.py, rounded to f32 where the tensor ops
  /// take the scalars.
  TRAINKIT_HOST_DEVICE static void derive(const Hyper& h, const StepHeader& head, Scalars& s) {
    const double bc1 = 1.0 - pow(h.beta1, head.step);
    const double bc2 = 1.0 - pow(h.beta2, head.step);
    s.decay = h.weight_decay != 0.0 ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
    s.w1 = static_cast<float>(1.0 - h.beta1);
    s.one_minus_w1 = 1.0f - s.w1;
    s.lerp_small = (s.w1 < 0.5f && s.w1 > -0.5f) ? 1 : 0;
    s.beta2 = static_cast<float>(h.beta2);
    s.omb2 = static_cast<float>(1.0 - h.beta2);
    s.inv_bc2_sqrt = static_cast<float>(1.0 / pow(bc2, 0.5));
    s.eps = static_cast<float>(h.eps);
    s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  }
};

/// The f32 scalars of one group splatted to T (float, or the host VecF).
template <class T>
struct AdamWCoeffs {
  T a, b, decay, w1, one_minus_w1, beta2, omb2, inv_bc2_sqrt, eps, neg_step;
};

template <class T>
TRAINKIT_HOST_DEVICE AdamWCoeffs<T> adamw_coeffs(const AdamWRule::Scalars& s, float a, float b) {
  if constexpr (std::is_same_v<T, float>) {
    return {a,       b,      s.decay,        s.w1,  s.one_minus_w1,
            s.beta2, s.omb2, s.inv_bc2_sqrt, s.eps, s.neg_step_size};
  } else {
    return {T::set1(a),
            T::set1(b),
            T::set1(s.decay),
            T::set1(s.w1),
            T::set1(s.one_minus_w1),
            T::set1(s.beta2),
            T::set1(s.omb2),
            T::set1(s.inv_bc2_sqrt),
            T::set1(s.eps),
            T::set1(s.neg_step_size)};
  }
}

/// One AdamW element update, PyTorch's operation order: g = g * inv_scale * clip; p *= decay;
/// m = lerp(m, g, 1 - beta1); v = v * beta2 + ((1 - beta2) * g) * g; (AMSGrad: vmax = max(vmax,
/// v)); p += (-step_size * m) / (sqrt(v) * (1 / sqrt(bc2)) + eps).
template <bool kAmsgrad, class T>
TRAINKIT_HOST_DEVICE TRAINKIT_FORCEINLINE void adamw_math(T& p, T g, T& m, T& v, T& vm,
                                                          bool lerp_small,
                                                          const AdamWCoeffs<T>& c) {
  g = (g * c.a) * c.b;
  p = p * c.decay;
  m = lerp_small ? m + c.w1 * (g - m) : g - (g - m) * c.one_minus_w1;
  v = v * c.beta2;
  v = v + (c.omb2 * g) * g;
  T denom_base = v;
  if constexpr (kAmsgrad) {
    vm = vmax(vm, v);
    denom_base = vm;
  }
  const T denom = vsqrt(denom_base) * c.inv_bc2_sqrt + c.eps;
  p = p + (c.neg_step * m) / denom;
}

/// The host loop over one contiguous range (f32 state): vector body, scalar tail.
template <bool kAmsgrad>
void adamw_host_range(float* TRAINKIT_RESTRICT p, const float* TRAINKIT_RESTRICT g,
                      float* TRAINKIT_RESTRICT m, float* TRAINKIT_RESTRICT v,
                      float* TRAINKIT_RESTRICT vm, std::int64_t n, const AdamWRule::Scalars& s,
                      float a, float b) {
  const bool small = s.lerp_small != 0;
  std::int64_t i = 0;
  // nvcc's device pass must not instantiate the (host-only) vector code through the
  // __host__ __device__ math template; the host pass always compiles it.
#if !defined(__CUDA_ARCH__)
  const AdamWCoeffs<VecF> cv = adamw_coeffs<VecF>(s, a, b);
  for (; i + VecF::kWidth <= n; i += VecF::kWidth) {
    VecF pi = VecF::load(p + i);
    VecF mi = VecF::load(m + i);
    VecF vi = VecF::load(v + i);
    VecF vmi = vi;
    if constexpr (kAmsgrad) vmi = VecF::load(vm + i);
    adamw_math<kAmsgrad>(pi, VecF::load(g + i), mi, vi, vmi, small, cv);
    pi.store(p + i);
    mi.store(m + i);
    vi.store(v + i);
    if constexpr (kAmsgrad) vmi.store(vm + i);
  }
#endif
  const AdamWCoeffs<float> cs = adamw_coeffs<float>(s, a, b);
  for (; i < n; ++i) {
    float vmi = kAmsgrad ? vm[i] : 0.0f;
    adamw_math<kAmsgrad>(p[i], g[i], m[i], v[i], vmi, small, cs);
    if constexpr (kAmsgrad) vm[i] = vmi;
  }
}

/// float -> bf16 rounding up with probability (dropped bits) / 2^16: unbiased in expectation.
/// Inf stays inf, NaN becomes the canonical NaN.
TRAINKIT_HOST_DEVICE inline bf16 bf16_round_stochastic(float x, std::uint32_t random) {
  const std::uint32_t bits = trainkit::detail::f32_to_u32(x);
  const std::uint32_t magnitude = bits & 0x7fffffffU;
  if (magnitude > 0x7f800000U) return bf16::from_bits(kBF16CanonicalNaN);
  if (magnitude == 0x7f800000U) return bf16::from_bits(static_cast<std::uint16_t>(bits >> 16));
  return bf16::from_bits(static_cast<std::uint16_t>((bits + (random & 0xffffU)) >> 16));
}

/// The CUDA element functor (f32 state); arity 6 without AMSGrad, 7 with.
struct AdamWF32Functor {
  const StepHeader* header;
  const AdamWRule::Scalars* scalars;
  const std::int32_t* segment_group;

  template <bool kAmsgrad>
  TRAINKIT_HOST_DEVICE void run(int t, float& p, float g, float& m, float& v, float& vm) const {
    const AdamWRule::Scalars s = scalars[segment_group[t]];
    adamw_math<kAmsgrad>(p, g, m, v, vm, s.lerp_small != 0,
                         adamw_coeffs<float>(s, header->grad_mult_a, header->grad_mult_b));
  }
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g, float* m,
                                       float* v) const {
    if (header->skip != 0) return;
    float unused = 0.0f;
    run<false>(t, p[i], g[i], m[i], v[i], unused);
  }
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g, float* m,
                                       float* v, float* vm) const {
    if (header->skip != 0) return;
    run<true>(t, p[i], g[i], m[i], v[i], vm[i]);
  }
};

/// The element functor with bf16 moments (host and device): f32 math, stochastic rounding of the
/// stored moments with Philox words of (seed, stream = step, counter = flat element index).
struct AdamWBf16Functor {
  const StepHeader* header;
  const AdamWRule::Scalars* scalars;
  const std::int32_t* segment_group;
  const std::int64_t* segment_begin;
  std::uint64_t seed;

  template <bool kAmsgrad>
  TRAINKIT_HOST_DEVICE void element(int group, std::int64_t flat, float& p, float g, bf16& m,
                                    bf16& v, bf16* vm) const {
    const AdamWRule::Scalars s = scalars[group];
    float mf = static_cast<float>(m);
    float vf = static_cast<float>(v);
    float vmf = kAmsgrad ? static_cast<float>(*vm) : 0.0f;
    adamw_math<kAmsgrad>(p, g, mf, vf, vmf, s.lerp_small != 0,
                         adamw_coeffs<float>(s, header->grad_mult_a, header->grad_mult_b));
    const U32x4 r = Philox4x32::generate(seed, static_cast<std::uint64_t>(header->step),
                                         static_cast<std::uint64_t>(flat));
    m = bf16_round_stochastic(mf, r.v[0]);
    v = bf16_round_stochastic(vf, r.v[1]);
    if constexpr (kAmsgrad) *vm = bf16_round_stochastic(vmf, r.v[2]);
  }
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g, bf16* m,
                                       bf16* v) const {
    if (header->skip != 0) return;
    element<false>(segment_group[t], segment_begin[t] + i, p[i], g[i], m[i], v[i], nullptr);
  }
  TRAINKIT_HOST_DEVICE void operator()(int t, std::int64_t i, float* p, const float* g, bf16* m,
                                       bf16* v, bf16* vm) const {
    if (header->skip != 0) return;
    element<true>(segment_group[t], segment_begin[t] + i, p[i], g[i], m[i], v[i], vm + i);
  }
};

}  // namespace detail

/// torch.optim.AdamW over a ParamArena: `optim::AdamW opt(arena, {.lr = 3e-4, .weight_decay =
/// 0.1}, {optim::no_weight_decay({"*.bias", "*ln*"})});` then `opt.step(exec)` or
/// `opt.step(exec, scaler)` each iteration. The state (exp_avg, exp_avg_sq, max_exp_avg_sq) is
/// kept in the arena's named state buffers (f32), or in bf16 buffers of the optimizer with
/// bf16_state. Throws for invalid hyper-parameters (as torch.optim does) or an unfinalized arena.
template <Space S = Space::kHost>
class AdamW : public FusedOptimizer<AdamW<S>, S, detail::AdamWRule> {
  using Base = FusedOptimizer<AdamW<S>, S, detail::AdamWRule>;
  friend Base;

 public:
  explicit AdamW(nn::ParamArena<S>& arena, AdamWOptions options = {},
                 std::vector<GroupRule> groups = {})
      : Base(arena, hyper_of(validated(options)), std::move(groups), /*merge_segments=*/true),
        options_(options) {
    const std::int64_t n = arena.buffer_numel();
    if (options_.bf16_state) {
      m16_ = zeroed_bf16(n);
      v16_ = zeroed_bf16(n);
      if (options_.amsgrad) vm16_ = zeroed_bf16(n);
      std::vector<std::int64_t> begins;
      for (const detail::Segment& s : this->segments_) begins.push_back(s.begin);
      segment_begin_ = Tensor<std::int64_t, S>(Shape{static_cast<std::int64_t>(begins.size())});
      copy_bytes(segment_begin_.data(), S, begins.data(), Space::kHost,
                 begins.size() * sizeof(std::int64_t));
    } else {
      m_ = this->arena_state("exp_avg");
      v_ = this->arena_state("exp_avg_sq");
      if (options_.amsgrad) vm_ = this->arena_state("max_exp_avg_sq");
    }
    if constexpr (S == Space::kDevice) build_lists();
  }

  const AdamWOptions& options() const noexcept { return options_; }

 private:
  bool needs_grad_norm() const noexcept { return false; }

  static AdamWOptions validated(const AdamWOptions& o) {
    TRAINKIT_CHECK(o.lr >= 0.0, "optim::AdamW: invalid learning rate ", o.lr);
    TRAINKIT_CHECK(o.eps >= 0.0, "optim::AdamW: invalid epsilon ", o.eps);
    TRAINKIT_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "optim::AdamW: invalid beta1 ", o.beta1);
    TRAINKIT_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "optim::AdamW: invalid beta2 ", o.beta2);
    TRAINKIT_CHECK(o.weight_decay >= 0.0, "optim::AdamW: invalid weight_decay ", o.weight_decay);
    return o;
  }
  static detail::AdamWRule::Hyper hyper_of(const AdamWOptions& o) {
    return {o.lr, o.weight_decay, o.beta1, o.beta2, o.eps};
  }
  Tensor<bf16, S> zeroed_bf16(std::int64_t n) {
    Tensor<bf16, S> t(Shape{n});
    zero_bytes(t.data(), S, t.bytes());
    return t;
  }

  void build_lists() {
    float* p = this->arena_->params_data();
    const float* g = this->arena_->grads_data();
    for (const detail::Segment& s : this->segments_) {
      const std::int64_t n = s.end - s.begin;
      const std::int64_t o = s.begin;
      if (options_.bf16_state) {
        if (options_.amsgrad)
          list16_ams_.add(n, p + o, g + o, m16_.data() + o, v16_.data() + o, vm16_.data() + o);
        else list16_.add(n, p + o, g + o, m16_.data() + o, v16_.data() + o);
      } else if (options_.amsgrad) {
        list_ams_.add(n, p + o, g + o, m_ + o, v_ + o, vm_ + o);
      } else {
        list_.add(n, p + o, g + o, m_ + o, v_ + o);
      }
    }
  }

  // Called by FusedOptimizer::step after the prologue.
  template <class E>
  void launch_update(const E& exec) {
    if constexpr (exec::is_host_executor_v<E>) {
      const detail::StepHeader& h = this->host_header();
      if (h.skip != 0) return;
      float* p = this->arena_->params_data();
      const float* g = this->arena_->grads_data();
      const float a = h.grad_mult_a;
      const float b = h.grad_mult_b;
      if (options_.bf16_state) {
        const detail::AdamWBf16Functor f{this->header_.data(), this->scalars_.data(), nullptr,
                                         nullptr, options_.seed};
        bf16* m = m16_.data();
        bf16* v = v16_.data();
        bf16* vm = vm16_.data();
        const bool ams = options_.amsgrad;
        detail::for_each_segment_range(
            exec, this->segments_, this->arena_->buffer_numel(),
            [&](const detail::Segment& s, std::int64_t begin, std::int64_t end) {
              for (std::int64_t i = begin; i < end; ++i) {
                if (ams) f.template element<true>(s.group, i, p[i], g[i], m[i], v[i], vm + i);
                else f.template element<false>(s.group, i, p[i], g[i], m[i], v[i], nullptr);
              }
            });
        return;
      }
      float* m = m_;
      float* v = v_;
      float* vm = vm_;
      const bool ams = options_.amsgrad;
      detail::for_each_segment_range(
          exec, this->segments_, this->arena_->buffer_numel(),
          [&](const detail::Segment& s, std::int64_t begin, std::int64_t end) {
            const auto& sc = this->host_scalars(s.group);
            if (ams)
              detail::adamw_host_range<true>(p + begin, g + begin, m + begin, v + begin, vm + begin,
                                             end - begin, sc, a, b);
            else
              detail::adamw_host_range<false>(p + begin, g + begin, m + begin, v + begin, nullptr,
                                              end - begin, sc, a, b);
          });
    } else {
      if (options_.bf16_state) {
        const detail::AdamWBf16Functor f{this->header_.data(), this->scalars_.data(),
                                         this->segment_group_.data(), segment_begin_.data(),
                                         options_.seed};
        if (options_.amsgrad) exec::multi_tensor_apply(exec, list16_ams_, f);
        else exec::multi_tensor_apply(exec, list16_, f);
        return;
      }
      const detail::AdamWF32Functor f{this->header_.data(), this->scalars_.data(),
                                      this->segment_group_.data()};
      if (options_.amsgrad) exec::multi_tensor_apply(exec, list_ams_, f);
      else exec::multi_tensor_apply(exec, list_, f);
    }
  }

  std::vector<detail::StateBuffer> state_buffers() const {
    std::vector<detail::StateBuffer> out;
    if (options_.bf16_state) {
      out.push_back({"exp_avg", const_cast<bf16*>(m16_.data()), DType::kBF16});
      out.push_back({"exp_avg_sq", const_cast<bf16*>(v16_.data()), DType::kBF16});
      if (options_.amsgrad)
        out.push_back({"max_exp_avg_sq", const_cast<bf16*>(vm16_.data()), DType::kBF16});
    } else {
      out.push_back({"exp_avg", m_, DType::kF32});
      out.push_back({"exp_avg_sq", v_, DType::kF32});
      if (options_.amsgrad) out.push_back({"max_exp_avg_sq", vm_, DType::kF32});
    }
    return out;
  }
  void save_options(StateDict& sd) const {
    sd.set("optimizer", "AdamW");
    sd.set("beta1", options_.beta1);
    sd.set("beta2", options_.beta2);
    sd.set("eps", options_.eps);
    sd.set("amsgrad", options_.amsgrad);
    sd.set("bf16_state", options_.bf16_state);
  }
  void load_options(const StateDict& sd) {
    TRAINKIT_CHECK(sd.get_string("optimizer") == "AdamW",
                   "optim::AdamW::load_state_dict: the "
                   "state is from ",
                   sd.get_string("optimizer"));
    TRAINKIT_CHECK((sd.get_int("amsgrad") != 0) == options_.amsgrad &&
                       (sd.get_int("bf16_state") != 0) == options_.bf16_state,
                   "optim::AdamW::load_state_dict: amsgrad/bf16_state differ from this optimizer");
    options_.beta1 = sd.get_double("beta1");
    options_.beta2 = sd.get_double("beta2");
    options_.eps = sd.get_double("eps");
    for (auto& h : this->hyper_) {
      h.beta1 = options_.beta1;
      h.beta2 = options_.beta2;
      h.eps = options_.eps;
    }
  }

  AdamWOptions options_;
  float* m_ = nullptr;
  float* v_ = nullptr;
  float* vm_ = nullptr;
  Tensor<bf16, S> m16_, v16_, vm16_;
  Tensor<std::int64_t, S> segment_begin_;
  exec::TensorList<float, const float, float, float> list_;
  exec::TensorList<float, const float, float, float, float> list_ams_;
  exec::TensorList<float, const float, bf16, bf16> list16_;
  exec::TensorList<float, const float, bf16, bf16, bf16> list16_ams_;
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
