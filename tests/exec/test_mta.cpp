// Tests for exec/multi_tensor_apply.hpp: on the Host every element of every tensor is visited
// exactly once with the right tensor index and the right arrays, for depths 1..5 with mixed
// element types and odd sizes; the CUDA launch planner (host code) covers every chunk exactly
// once within the kernel-argument tables, carrying a cut tensor over to the next launch.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <trainkit/exec/multi_tensor_apply.hpp>

namespace {

namespace exec = trainkit::exec;
namespace detail = trainkit::exec::detail;

// The value array k of tensor t holds at element i (fits every element type used here).
template <class T>
T value_of(int k, int t, std::int64_t i) {
  return static_cast<T>((t * 31 + i * 7 + k) % 101);
}

// Adds tensor + 1 to hits[i] (so a double visit or a wrong tensor index shows), then writes the
// expected value to each writable array and checks it in each read-only one.
struct Visit {
  std::atomic<std::int64_t>* errors;

  template <class... Ps>
  void operator()(int t, std::int64_t i, std::uint32_t* hits, Ps*... arrays) const {
    std::atomic_ref<std::uint32_t>(hits[i]).fetch_add(static_cast<std::uint32_t>(t + 1),
                                                      std::memory_order_relaxed);
    int k = 1;
    (visit(arrays, k++, t, i), ...);
  }
  template <class P>
  void visit(P* array, int k, int t, std::int64_t i) const {
    using T = std::remove_const_t<P>;
    if constexpr (std::is_const_v<P>) {
      if (array[i] != value_of<T>(k, t, i)) errors->fetch_add(1, std::memory_order_relaxed);
    } else {
      array[i] = value_of<T>(k, t, i);
    }
  }
};

// Owns the arrays of a TensorList<uint32_t, Ts...> with the given tensor sizes.
template <class... Ts>
struct Tensors {
  std::vector<std::int64_t> sizes;
  std::vector<std::vector<std::uint32_t>> hits;
  std::tuple<std::vector<std::vector<std::remove_const_t<Ts>>>...> arrays;
  exec::TensorList<std::uint32_t, Ts...> list;

  explicit Tensors(std::vector<std::int64_t> tensor_sizes) : sizes(std::move(tensor_sizes)) {
    fill(std::index_sequence_for<Ts...>{});
  }

  template <std::size_t... K>
  void fill(std::index_sequence<K...>) {
    const int count = static_cast<int>(sizes.size());
    hits.resize(sizes.size());
    (std::get<K>(arrays).resize(sizes.size()), ...);
    for (int t = 0; t < count; ++t) {
      const std::int64_t n = sizes[static_cast<std::size_t>(t)];
      hits[static_cast<std::size_t>(t)].assign(static_cast<std::size_t>(n), 0);
      (init_array<K>(t, n), ...);
      const int index = list.add(n, hits[static_cast<std::size_t>(t)].data(),
                                 std::get<K>(arrays)[static_cast<std::size_t>(t)].data()...);
      REQUIRE(index == t);
    }
  }
  template <std::size_t K>
  void init_array(int t, std::int64_t n) {
    using P = std::tuple_element_t<K, std::tuple<Ts...>>;
    using T = std::remove_const_t<P>;
    auto& array = std::get<K>(arrays)[static_cast<std::size_t>(t)];
    array.assign(static_cast<std::size_t>(n), T{});
    if constexpr (std::is_const_v<P>)
      for (std::int64_t i = 0; i < n; ++i)
        array[static_cast<std::size_t>(i)] = value_of<T>(static_cast<int>(K) + 1, t, i);
  }

