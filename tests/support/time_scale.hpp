// SPDX-License-Identifier: MIT
// How much slower than a plain build this test run is allowed to be. Tests that kill a child
// process after a wall-clock delay (crash safety) multiply that delay by it, so a sanitizer build,
// whose children start and run several times slower, still interrupts them mid-run and not before
// their first step. The asan/tsan test presets set TRAINKIT_TEST_TIME_SCALE; default 1.
#pragma once

#include <cstdlib>
#include <string>

namespace trainkit_test {

inline int time_scale() {
  const char* v = std::getenv("TRAINKIT_TEST_TIME_SCALE");
  if (v == nullptr || *v == '\0') return 1;
  const int s = std::atoi(v);
  return s >= 1 && s <= 100 ? s : 1;
}

}  // namespace trainkit_test
