// SPDX-License-Identifier: MIT
// trainkit/amp/scaler_fwd.hpp: what a loss scaler is, as far as precision policies care. The
// policies (amp/policy.hpp) refuse `amp::Fp16` without a scaler at compile time; they need only
// this header's traits, not the scalers themselves, which live in optim/grad_scaler.hpp.
// A scaler type opts in by declaring `static constexpr bool scales_loss = true;`.
#pragma once

#include <type_traits>

#include "trainkit/config.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace amp {

/// The "no loss scaling" scaler: gradients are used as computed (scale 1). Right for f32, tf32
/// and bf16 (whose exponent range equals f32's); wrong for f16, whose gradients underflow.
struct NoScaler {
  static constexpr bool scales_loss = false;
  static constexpr bool dynamic = false;
};

/// True when S multiplies the loss by a scale before backward (and unscales the gradients after):
/// a type with `static constexpr bool scales_loss = true`. Unknown types count as "no".
template <class S, class = void>
struct is_loss_scaler : std::false_type {};
template <class S>
struct is_loss_scaler<S, std::void_t<decltype(S::scales_loss)>>
    : std::bool_constant<static_cast<bool>(S::scales_loss)> {};
template <class S>
inline constexpr bool is_loss_scaler_v = is_loss_scaler<std::remove_cvref_t<S>>::value;

/// True when S adapts its scale to overflows (PyTorch's GradScaler): `static constexpr bool
/// dynamic = true` besides `scales_loss`.
template <class S, class = void>
struct is_dynamic_loss_scaler : std::false_type {};
template <class S>
struct is_dynamic_loss_scaler<S, std::void_t<decltype(S::dynamic)>>
    : std::bool_constant<is_loss_scaler_v<S>&& static_cast<bool>(S::dynamic)> {};
template <class S>
inline constexpr bool is_dynamic_loss_scaler_v =
    is_dynamic_loss_scaler<std::remove_cvref_t<S>>::value;

/// A scaler type: NoScaler, or anything that declares `scales_loss` (GradScaler, a static scale).
template <class S>
concept Scaler = std::is_same_v<std::remove_cvref_t<S>, NoScaler> || is_loss_scaler_v<S>;

}  // namespace amp
TRAINKIT_NAMESPACE_END
