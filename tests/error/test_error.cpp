#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>
#include <trainkit/error.hpp>

namespace {
// Sets TRAINKIT_VERBOSE_ERRORS for the scope (nullptr = unset), restoring it afterwards.
class VerboseErrors {
 public:
  explicit VerboseErrors(const char* value) {
    if (const char* old = std::getenv("TRAINKIT_VERBOSE_ERRORS")) old_ = old, had_ = true;
    if (value != nullptr) ::setenv("TRAINKIT_VERBOSE_ERRORS", value, 1);
    else ::unsetenv("TRAINKIT_VERBOSE_ERRORS");
  }
  ~VerboseErrors() {
    if (had_) ::setenv("TRAINKIT_VERBOSE_ERRORS", old_.c_str(), 1);
    else ::unsetenv("TRAINKIT_VERBOSE_ERRORS");
  }
  VerboseErrors(const VerboseErrors&) = delete;
  VerboseErrors& operator=(const VerboseErrors&) = delete;

 private:
  std::string old_;
  bool had_ = false;
};

std::string check_message(int n) {
  try {
    TRAINKIT_CHECK(n > 0, "tensor '", "w", "' is empty: n=", n);
  } catch (const trainkit::Error& e) {
    CHECK(e.library() == "trainkit");
    return e.what();
  }
  FAIL("no exception");
  return {};
}
std::string fail_message() {
  try {
    TRAINKIT_FAIL("file '", "a.bin", "' is truncated");
  } catch (const trainkit::Error& e) {
    return e.what();
  }
  FAIL("no exception");
  return {};
}
}  // namespace

TEST_CASE("TRAINKIT_CHECK: a message that stands alone; condition and location when verbose") {
  {
    VerboseErrors env("1");
    const std::string what = check_message(0);
    CHECK(what.rfind("trainkit: tensor 'w' is empty: n=0", 0) == 0);
    CHECK(what.find("[n > 0]") != std::string::npos);
    CHECK(what.find("test_error.cpp:") != std::string::npos);
    CHECK(fail_message().find("test_error.cpp:") != std::string::npos);
  }
  for (const char* off : {"0", "false", "off"}) {
    VerboseErrors env(off);
    CHECK(check_message(0) == "trainkit: tensor 'w' is empty: n=0");
    CHECK(fail_message() == "trainkit: file 'a.bin' is truncated");
  }
  {
    // Unset: the build decides (verbose in a debug build, i.e. without NDEBUG).
    VerboseErrors env(nullptr);
    const std::string what = check_message(0);
#ifdef NDEBUG
    CHECK(what == "trainkit: tensor 'w' is empty: n=0");
#else
    CHECK(what.find("[n > 0]") != std::string::npos);
    CHECK(what.find("test_error.cpp:") != std::string::npos);
#endif
  }
}
