// Helpers of the dist tests (ThreadComm here, MpiComm in tests/dist_mpi): deterministic inputs
// per (case, rank, element), the list of collective cases (every op, dtype and the sizes 0, 1,
// world_size-1 and primes), and a checker that runs one case on a communicator and compares every
// element with a float64 reference (integers and data movement exactly) and, for ThreadComm,
// bitwise with its documented summation order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <trainkit/core/dtype.hpp>
#include <trainkit/core/half.hpp>
#include <trainkit/dist/comm.hpp>
#include <trainkit/dist/host_reduce.hpp>
#include <trainkit/dist/thread_comm.hpp>

namespace disttest {

namespace tk = trainkit;
namespace dist = trainkit::dist;

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Input element i of `rank` for the case with `seed`: floats uniform in [-1, 1) rounded to T,
/// integers in [-1000, 1000].
template <class T>
T value(std::uint64_t seed, int rank, std::int64_t i) {
  const std::uint64_t h = mix(seed * 0x100000001b3ull ^ mix(static_cast<std::uint64_t>(rank) << 40 ^
                                                            static_cast<std::uint64_t>(i)));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(h % 2001) - 1000);
  } else {
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    if constexpr (std::is_same_v<T, double>) {
      return u;
    } else {
      return T(static_cast<float>(u));
    }
  }
}

template <class T>
std::vector<T> values(std::uint64_t seed, int rank, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value<T>(seed, rank, i);
  return v;
}

template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, tk::bf16> || std::is_same_v<T, tk::f16>) {
    return static_cast<double>(static_cast<float>(x));
  } else {
    return static_cast<double>(x);
  }
}

/// Bitwise equality (NaN-safe, -0 != +0).
template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

struct Case {
  Kind kind = Kind::kAllReduce;
  dist::ReduceOp op = dist::ReduceOp::kSum;
  tk::DType dtype = tk::DType::kF32;
  std::int64_t count = 0;  // all_reduce/broadcast buffer; per-rank segment otherwise
  int root = 0;
  bool in_place = false;
  std::uint64_t seed = 0;

