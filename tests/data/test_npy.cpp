// SPDX-License-Identifier: MIT
// .npy parsing and writing against files numpy wrote (tests/fixtures/data/gen_fixtures.py) and
// byte-level test vectors of numpy 1.24's np.save (header, padding, data offset), plus every
// refusal path.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <trainkit/core/half.hpp>
#include <trainkit/io/npy.hpp>

#include "data_test_util.hpp"
#include "support/file_size_limit.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::fixture;
using data_test::read_file;
using data_test::TempDir;
using data_test::write_file;

namespace {

/// A .npy file with header text `dict` (padded numpy-style) followed by `data`.
std::vector<std::byte> make_npy(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string text = dict;
  const std::size_t len_size = major == 1 ? 2 : 4;
  while ((6 + 2 + len_size + text.size() + 1) % 64 != 0) text += ' ';
  text += '\n';
  std::string file = "\x93NUMPY";
  file += static_cast<char>(major);
  file += '\0';
  for (std::size_t i = 0; i < len_size; ++i)
    file += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  file += text;
  std::vector<std::byte> out(file.size() + data_bytes, std::byte{0});
  std::memcpy(out.data(), file.data(), file.size());
  return out;
}

std::string parse_error(const std::vector<std::byte>& bytes) {
  return error_of([&] {
    const tk::io::NpyHeader h = tk::io::parse_npy_header(bytes, "mem.npy");
    tk::io::check_npy_size(h, bytes.size(), "mem.npy");
  });
}

template <class T>
void check_dtype_file(const char* name, tk::DType dtype, const std::vector<T>& expected) {
  CAPTURE(name);
  const std::string path = fixture(std::string("npy/") + name);
  tk::io::NpyFile f(path);
  CHECK(f.dtype() == dtype);
  CHECK(f.shape() == std::vector<std::int64_t>{2, 3});
  const auto values = f.values<T>();
  REQUIRE(values.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(values[i] == expected[i]);
  // Our writer produces numpy's bytes exactly (header padding, growth room, data).
  const std::vector<std::byte> file = read_file(path);
  const std::vector<std::int64_t> shape{2, 3};
  const std::string header = tk::io::npy_header_bytes(dtype, shape);
  REQUIRE(header.size() + f.header().data_bytes == file.size());
  CHECK(std::memcmp(header.data(), file.data(), header.size()) == 0);
  TempDir dir;
  tk::io::write_npy(dir / "out.npy", dtype, shape, f.data());
  CHECK(read_file(dir / "out.npy") == file);
}

}  // namespace

TEST_CASE("npy: np.save's bytes for [1,2,3] f4, versions 1 and 2") {
  const std::vector<std::byte> v1 = read_file(fixture("npy/vec_f4.npy"));
  REQUIRE(v1.size() == 140);
  const unsigned char prefix[] = {0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00};
  CHECK(std::memcmp(v1.data(), prefix, sizeof prefix) == 0);
  const tk::io::NpyHeader h = tk::io::parse_npy_header(v1, "vec_f4.npy");
  CHECK(h.dtype == tk::DType::kF32);
  CHECK(h.shape == std::vector<std::int64_t>{3});
  CHECK(h.data_offset == 128);
  CHECK(h.data_bytes == 12);
  CHECK(h.major == 1);
  tk::io::NpyFile f(fixture("npy/vec_f4.npy"));
  const auto x = f.values<float>();
  CHECK(x[0] == 1.0f);
  CHECK(x[1] == 2.0f);
  CHECK(x[2] == 3.0f);
  const std::vector<std::int64_t> shape{3};
  const std::string header = tk::io::npy_header_bytes(tk::DType::kF32, shape);
  CHECK(header.size() == 128);
  CHECK(std::memcmp(header.data(), v1.data(), 128) == 0);

  const std::vector<std::byte> v2 = read_file(fixture("npy/v2_f4.npy"));
  const unsigned char prefix2[] = {0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59,
                                   0x02, 0x00, 0x74, 0x00, 0x00, 0x00};
  CHECK(std::memcmp(v2.data(), prefix2, sizeof prefix2) == 0);
  const tk::io::NpyHeader h2 = tk::io::parse_npy_header(v2, "v2_f4.npy");
  CHECK(h2.major == 2);
  CHECK(h2.data_offset == 128);
  CHECK(tk::io::NpyFile(fixture("npy/v2_f4.npy")).values<float>()[2] == 3.0f);
}

TEST_CASE("npy: every supported dtype round-trips byte for byte with numpy") {
  check_dtype_file<double>("dt_f8.npy", tk::DType::kF64, {0, 3, 6, 9, 12, 15});
  check_dtype_file<float>("dt_f4.npy", tk::DType::kF32, {0, 3, 6, 9, 12, 15});
  check_dtype_file<std::int64_t>("dt_i8.npy", tk::DType::kI64, {-4, -1, 2, 5, 8, 11});
  check_dtype_file<std::int32_t>("dt_i4.npy", tk::DType::kI32, {-4, -1, 2, 5, 8, 11});
  check_dtype_file<std::int16_t>("dt_i2.npy", tk::DType::kI16, {-4, -1, 2, 5, 8, 11});
  check_dtype_file<std::int8_t>("dt_i1.npy", tk::DType::kI8, {-4, -1, 2, 5, 8, 11});
  check_dtype_file<std::uint64_t>("dt_u8.npy", tk::DType::kU64, {0, 3, 6, 9, 12, 15});
  check_dtype_file<std::uint32_t>("dt_u4.npy", tk::DType::kU32, {0, 3, 6, 9, 12, 15});
  check_dtype_file<std::uint16_t>("dt_u2.npy", tk::DType::kU16, {0, 3, 6, 9, 12, 15});
  check_dtype_file<std::uint8_t>("dt_u1.npy", tk::DType::kU8, {0, 3, 6, 9, 12, 15});
  check_dtype_file<bool>("dt_b1.npy", tk::DType::kBool, {false, true, false, true, false, true});
  std::vector<tk::f16> halves;
  for (float v : {0.f, 3.f, 6.f, 9.f, 12.f, 15.f}) halves.push_back(tk::f16(v));
  tk::io::NpyFile f(fixture("npy/dt_f2.npy"));
  CHECK(f.dtype() == tk::DType::kF16);
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(static_cast<float>(f.values<tk::f16>()[i]) == static_cast<float>(halves[i]));
  check_dtype_file<tk::f16>("dt_f2.npy", tk::DType::kF16, halves);
}

TEST_CASE("npy: scalars, empty arrays and rank 3 match numpy's files") {
  const std::vector<std::byte> scalar = read_file(fixture("npy/scalar_i8.npy"));
  tk::io::NpyFile s(fixture("npy/scalar_i8.npy"));
  CHECK(s.shape().empty());
  CHECK(s.numel() == 1);
  CHECK(s.values<std::int64_t>()[0] == 7);
  const std::string hs = tk::io::npy_header_bytes(tk::DType::kI64, {});
  CHECK(std::memcmp(hs.data(), scalar.data(), hs.size()) == 0);

  const std::vector<std::byte> empty = read_file(fixture("npy/empty_u1.npy"));
  CHECK(empty.size() == 128);
  tk::io::NpyFile e(fixture("npy/empty_u1.npy"));
  CHECK(e.numel() == 0);
  CHECK(e.header().data_bytes == 0);
  const std::vector<std::int64_t> zero{0};
  CHECK(tk::io::npy_header_bytes(tk::DType::kU8, zero).size() == 128);

  const std::vector<std::byte> r3 = read_file(fixture("npy/rank3_f4.npy"));
  const std::vector<std::int64_t> shape{2, 1, 4};
  const std::string h3 = tk::io::npy_header_bytes(tk::DType::kF32, shape);
  CHECK(std::memcmp(h3.data(), r3.data(), h3.size()) == 0);
  tk::io::NpyFile f3(fixture("npy/rank3_f4.npy"));
  CHECK(f3.shape() == shape);
  CHECK(f3.values<float>()[7] == 7.0f);
}

TEST_CASE("npy: key order, quotes and spacing do not matter; numpy's strictness does") {
  auto ok = make_npy("{\"shape\": (2,3), 'fortran_order':False,'descr':'<i4'}", 24);
  const tk::io::NpyHeader h = tk::io::parse_npy_header(ok, "x.npy");
  CHECK(h.dtype == tk::DType::kI32);
  CHECK(h.shape == std::vector<std::int64_t>{2, 3});
  // Fortran order is harmless when at most one extent exceeds 1.
  auto col = make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 5), }", 20);
  CHECK(tk::io::parse_npy_header(col, "col.npy").shape == std::vector<std::int64_t>{1, 5});
  check_contains(
      parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8)),
      {"mem.npy", "unexpected key 'x'"});
  check_contains(parse_error(make_npy("{'descr': '<f4', 'shape': (2,)}", 8)),
                 {"mem.npy", "missing key 'fortran_order'"});
  check_contains(parse_error(make_npy(
                     "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8)),
                 {"duplicate key 'descr'"});
  check_contains(
      parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 8)),
      {"non-negative integer"});
  check_contains(
      parse_error(make_npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", 8)),
      {"True or False"});
  check_contains(
      parse_error(make_npy(
          "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}",
          0)),
      {"overflows"});
  check_contains(
      parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", 8)),
      {"trailing characters"});
  check_contains(
      parse_error(make_npy("{'descr': '<q9', 'fortran_order': False, 'shape': (2,)}", 8)),
      {"not supported"});
}

