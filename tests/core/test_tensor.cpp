// Shapes, views (slicing, strides, transposes, reshapes), owning tensors, type-erased tensors and
// copies between spaces.
#include <doctest/doctest.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <trainkit/core/any_tensor.hpp>
#include <trainkit/core/copy.hpp>
#include <trainkit/core/shape.hpp>
#include <trainkit/core/state_dict.hpp>
#include <trainkit/core/tensor.hpp>
#include <trainkit/core/tensor_view.hpp>
#include <vector>

namespace tk = trainkit;

namespace {
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const tk::Error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("Shape: rank, numel, printing, validation") {
  tk::Shape scalar;
  CHECK(scalar.rank() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.to_string() == "[]");

  tk::Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s[1] == 3);
  CHECK(s.to_string() == "[2, 3, 4]");
  CHECK(s == tk::Shape{2, 3, 4});
  CHECK_FALSE(s == tk::Shape{2, 3});
  CHECK(tk::Shape{5, 0, 7}.numel() == 0);

  CHECK(contains(error_of([] { tk::Shape{2, -1}; }), "negative extent -1"));
  CHECK(contains(error_of([] { tk::Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}; }),
                 "exceeds trainkit::kMaxRank"));
  CHECK(contains(error_of([] { tk::Shape{1ll << 40, 1ll << 40}; }), "overflows"));
  CHECK(contains(error_of([&] { (void)s.at(3); }), "dimension 3 out of range for shape [2, 3, 4]"));
}

TEST_CASE("sizes past 2^63 - 1 (elements or bytes) are refused everywhere a shape enters") {
  // Each of these gave a tensor or view whose size wrapped to a small number, so that a
  // bounds-checked access wrote past its memory.
  tk::Shape s{(1ll << 62) + 1, 1};
  CHECK(contains(error_of([&] { s.set(1, 4); }), "overflows"));
  CHECK(s == tk::Shape{(1ll << 62) + 1, 1});  // unchanged
  s.set(1, 0);
  CHECK(s.numel() == 0);
  CHECK(contains(error_of([] { tk::Tensor<double> t(tk::Shape{(1ll << 61) - 1}); }),
                 "more than any memory"));
  CHECK(contains(error_of([] { tk::Allocation a(~std::size_t{0} - 10, tk::MemoryKind::kHost); }),
                 "more than any memory"));
  CHECK(contains(error_of([] { tk::AnyTensor t(tk::DType::kF64, tk::Shape{(1ll << 61) + 1}); }),
                 "would hold more than 2^63 - 1 bytes"));
  double buffer[4] = {1, 2, 3, 4};
  CHECK(contains(
      error_of([&] { tk::AnyTensorView v(tk::DType::kF64, tk::Shape{(1ll << 61) + 1}, buffer); }),
      "would hold more than 2^63 - 1 bytes"));
  const auto v = tk::make_view(buffer, {4});
  CHECK(contains(error_of([&] { (void)v.reshape<2>({{-1, -4}}); }), "negative extent"));
  CHECK(contains(error_of([&] { (void)v.reshape<2>({{(1ll << 62) + 1, 4}}); }), "overflows"));
  CHECK(v.reshape<2>({{2, 2}}).at(1, 1) == 4.0);
  CHECK(contains(error_of([&] { (void)tk::make_view(buffer, {1ll << 62, 8}); }), "overflows"));
  // An empty tensor may have extents whose strides do not fit (never used as offsets).
  tk::Tensor<float> empty(tk::Shape{0, 1ll << 62, 8});
  CHECK(empty.view<3>().numel() == 0);
}

TEST_CASE("TensorView: contiguous indexing matches row-major offsets") {
  std::vector<int> buf(24);
  std::iota(buf.begin(), buf.end(), 0);
  auto v = tk::make_view(buf.data(), {2, 3, 4});
  CHECK(v.is_contiguous());
  CHECK(v.numel() == 24);
  CHECK(v.stride(0) == 12);
  CHECK(v.stride(1) == 4);
  CHECK(v.stride(2) == 1);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(v(i, j, k) == i * 12 + j * 4 + k);
  tk::HostView<const int, 3> cv = v;  // T -> const T conversion
  CHECK(cv(1, 2, 3) == 23);
}

