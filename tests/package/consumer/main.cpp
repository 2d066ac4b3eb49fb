// The consumer program of every packaging test: it includes the umbrella the way a user does,
// checks that the capability macros it got are the ones the test expects, and calls one function
// of each enabled backend's library, so a macro without its link flag fails to link right here.
// Expected values come as TRAINKIT_EXPECT_<X> (0/1) from the test; absent = not checked.
#include <trainkit/trainkit.hpp>

#include <cstdio>
#include <string>

#if TRAINKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if TRAINKIT_WITH_CUBLASLT
#include <cublasLt.h>
#endif
#if TRAINKIT_WITH_NCCL
#include <nccl.h>
#endif
#if TRAINKIT_WITH_MPI
#include <mpi.h>
#endif
#if TRAINKIT_WITH_CBLAS
#include <cblas.h>
#endif
#if TRAINKIT_WITH_OPENMP
#include <omp.h>
#endif

#if defined(TRAINKIT_EXPECT_CUDA)
static_assert(TRAINKIT_WITH_CUDA == TRAINKIT_EXPECT_CUDA, "unexpected TRAINKIT_WITH_CUDA");
#endif
#if defined(TRAINKIT_EXPECT_NCCL)
static_assert(TRAINKIT_WITH_NCCL == TRAINKIT_EXPECT_NCCL, "unexpected TRAINKIT_WITH_NCCL");
#endif
#if defined(TRAINKIT_EXPECT_MPI)
static_assert(TRAINKIT_WITH_MPI == TRAINKIT_EXPECT_MPI, "unexpected TRAINKIT_WITH_MPI");
#endif

int main() {
  const trainkit::Version v = trainkit::version();
  if (std::string(v.string) != TRAINKIT_VERSION_STRING) return 1;
  if (trainkit::dtype_size(trainkit::parse_dtype("F32")) != 4) return 2;
  try {
    (void)trainkit::parse_dtype("no such dtype");
    return 3;
  } catch (const trainkit::Error&) {
  }
  std::string libs;
#if TRAINKIT_WITH_CUDA
  int cudart = 0;
  if (cudaRuntimeGetVersion(&cudart) != cudaSuccess) return 4;  // needs no GPU
  libs += " cudart=" + std::to_string(cudart);
#endif
#if TRAINKIT_WITH_CUBLASLT
  libs += " cublasLt=" + std::to_string(cublasLtGetVersion());
#endif
#if TRAINKIT_WITH_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess) return 5;
  libs += " nccl=" + std::to_string(nccl);
#endif
#if TRAINKIT_WITH_MPI
  int mpi_major = 0, mpi_minor = 0;
  MPI_Get_version(&mpi_major, &mpi_minor);  // callable before MPI_Init
  libs += " mpi=" + std::to_string(mpi_major) + "." + std::to_string(mpi_minor);
#endif
#if TRAINKIT_WITH_CBLAS
  const float x[3] = {1.0f, 2.0f, 3.0f};
  if (cblas_sdot(3, x, 1, x, 1) != 14.0f) return 6;
  libs += " cblas";
#endif
#if TRAINKIT_WITH_OPENMP
  libs += " openmp_threads=" + std::to_string(omp_get_max_threads());
#endif
  const trainkit::Capabilities caps = trainkit::capabilities();
  std::printf(
      "trainkit %s consumer OK: cuda_compiler=%d cuda=%d cublaslt=%d nccl=%d mpi=%d "
      "cblas=%d openmp=%d;%s\n",
      v.string, caps.cuda_compiler, caps.cuda, caps.cublaslt, caps.nccl, caps.mpi, caps.cblas,
      caps.openmp, libs.c_str());
  return 0;
}
