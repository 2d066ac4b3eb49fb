// SPDX-License-Identifier: MIT
// The allocation probe of tests/data (alloc_probe.hpp), compiled into test_io as well.
#include "data/alloc_probe.cpp"  // NOLINT: one definition of the replacement operator new
