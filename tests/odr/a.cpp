// ODR test: main TU. See odr_probe.hpp.
#include <cstdio>

#include "odr_probe.hpp"

int main() {
  int failures = 0;
  auto expect = [&](const char* tu, int code) {
    if (code != 0) {
      std::printf("odr: probe in %s failed with code %d\n", tu, code);
      ++failures;
    }
  };
  expect("a.cpp", odr_probe());
  expect("b.cpp", odr_b());
#if TRAINKIT_ODR_WITH_CUDA_TUS
  expect("c.cu", odr_c());
  expect("d.cu", odr_d());
#endif
  std::printf("odr: %s\n", failures == 0 ? "all TUs agree" : "FAILED");
  return failures == 0 ? 0 : 1;
}
