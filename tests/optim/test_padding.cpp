// The alignment padding of a ParamArena stays zero under every operation over the arena's
// buffers: gradient accumulation by a layer's backward, clip_grad_norm_ (with the norm a scaler
// measured or its own), clip_grad_value_, DynamicScaler / StaticScaler unscale_ and the checks
// of a step (also with 1/scale = inf), the fused SGD / AdamW (f32, AMSGrad, bf16 state) / LAMB
// steps (folded clipping included), Ema update / copy_to, compute-copy refreshes and zero_grad,
// with inf/NaN gradients injected, on random layouts. Afterwards a loop that overwrites the
// gradients without zero_grad measures a finite, exact norm again.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/ema.hpp>
#include <trainkit/optim/grad_norm.hpp>
#include <trainkit/optim/lamb.hpp>
#include <trainkit/optim/sgd.hpp>

namespace {

namespace tk = trainkit;
namespace nn = trainkit::nn;
namespace optim = trainkit::optim;
namespace amp = trainkit::amp;
using Arena = nn::ParamArena<tk::Space::kHost>;

tk::exec::Host& pool() {
  static tk::exec::Host host(2);
  return host;
}

// "p<k>" (built by append: GCC 12 warns falsely on "p" + std::to_string(k)).
std::string param_name(int k) {
  std::string name = "p";
  name += std::to_string(k);
  return name;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Number of padding elements of `data` (elements of `bytes` each) that are not all-zero bits.
std::int64_t dirty_padding(const Arena& arena, const void* data, std::size_t bytes) {
  const auto* base = static_cast<const unsigned char*>(data);
  const auto& infos = arena.infos();
  std::int64_t dirty = 0;
  for (std::size_t p = 0; p < infos.size(); ++p) {
    const std::int64_t end = p + 1 < infos.size() ? infos[p + 1].offset : arena.buffer_numel();
    for (std::int64_t i = infos[p].offset + infos[p].numel; i < end; ++i)
      for (std::size_t b = 0; b < bytes; ++b)
        if (base[static_cast<std::size_t>(i) * bytes + b] != 0) {
          ++dirty;
          break;
        }
  }
  return dirty;
}

// Every buffer with the arena's layout: parameters, gradients, states, compute copy, EMA.
void check_padding(Arena& arena, const optim::Ema<>& ema, const char* after) {
  INFO("after " << std::string(after));
  CHECK(dirty_padding(arena, arena.grads_data(), sizeof(float)) == 0);
  CHECK(dirty_padding(arena, arena.params_data(), sizeof(float)) == 0);
  for (const std::string& s : arena.state_names())
    CHECK(dirty_padding(arena, arena.state(s).data(), sizeof(float)) == 0);
  if (arena.has_compute_copy<tk::bf16>())
    CHECK(dirty_padding(arena, arena.compute_copy<tk::bf16>().data(), sizeof(tk::bf16)) == 0);
  CHECK(dirty_padding(arena, ema.data(), sizeof(float)) == 0);
}

enum class Kind { kSGD, kAdamW, kAdamWBf16, kLAMB };

// The optimizer of a configuration behind one interface.
struct AnyOpt {
  std::unique_ptr<optim::SGD<>> sgd;
  std::unique_ptr<optim::AdamW<>> adamw;
  std::unique_ptr<optim::LAMB<>> lamb;
  template <class... A>
  void step(A&&... a) {
    if (sgd) sgd->step(pool(), a...);
    if (adamw) adamw->step(pool(), a...);
    if (lamb) lamb->step(pool(), a...);
  }
};

AnyOpt make_opt(Kind kind, Arena& arena, tk::PhiloxStream& rng) {
  AnyOpt o;
  const bool flag = rng.next_u32() % 2 == 0;
  switch (kind) {
    case Kind::kSGD:
      o.sgd = std::make_unique<optim::SGD<>>(
          arena,
          optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = flag});
      break;
    case Kind::kAdamW:
      o.adamw = std::make_unique<optim::AdamW<>>(
          arena, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = flag});
      break;
    case Kind::kAdamWBf16:
      o.adamw = std::make_unique<optim::AdamW<>>(
          arena, optim::AdamWOptions{.lr = 1e-2, .amsgrad = flag, .bf16_state = true, .seed = 5});
      break;
    case Kind::kLAMB:
      // eps = 0: an untouched padding element would be 0 / 0.
      o.lamb = std::make_unique<optim::LAMB<>>(
          arena, optim::LAMBOptions{.lr = 1e-2, .eps = flag ? 0.0 : 1e-6, .max_grad_norm = 1.0});
      break;
  }
  return o;
}

