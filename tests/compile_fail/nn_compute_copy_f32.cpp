// Compile-fail test: ParamArena compute copies exist for bf16 and f16 only; asking for an f32
// one (the parameters themselves are f32) must be rejected with a message.
#include <trainkit/core/half.hpp>
#include <trainkit/nn/param_arena.hpp>

int main() {
  trainkit::nn::ParamArena<> arena;
  arena.add("w", trainkit::Shape{4});
  arena.finalize();
#if TRAINKIT_SHOULD_FAIL
  auto copy = arena.compute_copy<float>();
#else
  auto copy = arena.compute_copy<trainkit::bf16>();
#endif
  return copy.size(0) == 0;
}