  std::string name() const {
    static const char* kinds[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
    std::string s = kinds[static_cast<int>(kind)];
    if (kind == Kind::kAllReduce || kind == Kind::kReduceScatter)
      (s += '/') += dist::reduce_op_name(op);
    if (kind == Kind::kBroadcast) (s += "/root") += std::to_string(root);
    if (in_place) s += "/in-place";
    return s + " " + std::string(tk::dtype_name(dtype)) + " count " + std::to_string(count);
  }
};

/// Every op (all reductions, both ends as broadcast root, in-place variants) x every reducible
/// dtype x sizes {0, 1, world_size-1, 7, 13, 1031, 4099}.
inline std::vector<Case> all_cases(int world_size) {
  const tk::DType dtypes[] = {tk::DType::kF32, tk::DType::kBF16, tk::DType::kF16,
                              tk::DType::kF64, tk::DType::kI32,  tk::DType::kI64};
  const dist::ReduceOp ops[] = {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax,
                                dist::ReduceOp::kMin};
  std::vector<std::int64_t> sizes = {0, 1, 7, 13, 1031, 4099};
  if (world_size > 2) sizes.push_back(world_size - 1);
  std::vector<Case> out;
  std::uint64_t seed = 1;
  for (tk::DType t : dtypes) {
    for (std::int64_t n : sizes) {
      for (dist::ReduceOp op : ops) {
        out.push_back({Kind::kAllReduce, op, t, n, 0, false, seed++});
        out.push_back({Kind::kReduceScatter, op, t, n, 0, false, seed++});
      }
      out.push_back({Kind::kReduceScatter, dist::ReduceOp::kSum, t, n, 0, true, seed++});
      out.push_back({Kind::kAllGather, dist::ReduceOp::kSum, t, n, 0, false, seed++});
      out.push_back({Kind::kAllGather, dist::ReduceOp::kSum, t, n, 0, true, seed++});
      out.push_back({Kind::kBroadcast, dist::ReduceOp::kSum, t, n, 0, false, seed++});
      out.push_back({Kind::kBroadcast, dist::ReduceOp::kSum, t, n, world_size - 1, false, seed++});
    }
  }
  return out;
}

/// Allowed |got - f64 reference| of a reduction over `world_size` values in [-1, 1]: each of the
/// world_size - 1 steps rounds once in T (16-bit floats: from f32), plus the division of an
/// average.
template <class T>
double tolerance(int world_size) {
  double eps = 0.0;
  if constexpr (std::is_same_v<T, float>) eps = 0x1.0p-24;
  if constexpr (std::is_same_v<T, double>) eps = 0x1.0p-53;
  if constexpr (std::is_same_v<T, tk::bf16>) eps = 0x1.0p-8;
  if constexpr (std::is_same_v<T, tk::f16>) eps = 0x1.0p-11;
  return eps * 2.0 * world_size * world_size;
}

/// op over the world_size's values of element `idx` in float64 (integers: exact, average
/// truncated).
template <class T>
double reference(const Case& c, int world_size, std::int64_t idx) {
  if constexpr (std::is_integral_v<T>) {
    std::int64_t acc = static_cast<std::int64_t>(value<T>(c.seed, 0, idx));
    for (int r = 1; r < world_size; ++r) {
      const auto x = static_cast<std::int64_t>(value<T>(c.seed, r, idx));
      if (c.op == dist::ReduceOp::kMax) acc = std::max(acc, x);
      else if (c.op == dist::ReduceOp::kMin) acc = std::min(acc, x);
      else acc += x;
    }
    if (c.op == dist::ReduceOp::kAvg) acc /= world_size;
    return static_cast<double>(acc);
  } else {
    double acc = to_double(value<T>(c.seed, 0, idx));
    for (int r = 1; r < world_size; ++r) {
      const double x = to_double(value<T>(c.seed, r, idx));
      if (c.op == dist::ReduceOp::kMax) acc = std::max(acc, x);
      else if (c.op == dist::ReduceOp::kMin) acc = std::min(acc, x);
      else acc += x;
    }
    if (c.op == dist::ReduceOp::kAvg) acc /= world_size;
    return acc;
  }
}

/// ThreadComm's documented order (dist::detail::ring_chain_start) for element `idx` of
/// `segment`, computed with the same per-step arithmetic.
template <class T>
T chain_reference(const Case& c, int world_size, int segment, std::int64_t idx) {
  const int start = dist::detail::ring_chain_start(segment, world_size);
  T acc = value<T>(c.seed, start, idx);
  const dist::ReduceOp op = c.op == dist::ReduceOp::kAvg ? dist::ReduceOp::kSum : c.op;
  for (int j = 1; j < world_size; ++j) {
    const T x = value<T>(c.seed, (start + j) % world_size, idx);
    const int divisor = (j == world_size - 1 && c.op == dist::ReduceOp::kAvg) ? world_size : 1;
    dist::detail::combine_typed<T>(op, &acc, &x, &acc, 1, divisor);
  }
  return acc;
}

inline std::string describe_error(const Case& c, int rank, std::int64_t i, double got,
                                  double want) {
  char text[96];
  std::snprintf(text, sizeof text, " is %.17g, expected %.17g", got, want);
  return c.name() + ": rank " + std::to_string(rank) + " element " + std::to_string(i) + text;
}

/// Runs `c` on `comm` (every rank calls it with the same case) and returns "" when every element
/// of this rank's result is right, else the first wrong one. `chain_order`: also require the
/// bits of ThreadComm's summation order.
template <class T>
std::string run_case_typed(dist::Comm& comm, const Case& c, bool chain_order) {
  const int world_size = comm.world_size(), rank = comm.rank();
  const std::int64_t n = c.count;
  auto check_reduced = [&](std::int64_t i, T got, int segment, std::int64_t idx) -> std::string {
    const double want = reference<T>(c, world_size, idx);
    const double g = to_double(got);
    if (c.op == dist::ReduceOp::kMax || c.op == dist::ReduceOp::kMin || std::is_integral_v<T>) {
      if (g != want) return describe_error(c, rank, i, g, want);
    } else if (!(std::fabs(g - want) <= tolerance<T>(world_size))) {
      return describe_error(c, rank, i, g, want);
    }
    if (chain_order) {
      const T bits = chain_reference<T>(c, world_size, segment, idx);
      if (!same_bits(got, bits))
        return describe_error(c, rank, i, g, to_double(bits)) + " (not the documented order)";
    }
    return {};
  };

  switch (c.kind) {
    case Kind::kAllReduce: {
      std::vector<T> buf = values<T>(c.seed, rank, n);
      comm.all_reduce(std::span<T>(buf), c.op).wait();
      int segment = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        while ((segment + 1) * n / world_size <= i) ++segment;
        if (auto e = check_reduced(i, buf[static_cast<std::size_t>(i)], segment, i); !e.empty())
          return e;
      }
      return {};
    }
    case Kind::kReduceScatter: {
      std::vector<T> send = values<T>(c.seed, rank, n * world_size);
      std::vector<T> out(static_cast<std::size_t>(n), value<T>(99, rank, 0));
      std::span<T> recv(out);
      if (c.in_place)
        recv = std::span<T>(send).subspan(static_cast<std::size_t>(rank * n), out.size());
      comm.reduce_scatter(std::span<T>(send), recv, c.op).wait();
      for (std::int64_t i = 0; i < n; ++i)
        if (auto e = check_reduced(i, recv[static_cast<std::size_t>(i)], rank, rank * n + i);
            !e.empty())
          return e;
      return {};
    }
    case Kind::kAllGather: {
      std::vector<T> recv(static_cast<std::size_t>(n * world_size), value<T>(98, rank, 0));
      std::vector<T> own = values<T>(c.seed, rank, n);
      std::span<T> send(own);
      if (c.in_place) {
        send = std::span<T>(recv).subspan(static_cast<std::size_t>(rank * n), own.size());
        std::copy(own.begin(), own.end(), send.begin());
      }
      comm.all_gather(send, std::span<T>(recv)).wait();
      for (int r = 0; r < world_size; ++r)
        for (std::int64_t i = 0; i < n; ++i) {
          const T want = value<T>(c.seed, r, i);
          const T got = recv[static_cast<std::size_t>(r * n + i)];
          if (!same_bits(got, want))
            return describe_error(c, rank, r * n + i, to_double(got), to_double(want));
        }
      return {};
    }
    case Kind::kBroadcast: {
      std::vector<T> buf = values<T>(c.seed, rank, n);
      comm.broadcast(std::span<T>(buf), c.root).wait();
      for (std::int64_t i = 0; i < n; ++i) {
        const T want = value<T>(c.seed, c.root, i);
        if (!same_bits(buf[static_cast<std::size_t>(i)], want))
          return describe_error(c, rank, i, to_double(buf[static_cast<std::size_t>(i)]),
                                to_double(want));
      }
      return {};
    }
  }
  return "unknown case";
}

inline std::string run_case(dist::Comm& comm, const Case& c, bool chain_order) {
  std::string result;
  dist::detail::visit_reducible(
      c.dtype, [&](auto tag) { result = run_case_typed<decltype(tag)>(comm, c, chain_order); });
  return result;
}

}  // namespace disttest
