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