  // Number of elements whose hit count or value is wrong.
  std::int64_t wrong() const { return wrong(std::index_sequence_for<Ts...>{}); }
  template <std::size_t... K>
  std::int64_t wrong(std::index_sequence<K...>) const {
    std::int64_t bad = 0;
    for (int t = 0; t < static_cast<int>(sizes.size()); ++t) {
      for (std::int64_t i = 0; i < sizes[static_cast<std::size_t>(t)]; ++i) {
        bad += hits[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] !=
               static_cast<std::uint32_t>(t + 1);
        ((bad += std::get<K>(arrays)[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] !=
                 value_of<std::remove_const_t<std::tuple_element_t<K, std::tuple<Ts...>>>>(
                     static_cast<int>(K) + 1, t, i)),
         ...);
      }
    }
    return bad;
  }
};

const std::vector<std::int64_t> kOddSizes = {0,       1, 65535, 65536, 65537, 3 * 65536 + 5,
                                             1000003, 7, 0,     33};

std::vector<std::int64_t> many_sizes(int count) {
  std::mt19937 rng(1234);
  std::vector<std::int64_t> sizes;
  for (int t = 0; t < count; ++t)
    sizes.push_back(t % 50 == 49 ? 70000 + static_cast<std::int64_t>(rng() % 130000)
                                 : static_cast<std::int64_t>(rng() % 5000));
  sizes[3] = 0;
  return sizes;
}

template <class... Ts>
void check_host(const std::vector<std::int64_t>& sizes, std::initializer_list<int> thread_counts) {
  for (int threads : thread_counts) {
    Tensors<Ts...> tensors(sizes);
    std::atomic<std::int64_t> errors{0};
    exec::multi_tensor_apply(exec::Host(threads), tensors.list, Visit{&errors});
    CHECK_MESSAGE(errors.load() == 0, "depth ", sizeof...(Ts) + 1, ", ", threads, " threads");
    CHECK_MESSAGE(tensors.wrong() == 0, "depth ", sizeof...(Ts) + 1, ", ", threads, " threads");
  }
}

// Runs the CUDA planner on the host and checks each (tensor, chunk) is covered exactly once,
// within the table limits, with the right arrays and lengths. Returns the launches' block counts.
template <class Limits, class... Ts>
std::vector<int> check_plan(const exec::TensorList<Ts...>& list) {
  using Meta = detail::MtaMeta<Limits, sizeof...(Ts)>;
  static_assert(sizeof(Meta) + 256 <= Limits::kParamBytes, "tables leave room for the functor");
  std::map<std::pair<int, std::int64_t>, int> seen;
  std::vector<int> launches;
  bool consistent = true;
  Meta meta;
  detail::mta_plan<Limits>(list, meta, [&](const Meta& m, int blocks) {
    launches.push_back(blocks);
    consistent = consistent && blocks >= 1 && blocks <= Meta::kMaxBlocks;
    for (int b = 0; b < blocks; ++b) {
      const int slot = m.block_slot[b];
      consistent = consistent && slot < Meta::kMaxTensors;
      const int t = m.tensor_index[slot];
      consistent = consistent && t >= 0 && t < list.size() && m.numel[slot] == list.numel(t);
      std::apply(
          [&](auto*... arrays) {
            int d = 0;
            ((consistent = consistent && m.arrays[d++][slot] == detail::mta_address(arrays)), ...);
          },
          list.pointers(t));
      ++seen[{t, m.block_chunk[b]}];
    }
  });
  CHECK(consistent);
  std::int64_t expected_blocks = 0;
  for (int t = 0; t < list.size(); ++t) {
    const std::int64_t chunks = (list.numel(t) + exec::kMtaChunk - 1) / exec::kMtaChunk;
    expected_blocks += chunks;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const auto it = seen.find({t, c});
      CHECK_MESSAGE((it != seen.end() && it->second == 1), "tensor ", t, " chunk ", c);
    }
  }
  CHECK(static_cast<std::int64_t>(seen.size()) == expected_blocks);
  return launches;
}

}  // namespace

TEST_CASE("multi_tensor_apply(Host): odd sizes, depths 1..5, mixed element types") {
  check_host<>(kOddSizes, {1, 3, 8});
  check_host<const double>(kOddSizes, {1, 3, 8});
  check_host<float, std::int16_t>(kOddSizes, {1, 3, 8});
  check_host<const float, double, std::int64_t>(kOddSizes, {1, 3, 8});
  check_host<float, const double, std::uint8_t, std::int32_t>(kOddSizes, {1, 3, 8});
}

TEST_CASE("multi_tensor_apply(Host): 500 tensors, more than one CUDA launch holds") {
  check_host<float, const float, double>(many_sizes(500), {1, 2, 8});
}

TEST_CASE("multi_tensor_apply(Host): empty lists and lists of empty tensors do nothing") {
  exec::TensorList<float> list;
  int calls = 0;
  const auto count = [&](int, std::int64_t, float*) { ++calls; };
  exec::multi_tensor_apply(exec::Host(2), list, count);
  float dummy = 0;
  list.add(0, nullptr);
  list.add(0, &dummy);
  exec::multi_tensor_apply(exec::Host(2), list, count);
  CHECK(calls == 0);
  CHECK(list.size() == 2);
  CHECK(list.total_numel() == 0);
  CHECK_THROWS_AS(list.add(-1, &dummy), trainkit::Error);
  CHECK_THROWS_AS(list.add(5, nullptr), trainkit::Error);
}

