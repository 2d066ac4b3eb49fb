// SPDX-License-Identifier: MIT
// trainkit/config.hpp: capability tiers and execution-space macros, decided here and nowhere else.
// Each TRAINKIT_WITH_* macro is 0 or 1 and travels with the matching link flag (the CMake/Meson
// target sets both), so a plain `g++ -I single_include` build is always the CPU tier and never
// needs -lcudart by accident. Test with `#if TRAINKIT_WITH_X`, never `#ifdef`.
#pragma once

#include "trainkit/version.hpp"

// ---- Tier (c): a CUDA compiler is compiling this TU: kernels can be defined and launched. ------
#if defined(__CUDACC__)
#define TRAINKIT_CUDA_COMPILER 1
#else
#define TRAINKIT_CUDA_COMPILER 0
#endif

// ---- Tier (b): host code may call the CUDA runtime (the program links cudart). -----------------
// nvcc links cudart by default, so a .cu TU defaults to 1; for host compilers the build sets it.
#ifndef TRAINKIT_WITH_CUDA
#define TRAINKIT_WITH_CUDA TRAINKIT_CUDA_COMPILER
#endif
#ifndef TRAINKIT_WITH_CUBLASLT
#define TRAINKIT_WITH_CUBLASLT 0
#endif
#ifndef TRAINKIT_WITH_NCCL
#define TRAINKIT_WITH_NCCL 0
#endif
#ifndef TRAINKIT_WITH_MPI
#define TRAINKIT_WITH_MPI 0
#endif
#ifndef TRAINKIT_WITH_CBLAS
#define TRAINKIT_WITH_CBLAS 0
#endif
#ifndef TRAINKIT_WITH_OPENMP
#define TRAINKIT_WITH_OPENMP 0
#endif

#if TRAINKIT_WITH_CUDA
#if !__has_include(<cuda_runtime_api.h>)
#error \
    "TRAINKIT_WITH_CUDA=1 but <cuda_runtime_api.h> is not on the include path: add the CUDA toolkit's include directory (CMake: link the trainkit::cuda target), or build with -DTRAINKIT_WITH_CUDA=0 for the CPU tier."
#endif
#endif
#if TRAINKIT_WITH_CUBLASLT
#if !TRAINKIT_WITH_CUDA
#error "TRAINKIT_WITH_CUBLASLT=1 needs TRAINKIT_WITH_CUDA=1 (cuBLASLt is part of the CUDA toolkit)."
#endif
#if !__has_include(<cublasLt.h>)
#error \
    "TRAINKIT_WITH_CUBLASLT=1 but <cublasLt.h> is not on the include path: install the CUDA toolkit's cuBLAS headers or build with -DTRAINKIT_WITH_CUBLASLT=0."
#endif
#endif
#if TRAINKIT_WITH_NCCL
#if !TRAINKIT_WITH_CUDA
#error "TRAINKIT_WITH_NCCL=1 needs TRAINKIT_WITH_CUDA=1 (NCCL moves device buffers)."
#endif
#if !__has_include(<nccl.h>)
#error \
    "TRAINKIT_WITH_NCCL=1 but <nccl.h> is not on the include path: install NCCL (libnccl-dev or the CUDA toolkit's copy) or build with -DTRAINKIT_WITH_NCCL=0."
#endif
#endif
#if TRAINKIT_WITH_MPI
#if !__has_include(<mpi.h>)
#error \
    "TRAINKIT_WITH_MPI=1 but <mpi.h> is not on the include path: install libopenmpi-dev (or use mpicxx) or build with -DTRAINKIT_WITH_MPI=0."
#endif
#endif
#if TRAINKIT_WITH_CBLAS
#if !__has_include(<cblas.h>)
#error \
    "TRAINKIT_WITH_CBLAS=1 but <cblas.h> is not on the include path: install libopenblas-dev or build with -DTRAINKIT_WITH_CBLAS=0."
#endif
#endif
#if TRAINKIT_WITH_OPENMP
#if !defined(_OPENMP)
#error "TRAINKIT_WITH_OPENMP=1 but the compiler was not given -fopenmp."
#endif
#endif

// ---- Execution-space annotations. --------------------------------------------------------------
// Empty under a host compiler: every function still says `inline` itself (header-only, ODR-safe).
#if TRAINKIT_CUDA_COMPILER
#define TRAINKIT_HOST_DEVICE __host__ __device__
#define TRAINKIT_DEVICE __device__
#define TRAINKIT_HOST __host__
#define TRAINKIT_FORCEINLINE __forceinline__
// Only the device pass understands `#pragma unroll`; the host compiler would warn about it.
#if defined(__CUDA_ARCH__)
#define TRAINKIT_UNROLL _Pragma("unroll")
#else
#define TRAINKIT_UNROLL
#endif
#else
#define TRAINKIT_HOST_DEVICE
#define TRAINKIT_DEVICE
#define TRAINKIT_HOST
#if defined(__GNUC__) || defined(__clang__)
#define TRAINKIT_FORCEINLINE inline __attribute__((always_inline))
#else
#define TRAINKIT_FORCEINLINE inline
#endif
#define TRAINKIT_UNROLL
#endif

