// SPDX-License-Identifier: MIT
// The allocation probe of tests/loader (alloc_probe.hpp), compiled into test_io as well.
#include "loader/alloc_probe.cpp"  // NOLINT: one definition of the replacement operator new