TEST_CASE("TensorView: slice, select, transposed, reshape, flatten") {
  std::vector<float> buf(6 * 5);
  std::iota(buf.begin(), buf.end(), 0.0f);
  auto m = tk::make_view(buf.data(), {6, 5});

  auto rows = m.slice(0, 2, 4);  // rows 2..3
  CHECK(rows.size(0) == 2);
  CHECK(rows(0, 0) == 10.0f);
  CHECK(rows.is_contiguous());

  auto cols = m.slice(1, 1, 3);  // columns 1..2
  CHECK(cols.size(1) == 2);
  CHECK(cols(3, 1) == 17.0f);
  CHECK_FALSE(cols.is_contiguous());

  auto row3 = m.select(0, 3);
  CHECK(row3.rank == 1);
  CHECK(row3[4] == 19.0f);
  auto col2 = m.select(1, 2);
  CHECK(col2.stride(0) == 5);
  CHECK(col2[5] == 27.0f);

  auto t = m.transposed();
  CHECK(t.size(0) == 5);
  CHECK(t.size(1) == 6);
  CHECK_FALSE(t.is_contiguous());
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j) CHECK(t(j, i) == m(i, j));

  auto r = m.reshape<3>(tk::Extents<3>{{3, 2, 5}});
  CHECK(r(2, 1, 4) == 29.0f);
  CHECK(m.flatten()[29] == 29.0f);
  CHECK(contains(error_of([&] { (void)t.flatten(); }), "non-contiguous"));
  CHECK(contains(error_of([&] { (void)m.reshape<2>(tk::Extents<2>{{4, 4}}); }), "16 elements"));
  CHECK(contains(error_of([&] { (void)m.slice(0, 4, 7); }),
                 "out of range for dimension 0 of size 6"));
  CHECK(contains(error_of([&] { (void)m.select(2, 0); }), "dimension 2 out of range for rank 2"));
}

TEST_CASE("TensorView: at() is bounds-checked and names the shape") {
  std::vector<int> buf(6, 7);
  auto v = tk::make_view(buf.data(), {2, 3});
  CHECK(v.at(1, 2) == 7);
  const std::string e = error_of([&] { (void)v.at(1, 3); });
  CHECK(contains(e, "index 3 out of bounds for dimension 1"));
  CHECK(contains(e, "[2, 3]"));
  CHECK(contains(error_of([&] { (void)v.at(-1, 0); }), "index -1"));
}

TEST_CASE("TensorView: extent-1 dimensions with odd strides still count as contiguous") {
  float x[4] = {};
  tk::TensorView<float, 2> v(x, tk::Extents<2>{{1, 4}}, tk::Extents<2>{{99, 1}});
  CHECK(v.is_contiguous());
  tk::TensorView<float, 2> broadcast(x, tk::Extents<2>{{3, 4}}, tk::Extents<2>{{0, 1}});
  CHECK_FALSE(broadcast.is_contiguous());
  CHECK(&broadcast(2, 1) == &x[1]);
}

TEST_CASE("empty shapes and views: a zero extent anywhere makes 0 elements, in any order") {
  // A Shape accepted [0, 2^40, 2^40] but refused its transpose [2^40, 2^40, 0] (its element count
  // is 0 too), so shape() of a transposed empty view threw; and numel() multiplied 2^40 * 2^40
  // (signed overflow) before reaching the 0. An empty view was also "not contiguous" unless its
  // strides happened to be the contiguous ones: flatten() and AnyTensorView::of() of an empty
  // slice threw, where PyTorch calls every empty tensor contiguous.
  std::mt19937_64 rng(20261207);
  for (int trial = 0; trial < 200; ++trial) {
    std::int64_t dims[4];
    for (std::int64_t& d : dims)
      d = std::int64_t{1} << std::uniform_int_distribution<int>(0, 40)(rng);
    dims[std::uniform_int_distribution<int>(0, 3)(rng)] = 0;
    std::vector<std::int64_t> order(dims, dims + 4);
    std::shuffle(order.begin(), order.end(), rng);
    tk::Shape shape;
    CHECK_NOTHROW(shape = tk::Shape(std::span<const std::int64_t>(order)));
    CHECK(shape.numel() == 0);
    tk::Tensor<float> empty{tk::Shape(std::span<const std::int64_t>(dims))};
    auto v = empty.view<4>();
    const int d0 = std::uniform_int_distribution<int>(0, 3)(rng);
    const int d1 = std::uniform_int_distribution<int>(0, 3)(rng);
    const auto t = v.transposed(d0, d1);
    CHECK(t.numel() == 0);
    CHECK(t.empty());
    CHECK(t.is_contiguous());
    CHECK(t.shape().numel() == 0);
    CHECK(t.flatten().numel() == 0);
    CHECK(tk::AnyTensorView::of(tk::HostView<const float, 4>(t)).bytes() == 0);
  }
  // Without a zero extent the count must still fit, in every order.
  CHECK(contains(error_of([] { tk::Shape{1ll << 40, 1, 1ll << 40}; }), "overflows"));
  CHECK(contains(error_of([] {
                   tk::Shape{1, 1ll << 40, 1ll << 40};
                 }),
                 "shape [1, 1099511627776, 1099511627776] overflows"));
  // Empty slices of ordinary tensors, at random extents and dimensions.
  for (int trial = 0; trial < 100; ++trial) {
    std::uniform_int_distribution<std::int64_t> extent(1, 5);
    auto t = tk::HostTensor<float>::zeros({extent(rng), extent(rng), extent(rng)});
    const int dim = std::uniform_int_distribution<int>(0, 2)(rng);
    const std::int64_t at = std::uniform_int_distribution<std::int64_t>(0, t.size(dim))(rng);
    const auto slice = t.view<3>().slice(dim, at, at);
    CHECK(slice.is_contiguous());
    CHECK(slice.flatten().numel() == 0);
    CHECK(slice.reshape<2>({{0, 7}}).numel() == 0);
    CHECK(tk::AnyTensorView::of(tk::HostView<const float, 3>(slice)).numel() == 0);
    CHECK(tk::AnyTensor::copy_of(slice).shape() == slice.shape());
    tk::Tensor<float> dst(slice.shape());
    CHECK_NOTHROW(tk::copy(dst.view<3>(), tk::HostView<const float, 3>(slice)));
  }
}

