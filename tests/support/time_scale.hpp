// SPDX-License-Identifier: MIT
// How much slower than a plain build this test run is allowed to be. Tests that kill a child
// process after a wall-clock delay (crash safety) multiply that delay by it, so a sanitizer build,
// whose children start and run several times slower, still interrupts them mid-run and not before
// their first step. The asan/tsan test presets set TRAINKIT_TEST_TIME_SCALE; default 1.
#pragma once

#include <cstdlib>
#include <string>

namespace trainkit_test {

/// True in a build instrumented by AddressSanitizer or ThreadSanitizer (GCC's macros, clang's
/// __has_feature): tests whose largest case takes minutes there run fewer rounds of it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

inline int time_scale() {
  const char* v = std::getenv("TRAINKIT_TEST_TIME_SCALE");
  if (v == nullptr || *v == '\0') return 1;
  const int s = std::atoi(v);
  return s >= 1 && s <= 100 ? s : 1;
}

}  // namespace trainkit_test
