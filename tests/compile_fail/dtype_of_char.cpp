// Compile-fail test: `dtype_of<char>` has no DType (char's signedness is implementation-defined;
// use std::int8_t or std::uint8_t) and must be rejected by a static_assert that says so.
#include <cstdint>

#include <trainkit/core/dtype.hpp>

#if TRAINKIT_SHOULD_FAIL
constexpr auto bad = trainkit::dtype_of<char>;
#else
static_assert(trainkit::dtype_of<std::int8_t> == trainkit::DType::kI8);
#endif

int main() { return 0; }
