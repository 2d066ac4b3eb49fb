// SPDX-License-Identifier: MIT
// trainkit/amp/policy.hpp: precision policies, PyTorch's autocast decided at compile time. A
// policy (Fp32, Tf32, Bf16, Fp16) maps each op class to the type it computes in, following the
// autocast lists (matmuls and attention in the low type; norms, softmax, losses and reductions in
// f32). Master weights, their gradients and optimizer state stay f32; the low-precision weight
// copy is refreshed once per step (ParamArena::refresh_compute_copy). Misuse fails to compile.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace amp {

/// The op classes a policy assigns compute types to (PyTorch autocast: `linear`, `matmul`, `bmm`
/// are lower-precision ops; `layer_norm`, `softmax`, `log_softmax`, `cross_entropy`, `sum` are
/// f32 ops; unlisted element-wise ops run in their input type).
enum class OpClass : std::uint8_t {
  kMatmul,       ///< Linear, gemm: operands in the low type, f32 accumulation.
  kAttention,    ///< Q K^T and P V of attention: like matmul.
  kElementwise,  ///< GELU, ReLU, dropout, residual add: math in f32, stored in the activation type.
  kReduction,    ///< sums, norms of gradients: f32.
  kNorm,         ///< LayerNorm statistics and normalisation: f32.
  kSoftmax,      ///< softmax (also inside attention): f32.
  kLoss,         ///< cross-entropy and other losses: f32.
};

namespace detail {
/// The members every precision policy has: `low_type`, the type of matmul operands and of
/// activations between layers; `gemm_compute`; whether a loss scaler is required; the scaler a
/// Precision gets when it names none. Each policy adds its `name` and `tolerance`.
template <class Low, blas::ComputeType Gemm, bool RequiresLossScaler>
struct PolicyBase {
  using low_type = Low;
  static constexpr blas::ComputeType gemm_compute = Gemm;
  static constexpr bool requires_loss_scaler = RequiresLossScaler;
  using default_scaler = NoScaler;
};
}  // namespace detail

// Each policy below is then its name and tolerance (four lines of the same shape each).
/// Full f32 everywhere (the reference). Matmuls use full f32 products.
struct Fp32 : detail::PolicyBase<float, blas::ComputeType::kF32, false> {
  static constexpr const char* name = "fp32";
  /// ||step - f32 step|| / ||f32 step|| a small MLP step may reach (tests hold policies to it).
  static constexpr double tolerance = 1e-5;
};

/// f32 storage, matmuls on tensor cores in TF32 (10-bit mantissa inputs, f32 accumulate), like
/// `torch.backends.cuda.matmul.allow_tf32 = True`. On the CPU, TF32 gemms compute in full f32.
struct Tf32 : detail::PolicyBase<float, blas::ComputeType::kTf32, false> {
  static constexpr const char* name = "tf32";
  static constexpr double tolerance = 5e-3;
};

/// bfloat16 matmuls and activations, f32 norms/softmax/losses/reductions and master weights.
/// bf16 has f32's exponent range, so no loss scaler is needed (autocast on CPU defaults to it).
struct Bf16 : detail::PolicyBase<bf16, blas::ComputeType::kF32, false> {
  static constexpr const char* name = "bf16";
  static constexpr double tolerance = 2e-2;
};

/// IEEE f16 matmuls and activations (autocast's CUDA default). f16 gradients below 6e-8
/// underflow to zero, so this policy must be paired with a loss scaler (PyTorch's GradScaler).
// default_scaler stays NoScaler, deliberately: Precision<Fp16> must name its scaler.
struct Fp16 : detail::PolicyBase<f16, blas::ComputeType::kF32, true> {
  static constexpr const char* name = "fp16";
  static constexpr double tolerance = 2e-3;
};

/// A precision policy: one of the four above or a user type with the same members.
template <class P>
concept Policy = requires {
  typename P::low_type;
  typename P::default_scaler;
  { P::gemm_compute } -> std::convertible_to<blas::ComputeType>;
  { P::requires_loss_scaler } -> std::convertible_to<bool>;
  { P::tolerance } -> std::convertible_to<double>;
};

