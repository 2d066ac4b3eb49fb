// Device tests for optim/ and optim/grad_scaler.hpp: on exec::Cuda (device ParamArena, device
// scaler) SGD, AdamW (AMSGrad, bf16 state), LAMB, the fused unscale/check/norm pass, clipping and
// Ema give the host versions' results (within 1e-6 relative; the same f32 operations, FMA
// contraction aside), skipped steps (inf/NaN) leave device state bit-identical, and the scale
// sequence equals the host scaler's exactly. Needs a GPU (exits 77 without one).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/cuda/stream.hpp>
#include <trainkit/exec/cuda.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/ema.hpp>
#include <trainkit/optim/grad_norm.hpp>
#include <trainkit/optim/lamb.hpp>
#include <trainkit/optim/sgd.hpp>

namespace {

namespace tk = trainkit;
namespace optim = trainkit::optim;
namespace amp = trainkit::amp;
using HostArena = tk::nn::ParamArena<tk::Space::kHost>;
using DevArena = tk::nn::ParamArena<tk::Space::kDevice>;

// A model with tensors of awkward sizes: several CUDA chunks, tails, a 1-element tensor.
template <tk::Space S>
void build(tk::nn::ParamArena<S>& a) {
  a.add("emb.weight", tk::Shape{300, 257});
  a.add("h.0.ln.weight", tk::Shape{257});
  a.add("h.0.fc.bias", tk::Shape{1});
  a.add("h.0.fc.weight", tk::Shape{1000, 70});
  a.finalize();
}

float grad_value(int step, std::int64_t i) {
  return std::sin(0.013f * static_cast<float>(i) + 0.7f * static_cast<float>(step)) * 0.1f;
}

struct Pair {
  HostArena host;
  DevArena dev;
  Pair() {
    build(host);
    build(dev);
    for (const auto& p : host.infos())  // the parameters' elements; the padding stays zero
      for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
        host.params_data()[i] = std::cos(0.001f * static_cast<float>(i));
    dev.copy_params_from(host);
  }
  // Same gradients on both sides (times `scale`), with an inf/NaN at `bad` when >= 0.
  void set_grads(int step, float scale, std::int64_t bad = -1, float bad_value = 0.0f) {
    host.zero_grad();
    for (const auto& p : host.infos())
      for (std::int64_t i = 0; i < p.numel; ++i)
        host.grads_data()[p.offset + i] = grad_value(step, p.offset + i) * scale;
    if (bad >= 0) host.grads_data()[bad] = bad_value;
    host.copy_grads_to(dev);
  }
  // max |dev - host| / max |host| over the parameters.
  double param_error() const {
    HostArena back;
    build(back);
    back.copy_params_from(dev);
    double num = 0.0, den = 0.0;
    for (std::int64_t i = 0; i < host.buffer_numel(); ++i) {
      num = std::max(num, std::abs(double(back.params_data()[i]) - host.params_data()[i]));
      den = std::max(den, std::abs(double(host.params_data()[i])));
    }
    return num / den;
  }
};

// Max relative difference of two state dicts' tensors of the same name (f32 or bf16 as f32).
double state_error(const tk::StateDict& a, const tk::StateDict& b) {
  double worst = 0.0;
  for (const auto& [k, t] : a.tensors) {
    const tk::AnyTensor& u = b.tensor(k);
    REQUIRE(u.dtype() == t.dtype());
    const std::int64_t n = t.numel();
    double num = 0.0, den = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      double x = 0, y = 0;
      if (t.dtype() == tk::DType::kF32) {
        x = reinterpret_cast<const float*>(t.data())[i];
        y = reinterpret_cast<const float*>(u.data())[i];
      } else {
        x = static_cast<float>(reinterpret_cast<const tk::bf16*>(t.data())[i]);
        y = static_cast<float>(reinterpret_cast<const tk::bf16*>(u.data())[i]);
      }
      num = std::max(num, std::abs(x - y));
      den = std::max(den, std::abs(y));
    }
    worst = std::max(worst, den == 0.0 ? num : num / den);
  }
  return worst;
}

