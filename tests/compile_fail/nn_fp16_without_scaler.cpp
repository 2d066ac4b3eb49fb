// Compile-fail test: the amp::Fp16 policy without a loss scaler must be rejected (f16 gradients
// underflow), with a message naming the fix (optim::GradScaler, or amp::Bf16).
#include <trainkit/amp/policy.hpp>

namespace amp = trainkit::amp;

struct Scaler {
  static constexpr bool scales_loss = true;
};

#if TRAINKIT_SHOULD_FAIL
amp::Precision<amp::Fp16> precision;
#else
amp::Precision<amp::Fp16, Scaler> precision;
amp::Precision<amp::Bf16> bf16_needs_none;
#endif

int main() { return 0; }
