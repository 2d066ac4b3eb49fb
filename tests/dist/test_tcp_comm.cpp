// TcpComm over loopback, ranks as threads of this process (each with its own TcpComm, a fresh
// port per group): every collective x dtype x op x size against float64 references and bitwise
// against ThreadComm's documented order, random sizes up to a few MB bitwise equal to ThreadComm
// (NaN and signed zeros included), asynchronous issue order, GradBucketer over TcpComm; the
// bootstrap's errors (a rank that never arrives, disagreeing world sizes, a duplicate rank, a
// foreign service, a busy port, another protocol version); faults (a stalled rank, a rank that
// throws, leaves or is destroyed mid-collective, mismatched calls); and real processes (fork)
// started with torchrun's variables that meet through dist::init, including one that dies
// mid-collective.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <trainkit/dist/bootstrap.hpp>
#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/tcp_comm.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/nn/param_arena.hpp>

#include "dist/dist_test_util.hpp"
#include "dist/free_port.hpp"

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;
using disttest::free_port;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

dist::TcpCommOptions quick(int timeout_ms = 10000, std::int64_t chunk_bytes = 256 << 10) {
  dist::TcpCommOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.chunk_bytes = chunk_bytes;
  return o;
}

// Runs f(comm) on `world_size` threads, each with its own TcpComm of one group at a fresh port
// of 127.0.0.1, and returns each rank's error ("" when it finished). `skip(rank)`: that rank
// never joins. `make` lets a case construct the comm itself (other arguments).
std::vector<std::string> run_tcp(
    int world_size, const std::function<void(dist::TcpComm&)>& f, dist::TcpCommOptions options,
    const std::function<bool(int)>& skip = [](int) { return false; }) {
  const int port = free_port();
  std::vector<std::string> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    if (skip(r)) continue;
    threads.emplace_back([&, r] {
      try {
        dist::TcpComm comm("127.0.0.1", port, r, world_size, options);
        f(comm);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        if (errors[static_cast<std::size_t>(r)].empty()) errors[static_cast<std::size_t>(r)] = "?";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void check_no_errors(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CHECK(errors[r] == "");
  }
}

// One collective on rank `rank`'s copy of the inputs of `seed`, returned as raw bytes: run on
// ThreadComm and on TcpComm and compared bit for bit.
struct BitCase {
  disttest::Kind kind = disttest::Kind::kAllReduce;
  dist::ReduceOp op = dist::ReduceOp::kSum;
  tk::DType dtype = tk::DType::kF32;
  std::int64_t count = 0;  // all_reduce buffer, reduce_scatter per-rank segment
  std::uint64_t seed = 0;
};

// Inputs with NaN, +-0 and infinities sprinkled in (max/min must keep ThreadComm's operand order
// for them too).
template <class T>
std::vector<T> special_values(std::uint64_t seed, int rank, std::int64_t n) {
  std::vector<T> v = disttest::values<T>(seed, rank, n);
  if constexpr (!std::is_integral_v<T>) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t h = disttest::mix(seed ^ (static_cast<std::uint64_t>(i) << 8) ^
                                            static_cast<std::uint64_t>(rank));
      switch (h % 97) {
        case 0: v[static_cast<std::size_t>(i)] = T(std::numeric_limits<float>::quiet_NaN()); break;
        case 1: v[static_cast<std::size_t>(i)] = T(-0.0f); break;
        case 2: v[static_cast<std::size_t>(i)] = T(0.0f); break;
        case 3: v[static_cast<std::size_t>(i)] = T(std::numeric_limits<float>::infinity()); break;
        default: break;
      }
    }
  }
  return v;
}

std::vector<unsigned char> run_bit_case(dist::Comm& comm, const BitCase& c) {
  std::vector<unsigned char> out;
  dist::detail::visit_reducible(c.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int w = comm.world_size();
    if (c.kind == disttest::Kind::kAllReduce) {
      std::vector<T> buf = special_values<T>(c.seed, comm.rank(), c.count);
      comm.all_reduce(std::span<T>(buf), c.op).wait();
      out.resize(buf.size() * sizeof(T));
      if (!out.empty()) std::memcpy(out.data(), buf.data(), out.size());
    } else {
      std::vector<T> send = special_values<T>(c.seed, comm.rank(), c.count * w);
      std::vector<T> recv(static_cast<std::size_t>(c.count));
      comm.reduce_scatter(std::span<T>(send), std::span<T>(recv), c.op).wait();
      out.resize(recv.size() * sizeof(T));
      if (!out.empty()) std::memcpy(out.data(), recv.data(), out.size());
    }
  });
  return out;
}

}  // namespace

TEST_CASE("TcpComm: every op, dtype and size, worlds 1-4 (float64 reference, ThreadComm's order)") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    const auto cases = disttest::all_cases(w);
    // Small units, so that the larger sizes stream through many of them per step.
    const auto errors = run_tcp(
        w,
        [&](dist::TcpComm& comm) {
          for (const auto& c : cases) {
            const std::string e = disttest::run_case(comm, c, /*chain_order=*/true);
            if (!e.empty()) throw std::runtime_error(e);
          }
          comm.barrier().wait();
        },
        quick(10000, 1000));
    check_no_errors(errors);
  }
}