/// Master weights, their gradients and optimizer state: f32 under every policy.
using master_t = float;

/// The type op class C computes in under policy P: the low type for matmul and attention
/// operands and for element-wise ops (which run in their input type, i.e. the activations'),
/// f32 for reductions, norms, softmax and losses.
template <Policy P, OpClass C>
using compute_t = std::conditional_t<C == OpClass::kMatmul || C == OpClass::kAttention ||
                                         C == OpClass::kElementwise,
                                     typename P::low_type, float>;

/// The type activations (layer inputs and outputs, and their gradients) are stored in under P.
template <Policy P>
using activation_t = typename P::low_type;

/// True when P keeps a low-precision copy of the weights (bf16/f16) next to the f32 masters.
template <Policy P>
inline constexpr bool uses_compute_copy_v = !std::is_same_v<typename P::low_type, float>;

/// True when T is the activation type of P (used by layers to reject views of the wrong type).
template <Policy P, class T>
inline constexpr bool is_activation_type_v = std::is_same_v<std::remove_cv_t<T>, activation_t<P>>;

/// A policy together with its loss scaler: what a training step is templated on. It fails to
/// compile for misuse: `Precision<Fp16>` (no scaler) and non-scaler types.
template <Policy P, class S = typename P::default_scaler>
struct Precision {
  static_assert(Scaler<S>,
                "trainkit::amp::Precision<P, S>: S is not a loss scaler; "
                "use amp::NoScaler or a scaler type declaring `static constexpr bool scales_loss` "
                "(optim::GradScaler)");
  static_assert(!P::requires_loss_scaler || is_loss_scaler_v<S>,
                "trainkit::amp::Fp16 requires a loss scaler: "
                "f16 gradients below 6e-8 flush to zero. "
                "Use amp::Precision<amp::Fp16, optim::GradScaler> (dynamic loss scaling), "
                "or amp::Bf16, which needs none");
  using policy = P;
  using scaler = S;
  template <OpClass C>
  using compute = compute_t<P, C>;
  using activation = activation_t<P>;
};

/// True when an optimizer whose state and master weights are `Master` may consume gradients of
/// type `Grad`: only when the gradient is at least as precise (f32 into f32).
template <class Grad, class Master = master_t>
inline constexpr bool grad_compatible_v =
    std::is_same_v<std::remove_cv_t<Grad>, std::remove_cv_t<Master>> ||
    (std::is_same_v<std::remove_cv_t<Grad>, double> &&
     std::is_same_v<std::remove_cv_t<Master>, float>);

/// Compile-time check optimizers call on their gradient element type (`check_optimizer_grad<G>()`).
template <class Grad, class Master = master_t>
constexpr void check_optimizer_grad() {
  static_assert(grad_compatible_v<Grad, Master>,
                "trainkit::amp: an f32 optimizer needs f32 gradients. "
                "f16/bf16 gradients lose small updates and overflow silently; "
                "accumulate backward into the ParamArena's f32 grad buffer (trainkit layers do) "
                "or cast the gradients to f32 "
                "(unscaling them first under amp::Fp16)");
}

/// Calls `f.template operator()<P>()` (e.g. a lambda `[&]<class P>() { ... }`) with the policy
/// named `name` — "fp32", "tf32", "bf16" or "fp16", as a --precision flag spells them — and
/// returns its result: one run-time choice, then everything compiled for that policy. Throws
/// naming the four choices for any other name.
template <class F>
decltype(auto) visit_policy(std::string_view name, F&& f) {
  if (name == "fp32") return f.template operator()<Fp32>();
  if (name == "tf32") return f.template operator()<Tf32>();
  if (name == "bf16") return f.template operator()<Bf16>();
  TRAINKIT_CHECK(name == "fp16", "precision '", ::trainkit::detail::printable_bytes(name),
                 "' is not fp32, tf32, bf16 or fp16");
  return f.template operator()<Fp16>();
}

}  // namespace amp
TRAINKIT_NAMESPACE_END
