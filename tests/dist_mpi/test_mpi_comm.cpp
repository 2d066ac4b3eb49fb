// MpiComm under mpirun (registered by tests/dist_mpi/CMakeLists.txt with -np 2 and -np 4): every
// collective x dtype x size against float64 references, 10^7 elements, the data-parallel
// equivalence (2+ ranks x batch B vs 1 rank x the whole batch, within 1e-6 relative), layout
// mismatches caught at start, argument errors; and, with --fault=stall, a stalled rank making the
// others fail within the timeout (ctest checks the output: the job then ends in MPI_Abort).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/dist/bootstrap.hpp>
#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/mpi_comm.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/linear.hpp>

#include "dist/dist_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;
namespace nn = trainkit::nn;

dist::MpiComm* g_comm = nullptr;

dist::MpiComm& comm() { return *g_comm; }

// Every rank's verdict: a failure on any rank fails the check on every rank (and keeps the
// ranks in step: a REQUIRE on one rank alone would leave the others waiting in a collective).
bool all_ok(bool ok) {
  std::vector<std::int32_t> v{ok ? 1 : 0};
  comm().all_reduce(std::span<std::int32_t>(v), dist::ReduceOp::kMin).wait();
  return v[0] == 1;
}

tk::HostView<float, 2> mat(float* p, std::int64_t r, std::int64_t c) {
  return tk::make_view(p, {r, c});
}

}  // namespace

TEST_CASE("MpiComm: launched by mpirun, rank and size agree with the environment") {
  const auto info = dist::detect_launch();
  CHECK(info.launcher == dist::Launcher::kOpenMpi);
  CHECK(info.world_size == comm().world_size());
  CHECK(info.rank == comm().rank());
  CHECK(comm().backend() == "MpiComm");
}

TEST_CASE("MpiComm: every op, dtype and size (float64 reference)") {
  const auto cases = disttest::all_cases(comm().world_size());
  std::string first_error;
  for (const auto& c : cases) {
    const std::string e = disttest::run_case(comm(), c, false);
    if (!e.empty() && first_error.empty()) first_error = e;
  }
  CHECK_MESSAGE(first_error.empty(), first_error);
  CHECK(all_ok(first_error.empty()));
  // Asynchronous: several in flight, completed in order.
  std::vector<std::vector<std::int64_t>> bufs(4, std::vector<std::int64_t>(100, comm().rank()));
  std::vector<dist::Work> works;
  for (auto& b : bufs)
    works.push_back(comm().all_reduce(std::span<std::int64_t>(b), dist::ReduceOp::kSum));
  works.push_back(comm().barrier());
  for (auto& w : works) w.wait();
  const std::int64_t n = comm().world_size();
  CHECK(bufs[3][99] == n * (n - 1) / 2);
}

TEST_CASE("MpiComm: 10^7-element all_reduce") {
  constexpr std::int64_t n = 10'000'000;
  const disttest::Case c{
      disttest::Kind::kAllReduce, dist::ReduceOp::kAvg, tk::DType::kF32, n, 0, false, 4242};
  std::vector<float> buf = disttest::values<float>(c.seed, comm().rank(), n);
  comm().all_reduce(std::span<float>(buf), c.op).wait();
  std::int64_t bad = 0;
  for (std::int64_t i = comm().rank(); i < n; i += 7 * comm().world_size())
    bad += std::fabs(buf[static_cast<std::size_t>(i)] -
                     disttest::reference<float>(c, comm().world_size(), i)) > 1e-6;
  CHECK(bad == 0);
}

TEST_CASE("MpiComm: argument errors throw at the call") {
  std::vector<float> a(10), b(15);
  std::vector<std::uint8_t> bytes(4);
  CHECK_THROWS_WITH_AS(comm().all_reduce(std::span<std::uint8_t>(bytes), dist::ReduceOp::kSum),
                       doctest::Contains("cannot reduce U8"), tk::Error);
  CHECK_THROWS_WITH_AS(comm().all_gather(std::span<float>(a), std::span<float>(b)),
                       doctest::Contains("recv must hold world_size * send.count"), tk::Error);
  CHECK_THROWS_AS(comm().broadcast(std::span<float>(a), comm().world_size()), tk::Error);
  if (!comm().cuda_aware())
    CHECK_THROWS_WITH_AS(comm().all_reduce(dist::device_buffer(a.data(), 10), dist::ReduceOp::kSum),
                         doctest::Contains("not CUDA-aware"), tk::Error);
}