TEST_CASE("TcpComm: bitwise equal to ThreadComm on random sizes up to a few MB") {
  const tk::DType dtypes[] = {tk::DType::kF32, tk::DType::kBF16, tk::DType::kF16,
                              tk::DType::kF64, tk::DType::kI32,  tk::DType::kI64};
  const dist::ReduceOp ops[] = {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax,
                                dist::ReduceOp::kMin};
  std::vector<BitCase> cases;
  std::uint64_t seed = 1000;
  for (const std::int64_t n : {0, 1, 2, 3, 5, 97, 65537}) {
    for (tk::DType t : dtypes)
      for (dist::ReduceOp op : ops) {
        cases.push_back({disttest::Kind::kAllReduce, op, t, n, ++seed});
        if (n < 1000) cases.push_back({disttest::Kind::kReduceScatter, op, t, n, ++seed});
      }
  }
  // A few MB: 1.5M floats (6 MB) averaged, 2^20 + 3 bf16 summed.
  cases.push_back({disttest::Kind::kAllReduce, dist::ReduceOp::kAvg, tk::DType::kF32, 1500007, 7});
  cases.push_back(
      {disttest::Kind::kAllReduce, dist::ReduceOp::kSum, tk::DType::kBF16, (1 << 20) + 3, 8});
  for (int w = 2; w <= 4; ++w) {
    CAPTURE(w);
    std::vector<std::vector<std::vector<unsigned char>>> want(static_cast<std::size_t>(w)),
        got(static_cast<std::size_t>(w));
    dist::ThreadComm::run(w, [&](dist::ThreadComm& comm) {
      for (const auto& c : cases)
        want[static_cast<std::size_t>(comm.rank())].push_back(run_bit_case(comm, c));
    });
    // Other unit sizes than ThreadComm's: only the segments fix the order.
    const auto errors = run_tcp(
        w,
        [&](dist::TcpComm& comm) {
          for (const auto& c : cases)
            got[static_cast<std::size_t>(comm.rank())].push_back(run_bit_case(comm, c));
        },
        quick(10000, 64 << 10));
    check_no_errors(errors);
    for (int r = 0; r < w; ++r) {
      CAPTURE(r);
      REQUIRE(got[static_cast<std::size_t>(r)].size() == cases.size());
      for (std::size_t i = 0; i < cases.size(); ++i) {
        CAPTURE(i);
        CAPTURE(cases[i].count);
        CHECK(got[static_cast<std::size_t>(r)][i] == want[static_cast<std::size_t>(r)][i]);
      }
    }
  }
}

TEST_CASE("TcpComm: collectives are asynchronous and complete in issue order") {
  const auto errors = run_tcp(
      3,
      [](dist::TcpComm& comm) {
        std::vector<std::vector<std::int64_t>> bufs(6, std::vector<std::int64_t>(20000));
        std::vector<dist::Work> works;
        for (std::size_t k = 0; k < bufs.size(); ++k) {
          for (auto& x : bufs[k]) x = static_cast<std::int64_t>(k) * 10 + comm.rank();
          if (k % 2 == 0) {
            works.push_back(
                comm.all_reduce(std::span<std::int64_t>(bufs[k]), dist::ReduceOp::kMax));
          } else {
            works.push_back(
                comm.broadcast(std::span<std::int64_t>(bufs[k]), static_cast<int>(k % 3)));
          }
        }
        works.push_back(comm.barrier());
        works.back().wait();  // one progress thread in issue order: all earlier ones are done
        for (std::size_t k = 0; k < bufs.size(); ++k) {
          if (!works[k].test()) throw std::runtime_error("work " + std::to_string(k));
          const std::int64_t want = static_cast<std::int64_t>(k) * 10 +
                                    (k % 2 == 0 ? 2 : static_cast<std::int64_t>(k % 3));
          for (std::int64_t x : bufs[k])
            if (x != want) throw std::runtime_error("buffer " + std::to_string(k));
        }
      },
      quick(10000, 4096));
  check_no_errors(errors);
}

TEST_CASE("TcpComm: argument errors throw at the call") {
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 1, 2, 2), doctest::Contains("rank 2"), tk::Error);
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 1, 0, 0), doctest::Contains("world_size"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 0, 0, 2),
                       doctest::Contains("master port 0 is not in [1, 65535]"), tk::Error);
  CHECK_THROWS_WITH_AS(dist::TcpComm("", 5000, 1, 2), doctest::Contains("MASTER_ADDR"), tk::Error);
  dist::TcpComm one("", 0, 0, 1);
  std::vector<float> v(4, 1.5f), g(4);
  CHECK_THROWS_WITH_AS(one.all_gather(std::span<float>(v), std::span<float>(v).first(2)),
                       doctest::Contains("TcpComm rank 0: all_gather"), tk::Error);
  std::vector<std::uint8_t> bytes(3);
  CHECK_THROWS_WITH_AS(one.all_reduce(std::span<std::uint8_t>(bytes), dist::ReduceOp::kSum),
                       doctest::Contains("cannot reduce U8"), tk::Error);
  one.all_gather(std::span<float>(v), std::span<float>(g)).wait();
  CHECK(g[3] == 1.5f);
}

TEST_CASE("TcpComm: a timeout that would overflow the clock's deadlines is refused") {
  // milliseconds::max() ("never") wrapped every deadline into the past.
  for (const auto t : {std::chrono::milliseconds::max(),
                       std::chrono::milliseconds(std::int64_t{10000000} * 1000 + 1)}) {
    CAPTURE(t.count());
    dist::TcpCommOptions o;
    o.timeout = t;
    CHECK_THROWS_WITH_AS(dist::TcpComm("", 0, 0, 1, o),
                         doctest::Contains("TcpComm: the timeout must be positive and at most "
                                           "10^7 s"),
                         tk::Error);
    CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 29500, 1, 2, o),
                         doctest::Contains("TcpComm: the timeout must be positive"), tk::Error);
  }
}

TEST_CASE(
    "TcpComm bootstrap: a rank that never arrives is named by every rank within the timeout") {
  const auto t0 = Clock::now();
  const auto errors = run_tcp(
      4, [](dist::TcpComm&) {}, quick(800), [](int r) { return r == 2; });
  const double took = seconds_since(t0);
  CHECK(contains(errors[0], "1 of the 3 other ranks never connected (missing: rank 2)"));
  for (int r : {1, 3}) {
    CAPTURE(r);
    CHECK(contains(errors[static_cast<std::size_t>(r)], "rank 0 refused the group"));
    CHECK(contains(errors[static_cast<std::size_t>(r)], "missing: rank 2"));
  }
  CHECK(took < 3.0);
}

