// Compile-fail test: a layer run under amp::Bf16 with f32 activation views must be rejected: the
// views must hold the policy's activation type (bf16 here).
#include <trainkit/amp/policy.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>

namespace tk = trainkit;

int main() {
  tk::nn::ParamArena<> arena;
  tk::nn::Linear fc(arena, "fc", {.in_features = 4, .out_features = 2});
  arena.finalize();
  tk::exec::Host host(1);
#if TRAINKIT_SHOULD_FAIL
  float x[8] = {}, y[4] = {};
  fc.forward<tk::amp::Bf16>(host, tk::make_view(x, {2, 4}), tk::make_view(y, {2, 2}));
#else
  tk::bf16 x[8] = {}, y[4] = {};
  arena.refresh_compute_copy<tk::bf16>(host);
  fc.forward<tk::amp::Bf16>(host, tk::make_view(x, {2, 4}), tk::make_view(y, {2, 2}));
#endif
  return 0;
}
