// Shapes, views (slicing, strides, transposes, reshapes), owning tensors, type-erased tensors and
// copies between spaces.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <trainkit/core/any_tensor.hpp>
#include <trainkit/core/copy.hpp>
#include <trainkit/core/shape.hpp>
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
}