// One configuration: a random layout (a Linear layer plus odd-sized parameters), an optimizer,
// a loss scale (normal, or so small that 1/scale is inf) and a sequence of the arena-wide
// operations over steps with inf/NaN gradients injected.
void run_config(std::uint64_t seed, Kind kind) {
  tk::PhiloxStream rng(seed, 11);
  CAPTURE(seed);
  CAPTURE(static_cast<int>(kind));
  Arena arena;
  const std::int64_t in = 2 + rng.next_u32() % 9, out = 1 + rng.next_u32() % 7;
  nn::Linear<> fc(arena, "fc", {.in_features = in, .out_features = out});
  const int extra = 1 + static_cast<int>(rng.next_u32() % 5);
  for (int k = 0; k < extra; ++k) {
    const std::uint32_t r = rng.next_u32() % 5;
    const std::int64_t n = r == 0 ? 16 * (1 + rng.next_u32() % 3) : 1 + rng.next_u32() % 70;
    arena.add(param_name(k), tk::Shape{n});
  }
  arena.finalize();
  REQUIRE(arena.num_parameters() < arena.buffer_numel());  // there is padding to watch
  for (const auto& info : arena.infos())
    for (std::int64_t i = 0; i < info.numel; ++i)
      arena.params_data()[info.offset + i] = 2.0f * rng.next_uniform() - 1.0f;

  AnyOpt opt = make_opt(kind, arena, rng);
  optim::Ema<> ema(arena, {.decay = 0.9});
  const bool tiny_scale = rng.next_u32() % 2 == 0;
  optim::DynamicScaler scaler(pool(), {.init_scale = 1024.0});
  if (tiny_scale) {  // 1 / scale overflows to inf; refused as init_scale, so from a checkpoint
    tk::StateDict sd = scaler.state_dict();
    sd.set("scale", 1e-40);
    scaler.load_state_dict(sd);
  }
  optim::StaticScaler fixed(pool(), 8.0);
  const bool zero_grad_each_step = rng.next_u32() % 3 == 0;

  const std::int64_t batch = 3;
  std::vector<float> x(static_cast<std::size_t>(batch * in)),
      dy(static_cast<std::size_t>(batch * out));
  const std::uint32_t first_op = rng.next_u32() % 5;
  for (int s = 0; s < 10; ++s) {
    CAPTURE(s);
    if (zero_grad_each_step) {
      arena.zero_grad();
      check_padding(arena, ema, "zero_grad");
    }
    // A micro-batch's backward accumulates into the gradients (inf/NaN inputs on some steps).
    for (auto& v : x) v = 2.0f * rng.next_uniform() - 1.0f;
    for (auto& v : dy) v = 2.0f * rng.next_uniform() - 1.0f;
    if (s % 3 == 1) x[rng.next_u32() % x.size()] = (s % 2 == 0) ? kInf : kNaN;
    fc.backward(pool(), tk::HostView<const float, 2>(x.data(), tk::Extents<2>{{batch, in}}),
                tk::HostView<const float, 2>(dy.data(), tk::Extents<2>{{batch, out}}),
                tk::HostView<float, 2>());
    for (const auto& info : arena.infos())
      for (std::int64_t i = 0; i < info.numel; ++i)
        arena.grads_data()[info.offset + i] += 0.1f * (2.0f * rng.next_uniform() - 1.0f);
    if (s % 4 == 2) {
      const auto& info = arena.infos()[rng.next_u32() % arena.size()];
      arena.grads_data()[info.offset + rng.next_u32() % info.numel] = s % 8 == 2 ? kNaN : -kInf;
    }
    check_padding(arena, ema, "a layer's backward");

    switch ((first_op + static_cast<std::uint32_t>(s)) % 5) {
      case 0:
        optim::clip_grad_norm_(pool(), arena, 0.5);
        check_padding(arena, ema, "clip_grad_norm_");
        opt.step();
        check_padding(arena, ema, "a step");
        break;
      case 1: {
        const optim::GradNorm norm = scaler.unscale_(pool(), arena);
        check_padding(arena, ema, "DynamicScaler::unscale_");
        optim::clip_grad_norm_(pool(), arena, 1.0, norm);
        check_padding(arena, ema, "clip_grad_norm_ by the scaler's norm");
        opt.step(scaler);
        check_padding(arena, ema, "a step after unscale_");
        scaler.update(pool());
        break;
      }
      case 2:
        opt.step(scaler, optim::ClipGradNorm{0.5});
        check_padding(arena, ema, "a step with a scaler and folded clipping");
        scaler.update(pool());
        break;
      case 3:
        optim::clip_grad_value_(pool(), arena, 0.05);
        check_padding(arena, ema, "clip_grad_value_");
        opt.step(optim::ClipGradNorm{0.5});
        check_padding(arena, ema, "a step with folded clipping");
        break;
      default:
        fixed.unscale_(pool(), arena);
        check_padding(arena, ema, "StaticScaler::unscale_");
        opt.step(fixed);
        check_padding(arena, ema, "a step with a static scaler");
        fixed.update(pool());
        break;
    }
    ema.update(pool());
    check_padding(arena, ema, "Ema::update");
    arena.refresh_compute_copy<tk::bf16>(pool());
    check_padding(arena, ema, "refresh_compute_copy");
  }
  ema.copy_to(pool(), arena);
  check_padding(arena, ema, "Ema::copy_to");

  // A loop that writes its gradients without zero_grad: the norm is that of the new values.
  double sum = 0.0;
  for (const auto& info : arena.infos())
    for (std::int64_t i = 0; i < info.numel; ++i) {
      const float g = 2.0f * rng.next_uniform() - 1.0f;
      arena.grads_data()[info.offset + i] = g;
      sum += double(g) * g;
    }
  const float norm = optim::grad_norm(pool(), arena).get();
  CHECK(std::isfinite(norm));
  CHECK(norm == doctest::Approx(std::sqrt(sum)).epsilon(1e-6));
  optim::DynamicScaler clean(pool(), {.init_scale = 4.0});
  clean.unscale_(pool(), arena);
  CHECK_FALSE(clean.found_inf());
  check_padding(arena, ema, "a clean unscale_");
}

}  // namespace

