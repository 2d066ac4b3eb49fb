// Compile-fail test: an f32 optimizer fed f16 (or bf16) gradients must be rejected by the trait
// the optimizers check, with a message saying to accumulate gradients in f32.
#include <trainkit/amp/policy.hpp>
#include <trainkit/core/half.hpp>

int main() {
#if TRAINKIT_SHOULD_FAIL
  trainkit::amp::check_optimizer_grad<trainkit::f16>();
#else
  trainkit::amp::check_optimizer_grad<float>();
#endif
  return 0;
}