TEST_CASE("GradBucketer over MPI: N ranks x batch B == 1 rank x batch N*B within 1e-6") {
  // An MLP on random data: every rank can compute the single-process reference itself.
  constexpr std::int64_t in = 12, hidden = 24, out = 5, per_rank = 6;
  const int world_size = comm().world_size();
  const std::int64_t total = per_rank * world_size;
  auto make = [&](nn::ParamArena<>& arena, std::uint64_t seed) {
    auto fc1 = nn::Linear<>(arena, "fc1", {.in_features = in, .out_features = hidden});
    auto fc2 = nn::Linear<>(arena, "fc2", {.in_features = hidden, .out_features = out});
    arena.finalize();
    arena.initialize(seed);
    return std::pair(std::move(fc1), std::move(fc2));
  };
  const tk::exec::Host host(1);
  auto step = [&](nn::ParamArena<>& arena, nn::Linear<>& fc1, nn::Linear<>& fc2, std::int64_t first,
                  std::int64_t n, auto&& mark, auto&& finish) {
    std::vector<float> x(n * in), t(n * out), h(n * hidden), a(n * hidden), y(n * out), dy(n * out),
        da(n * hidden), dh(n * hidden);
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < in; ++j)
        x[r * in + j] = disttest::value<float>(11, 0, (first + r) * in + j);
      for (std::int64_t j = 0; j < out; ++j)
        t[r * out + j] = disttest::value<float>(12, 0, (first + r) * out + j);
    }
    nn::ReLU relu;
    fc1.forward(host, mat(x.data(), n, in), mat(h.data(), n, hidden));
    relu.forward(host, mat(h.data(), n, hidden), mat(a.data(), n, hidden));
    fc2.forward(host, mat(a.data(), n, hidden), mat(y.data(), n, out));
    for (std::int64_t i = 0; i < n * out; ++i)
      dy[i] = (y[i] - t[i]) * 2.0f / static_cast<float>(n * out);
    fc2.backward(host, mat(a.data(), n, hidden), mat(dy.data(), n, out), mat(da.data(), n, hidden));
    mark(fc2.bias());
    mark(fc2.weight());
    relu.backward(host, mat(h.data(), n, hidden), mat(da.data(), n, hidden),
                  mat(dh.data(), n, hidden));
    fc1.backward(host, mat(x.data(), n, in), mat(dh.data(), n, hidden), tk::HostView<float, 2>());
    mark(fc1.bias());
    mark(fc1.weight());
    finish();
    float* p = arena.params_data();
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) p[i] -= 0.1f * arena.grads_data()[i];
    arena.zero_grad();
  };

  nn::ParamArena<> ref_arena;
  auto [r1, r2] = make(ref_arena, 5);
  nn::ParamArena<> arena;
  auto [f1, f2] = make(arena, 5 + static_cast<std::uint64_t>(comm().rank()));  // rank 0's wins
  dist::BucketOptions o;
  o.first_bucket_bytes = 64;
  o.bucket_bytes = 512;
  dist::GradBucketer<> ddp(arena, comm(), o);
  for (int s = 0; s < 3; ++s) {
    step(
        ref_arena, r1, r2, s * total, total, [](nn::ParamId) {}, [] {});
    step(
        arena, f1, f2, s * total + comm().rank() * per_rank, per_rank,
        [&](nn::ParamId p) { ddp.mark_ready(p); }, [&] { ddp.finish(); });
  }
  double worst = 0.0;
  for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) {
    const double want = ref_arena.params_data()[i];
    worst =
        std::max(worst, std::fabs(arena.params_data()[i] - want) / std::max(1.0, std::fabs(want)));
  }
  CHECK(worst < 1e-6);
  CHECK(all_ok(worst < 1e-6));
}

TEST_CASE("GradBucketer over MPI: a rank with another layout fails every rank at start") {
  nn::ParamArena<> arena;
  arena.add("embed", tk::Shape{10, 4});
  arena.add("head", comm().rank() == comm().world_size() - 1 ? tk::Shape{4, 3} : tk::Shape{3, 4});
  arena.finalize();
  std::string error;
  try {
    dist::GradBucketer<> ddp(arena, comm());
  } catch (const tk::Error& e) {
    error = e.what();
  }
  const std::string want =
      "parameter #1 is 'head' [3, 4] F32 on rank 0 but 'head' [4, 3] F32 on rank " +
      std::to_string(comm().world_size() - 1);
  CHECK_MESSAGE(error.find(want) != std::string::npos, error);
}

