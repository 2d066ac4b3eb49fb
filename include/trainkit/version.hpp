// SPDX-License-Identifier: MIT
// trainkit/version.hpp: the library version, the single source that CMake and Meson read.
// TRAINKIT_VERSION is MAJOR*10000 + MINOR*100 + PATCH so it compares with plain integers.
#pragma once

#define TRAINKIT_VERSION_MAJOR 0
#define TRAINKIT_VERSION_MINOR 1
#define TRAINKIT_VERSION_PATCH 0
#define TRAINKIT_VERSION \
  (TRAINKIT_VERSION_MAJOR * 10000 + TRAINKIT_VERSION_MINOR * 100 + TRAINKIT_VERSION_PATCH)
#define TRAINKIT_VERSION_STRING "0.1.0"

// The versioned inline namespace: mixing TUs built against different trainkit versions is a link
// error, not a silent ODR violation. Users write `trainkit::X`; the v0_1 part is invisible.
#define TRAINKIT_NAMESPACE_BEGIN \
  namespace trainkit {           \
  inline namespace v0_1 {
#define TRAINKIT_NAMESPACE_END \
  }                            \
  }

TRAINKIT_NAMESPACE_BEGIN

/// The library version as numbers and as a string, for logs and `env_check`.
struct Version {
  int major;
  int minor;
  int patch;
  const char* string;
};

/// The version of the headers this translation unit was compiled against.
inline constexpr Version version() noexcept {
  return {TRAINKIT_VERSION_MAJOR, TRAINKIT_VERSION_MINOR, TRAINKIT_VERSION_PATCH,
          TRAINKIT_VERSION_STRING};
}

TRAINKIT_NAMESPACE_END