TEST_CASE("npy: numpy files trainkit refuses, with the file and the reason") {
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/fortran_f8.npy")); }),
                 {"fortran_f8.npy", "Fortran-order", "ascontiguousarray"});
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/big_f4.npy")); }),
                 {"big_f4.npy", "'>f4'", "byte order"});
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/complex_c8.npy")); }),
                 {"complex_c8.npy", "'<c8'", "complex"});
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/object.npy")); }),
                 {"object.npy", "pickle"});
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/structured.npy")); }),
                 {"structured.npy", "structured"});
  check_contains(error_of([] {
                   tk::io::NpyFile f(fixture("npy/vec_f4.npy"));
                   (void)f.values<double>();
                 }),
                 {"vec_f4.npy", "holds F32, not F64"});
  check_contains(error_of([] { tk::io::NpyFile f(fixture("npy/no_such_file.npy")); }),
                 {"no_such_file.npy", "cannot open"});
  check_contains(error_of([] { (void)tk::io::npy_descr(tk::DType::kBF16); }),
                 {"BF16", "no .npy descr"});
}

TEST_CASE("npy: truncated and corrupt files name the file and the problem") {
  const std::vector<std::byte> good = read_file(fixture("npy/features.npy"));
  TempDir dir;
  auto open_error = [&](const std::vector<std::byte>& bytes) {
    write_file(dir / "bad.npy", bytes);
    return error_of([&] { tk::io::NpyFile f(dir / "bad.npy"); });
  };
  std::vector<std::byte> cut(good.begin(), good.end() - 4);
  check_contains(open_error(cut), {"bad.npy", "truncated", "promises 740 data bytes", "only 736"});
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{1});
  check_contains(open_error(longer), {"bad.npy", "1 trailing bytes"});
  check_contains(open_error({good.begin(), good.begin() + 60}), {"bad.npy", "truncated header"});
  check_contains(open_error({good.begin(), good.begin() + 7}), {"bad.npy", "truncated", "10-byte"});
  check_contains(open_error({}), {"bad.npy", "truncated"});
  std::vector<std::byte> magic = good;
  magic[1] = std::byte{'X'};
  check_contains(open_error(magic), {"bad.npy", "bad magic"});
  std::vector<std::byte> version = good;
  version[6] = std::byte{4};
  check_contains(open_error(version), {"bad.npy", "version 4.0"});
  std::vector<std::byte> newline = good;  // numpy's reader accepts a header without '\n'
  newline[127] = std::byte{' '};
  write_file(dir / "nl.npy", newline);
  CHECK(tk::io::NpyFile(dir / "nl.npy").shape() == std::vector<std::int64_t>{37, 5});
  check_contains(open_error(make_npy("", 0)), {"bad.npy", "expected '{'"});
  std::vector<std::byte> huge = good;
  huge[6] = std::byte{2};  // v2: the 4-byte length now reads the first header bytes
  check_contains(open_error(huge), {"bad.npy", "exceeds the 10000-byte limit"});
}

