#include <doctest/doctest.h>

#include <string>
#include <trainkit/error.hpp>

TEST_CASE("TRAINKIT_CHECK throws trainkit::Error with message, expression and location") {
  int n = 0;
  try {
    TRAINKIT_CHECK(n > 0, "tensor '", "w", "' is empty: n=", n);
    FAIL("no exception");
  } catch (const trainkit::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("tensor 'w' is empty: n=0") != std::string::npos);
    CHECK(what.find("[n > 0]") != std::string::npos);
    CHECK(what.find("test_error.cpp:") != std::string::npos);
    CHECK(e.library() == "trainkit");
  }
}