template <template <tk::Space> class Opt, class Options>
void compare_optimizer(const Options& options, double tol, bool bf16 = false) {
  const tk::cuda::Stream stream;
  const tk::exec::Cuda gpu(stream);
  const tk::exec::Host cpu(2);
  Pair pair;
  Opt<tk::Space::kHost> ho(pair.host, options, {optim::no_weight_decay({"*.bias", "*ln*"})});
  Opt<tk::Space::kDevice> dop(pair.dev, options, {optim::no_weight_decay({"*.bias", "*ln*"})});
  optim::DynamicScaler hs(cpu, {.init_scale = 1024.0, .growth_interval = 3});
  optim::DynamicScaler ds(gpu, {.init_scale = 1024.0, .growth_interval = 3});
  const std::int64_t bad = pair.host.info(pair.host.at("h.0.fc.weight")).offset + 17;
  for (int step = 1; step <= 12; ++step) {
    const bool inject = step == 5 || step == 9;
    pair.set_grads(step, hs.scale(), inject ? bad : -1,
                   step == 5 ? std::numeric_limits<float>::infinity()
                             : std::numeric_limits<float>::quiet_NaN());
    tk::StateDict before;
    if (inject) before = dop.state_dict();
    if (step % 4 == 0) {
      ho.step(cpu, hs, {.max_norm = 0.5});
      dop.step(gpu, ds, {.max_norm = 0.5});
    } else {
      ho.step(cpu, hs);
      dop.step(gpu, ds);
    }
    hs.update(cpu);
    ds.update(gpu);
    stream.synchronize();
    CHECK(ds.scale() == hs.scale());
    CHECK(ds.growth_tracker() == hs.growth_tracker());
    CHECK(dop.last_step_skipped() == inject);
    if (inject) {
      const tk::StateDict after = dop.state_dict();
      CHECK(state_error(after, before) == 0.0);
    }
    INFO("step " << step);
    CHECK(pair.param_error() <= tol);
  }
  CHECK(dop.step_count() == ho.step_count());
  const double se = state_error(dop.state_dict(), ho.state_dict());
  MESSAGE("device vs host: params " << pair.param_error() << ", state " << se);
  CHECK(se <= (bf16 ? 1e-2 : tol));
}

}  // namespace

TEST_CASE("CUDA SGD equals the host SGD (scaler, skip, folded clipping)") {
  compare_optimizer<optim::SGD>(
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}, 1e-6);
  compare_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true},
                                1e-6);
  compare_optimizer<optim::SGD>(optim::SGDOptions{.lr = 0.1}, 1e-6);
}

TEST_CASE("CUDA AdamW equals the host AdamW (AMSGrad, bf16 state)") {
  compare_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1}, 1e-6);
  compare_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-2, .amsgrad = true}, 1e-6);
  // bf16 moments: the same Philox words on both sides; only f32 rounding differences can flip a
  // stochastic rounding, so compare loosely.
  compare_optimizer<optim::AdamW>(optim::AdamWOptions{.lr = 1e-3, .bf16_state = true, .seed = 5},
                                  1e-4, true);
}

TEST_CASE("CUDA LAMB equals the host LAMB") {
  compare_optimizer<optim::LAMB>(optim::LAMBOptions{.lr = 2e-3, .weight_decay = 0.01}, 1e-6);
}

TEST_CASE("CUDA unscale_, grad_norm, clipping and Ema equal the host's") {
  const tk::cuda::Stream stream;
  const tk::exec::Cuda gpu(stream);
  const tk::exec::Host cpu(2);
  Pair pair;
  optim::DynamicScaler hs(cpu, {.init_scale = 256.0});
  optim::DynamicScaler ds(gpu, {.init_scale = 256.0});
  pair.set_grads(1, 256.0f);
  const float hn = hs.unscale_(cpu, pair.host).get();
  const float dn = ds.unscale_(gpu, pair.dev).get();
  CHECK(dn == doctest::Approx(hn).epsilon(1e-6));
  CHECK_FALSE(ds.found_inf());
  HostArena back;
  build(back);
  pair.dev.copy_grads_to(back);
  CHECK(std::memcmp(back.grads_data(), pair.host.grads_data(),
                    static_cast<std::size_t>(back.buffer_numel()) * sizeof(float)) == 0);
  const optim::GradNorm d1 = optim::clip_grad_norm_(gpu, pair.dev, 0.1);
  const optim::GradNorm h1 = optim::clip_grad_norm_(cpu, pair.host, 0.1);
  CHECK(d1.get() == doctest::Approx(h1.get()).epsilon(1e-6));
  CHECK(optim::grad_norm(gpu, pair.dev).get() == doctest::Approx(0.1).epsilon(1e-5));
  // Reproducible: the same device reduction twice gives the same bits.
  CHECK(optim::grad_norm(gpu, pair.dev).get() == optim::grad_norm(gpu, pair.dev).get());
  optim::clip_grad_value_(gpu, pair.dev, 1e-4);
  optim::clip_grad_value_(cpu, pair.host, 1e-4);
  stream.synchronize();  // copy_grads_to copies on the legacy stream
  pair.dev.copy_grads_to(back);
  double worst = 0.0;
  for (std::int64_t i = 0; i < back.buffer_numel(); ++i)
    worst = std::max(worst, std::abs(double(back.grads_data()[i]) - pair.host.grads_data()[i]));
  CHECK(worst <= 1e-6 * 1e-4);  // the clip coefficients may differ by an ulp (reduction order)
  optim::Ema<tk::Space::kHost> he(pair.host, {.decay = 0.9});
  optim::Ema<tk::Space::kDevice> de(pair.dev, {.decay = 0.9});
  for (int s = 0; s < 3; ++s) {
    he.update(cpu);
    de.update(gpu);
  }
  CHECK(state_error(de.state_dict(), he.state_dict()) <= 1e-6);  // FMA contraction on the GPU
}

