// The doctest main of the CUDA test executables: exits 77 (CTest/Meson "skipped") when no CUDA
// device is usable, so CPU machines compile these tests without pretending to pass them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