TEST_CASE("default-constructed and moved-from tensors are empty, not a scalar without memory") {
  // They kept shape [] (or their old shape) with no memory: numel() 1 (or the old count) over a
  // null pointer, so clone(), fill() and copying a StateDict holding one read or wrote null, and
  // `if (t.numel() == 0) allocate` never allocated.
  tk::Tensor<float> t;
  REQUIRE(t.numel() == 0);
  CHECK(t.bytes() == 0);
  CHECK(t.empty());
  CHECK(t.shape() == tk::Shape{0});
  CHECK(t.flat().numel() == 0);
  t.fill(1.0f);
  CHECK(t.clone().empty());
  tk::AnyTensor a;
  REQUIRE(a.numel() == 0);
  CHECK(a.bytes() == 0);
  CHECK(tk::AnyTensorView().bytes() == 0);
  CHECK(tk::AnyTensor::copy_of(a.view()).bytes() == 0);
  tk::StateDict sd;
  (void)sd.tensors["unset"];  // operator[] default-constructs
  const tk::StateDict copy = sd;
  CHECK(copy.tensor("unset").numel() == 0);

  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_int_distribution<std::int64_t> extent(0, 6);
    const tk::Shape shape = trial % 5 == 0 ? tk::Shape{} : tk::Shape{extent(rng), extent(rng)};
    auto src = tk::HostTensor<float>::full(shape, 2.0f);
    tk::Tensor<float> moved(std::move(src));
    CHECK(moved.shape() == shape);
    REQUIRE(src.numel() == 0);  // NOLINT(bugprone-use-after-move): the state is specified
    CHECK(src.data() == nullptr);
    CHECK(src.clone().numel() == 0);
    tk::Tensor<float> assigned;
    assigned = std::move(moved);
    CHECK(assigned.shape() == shape);
    CHECK(moved.numel() == 0);                       // NOLINT(bugprone-use-after-move)
    moved = tk::HostTensor<float>::full({3}, 1.0f);  // reusable
    CHECK(moved.numel() == 3);

    tk::AnyTensor any(tk::DType::kBF16, shape);
    tk::AnyTensor any_moved(std::move(any));
    CHECK(any_moved.shape() == shape);
    CHECK(any_moved.dtype() == tk::DType::kBF16);
    REQUIRE(any.numel() == 0);  // NOLINT(bugprone-use-after-move)
    CHECK(any.bytes() == 0);
    CHECK(tk::AnyTensor::copy_of(any.view()).bytes() == 0);
    tk::AnyTensor any_assigned;
    any_assigned = std::move(any_moved);
    CHECK(any_assigned.shape() == shape);
    CHECK(any_moved.bytes() == 0);  // NOLINT(bugprone-use-after-move)
  }
}

