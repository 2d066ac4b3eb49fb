// The one doctest main of the CPU test executables. It prints what the build was compiled with,
// so a failing CI log says which tier ran.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <trainkit/config.hpp>

int main(int argc, char** argv) {
  const auto caps = trainkit::capabilities();
  std::printf("trainkit %s tests: cuda=%d cublaslt=%d nccl=%d mpi=%d cblas=%d openmp=%d\n",
              trainkit::version().string, caps.cuda, caps.cublaslt, caps.nccl, caps.mpi, caps.cblas,
              caps.openmp);
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
