// SPDX-License-Identifier: MIT
// src/trainkit.cpp: the optional compiled part of trainkit (the trainkit::compiled CMake target,
// built when TRAINKIT_SEPARATE_COMPILATION is ON). It defines, once, the bodies that headers leave
// out under TRAINKIT_SEPARATE_COMPILATION=1 (see config.hpp) and the explicit instantiations that
// their `extern template` declarations promise. It must be compiled with the TRAINKIT_WITH_*
// values of the program it is linked into; the CMake target takes them from the backends it links.
#define TRAINKIT_BUILDING_COMPILED_LIBRARY 1
#ifndef TRAINKIT_SEPARATE_COMPILATION
#define TRAINKIT_SEPARATE_COMPILATION 1
#endif
#if !TRAINKIT_SEPARATE_COMPILATION
#error \
    "src/trainkit.cpp is the compiled part of trainkit: build it with TRAINKIT_SEPARATE_COMPILATION=1 (or leave the macro undefined)."
#endif

#include "trainkit/trainkit.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace blas::detail {
template void host_gemm_2d<float, float, float>(const exec::Host*, const GemmShape&,
                                                const OperandRef<float>&, const OperandRef<float>&,
                                                const GemmOutput<float>&, const GemmKernel&);
template void host_bias_grad<float, float>(const exec::Host*, const OperandRef<float>&,
                                           std::int64_t, std::int64_t, float*);
}  // namespace blas::detail
namespace nn {
template ParamId ParamArena<Space::kHost>::add(std::string, Shape, Init);
template void ParamArena<Space::kHost>::finalize();
template ParamId ParamArena<Space::kHost>::at(std::string_view) const;
template StateDict ParamArena<Space::kHost>::state_dict() const;
template void ParamArena<Space::kHost>::load_state_dict(const StateDict&);
template void ParamArena<Space::kHost>::initialize(std::uint64_t);
template void ParamArena<Space::kHost>::initialize(ParamId, const Init&, std::uint64_t);
template TensorView<float, 1, Space::kHost> ParamArena<Space::kHost>::add_state(std::string);
template TensorView<float, 1, Space::kHost> ParamArena<Space::kHost>::state(std::string_view);
template std::vector<std::string> ParamArena<Space::kHost>::state_names() const;
}  // namespace nn
namespace optim {
template FusedOptimizer<detail::AdamWRule, Space::kHost>::FusedOptimizer(
    nn::ParamArena<Space::kHost>&, AdamWOptions, std::vector<GroupRule>);
template void FusedOptimizer<detail::AdamWRule, Space::kHost>::state_dict_into(StateDict&) const;
template void FusedOptimizer<detail::AdamWRule, Space::kHost>::load_state_dict(const StateDict&);
template std::string FusedOptimizer<detail::AdamWRule, Space::kHost>::state_layout(
    const AdamWOptions&);
template void FusedOptimizer<detail::AdamWRule, Space::kHost>::allocate_states();
template std::vector<detail::StateBuffer>
FusedOptimizer<detail::AdamWRule, Space::kHost>::state_buffers() const;
template FusedOptimizer<detail::SGDRule, Space::kHost>::FusedOptimizer(
    nn::ParamArena<Space::kHost>&, SGDOptions, std::vector<GroupRule>);
template void FusedOptimizer<detail::SGDRule, Space::kHost>::state_dict_into(StateDict&) const;
template void FusedOptimizer<detail::SGDRule, Space::kHost>::load_state_dict(const StateDict&);
template std::string FusedOptimizer<detail::SGDRule, Space::kHost>::state_layout(const SGDOptions&);
template void FusedOptimizer<detail::SGDRule, Space::kHost>::allocate_states();
template std::vector<detail::StateBuffer>
FusedOptimizer<detail::SGDRule, Space::kHost>::state_buffers() const;
}  // namespace optim
TRAINKIT_NAMESPACE_END
