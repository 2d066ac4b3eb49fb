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
                                                const GemmOutput<float>&, GemmMicroKernel);
template void host_bias_grad<float, float>(const exec::Host*, const OperandRef<float>&,
                                           std::int64_t, std::int64_t, float*);
}  // namespace blas::detail
TRAINKIT_NAMESPACE_END
