// SPDX-License-Identifier: MIT
// Helpers shared by the tests of tests/data (datasets, samplers, prefetcher, file formats).
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <trainkit/error.hpp>

#include "support/temp_dir.hpp"

namespace data_test {

/// tests/fixtures/data/<rel>.
inline std::string fixture(std::string_view rel) {
  return std::string(TRAINKIT_TEST_DATA_DIR) + "/data/" + std::string(rel);
}

inline std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p.string());
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) out[i] = static_cast<std::byte>(c[i]);
  return out;
}

inline void write_file(const std::filesystem::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

using trainkit_test::TempDir;  // support/temp_dir.hpp

/// Runs f and returns the what() of the trainkit::Error it throws ("" and a failed check if it
/// throws nothing or something else).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const trainkit::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("expected trainkit::Error, got std::exception: " << e.what());
    return "";
  }
  FAIL_CHECK("expected trainkit::Error, nothing was thrown");
  return "";
}

/// CHECKs that `text` contains every one of `parts`.
inline void check_contains(const std::string& text, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts)
    CHECK_MESSAGE(text.find(p) != std::string::npos, "'" << p << "' not in: " << text);
}

/// Rewrites the checksum field of the 512-byte tar header at `header` in `b`.
inline void set_checksum(std::vector<std::byte>& b, std::size_t header) {
  std::memset(b.data() + header + 148, ' ', 8);
  unsigned sum = 0;
  for (std::size_t i = 0; i < 512; ++i) sum += static_cast<unsigned char>(b[header + i]);
  char text[8];
  std::snprintf(text, sizeof text, "%06o", sum);
  std::memcpy(b.data() + header + 148, text, 7);
}

}  // namespace data_test
