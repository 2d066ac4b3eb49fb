// ODR test helper: every TU of test_odr includes the umbrella and runs this probe. Each TU then
// emits its own copy of every non-template function and variable the umbrella defines; a missing
// `inline` (or a non-static non-template __global__ in the .cu TUs) is a duplicate-symbol link
// error, so the test fails at link time, which is the point.
#pragma once

#include <string>

#include <trainkit/trainkit.hpp>

// Returns 0 when the basic API behaves the same in this TU, else a nonzero code naming the check.
inline int odr_probe() {
  const trainkit::Version v = trainkit::version();
  if (v.major * 10000 + v.minor * 100 + v.patch != TRAINKIT_VERSION) return 1;
  if (std::string(v.string) != TRAINKIT_VERSION_STRING) return 2;
  try {
    TRAINKIT_CHECK(v.major < 0, "odr probe ", 42);
    return 3;
  } catch (const trainkit::Error& e) {
    if (std::string(e.what()).find("odr probe 42") == std::string::npos) return 4;
  }
  if (trainkit::dtype_size(trainkit::parse_dtype("BF16")) != 2) return 5;
  return 0;
}

int odr_b();
#if TRAINKIT_ODR_WITH_CUDA_TUS
int odr_c();
int odr_d();
#endif