TEST_CASE("TensorList: offsets and tensor_at") {
  Tensors<float> tensors({3, 0, 5, 0, 0, 2});
  const auto& list = tensors.list;
  CHECK(list.total_numel() == 10);
  CHECK(list.offset(2) == 3);
  CHECK(list.numel(1) == 0);
  const int expected[10] = {0, 0, 0, 2, 2, 2, 2, 2, 5, 5};
  for (int i = 0; i < 10; ++i) CHECK(list.tensor_at(i) == expected[i]);
  // Sizes whose sum passes 2^63 - 1 are refused (the total wrapped negative: nothing ran).
  float x = 0.0f;
  exec::TensorList<float> huge;
  huge.add(std::int64_t{1} << 62, &x);
  huge.add((std::int64_t{1} << 62) - 1, &x);
  CHECK_THROWS_WITH_AS(huge.add(std::int64_t{1} << 62, &x),
                       doctest::Contains("takes the list past 2^63 - 1 elements"), trainkit::Error);
  CHECK(huge.size() == 2);
}

TEST_CASE("multi_tensor_apply(Cuda) planner: coverage and limits, 4 KB and 32 KB tables") {
  {
    Tensors<float, const float, double> tensors(many_sizes(500));
    check_plan<detail::MtaLimitsSmall>(tensors.list);
    check_plan<detail::MtaLimitsLarge>(tensors.list);
  }
  {
    Tensors<> tensors(kOddSizes);
    check_plan<detail::MtaLimitsSmall>(tensors.list);
    check_plan<detail::MtaLimitsLarge>(tensors.list);
  }
  {
    Tensors<float, const double, std::uint8_t, std::int32_t> tensors(kOddSizes);
    check_plan<detail::MtaLimitsSmall>(tensors.list);
    check_plan<detail::MtaLimitsLarge>(tensors.list);
  }
}

TEST_CASE("multi_tensor_apply(Cuda) planner: when a new launch starts") {
  // 500 one-element tensors at depth 4: the tensor table (36 with 4 KB arguments) decides.
  {
    Tensors<float, float, float> tensors(std::vector<std::int64_t>(500, 1));
    const auto launches = check_plan<detail::MtaLimitsSmall>(tensors.list);
    CHECK(launches.size() == 14);  // ceil(500 / 36)
    CHECK(launches.front() == 36);
    CHECK(launches.back() == 500 - 13 * 36);
    CHECK(check_plan<detail::MtaLimitsLarge>(tensors.list).size() == 2);  // ceil(500 / 252)
  }
  // Two tensors of 200 chunks: the block table (320) fills inside the second one, which is
  // carried over as slot 0 of the second launch, starting at its chunk 120.
  {
    Tensors<> tensors({200 * exec::kMtaChunk, 200 * exec::kMtaChunk});
    using Meta = detail::MtaMeta<detail::MtaLimitsSmall, 1>;
    std::vector<std::tuple<int, int, int>> first_blocks;  // (blocks, tensor, chunk) per launch
    Meta meta;
    detail::mta_plan<detail::MtaLimitsSmall>(tensors.list, meta, [&](const Meta& m, int blocks) {
      first_blocks.emplace_back(blocks, m.tensor_index[m.block_slot[0]], m.block_chunk[0]);
      if (first_blocks.size() == 2) {
        CHECK(m.block_slot[0] == 0);
        CHECK(m.block_slot[blocks - 1] == 0);
        CHECK(m.block_chunk[blocks - 1] == 199);
      }
    });
    REQUIRE(first_blocks.size() == 2);
    CHECK(first_blocks[0] == std::make_tuple(320, 0, 0));
    CHECK(first_blocks[1] == std::make_tuple(80, 1, 120));
  }
  // One tensor larger than a launch: 320 + 1 blocks.
  {
    Tensors<> tensors({320 * exec::kMtaChunk + 1});
    const auto launches = check_plan<detail::MtaLimitsSmall>(tensors.list);
    CHECK(launches == std::vector<int>{320, 1});
  }
}

TEST_CASE("multi_tensor_apply(Cuda) planner: tables fit the kernel-argument limits") {
  CHECK(sizeof(detail::MtaMeta<detail::MtaLimitsSmall, 1>) <= 4096 - 256);
  CHECK(sizeof(detail::MtaMeta<detail::MtaLimitsSmall, 4>) <= 4096 - 256);
  CHECK(sizeof(detail::MtaMeta<detail::MtaLimitsSmall, 8>) <= 4096 - 256);
  CHECK(sizeof(detail::MtaMeta<detail::MtaLimitsLarge, 1>) <= 32764 - 256);
  CHECK(sizeof(detail::MtaMeta<detail::MtaLimitsLarge, 8>) <= 32764 - 256);
}