// ---- Optional separate compilation. -------------------------------------------------------------
// By default trainkit is header-only: every function is defined in its header. With
// TRAINKIT_SEPARATE_COMPILATION=1 (the CMake option of that name sets it through the
// trainkit::compiled library) the bodies of the heavy non-template functions (file formats,
// checkpoints, the loader, the monitor) and the f32 host GEMM are compiled once, in
// src/trainkit.cpp, and a TU that includes a header sees only their declarations. TRAINKIT_IMPL
// is 1 where those bodies are compiled: in every TU of a header-only build, and in that one TU.
// TRAINKIT_INLINE marks such a function: `inline` in a header-only build, nothing (one external
// definition) in the compiled library.
#ifndef TRAINKIT_SEPARATE_COMPILATION
#define TRAINKIT_SEPARATE_COMPILATION 0
#endif
#if !TRAINKIT_SEPARATE_COMPILATION
#define TRAINKIT_IMPL 1
#define TRAINKIT_INLINE inline
#elif defined(TRAINKIT_BUILDING_COMPILED_LIBRARY)
#define TRAINKIT_IMPL 1
#define TRAINKIT_INLINE
#else
#define TRAINKIT_IMPL 0
#define TRAINKIT_INLINE
#endif

// A host lambda that must be inlined into its caller, written after its parameter list: the
// row bodies that nn::detail::host_simd compiles a second time for AVX2 (only what is inlined
// into that function is compiled for its target). Empty under nvcc, whose host pass keeps
// the build's own target anyway.
#if (defined(__GNUC__) || defined(__clang__)) && !TRAINKIT_CUDA_COMPILER
#define TRAINKIT_INLINE_LAMBDA __attribute__((always_inline))
#else
#define TRAINKIT_INLINE_LAMBDA
#endif

// `__restrict__` is understood by g++, clang++ and nvcc alike.
#define TRAINKIT_RESTRICT __restrict__

// ---- Debug checks (bounds-checked accessors, extra validation). --------------------------------
#ifndef TRAINKIT_DEBUG
#ifdef NDEBUG
#define TRAINKIT_DEBUG 0
#else
#define TRAINKIT_DEBUG 1
#endif
#endif

#define TRAINKIT_DETAIL_STRINGIFY2(x) #x
#define TRAINKIT_DETAIL_STRINGIFY(x) TRAINKIT_DETAIL_STRINGIFY2(x)

TRAINKIT_NAMESPACE_BEGIN

/// The capability tiers this TU was compiled with, for logs and `env_check`.
struct Capabilities {
  bool cuda_compiler;
  bool cuda;
  bool cublaslt;
  bool nccl;
  bool mpi;
  bool cblas;
  bool openmp;
};

/// `cuda_compiler` differs between .cpp and .cu TUs of one program; the defaulted template
/// parameter makes those two different functions, so the ODR holds.
template <bool CudaCompiler = (TRAINKIT_CUDA_COMPILER != 0)>
constexpr Capabilities capabilities() noexcept {
  return {CudaCompiler,
          TRAINKIT_WITH_CUDA != 0,
          TRAINKIT_WITH_CUBLASLT != 0,
          TRAINKIT_WITH_NCCL != 0,
          TRAINKIT_WITH_MPI != 0,
          TRAINKIT_WITH_CBLAS != 0,
          TRAINKIT_WITH_OPENMP != 0};
}

TRAINKIT_NAMESPACE_END

// Under TRAINKIT_SEPARATE_COMPILATION the compiled library's bodies were built with its own
// TRAINKIT_WITH_* values, so every TU linked with it must have the same ones. The library defines
// one variable whose name spells its values, and every other TU refers to the name spelt by its
// own: a TU of another tier fails to link with an undefined reference that names the difference
// (e.g. `compiled_tier_cuda1_cublaslt0_nccl0_mpi0_cblas0`).
#if TRAINKIT_SEPARATE_COMPILATION
#define TRAINKIT_DETAIL_TIER_NAME2(cuda, cublaslt, nccl, mpi, cblas) \
  compiled_tier_cuda##cuda##_cublaslt##cublaslt##_nccl##nccl##_mpi##mpi##_cblas##cblas
#define TRAINKIT_DETAIL_TIER_NAME(cuda, cublaslt, nccl, mpi, cblas) \
  TRAINKIT_DETAIL_TIER_NAME2(cuda, cublaslt, nccl, mpi, cblas)
#define TRAINKIT_DETAIL_TIER                                                                \
  TRAINKIT_DETAIL_TIER_NAME(TRAINKIT_WITH_CUDA, TRAINKIT_WITH_CUBLASLT, TRAINKIT_WITH_NCCL, \
                            TRAINKIT_WITH_MPI, TRAINKIT_WITH_CBLAS)
TRAINKIT_NAMESPACE_BEGIN
namespace detail {
extern const int TRAINKIT_DETAIL_TIER;
#if defined(TRAINKIT_BUILDING_COMPILED_LIBRARY)
const int TRAINKIT_DETAIL_TIER = 1;
#elif defined(__GNUC__) || defined(__clang__)
[[maybe_unused]] __attribute__((used)) static const int* const compiled_tier_reference =
    &TRAINKIT_DETAIL_TIER;
#else
[[maybe_unused]] static const int* const compiled_tier_reference = &TRAINKIT_DETAIL_TIER;
#endif
}  // namespace detail
TRAINKIT_NAMESPACE_END
#endif