namespace {

// --fault=stall: the last rank stalls before its second all_reduce for much longer than the
// timeout; every other rank must fail within the timeout (plus slack) with trainkit::Error.
int run_stall_fault() {
  const int rank = comm().rank(), last = comm().world_size() - 1;
  std::vector<float> buf(1000, 1.0f);
  comm().all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
  if (rank == last) {
    std::this_thread::sleep_for(std::chrono::seconds(6));
    std::printf("rank %d: woke up\n", rank);
    return 0;  // the others have aborted the job by now
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comm().all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
    std::printf("FAULT-TEST-FAIL rank %d: the all_reduce completed\n", rank);
  } catch (const tk::Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool clear =
        std::string(e.what()).find("did not complete within 1.5 s") != std::string::npos;
    std::printf("%s rank %d after %.2f s: %s\n",
                clear && s < 4.0 ? "FAULT-TEST-PASS" : "FAULT-TEST-FAIL", rank, s, e.what());
    // Later collectives fail at once: the communicator is broken.
    try {
      comm().barrier().wait();
      std::printf("FAULT-TEST-FAIL rank %d: barrier after the failure did not fail\n", rank);
    } catch (const tk::Error& e2) {
      std::printf("rank %d: then: %s\n", rank, e2.what());
    }
  }
  std::fflush(stdout);
  return 0;  // ~MpiComm calls MPI_Abort: the communicator is broken
}

// --fault=exit: the last rank exits without MPI_Finalize in the middle of the job. Open MPI's
// runtime then ends every process (non-zero exit status) before their timeout: no hang.
int run_exit_fault() {
  std::vector<float> buf(1000, 1.0f);
  comm().all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
  if (comm().rank() == comm().world_size() - 1) std::_Exit(3);
  try {
    comm().all_reduce(std::span<float>(buf), dist::ReduceOp::kSum).wait();
    std::printf("rank %d: the all_reduce completed\n", comm().rank());
  } catch (const tk::Error& e) {
    std::printf("rank %d: %s\n", comm().rank(), e.what());
  }
  std::fflush(stdout);
  return 0;
}

// --fault=bcast: rank r broadcasts 4 + r floats from rank 0. Every rank must fail with an error
// saying so, and no rank's buffer may be written (MPI alone would fill part of the larger ones).
int run_bcast_fault() {
  const int rank = comm().rank();
  std::vector<float> data(std::size_t(4 + rank), rank == 0 ? 7.0f : -1.0f);
  try {
    comm().broadcast(std::span<float>(data), 0).wait();
    std::printf("FAULT-TEST-FAIL rank %d: the broadcast completed\n", rank);
  } catch (const tk::Error& e) {
    const bool clear = std::string(e.what()).find("every rank must broadcast the root's size") !=
                       std::string::npos;
    const bool untouched = data == std::vector<float>(data.size(), rank == 0 ? 7.0f : -1.0f);
    std::printf("%s rank %d: %s\n", clear && untouched ? "FAULT-TEST-PASS" : "FAULT-TEST-FAIL",
                rank, e.what());
  }
  std::fflush(stdout);
  return 0;  // ~MpiComm calls MPI_Abort: the communicator is broken
}

}  // namespace

int main(int argc, char** argv) {
  bool stall = false, exit_fault = false, bcast = false;
  for (int i = 1; i < argc; ++i) {
    stall = stall || std::strcmp(argv[i], "--fault=stall") == 0;
    exit_fault = exit_fault || std::strcmp(argv[i], "--fault=exit") == 0;
    bcast = bcast || std::strcmp(argv[i], "--fault=bcast") == 0;
  }
  dist::MpiOptions options;
  options.timeout = stall ? std::chrono::milliseconds(1500)
                          : std::chrono::milliseconds(exit_fault ? 20000 : 60000);
  dist::MpiComm mpi(options);
  g_comm = &mpi;
  if (stall) return run_stall_fault();
  if (exit_fault) return run_exit_fault();
  if (bcast) return run_bcast_fault();
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  if (mpi.rank() != 0) context.setOption("minimal", true);  // one full report, from rank 0
  int rc = context.run();
  // The job fails when any rank failed.
  std::vector<std::int32_t> worst{rc};
  mpi.all_reduce(std::span<std::int32_t>(worst), dist::ReduceOp::kMax).wait();
  if (mpi.rank() == 0)
    std::printf("test_dist_mpi: %d ranks, exit %d\n", mpi.world_size(), worst[0]);
  return worst[0];
}