TEST_CASE("ParamArena padding stays zero under every arena-wide operation, inf/NaN included") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed)
    for (const Kind kind : {Kind::kSGD, Kind::kAdamW, Kind::kAdamWBf16, Kind::kLAMB})
      run_config(seed * 977 + static_cast<std::uint64_t>(kind), kind);
}

TEST_CASE("PaddingMask tells every parameter element from the padding") {
  tk::PhiloxStream rng(4242, 1);
  for (int c = 0; c < 20; ++c) {
    Arena arena;
    const int n = 1 + static_cast<int>(rng.next_u32() % 6);
    for (int k = 0; k < n; ++k)
      arena.add(param_name(k), tk::Shape{static_cast<std::int64_t>(rng.next_u32() % 50)});
    arena.finalize();
    const nn::PaddingMask mask = arena.padding_mask();
    std::vector<char> real(static_cast<std::size_t>(arena.buffer_numel()), 0);
    for (const auto& info : arena.infos())
      for (std::int64_t i = 0; i < info.numel; ++i) real[std::size_t(info.offset + i)] = 1;
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
      wrong += mask.real(i) != (real[std::size_t(i)] != 0) ? 1 : 0;
    CHECK(wrong == 0);
  }
  CHECK(nn::PaddingMask{}.real(12345));  // no table: everything counts
}