TEST_CASE("CUDA: padding stays zero and 1/scale = inf follows PyTorch, as on the host") {
  const tk::cuda::Stream stream;
  const tk::exec::Cuda gpu(stream);
  const tk::exec::Host cpu(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  HostArena back;
  build(back);
  // The same bits, except that any NaN equals any NaN: 0 * inf is the x86 default NaN
  // (0xffc00000) on the host and the canonical NaN (0x7fffffff) on the GPU.
  auto same_bits = [&](const HostArena& host, const DevArena& dev) {
    stream.synchronize();
    dev.copy_grads_to(back);
    for (std::int64_t i = 0; i < back.buffer_numel(); ++i) {
      const float d = back.grads_data()[i], h = host.grads_data()[i];
      if (std::isnan(d) != std::isnan(h) ||
          (!std::isnan(d) && std::bit_cast<std::uint32_t>(d) != std::bit_cast<std::uint32_t>(h)))
        return false;
    }
    return true;
  };
  auto padding_zero = [&](const DevArena& dev) {
    stream.synchronize();
    dev.copy_grads_to(back);
    HostArena params;
    build(params);
    params.copy_params_from(dev);
    const auto& infos = back.infos();
    for (std::size_t p = 0; p < infos.size(); ++p) {
      const std::int64_t end = p + 1 < infos.size() ? infos[p + 1].offset : back.buffer_numel();
      for (std::int64_t i = infos[p].offset + infos[p].numel; i < end; ++i)
        if (back.grads_data()[i] != 0.0f || params.params_data()[i] != 0.0f) return false;
    }
    return true;
  };
  for (const double scale : {0.0, 1e-40, 1e-38}) {
    CAPTURE(scale);
    Pair pair;
    optim::DynamicScaler hs(cpu, {.growth_interval = 2});
    optim::DynamicScaler ds(gpu, {.growth_interval = 2});
    tk::StateDict sd = hs.state_dict();
    sd.set("scale", scale);
    hs.load_state_dict(sd);
    ds.load_state_dict(sd);
    pair.set_grads(1, 1.0f);
    pair.host.grads_data()[3] = 0.0f;  // unscaled to NaN when 1/scale is inf
    pair.host.copy_grads_to(pair.dev);
    const float hn = hs.unscale_(cpu, pair.host).get();
    const optim::GradNorm dnorm = ds.unscale_(gpu, pair.dev);
    const float dn = dnorm.get();
    CHECK(ds.found_inf() == hs.found_inf());
    CHECK_FALSE(ds.found_inf());
    CHECK((std::isnan(dn) == std::isnan(hn) && (std::isnan(dn) || dn == hn)));
    CHECK(same_bits(pair.host, pair.dev));
    CHECK(padding_zero(pair.dev));
    optim::clip_grad_norm_(gpu, pair.dev, 1.0, dnorm);  // by a NaN norm
    CHECK(padding_zero(pair.dev));
    ds.update(gpu);
    hs.update(cpu);
    CHECK(ds.scale() == hs.scale());
    CHECK(ds.growth_tracker() == hs.growth_tracker());
  }
  // A NaN gradient: clipping by the NaN norm and a step with folded clipping leave the padding.
  Pair pair;
  optim::AdamW<tk::Space::kDevice> opt(pair.dev, {.lr = 1e-2});
  pair.set_grads(2, 1.0f, pair.host.info(pair.host.at("h.0.ln.weight")).offset + 5, nan);
  optim::clip_grad_norm_(gpu, pair.dev, 0.5);
  CHECK(padding_zero(pair.dev));
  opt.step(gpu, {.max_norm = 0.5});
  CHECK(padding_zero(pair.dev));
  pair.set_grads(3, 1.0f, 7, inf);
  opt.step(gpu, {.max_norm = 0.5});
  CHECK(padding_zero(pair.dev));
}