TEST_CASE("TcpComm bootstrap: world sizes that disagree and a duplicate rank name the ranks") {
  {
    const int port = free_port();
    std::string e0, e1;
    std::thread a([&] {
      try {
        dist::TcpComm c("127.0.0.1", port, 0, 2, quick(3000));
      } catch (const std::exception& e) {
        e0 = e.what();
      }
    });
    std::thread b([&] {
      try {
        dist::TcpComm c("127.0.0.1", port, 1, 3, quick(3000));
      } catch (const std::exception& e) {
        e1 = e.what();
      }
    });
    a.join();
    b.join();
    CHECK(contains(e0, "rank 1 was started for a world of 3 ranks, rank 0 for 2"));
    CHECK(contains(e1, "rank 1 was started for a world of 3 ranks, rank 0 for 2"));
  }
  {
    const int port = free_port();
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i)
      threads.emplace_back([&, i] {
        try {
          dist::TcpComm c("127.0.0.1", port, i == 0 ? 0 : 1, 3, quick(3000));
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(i)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors) {
      CAPTURE(e);
      CHECK(contains(e, "rank 1 connected twice"));
    }
  }
}

TEST_CASE("TcpComm bootstrap: rank 0 refuses a rank of another job, and it hears why") {
  // Two jobs with the same world size on one port: the other job's rank 1 joined this group and
  // the two jobs reduced each other's gradients.
  const std::vector<std::pair<std::string, std::string>> keys = {{"torchrun:a", "torchrun:b"},
                                                                 {"", "slurm:7.0"},
                                                                 {"slurm:7.0", ""},
                                                                 {std::string(256, 'k'), "k\x01"}};
  for (const auto& [key0, key1] : keys) {
    const int port = free_port();
    std::string e0, e1;
    const auto t0 = Clock::now();
    std::thread a([&] {
      try {
        auto o = quick(4000);
        o.job_key = key0;
        dist::TcpComm c("127.0.0.1", port, 0, 2, o);
        std::vector<double> v{1.0};
        c.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
      } catch (const std::exception& e) {
        e0 = e.what();
      }
    });
    try {
      auto o = quick(4000);
      o.job_key = key1;
      dist::TcpComm c("127.0.0.1", port, 1, 2, o);
      std::vector<double> v{2.0};
      c.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
    } catch (const std::exception& e) {
      e1 = e.what();
    }
    a.join();
    CHECK(seconds_since(t0) < 3.5);
    const std::string expect = "rank 1 of 2 belongs to job '" + tk::detail::printable_bytes(key1) +
                               "', rank 0 expects job '" + tk::detail::printable_bytes(key0) + "'";
    CAPTURE(e0);
    CAPTURE(e1);
    CHECK(contains(e0, "TcpComm rank 0: " + expect));
    CHECK(contains(e1, "TcpComm rank 1: rank 0 refused the group: "));
    CHECK(contains(e1, tk::detail::printable_bytes(expect)));
  }
  // The same key (any bytes) meets; a key over 256 bytes is refused at the call.
  auto o = quick(8000);
  o.job_key = std::string("job\0\xff", 5);
  const auto errors = run_tcp(
      3,
      [](dist::TcpComm& c) {
        std::vector<double> v{1.0};
        c.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
        if (v[0] != 3.0) throw std::runtime_error("wrong sum");
      },
      o);
  for (const auto& e : errors) CHECK(e.empty());
  o.job_key = std::string(257, 'k');
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 1, 1, 2, o),
                       doctest::Contains("the job key has 257 bytes, at most 256"), tk::Error);
  o.job_key = std::string(256, 'k');  // the hello carries both in 1024 bytes
  o.announce_addr = std::string(769, 'a');
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", 1, 1, 2, o),
                       doctest::Contains("announce_addr and job_key have 1025 bytes together"),
                       tk::Error);
}

TEST_CASE("TcpComm bootstrap: nobody at the address, a foreign service, a busy port") {
  {  // nobody listens: a timeout naming the address
    const int port = free_port();
    const auto t0 = Clock::now();
    const std::string where = "could not reach rank 0 at 127.0.0.1:" + std::to_string(port);
    CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", port, 1, 2, quick(300)),
                         doctest::Contains(where.c_str()), tk::Error);
    CHECK(seconds_since(t0) < 3.0);
  }
  {  // something else answers on the port
    std::string error;
    dist::detail::Socket listener = dist::detail::listen_on(0, error);
    REQUIRE(listener.valid());
    const int port = dist::detail::bound_port(listener.fd());
    std::thread server([&] {
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      if (!dist::detail::wait_fd(listener.fd(), POLLIN, deadline)) return;
      dist::detail::Socket s(::accept(listener.fd(), nullptr, nullptr));
      const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n   ";
      (void)dist::detail::send_all(s.fd(), reply, 40, deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
    CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", port, 1, 2, quick(3000)),
                         doctest::Contains("does not speak the TcpComm protocol"), tk::Error);
    server.join();
  }
  {  // the master port is taken for a while (a job that just ended): rank 0 retries
    std::string error;
    auto blocker = std::make_unique<dist::detail::Socket>(dist::detail::listen_on(0, error));
    REQUIRE(blocker->valid());
    const int port = dist::detail::bound_port(blocker->fd());
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      blocker.reset();
    });
    std::vector<std::string> errors(2);
    std::vector<double> sums(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          dist::TcpComm c("127.0.0.1", port, r, 2, quick(5000));
          std::vector<double> v{static_cast<double>(r) + 0.25};
          c.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
          sums[static_cast<std::size_t>(r)] = v[0];
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    release.join();
    check_no_errors(errors);
    CHECK(sums[0] == 1.5);
    CHECK(sums[1] == 1.5);
  }
}

TEST_CASE("TcpComm bootstrap: out of file descriptors at accept fails at once, naming the port") {
  // accept() failing with EMFILE leaves the connection queued and poll keeps reporting it: the
  // bootstrap spun at full CPU (past the timeout: wait_fd never saw the deadline). Each rank runs
  // in a child with no descriptor left for accept.
  for (int world_size : {2, 3}) {
    CAPTURE(world_size);
    // Rank 0 at the master port: its ring listener and the master listener, nothing more.
    const int port = free_port();
    const disttest::ChildReport root = disttest::run_out_of_fds(
        port, 2, [&] { dist::TcpComm c("127.0.0.1", port, 0, world_size, quick(4000)); });
    CAPTURE(root.message);
    CHECK(contains(root.message, "TcpComm rank 0: cannot accept connections on port " +
                                     std::to_string(port) + ": "));
    CHECK(contains(root.message, "ulimit -n"));
    CHECK(root.wall_s >= 0);
    CHECK(root.wall_s < 2.0);
    CHECK(root.cpu_s < 1.0);
  }
  // The last rank at its ring listener, after the bootstrap: it holds the ring listener and the
  // connection to its right neighbour (rank 0, in this process), and rank 0 connects to it.
  const int port = free_port();
  std::string error0;
  const disttest::ChildReport last = disttest::run_starved_child(
      2, [&] { dist::TcpComm c("127.0.0.1", port, 1, 2, quick(4000)); },
      [&](const std::atomic<bool>&) {
        try {
          dist::TcpComm c("127.0.0.1", port, 0, 2, quick(4000));
          c.barrier().wait();
        } catch (const std::exception& e) {
          error0 = e.what();
        }
      });
  CAPTURE(last.message);
  CHECK(contains(last.message, "TcpComm rank 1: cannot accept connections on port "));
  CHECK(contains(last.message, "Too many open files"));
  CHECK(last.wall_s >= 0);
  CHECK(last.wall_s < 2.0);
  CHECK(last.cpu_s < 1.0);
  CAPTURE(error0);
  CHECK(contains(error0, "TcpComm rank 0: "));  // its ring formed; its first collective fails
}

