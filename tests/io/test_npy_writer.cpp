// SPDX-License-Identifier: MIT
// write_npy / npy_header_bytes against what numpy.load accepts: shapes numpy refuses (more than
// 64 dimensions, a byte size past 2^63 - 1, negative extents) and dtypes it lacks are refused up
// front with an Error naming the file, and no file is left behind; edge shapes numpy does load
// (0-d, empty, 64 dimensions, a huge extent next to a 0) round-trip through NpyFile. NpyFile
// refuses a bool array holding bytes other than 0 and 1 (numpy saves them from .view(bool)).
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "io/io_test_util.hpp"
#include "trainkit/io/npy.hpp"

namespace io = trainkit::io;
using io_test::TempDir;
using trainkit::DType;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const trainkit::Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("npy writer: shapes and dtypes numpy cannot load are refused, naming the file") {
  TempDir dir;
  const std::int64_t one = 1;
  struct Case {
    const char* file;
    DType dtype;
    std::vector<std::int64_t> shape;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"dims65.npy", DType::kI64, std::vector<std::int64_t>(65, 1), "65 dimensions"},
      {"dims3000.npy", DType::kU8, std::vector<std::int64_t>(3000, 1), "3000 dimensions"},
      {"too_big.npy", DType::kF64, {std::int64_t{1} << 62, 0}, "too large"},
      {"too_big2.npy", DType::kU8, {0, std::int64_t{1} << 32, std::int64_t{1} << 31}, "too large"},
      {"negative.npy", DType::kF32, {2, -3}, "negative extent in shape (2, -3)"},
      {"bf16.npy", DType::kBF16, {1}, "no .npy descr"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.file);
    const std::filesystem::path path = dir / c.file;
    const std::string message = error_of([&] { io::write_npy(path, c.dtype, c.shape, &one); });
    CHECK(contains(message, "cannot write npy file '" + path.string() + "'"));
    CHECK(contains(message, c.why));
    CHECK(!contains(message, "["));  // no internal condition text
    CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                        std::filesystem::directory_iterator()) == 0);
    CHECK(contains(error_of([&] { (void)io::npy_header_bytes(c.dtype, c.shape); }), c.why));
  }
  // The typed overload checks the shape before counting elements.
  const std::vector<std::int64_t> neg{-1};
  const std::string typed =
      error_of([&] { io::write_npy<float>(dir / "typed.npy", neg, std::span<const float>()); });
  CHECK(contains(typed, "cannot write npy file '" + (dir / "typed.npy").string() + "'"));
}

TEST_CASE("npy writer: edge shapes numpy loads round-trip through NpyFile") {
  TempDir dir;
  std::mt19937_64 rng(7);
  std::vector<std::vector<std::int64_t>> shapes = {{},
                                                   {0},
                                                   {3, 0, 2},
                                                   {0, std::int64_t{1} << 40},
                                                   {std::int64_t{1} << 59, 0},
                                                   std::vector<std::int64_t>(64, 1)};
  for (int i = 0; i < 40; ++i) {  // random ranks up to the limit, small extents, some zeros
    std::vector<std::int64_t> s(rng() % 65);
    for (auto& d : s) d = rng() % 8 == 0 ? 2 : (rng() % 16 == 0 ? 0 : 1);
    shapes.push_back(s);
  }
  for (const auto& shape : shapes) {
    CAPTURE(shape.size());
    std::size_t numel = 1;
    for (std::int64_t d : shape) numel *= std::size_t(d);
    std::vector<std::int32_t> values(numel);
    for (auto& v : values) v = std::int32_t(rng());
    const std::filesystem::path path = dir / "a.npy";
    io::write_npy(path, DType::kI32, shape, values.data());
    io::NpyFile f(path);
    CHECK(f.shape() == shape);
    CHECK(f.numel() == numel);
    CHECK(f.header().data_offset % 64 == 0);
    const auto got = f.values<std::int32_t>();
    CHECK(std::vector<std::int32_t>(got.begin(), got.end()) == values);
  }
}

TEST_CASE("npy reader: a bool array holding bytes other than 0 and 1 is refused at open") {
  // numpy saves `np.array([0, 1, 2, 255], np.uint8).view(bool)` byte for byte and reads every
  // nonzero byte as True; read as C++ bools those bytes are neither true nor false (a sum of
  // float(b) gave 258 for that array, not 3).
  TempDir dir;
  const std::vector<std::uint8_t> raw{0, 1, 2, 255};
  const std::vector<std::int64_t> shape{4};
  io::write_npy(dir / "view.npy", DType::kBool, shape, raw.data());
  const std::string message = error_of([&] { io::NpyFile f(dir / "view.npy"); });
  CHECK(contains(message, (dir / "view.npy").string()));
  CHECK(contains(message, "bool element 2 holds the byte 2"));
  CHECK(contains(message, "a != 0"));
  // Past the first block of the scan, the element is still the right one; clean arrays open.
  std::vector<std::uint8_t> big(10000, 1);
  for (std::size_t i = 0; i < big.size(); i += 3) big[i] = 0;
  const std::vector<std::int64_t> big_shape{100, 100};
  io::write_npy(dir / "clean.npy", DType::kBool, big_shape, big.data());
  const io::NpyFile clean(dir / "clean.npy");
  CHECK(clean.values<bool>()[1]);
  CHECK(!clean.values<bool>()[3]);
  big[9001] = 7;
  io::write_npy(dir / "late.npy", DType::kBool, big_shape, big.data());
  CHECK(contains(error_of([&] { io::NpyFile f(dir / "late.npy"); }),
                 "bool element 9001 holds the byte 7"));
  // A zero-size bool array has nothing to check.
  const std::vector<std::int64_t> empty{0, 3};
  io::write_npy(dir / "empty.npy", DType::kBool, empty, nullptr);
  CHECK(io::NpyFile(dir / "empty.npy").numel() == 0);
}