TEST_CASE("Tensor: allocation, alignment, views, fill, clone") {
  auto t = tk::HostTensor<float>::zeros({3, 4});
  CHECK(t.numel() == 12);
  CHECK(t.bytes() == 48);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % tk::kHostAlignment == 0);
  CHECK(t.dtype() == tk::DType::kF32);
  for (std::int64_t i = 0; i < 12; ++i) CHECK(t.data()[i] == 0.0f);
  auto v = t.view<2>();
  v(2, 3) = 5.0f;
  CHECK(t.data()[11] == 5.0f);
  CHECK(contains(error_of([&] { (void)t.view<3>(); }), "view<3>() of a tensor of rank 2"));

  auto c = t.clone();
  c.fill(1.5f);
  CHECK(t.data()[0] == 0.0f);
  CHECK(c.data()[7] == 1.5f);

  t.reshape({12});
  CHECK(t.view<1>()[11] == 5.0f);
  CHECK(contains(error_of([&] { t.reshape({5}); }), "changes the element count"));

  tk::HostTensor<double> empty({0, 5});
  CHECK(empty.empty());
  CHECK(empty.clone().numel() == 0);

  tk::HostTensor<int> moved = tk::HostTensor<int>::full({4}, 9);
  tk::HostTensor<int> into = std::move(moved);
  CHECK(into.data()[3] == 9);
  CHECK(moved.data() == nullptr);  // NOLINT: moved-from is empty by contract
}

TEST_CASE("Tensor: pinned memory falls back to aligned host memory without a device") {
  tk::HostTensor<float> p({1024}, tk::MemoryKind::kPinned);
  CHECK(p.data() != nullptr);
  CHECK((p.memory_kind() == tk::MemoryKind::kPinned || p.memory_kind() == tk::MemoryKind::kHost));
  p.fill(2.0f);
  CHECK(p.data()[1023] == 2.0f);
#if !TRAINKIT_WITH_CUDA
  CHECK(p.memory_kind() == tk::MemoryKind::kHost);
  CHECK(contains(error_of([] { tk::DeviceTensor<float> d({4}); }), "built without CUDA"));
#else
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    CHECK(p.memory_kind() == tk::MemoryKind::kHost);
    CHECK(contains(error_of([] { tk::DeviceTensor<float> d({4}); }), "device memory"));
  }
#endif
}

TEST_CASE("copy: host strided copies, transposes and shape errors") {
  std::vector<int> a(12), b(12, -1);
  std::iota(a.begin(), a.end(), 0);
  auto src = tk::make_view(a.data(), {3, 4});
  auto dst = tk::make_view(b.data(), {4, 3});
  tk::copy(dst, tk::HostView<const int, 2>(src.transposed()));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(dst(i, j) == src(j, i));

  // Strided destination: every other column.
  std::vector<int> wide(3 * 8, 0);
  auto w = tk::make_view(wide.data(), {3, 8});
  tk::HostView<int, 2> every_other(wide.data(), tk::Extents<2>{{3, 4}}, tk::Extents<2>{{8, 2}});
  tk::copy(every_other, src);
  CHECK(w(2, 6) == src(2, 3));
  CHECK(w(2, 7) == 0);

  const std::string e = error_of([&] { tk::copy(dst, src); });
  CHECK(contains(e, "destination shape [4, 3] differs from source shape [3, 4]"));

  auto t = tk::HostTensor<int>::full({2, 2}, 3);
  tk::HostTensor<int> u({2, 2});
  tk::copy(u, t);
  CHECK(u.data()[3] == 3);
  auto h = tk::to_space<tk::Space::kHost>(t);
  CHECK(h.data()[0] == 3);
}

TEST_CASE("AnyTensor: typed access checks dtype and rank; copies of strided views") {
  tk::AnyTensor a(tk::DType::kI32, {2, 3});
  CHECK(a.bytes() == 24);
  auto v = a.as<std::int32_t, 2>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) v(i, j) = i * 10 + j;
  CHECK(contains(error_of([&] { (void)a.as<float, 2>(); }), "tensor holds I32, requested F32"));
  CHECK(contains(error_of([&] { (void)a.as<std::int32_t, 1>(); }), "requested rank 1"));

  tk::AnyTensorView view = a;
  CHECK(view.as<std::int32_t, 2>()(1, 2) == 12);

  auto t = tk::AnyTensor::copy_of(v.transposed());
  CHECK(t.shape() == tk::Shape{3, 2});
  CHECK(t.as<std::int32_t, 2>()(2, 1) == 12);
  auto c = tk::AnyTensor::copy_of(view);
  CHECK(c.as<std::int32_t, 2>()(1, 0) == 10);

  std::vector<double> d(4, 1.25);
  auto dv = tk::AnyTensorView::of(tk::make_view(d.data(), {4}));
  CHECK(dv.dtype() == tk::DType::kF64);
  CHECK(dv.as<double, 1>()[3] == 1.25);

  tk::AnyTensor scalar(tk::DType::kF32, tk::Shape{});
  scalar.as<float, 0>()() = 4.0f;
  CHECK(scalar.as<float, 0>()() == 4.0f);
}

