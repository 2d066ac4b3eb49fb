// SPDX-License-Identifier: MIT
// trainkit/optim/param_groups.hpp: parameter groups chosen by name pattern, PyTorch's
// `param_groups` without building lists by hand: `{.match = {"*.bias", "*ln*"}, .weight_decay = 0}`
// puts every bias and LayerNorm parameter into a group without weight decay. Also `LrGroups`,
// the per-group learning rates that optimizers read and LR schedules write (group["lr"]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace optim {

/// At most this many parameter groups per optimizer (the default group included): their
/// hyper-parameters travel as a kernel argument.
inline constexpr int kMaxParamGroups = 16;

/// Shell-style match of a whole parameter name: `*` matches any run of characters (dots
/// included), `?` any single character, everything else itself. "*.bias" matches
/// "blocks.0.attn.bias"; "*ln*" matches "blocks.3.ln_1.weight".
inline bool glob_match(std::string_view pattern, std::string_view name) noexcept {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

/// One parameter group: the parameters whose names match any pattern of `match`, with the
/// options given here overriding the optimizer's. A parameter joins the first rule it matches;
/// parameters matching none form the default group (group 0); rule i is group i + 1.
struct GroupRule {
  std::vector<std::string> match;      ///< glob patterns over parameter names (glob_match)
  std::optional<double> lr;            ///< this group's learning rate
  std::optional<double> weight_decay;  ///< this group's weight decay
};

/// The usual rule: no weight decay for the parameters matching `patterns`, e.g.
/// `no_weight_decay({"*.bias", "*ln*"})` (biases and LayerNorm weights, as in GPT-2 recipes).
inline GroupRule no_weight_decay(std::vector<std::string> patterns) {
  return GroupRule{std::move(patterns), std::nullopt, 0.0};
}

/// Group index (0 = default, i + 1 = rules[i]) of each name, first matching rule wins. Throws
/// when there are more than kMaxParamGroups groups.
inline std::vector<int> assign_groups(const std::vector<std::string>& names,
                                      const std::vector<GroupRule>& rules) {
  TRAINKIT_CHECK(rules.size() + 1 <= static_cast<std::size_t>(kMaxParamGroups),
                 "optim: ", rules.size(), " group rules give ", rules.size() + 1,
                 " parameter groups; at most ", kMaxParamGroups, " are supported");
  std::vector<int> group(names.size(), 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t r = 0; r < rules.size() && group[i] == 0; ++r)
      for (const std::string& pattern : rules[r].match)
        if (glob_match(pattern, names[i])) {
          group[i] = static_cast<int>(r) + 1;
          break;
        }
  }
  return group;
}

/// The learning rate of every parameter group, PyTorch's `param_groups[g]["lr"]` and
/// `["initial_lr"]`. Optimizers own one and read it at each step (no device copy: it travels as
/// a kernel argument); LR schedules hold a reference and write it, exactly like PyTorch's.
struct LrGroups {
  std::vector<double> lr;
  /// Set by the first schedule attached (PyTorch's `setdefault("initial_lr", lr)`).
  std::vector<double> initial_lr;

  std::size_t size() const noexcept { return lr.size(); }
  /// Sets every group's learning rate.
  void set_all(double value) {
    for (double& v : lr) v = value;
  }
};

}  // namespace optim
TRAINKIT_NAMESPACE_END