TEST_CASE("TcpComm bootstrap: a rank that announces no address is listed where rank 0 sees it") {
  // Rank 1 by hand, from 127.0.0.2 (any 127/8 address is this machine): a hello without an
  // address, then the table rank 0 sends back. Rank 0's own address (127.0.0.1) would be wrong.
  const int port = free_port();
  std::string error;
  dist::detail::Socket ring = dist::detail::listen_on(0, error);  // rank 1's ring listener
  REQUIRE(ring.valid());
  std::string rank0_error;
  std::thread rank0([&] {
    try {
      dist::TcpComm c("127.0.0.1", port, 0, 2, quick(1500));
    } catch (const std::exception& e) {
      rank0_error = e.what();
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  dist::detail::Socket s;
  bool bound = true;
  while (!s.valid() && bound && Clock::now() < deadline) {
    dist::detail::Socket attempt(::socket(AF_INET, SOCK_STREAM, 0));
    REQUIRE(attempt.valid());
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<std::uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(attempt.fd(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      bound = false;
    } else if (::connect(attempt.fd(), reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
      s = std::move(attempt);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 is not up yet
    }
  }
  if (bound) {
    REQUIRE(s.valid());
    dist::detail::set_nonblocking(s.fd());
    dist::detail::TcpFrame hello;
    hello.type = dist::detail::TcpFrameType::kHello;
    hello.a = 1;
    hello.b = 2;
    hello.seq = static_cast<std::uint64_t>(dist::detail::bound_port(ring.fd()));
    hello.length = 0;
    REQUIRE(dist::detail::send_tcp_frame(s.fd(), hello, nullptr, deadline));
    unsigned char head[dist::detail::kTcpFrameBytes];
    REQUIRE(dist::detail::recv_all(s.fd(), head, sizeof head, deadline));
    const auto f = dist::detail::decode_tcp_frame(head, sizeof head, "rank 0");
    REQUIRE(f.type == dist::detail::TcpFrameType::kTable);
    std::vector<unsigned char> payload(static_cast<std::size_t>(f.length));
    REQUIRE(dist::detail::recv_all(s.fd(), payload.data(), payload.size(), deadline));
    const auto table = dist::detail::decode_tcp_table(payload, 2, "rank 0");
    CHECK(table[0].host == "127.0.0.1");
    CHECK(table[1].host == "127.0.0.2");
    CHECK(table[1].port == dist::detail::bound_port(ring.fd()));
  } else {
    MESSAGE("cannot bind to 127.0.0.2 here: the check of the announced address is skipped");
  }
  s = dist::detail::Socket();  // rank 0 then fails: the ring never forms
  rank0.join();
  CHECK(!rank0_error.empty());
}

TEST_CASE("TcpComm bootstrap: a refusal cut short is not shown as zero bytes") {
  // A rank 0 (by hand) that announces a 64-byte reason, sends 5 bytes and closes: the rank showed
  // the 5 bytes and 59 times \x00.
  std::string error;
  dist::detail::Socket listener = dist::detail::listen_on(0, error);
  REQUIRE(listener.valid());
  const int port = dist::detail::bound_port(listener.fd());
  std::thread server([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    if (!dist::detail::wait_fd(listener.fd(), POLLIN, deadline)) return;
    dist::detail::Socket s(::accept(listener.fd(), nullptr, nullptr));
    unsigned char head[dist::detail::kTcpFrameBytes];
    if (!dist::detail::recv_all(s.fd(), head, sizeof head, deadline)) return;
    const auto hello = dist::detail::decode_tcp_frame(head, sizeof head, "rank 1");
    std::string rest(static_cast<std::size_t>(hello.length), '\0');
    if (!dist::detail::recv_all(s.fd(), rest.data(), rest.size(), deadline)) return;
    dist::detail::TcpFrame abort;
    abort.type = dist::detail::TcpFrameType::kAbort;
    abort.length = 64;
    unsigned char out[dist::detail::kTcpFrameBytes];
    dist::detail::encode_tcp_frame(abort, out);
    (void)dist::detail::send_all(s.fd(), out, sizeof out, deadline);
    (void)dist::detail::send_all(s.fd(), "Nope!", 5, deadline);
  });
  const auto t0 = Clock::now();
  std::string e1;
  try {
    dist::TcpComm c("127.0.0.1", port, 1, 2, quick(3000));
  } catch (const tk::Error& e) {
    e1 = e.what();
  }
  server.join();
  CAPTURE(e1);
  CHECK(contains(e1, "TcpComm rank 1: rank 0 refused the group: (no reason: rank 0 closed"));
  CHECK(!contains(e1, "\\x00"));
  CHECK(seconds_since(t0) < 2.5);
}

TEST_CASE("TcpComm: an address that no rank could use is refused where it is made") {
  // announce_addr or MASTER_ADDR with a blank: rank 0 listed it, every other rank then failed
  // blaming rank 0, and rank 0 waited for the ring until its timeout.
  const int port = free_port();
  const auto t0 = Clock::now();
  auto options = quick(3000);
  options.announce_addr = "127.0.0.1 ";
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", port, 1, 2, options),
                       doctest::Contains("TcpComm rank 1: TcpCommOptions::announce_addr "
                                         "'127.0.0.1 ' is not a host name or address"),
                       tk::Error);
  options.announce_addr = "bad\x01";
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1", port, 0, 2, options),
                       doctest::Contains("announce_addr 'bad\\x01'"), tk::Error);
  options.announce_addr.clear();
  CHECK_THROWS_WITH_AS(dist::TcpComm("127.0.0.1 ", port, 0, 2, options),
                       doctest::Contains("the master address (MASTER_ADDR) '127.0.0.1 ' is not"),
                       tk::Error);
  CHECK_THROWS_WITH_AS(dist::TcpComm(std::string(1025, 'h'), port, 1, 2, options),
                       doctest::Contains("the master address (MASTER_ADDR)"), tk::Error);
  CHECK(seconds_since(t0) < 2.0);  // at once, not after a timeout
}

TEST_CASE("TcpComm bootstrap: rank 0 refuses a hello with an unusable address, naming the rank") {
  // A rank 1 by hand that announces an address with a blank or a control byte: rank 0 answers
  // with its verdict at once (it used to send the table, which the other ranks then refused).
  for (const std::string& host : {std::string("a b"), std::string("host\x1b[2J")}) {
    CAPTURE(host);
    const int port = free_port();
    std::string rank0_error;
    const auto t0 = Clock::now();
    std::thread rank0([&] {
      try {
        dist::TcpComm c("127.0.0.1", port, 0, 2, quick(3000));
      } catch (const std::exception& e) {
        rank0_error = e.what();
      }
    });
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    std::string error;
    dist::detail::Socket s;
    while (!s.valid() && Clock::now() < deadline) {
      s = dist::detail::connect_once("127.0.0.1", port, deadline, error);
      if (!s.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(s.valid());
    dist::detail::TcpFrame hello;
    hello.type = dist::detail::TcpFrameType::kHello;
    hello.a = 1;
    hello.b = 2;
    hello.seq = 4242;
    hello.length = host.size();
    REQUIRE(dist::detail::send_tcp_frame(s.fd(), hello, host.data(), deadline));
    unsigned char head[dist::detail::kTcpFrameBytes];
    REQUIRE(dist::detail::recv_all(s.fd(), head, sizeof head, deadline));
    const auto f = dist::detail::decode_tcp_frame(head, sizeof head, "rank 0");
    CHECK(f.type == dist::detail::TcpFrameType::kAbort);
    std::string text(static_cast<std::size_t>(f.length), '\0');
    if (f.type == dist::detail::TcpFrameType::kAbort)
      CHECK(dist::detail::recv_all(s.fd(), text.data(), text.size(), deadline));
    s = dist::detail::Socket();
    rank0.join();
    const std::string shown = host == "a b" ? "'a b'" : "'host\\x1b[2J'";
    CHECK(contains(text, "rank 1 announced an unusable address " + shown));
    CHECK(contains(rank0_error, "TcpComm rank 0: rank 1 announced an unusable address " + shown));
    CHECK(seconds_since(t0) < 2.5);
  }
}

TEST_CASE("TcpComm bootstrap: a hello of another protocol version is refused, naming both") {
  // Rank 0 dropped such a hello like a port scanner's: the rank of the other build retried and
  // rank 0 waited until their timeouts, and rank 0 then blamed a missing rank. Now rank 0 refuses
  // the group at once; the rank that joined before hears why, and so does the other build's rank
  // (in this build's frame). A hello cut after the version byte is enough to be recognised.
  namespace d = dist::detail;
  const std::pair<int, bool> cases[] = {{2, true}, {0, true}, {2, false}};  // version, whole frame
  for (const auto& [version, whole] : cases) {
    CAPTURE(version);
    CAPTURE(whole);
    const int port = free_port();
    std::string e0, e1;
    const auto t0 = Clock::now();
    std::thread rank0([&] {
      try {
        dist::TcpComm c("127.0.0.1", port, 0, 3, quick(5000));
      } catch (const std::exception& e) {
        e0 = e.what();
      }
    });
    std::thread rank1([&] {
      try {
        dist::TcpComm c("127.0.0.1", port, 1, 3, quick(5000));
      } catch (const std::exception& e) {
        e1 = e.what();
      }
    });
    // The other build's rank 2 comes once rank 1 had time to join.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto deadline = Clock::now() + std::chrono::seconds(8);
    std::string error;
    d::Socket s;
    while (!s.valid() && Clock::now() < deadline) {
      s = d::connect_once("127.0.0.1", port, deadline, error);
      if (!s.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(s.valid());
    d::TcpFrame hello;
    hello.type = d::TcpFrameType::kHello;
    hello.a = 2;
    hello.b = 3;
    hello.seq = 4242;
    unsigned char out[d::kTcpFrameBytes];
    d::encode_tcp_frame(hello, out);
    out[4] = static_cast<unsigned char>(version);
    REQUIRE(d::send_all(s.fd(), out, whole ? sizeof out : 5, deadline));
    unsigned char head[d::kTcpFrameBytes];
    std::string text;
    if (d::recv_all(s.fd(), head, sizeof head, deadline)) {
      const d::TcpFrame f = d::decode_tcp_frame(head, sizeof head, "rank 0");
      CHECK(f.type == d::TcpFrameType::kAbort);
      text.resize(static_cast<std::size_t>(f.length));
      CHECK(d::recv_all(s.fd(), text.data(), text.size(), deadline));
    }
    rank0.join();
    rank1.join();
    const double took = seconds_since(t0);
    const std::string expect = "a peer at 127.0.0.1 speaks TcpComm protocol version " +
                               std::to_string(version) +
                               ", rank 0 speaks version 1 (are all ranks the same trainkit "
                               "build?)";
    CAPTURE(e0);
    CAPTURE(e1);
    CAPTURE(text);
    CHECK(contains(e0, "TcpComm rank 0: " + expect));
    CHECK(contains(e1, "TcpComm rank 1: rank 0 refused the group: TcpComm rank 0: " + expect));
    CHECK(text == "TcpComm rank 0: " + expect);
    CHECK(took < 3.0);  // at once, not after the 5 s timeout
  }
}

namespace {

// Rank 1 of a group of 2 played by hand, to send rank 0 what a real rank never would. After
// join(), `right` carries frames to rank 0 (rank 0's left neighbour link) and `left` is rank 0's
// link to us. Every step is bounded by `deadline`; false when rank 0 did not play along.
struct FakeRank1 {
  dist::detail::Socket listener, right, left;
  bool join(int master_port, Clock::time_point deadline) {
    namespace d = dist::detail;
    std::string error;
    listener = d::listen_on(0, error);
    if (!listener.valid()) return false;
    d::Socket s;
    while (!s.valid() && Clock::now() < deadline) {
      s = d::connect_once("127.0.0.1", master_port, deadline, error);
      if (!s.valid()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!s.valid()) return false;
    const std::string host = "127.0.0.1";
    d::TcpFrame hello;
    hello.type = d::TcpFrameType::kHello;
    hello.a = 1;
    hello.b = 2;
    hello.seq = static_cast<std::uint64_t>(d::bound_port(listener.fd()));
    hello.length = host.size();
    unsigned char head[d::kTcpFrameBytes];
    if (!d::send_tcp_frame(s.fd(), hello, host.data(), deadline) ||
        !d::recv_all(s.fd(), head, sizeof head, deadline))
      return false;
    const d::TcpFrame table = d::decode_tcp_frame(head, sizeof head, "rank 0");
    std::vector<unsigned char> payload(static_cast<std::size_t>(table.length));
    if (table.type != d::TcpFrameType::kTable ||
        !d::recv_all(s.fd(), payload.data(), payload.size(), deadline))
      return false;
    const auto endpoints = d::decode_tcp_table(payload, 2, "rank 0");
    right = d::connect_once(endpoints[0].host, endpoints[0].port, deadline, error);
    if (!right.valid()) return false;
    d::TcpFrame link;
    link.type = d::TcpFrameType::kLink;
    link.a = 1;
    link.b = 2;
    link.seq = table.seq;
    if (!d::send_tcp_frame(right.fd(), link, nullptr, deadline) ||
        !d::wait_fd(listener.fd(), POLLIN, deadline))
      return false;
    left = d::Socket(::accept(listener.fd(), nullptr, nullptr));
    return left.valid() && d::recv_all(left.fd(), head, sizeof head, deadline);
  }
};

// Rank 0 (a real TcpComm) meets a FakeRank1 that sends `frames` (raw bytes) once the group has
// formed, while rank 0 runs one all_reduce of 10 floats; returns rank 0's error and how long
// the collective took.
std::pair<std::string, double> rank0_against(const std::vector<unsigned char>& frames) {
  const int port = free_port();
  std::string error;
  double took = -1.0;
  std::thread rank0([&] {
    try {
      dist::TcpComm comm("127.0.0.1", port, 0, 2, quick(5000));
      const auto t0 = Clock::now();
      std::vector<float> v(10, 1.0f);
      try {
        comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();
      } catch (...) {
        took = seconds_since(t0);
        throw;
      }
      took = seconds_since(t0);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  FakeRank1 fake;
  if (fake.join(port, deadline))
    (void)dist::detail::send_all(fake.right.fd(), frames.data(), frames.size(), deadline);
  // Hold the connections until rank 0 finished (a close would be a failure of its own).
  rank0.join();
  return {error, took};
}

std::vector<unsigned char> frame_bytes(const dist::detail::TcpFrame& f,
                                       const std::string& payload = {}) {
  std::vector<unsigned char> out(dist::detail::kTcpFrameBytes);
  dist::detail::encode_tcp_frame(f, out.data());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace

TEST_CASE("TcpComm: a peer's failure text is shown escaped; garbage fails the collective at once") {
  namespace d = dist::detail;
  d::TcpFrame header;
  header.type = d::TcpFrameType::kHeader;
  header.kind = d::RingOp::kAllReduce;
  header.op = dist::ReduceOp::kSum;
  header.dtype = tk::DType::kF32;
  header.b = 256 << 10;
  header.seq = 1;
  header.length = 10;
  SUBCASE("an abort whose text holds control bytes (a terminal escape, a line break)") {
    const std::string text = "rank 1 says \x1b[2J\nFAKE LOG LINE";
    d::TcpFrame abort;
    abort.type = d::TcpFrameType::kAbort;
    abort.length = text.size();
    const auto [error, took] = rank0_against(frame_bytes(abort, text));
    CAPTURE(error);
    CHECK(contains(error, "told by rank 1): rank 1 says \\x1b[2J\\x0aFAKE LOG LINE"));
    CHECK(error.find('\x1b') == std::string::npos);
    CHECK(error.find('\n') == std::string::npos);
    CHECK(took < 2.5);
  }
  SUBCASE("a data unit of another size than the header announced") {
    d::TcpFrame data;
    data.type = d::TcpFrameType::kData;
    data.seq = 1;
    data.length = 7;
    auto bytes = frame_bytes(header);
    const auto unit = frame_bytes(data, std::string(7, 'x'));
    bytes.insert(bytes.end(), unit.begin(), unit.end());
    const auto [error, took] = rank0_against(bytes);
    CAPTURE(error);
    CHECK(contains(error,
                   "rank 1 sent a frame of type 5 (collective #1, unit 0, 7 bytes) where "
                   "unit 0 of 20 bytes belongs (a protocol error)"));
    CHECK(took < 2.5);
  }
  SUBCASE("a header that announces 2^62 elements") {
    header.length = std::uint64_t{1} << 62;
    const auto [error, took] = rank0_against(frame_bytes(header));
    CAPTURE(error);
    CHECK(contains(error, "rank 1 called all_reduce(4611686018427387904 x F32, sum)"));
    CHECK(took < 2.5);
  }
}

TEST_CASE("TcpComm: a stalled rank fails every rank within the timeout, naming it") {
  auto options = quick(500, 4096);
  options.fault_injection = [](int rank, std::uint64_t op, std::int64_t unit) {
    if (rank == 2 && op == 2 && unit == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  };
  const auto t0 = Clock::now();
  std::vector<double> failed_after(4, -1.0);
  const auto errors = run_tcp(
      4,
      [&](dist::TcpComm& comm) {
        std::vector<float> v(10000, 1.0f);
        comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();  // #1 is fine
        try {
          comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();
        } catch (...) {
          failed_after[static_cast<std::size_t>(comm.rank())] = seconds_since(t0);
          throw;
        }
      },
      options);
  // Rank 3 waits on rank 2 and times out; the others learn it from the abort that travels round.
  CHECK(contains(errors[3], "rank 2 stopped sending after 0 of its units"));
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CAPTURE(errors[static_cast<std::size_t>(r)]);
    CHECK(contains(errors[static_cast<std::size_t>(r)], "made no progress for 0.5 s"));
    CHECK(contains(errors[static_cast<std::size_t>(r)], "rank 2 "));
    if (r != 2) CHECK(failed_after[static_cast<std::size_t>(r)] < 1.4);  // before rank 2 woke
  }
}

TEST_CASE("TcpComm: a rank that throws mid-collective fails the others at once, naming it") {
  auto options = quick(20000, 1024);
  options.fault_injection = [](int rank, std::uint64_t op, std::int64_t unit) {
    if (rank == 1 && op == 2 && unit == 5) throw std::runtime_error("injected crash");
  };
  const auto t0 = Clock::now();
  const auto errors = run_tcp(
      3,
      [&](dist::TcpComm& comm) {
        std::vector<double> v(5000, 1.0);
        comm.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
        comm.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
      },
      options);
  CHECK(seconds_since(t0) < 5.0);  // not the 20 s timeout
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(contains(errors[static_cast<std::size_t>(r)],
                   "TcpComm rank 1: all_reduce #2 failed: injected crash"));
  }
}

TEST_CASE("TcpComm: a hook that throws a non-std exception fails the group at once too") {
  // It used to complete this rank's Work with the exception but leave the group unbroken: the
  // neighbours waited for their timeout, and this rank's next collective read the rest of the
  // failed one's stream as its own.
  auto options = quick(20000, 1024);
  options.fault_injection = [](int rank, std::uint64_t op, std::int64_t unit) {
    if (rank == 1 && op == 1 && unit == 3) throw 42;
  };
  const auto t0 = Clock::now();
  std::vector<std::string> second(3);
  const auto errors = run_tcp(
      3,
      [&](dist::TcpComm& comm) {
        std::vector<double> v(5000, 1.0);
        bool std_error = true;
        try {
          try {
            comm.all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
          } catch (const std::exception&) {
            throw;
          } catch (...) {
            std_error = false;  // the bare int
          }
        } catch (...) {
          try {
            comm.barrier().wait();
          } catch (const std::exception& e) {
            second[static_cast<std::size_t>(comm.rank())] = e.what();
          }
          throw;
        }
        if (!std_error) throw std::runtime_error("Work::wait() rethrew the hook's int");
      },
      options);
  CHECK(seconds_since(t0) < 5.0);  // not the 20 s timeout
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(contains(errors[static_cast<std::size_t>(r)],
                   "TcpComm rank 1: all_reduce #1 failed: an exception that is not a "
                   "std::exception"));
    CHECK(contains(second[static_cast<std::size_t>(r)], "refused: the group failed earlier"));
  }
}

TEST_CASE("TcpComm: a rank destroyed mid-collective or between collectives is named") {
  {  // destroyed with a collective in flight (its thread returned without waiting)
    std::vector<float> rank1_buffer(100000, 1.0f);  // outlives rank 1's TcpComm
    const auto errors = run_tcp(
        3,
        [&](dist::TcpComm& comm) {
          std::vector<float> v(100000, 1.0f);
          if (comm.rank() == 1) {
            (void)comm.all_reduce(std::span<float>(rank1_buffer), dist::ReduceOp::kSum);
            return;  // ~TcpComm with the collective in flight
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();
        },
        quick(20000, 4096));
    for (int r : {0, 2}) {
      CAPTURE(r);
      CHECK(contains(errors[static_cast<std::size_t>(r)], "TcpComm rank 1: all_reduce #1"));
      CHECK(contains(errors[static_cast<std::size_t>(r)], "destroyed with collectives in flight"));
    }
  }
  {  // left between collectives: the next collective names it
    const auto errors = run_tcp(
        3,
        [](dist::TcpComm& comm) {
          std::vector<std::int32_t> v(10, comm.rank());
          comm.all_reduce(std::span<std::int32_t>(v), dist::ReduceOp::kSum).wait();
          if (comm.rank() == 1) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          comm.broadcast(std::span<std::int32_t>(v), 0).wait();
        },
        quick(20000));
    CHECK(errors[1] == "");
    for (int r : {0, 2}) {
      CAPTURE(r);
      CHECK(contains(errors[static_cast<std::size_t>(r)], "rank 1 left the group"));
    }
  }
}

TEST_CASE("TcpComm: mismatched calls fail every rank naming both calls; later ones are refused") {
  struct Mismatch {
    std::function<dist::Work(dist::TcpComm&, std::vector<float>&)> odd;
    std::string odd_text, usual_text;
  };
  const std::vector<Mismatch> mismatches = {
      {[](dist::TcpComm& c, std::vector<float>& v) {
         return c.all_reduce(std::span<float>(v).first(99), dist::ReduceOp::kSum);
       },
       "all_reduce(99 x F32, sum)", "all_reduce(100 x F32, sum)"},
      {[](dist::TcpComm& c, std::vector<float>& v) {
         return c.all_reduce(std::span<float>(v), dist::ReduceOp::kMax);
       },
       "all_reduce(100 x F32, max)", "all_reduce(100 x F32, sum)"},
      {[](dist::TcpComm& c, std::vector<float>& v) { return c.broadcast(std::span<float>(v), 0); },
       "broadcast(100 x F32, root 0)", "all_reduce(100 x F32, sum)"},
  };
  for (const auto& m : mismatches) {
    CAPTURE(m.odd_text);
    std::vector<std::string> refused(3);
    const auto errors = run_tcp(
        3,
        [&](dist::TcpComm& comm) {
          std::vector<float> v(100, 1.0f);
          dist::Work w = comm.rank() == 2
                             ? m.odd(comm, v)
                             : comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum);
          try {
            w.wait();
          } catch (...) {
            try {
              comm.barrier().wait();
            } catch (const std::exception& e) {
              refused[static_cast<std::size_t>(comm.rank())] = e.what();
            }
            throw;
          }
        },
        quick(5000));
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const std::string& e = errors[static_cast<std::size_t>(r)];
      CHECK(contains(e, "collective #1 does not match"));
      CHECK(contains(e, m.odd_text));
      CHECK(contains(e, m.usual_text));
      CHECK(contains(refused[static_cast<std::size_t>(r)], "refused: the group failed earlier"));
    }
  }
}

TEST_CASE("TcpComm: ranks with different chunk sizes are an error, not garbage") {
  const int port = free_port();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        dist::TcpComm comm("127.0.0.1", port, r, 2, quick(5000, r == 0 ? 4096 : 8192));
        std::vector<float> v(10000, 1.0f);
        comm.all_reduce(std::span<float>(v), dist::ReduceOp::kSum).wait();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {  // each rank's own finding, or its neighbour's that came first
    CAPTURE(e);
    CHECK((contains(e, "rank 1 streams units of 8192 bytes, this rank of 4096") ||
           contains(e, "rank 0 streams units of 4096 bytes, this rank of 8192")));
  }
}

TEST_CASE("TcpComm: GradBucketer averages the same gradient bits as over ThreadComm") {
  constexpr int kWorld = 3;
  auto train = [](dist::Comm& comm, std::vector<float>& grads, std::vector<float>& params) {
    tk::nn::ParamArena<> arena;
    const tk::nn::ParamId a = arena.add("a", tk::Shape{37});
    const tk::nn::ParamId b = arena.add("b", tk::Shape{5, 11});
    const tk::nn::ParamId c = arena.add("c", tk::Shape{3001});
    arena.finalize();
    float* p = arena.params_data();
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
      p[i] = disttest::value<float>(5, comm.rank(), i);  // rank 0's are broadcast
    dist::BucketOptions o;
    o.first_bucket_bytes = 100;
    o.bucket_bytes = 4000;
    dist::GradBucketer<> ddp(arena, comm, o);
    for (int step = 0; step < 2; ++step) {
      arena.zero_grad();
      float* g = arena.grads_data();
      for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
        g[i] = disttest::value<float>(100 + static_cast<std::uint64_t>(step), comm.rank(), i);
      ddp.mark_ready(c);
      ddp.mark_ready(b);
      ddp.mark_ready(a);
      ddp.finish();
    }
    grads.assign(arena.grads_data(), arena.grads_data() + arena.buffer_numel());
    params.assign(arena.params_data(), arena.params_data() + arena.buffer_numel());
  };
  std::vector<std::vector<float>> tg(kWorld), tp(kWorld), cg(kWorld), cp(kWorld);
  dist::ThreadComm::run(kWorld, [&](dist::ThreadComm& comm) {
    train(comm, tg[static_cast<std::size_t>(comm.rank())],
          tp[static_cast<std::size_t>(comm.rank())]);
  });
  const auto errors = run_tcp(
      kWorld,
      [&](dist::TcpComm& comm) {
        train(comm, cg[static_cast<std::size_t>(comm.rank())],
              cp[static_cast<std::size_t>(comm.rank())]);
      },
      quick(10000));
  check_no_errors(errors);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    const auto i = static_cast<std::size_t>(r);
    REQUIRE(cg[i].size() == tg[i].size());
    CHECK(std::memcmp(cg[i].data(), tg[i].data(), cg[i].size() * sizeof(float)) == 0);
    CHECK(std::memcmp(cp[i].data(), tp[i].data(), cp[i].size() * sizeof(float)) == 0);
    // The average itself: element 7 of the second step's gradients.
    double want = 0.0;
    for (int q = 0; q < kWorld; ++q) want += disttest::value<float>(101, q, 7);
    CHECK(std::fabs(cg[i][7] - want / kWorld) < 1e-6);
    CHECK(cp[i][3] == disttest::value<float>(5, 0, 3));
  }
}

namespace {

// A child process of the fork test: torchrun's variables, dist::init, one all_reduce. Exit code
// 0 when the result (or, for `expect_error`, the error) is right; never returns.
[[noreturn]] void torchrun_child(int rank, int world_size, int master_port, bool agent_store,
                                 int die_rank) {
  int code = 0;
  try {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(master_port).c_str(), 1);
    if (agent_store) ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    dist::Context ctx = dist::init({.timeout = std::chrono::milliseconds(10000)});
    if (ctx.backend() != dist::Backend::kTcp || ctx.rank() != rank ||
        ctx.world_size() != world_size || ctx.comm().backend() != "TcpComm")
      ::_exit(10);
    std::vector<double> v(100003);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 1000) * 0.5 + rank;
    if (rank == die_rank) {
      (void)ctx.comm().all_reduce(std::span<double>(v), dist::ReduceOp::kSum);
      // The process dies with its collective in flight. SIGKILL, not _exit: under TSan _exit
      // runs the sanitizer's finalization while the communicator's thread goes on, and can
      // finish the collective before the process ends.
      ::kill(::getpid(), SIGKILL);
    }
    if (die_rank >= 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      ctx.comm().all_reduce(std::span<double>(v), dist::ReduceOp::kSum).wait();
    } catch (const tk::Error& e) {
      const std::string what = e.what();
      ::_exit(die_rank >= 0 && contains(what, "rank " + std::to_string(die_rank)) ? 0 : 11);
    }
    if (die_rank >= 0) ::_exit(12);
    const double ranks = world_size * (world_size - 1) / 2.0;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != static_cast<double>(i % 1000) * 0.5 * world_size + ranks) ::_exit(13);
    ctx.comm().barrier().wait();
  } catch (...) {
    code = 14;
  }
  ::_exit(code);
}

// Forks world_size children and returns their exit codes (-1: killed after 20 s).
std::vector<int> run_children(int world_size, int master_port, bool agent_store, int die_rank) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) torchrun_child(r, world_size, master_port, agent_store, die_rank);
    pids.push_back(pid);
  }
  std::vector<int> codes(static_cast<std::size_t>(world_size), -1);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (int r = 0; r < world_size; ++r) {
    int status = 0;
    for (;;) {
      const pid_t done = ::waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG);
      if (done == pids[static_cast<std::size_t>(r)]) {
        codes[static_cast<std::size_t>(r)] = WIFEXITED(status)     ? WEXITSTATUS(status)
                                             : WIFSIGNALED(status) ? -WTERMSIG(status)
                                                                   : -2;
        break;
      }
      if (Clock::now() > deadline) {
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        (void)::waitpid(pids[static_cast<std::size_t>(r)], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return codes;
}

}  // namespace

TEST_CASE("TcpComm: real processes launched like torchrun meet through dist::init") {
  {  // plain MASTER_PORT
    const auto codes = run_children(3, free_port(), false, -1);
    for (std::size_t r = 0; r < codes.size(); ++r) {
      CAPTURE(r);
      CHECK(codes[r] == 0);
    }
  }
  {  // torchrun's agent store holds MASTER_PORT: rank 0 listens on MASTER_PORT + 1
    std::string error;
    dist::detail::Socket agent = dist::detail::listen_on(0, error);  // stands for the agent
    REQUIRE(agent.valid());
    const int agent_port = dist::detail::bound_port(agent.fd());
    std::string error2;
    dist::detail::Socket probe = dist::detail::listen_on(agent_port + 1, error2);
    if (probe.valid()) {  // MASTER_PORT + 1 is free on this machine
      probe.reset();
      const auto codes = run_children(2, agent_port, true, -1);
      for (std::size_t r = 0; r < codes.size(); ++r) {
        CAPTURE(r);
        CHECK(codes[r] == 0);
      }
    }
  }
  {  // rank 2 dies with its collective in flight: the others fail naming it
    const auto codes = run_children(4, free_port(), false, 2);
    for (std::size_t r = 0; r < codes.size(); ++r) {
      CAPTURE(r);
      CHECK(codes[r] == (r == 2 ? -SIGKILL : 0));
    }
  }
}