TEST_CASE("DType names round-trip and sizes") {
  for (tk::DType t : tk::kAllDTypes) CHECK(tk::parse_dtype(tk::dtype_name(t)) == t);
  CHECK(tk::dtype_size(tk::DType::kBF16) == 2);
  CHECK(tk::dtype_size(tk::DType::kF8E4M3) == 1);
  CHECK(tk::dtype_of<std::int64_t> == tk::DType::kI64);
  CHECK(contains(error_of([] { (void)tk::parse_dtype("F128"); }), "unknown dtype 'F128'"));
  CHECK(contains(error_of([] { (void)tk::parse_dtype("F\n32\x1b"); }),
                 "unknown dtype 'F\\x0a32\\x1b'"));
}

TEST_CASE("StateDict: values from a file are shown escaped and bounded in errors") {
  // The text of a value comes from a checkpoint: it was pasted raw into the message (terminal
  // escapes, newlines, any bytes, any length).
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string text(std::uniform_int_distribution<std::size_t>(1, 600)(rng), 'x');
    for (char& c : text)
      if (rng() % 3 == 0) c = static_cast<char>(rng() % 256);
    text[0] = '\x1b';  // never a number
    tk::StateDict sd;
    sd.set("step", text);
    const std::string key = std::string("bad\nkey\x07") + std::to_string(trial);
    sd.set(key, text);
    for (const std::string& k : {std::string("step"), key}) {
      for (const std::string& e :
           {error_of([&] { (void)sd.get_int(k); }), error_of([&] { (void)sd.get_u64(k); }),
            error_of([&] { (void)sd.get_double(k); })}) {
        CHECK(contains(e, "' is '\\x1b"));
        CHECK(std::none_of(e.begin(), e.end(), [](char c) {
          const auto u = static_cast<unsigned char>(c);
          return u < 0x20 || u >= 0x7f;
        }));
        CHECK(e.size() < 4 * 200 + 400);  // at most 200 bytes of the value, 4 characters each
      }
    }
    CHECK(contains(error_of([&] { (void)sd.get_string(key + "?"); }), "bad\\x0akey\\x07"));
    CHECK(contains(error_of([&] { (void)sd.tensor(key); }), "missing tensor 'bad\\x0akey"));
  }
  tk::StateDict sd;
  sd.set("small", std::int64_t{-1});
  CHECK(contains(error_of([&] { (void)sd.get_u64("small"); }),
                 "state dict: 'small' is '-1', not an unsigned integer"));
}

TEST_CASE("check_saved_setting shows both values exactly and escapes saved text") {
  // Values were printed with the stream's 6 significant digits ("saved with p = 0.1 but this one
  // has p = 0.1") and saved text raw.
  const auto message = [](const auto& saved, const auto& here) {
    return error_of([&] { tk::check_saved_setting("Thing", "p", saved, here); });
  };
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const double saved = std::uniform_real_distribution<double>(-10, 10)(rng);
    const double here = std::nextafter(saved, trial % 2 ? 100.0 : -100.0);
    const std::string e = message(saved, here);
    const std::string a = tk::StateDict::number_to_string(saved);
    const std::string b = tk::StateDict::number_to_string(here);
    REQUIRE(a != b);
    CHECK(contains(e, "saved with p = " + a + " but this one has p = " + b + ";"));
    const float fs = static_cast<float>(saved);
    const float fh = std::nextafter(fs, 100.0f);
    char buf[2][32];
    const auto ea = std::to_chars(buf[0], buf[0] + 32, fs).ptr;
    const auto eb = std::to_chars(buf[1], buf[1] + 32, fh).ptr;
    CHECK(contains(message(fs, fh), "p = " + std::string(buf[0], ea) +
                                        " but this one has p = " + std::string(buf[1], eb) + ";"));
  }
  CHECK(contains(message(std::string("2:4\x1b[2J\n"), std::string("2:4")),
                 "saved with p = 2:4\\x1b[2J\\x0a but this one has p = 2:4;"));
  CHECK(contains(message(std::uint64_t{7}, std::uint64_t{8}), "p = 7 but this one has p = 8;"));
  CHECK(contains(message(std::int8_t{-3}, std::int8_t{65}), "p = -3 but this one has p = 65;"));
  CHECK(message(0.5, 0.5).empty());
}