TEST_CASE("npy: write_npy of every dtype reads back through NpyFile") {
  TempDir dir;
  const std::vector<std::int64_t> shape{4, 2};
  std::vector<std::int32_t> v(8);
  for (int i = 0; i < 8; ++i) v[static_cast<std::size_t>(i)] = i * i - 10;
  tk::io::write_npy<std::int32_t>(dir / "a.npy", shape, v);
  tk::io::NpyFile f(dir / "a.npy");
  CHECK(f.shape() == shape);
  const auto r = f.values<std::int32_t>();
  CHECK(std::vector<std::int32_t>(r.begin(), r.end()) == v);
  check_contains(error_of([&] {
                   tk::io::write_npy<std::int32_t>(dir / "b.npy", shape, std::span(v).first(7));
                 }),
                 {"b.npy", "holds 8 elements but 7"});

  // A write that fails part-way (a file size limit, as a full disk) leaves the old file whole.
  std::vector<float> big(std::size_t{1} << 20, 1.5f);
  const std::vector<std::int64_t> big_shape{1 << 20};
  const std::string error = trainkit_test::error_under_file_size_limit(
      100000, [&] { tk::io::write_npy<float>(dir / "a.npy", big_shape, big); });
  CHECK(error.find("a.npy") != std::string::npos);
  tk::io::NpyFile again(dir / "a.npy");
  CHECK(again.shape() == shape);
  const auto r2 = again.values<std::int32_t>();
  CHECK(std::vector<std::int32_t>(r2.begin(), r2.end()) == v);
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"a.npy"});  // no partial file beside it
}
