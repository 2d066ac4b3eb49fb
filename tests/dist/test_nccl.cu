// NcclComm with world_size 1 on one GPU (skipped, exit 77, without one): every op and dtype on
// device buffers, groups, stream ordering (wait_on), the GradBucketer on a device arena with and
// without bf16 compression (its kernels are registered by this nvcc TU), and dist::init choosing
// NCCL for device tensors.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include <trainkit/config.hpp>
#include <trainkit/dist/bootstrap.hpp>
#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/nccl_comm.hpp>

#if TRAINKIT_WITH_NCCL

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;

template <class T>
std::vector<T> round_trip(const std::vector<T>& host, auto&& op) {
  T* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, host.size() * sizeof(T) + 1) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  op(dev);
  std::vector<T> out(host.size());
  REQUIRE(cudaMemcpy(out.data(), dev, host.size() * sizeof(T), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  cudaFree(dev);
  return out;
}

dist::NcclComm& solo() {
  static dist::NcclComm comm(0, 1, dist::NcclComm::make_unique_id());
  return comm;
}

}  // namespace

TEST_CASE("NcclComm world_size 1: every reduction and dtype is the identity") {
  auto& comm = solo();
  CHECK(comm.world_size() == 1);
  CHECK(comm.space() == tk::Space::kDevice);
  CHECK(dist::NcclComm::version() >= 21003);
  for (auto op :
       {dist::ReduceOp::kSum, dist::ReduceOp::kAvg, dist::ReduceOp::kMax, dist::ReduceOp::kMin}) {
    const std::vector<float> f{1.5f, -2.0f, 3.25f};
    CHECK(round_trip(f, [&](float* d) { comm.all_reduce(dist::device_buffer(d, 3), op).wait(); }) ==
          f);
    const std::vector<std::int64_t> i{7, -9, 1LL << 40};
    CHECK(round_trip(i, [&](std::int64_t* d) {
            comm.all_reduce(dist::device_buffer(d, 3), op).wait();
          }) == i);
    const std::vector<tk::bf16> b{tk::bf16(0.5f), tk::bf16(-3.0f)};
    const auto bo =
        round_trip(b, [&](tk::bf16* d) { comm.all_reduce(dist::device_buffer(d, 2), op).wait(); });
    CHECK(static_cast<float>(bo[1]) == -3.0f);
  }
}

TEST_CASE("NcclComm world_size 1: data movement, groups, barrier and stream order") {
  auto& comm = solo();
  const std::vector<double> v{1.0, 2.0, 3.0, 4.0};
  std::vector<double> got = round_trip(v, [&](double* d) {
    comm.broadcast(dist::device_buffer(d, 4), 0).wait();
    {
      auto group = comm.group();
      comm.all_reduce(dist::device_buffer(d, 2), dist::ReduceOp::kSum);
      comm.all_gather(dist::device_buffer(d + 2, 1), dist::device_buffer(d + 3, 1));
    }
    comm.barrier().wait();
    tk::cuda::Stream other;
    dist::Work w = comm.reduce_scatter(dist::device_buffer(d, 1), dist::device_buffer(d + 1, 1),
                                       dist::ReduceOp::kMax);
    comm.wait_on(w, other);
    other.synchronize();
    CHECK(w.test());
  });
  CHECK(got == std::vector<double>{1.0, 1.0, 3.0, 3.0});
  comm.check_async_error();
}

TEST_CASE("GradBucketer on a device arena (NCCL, world_size 1), with and without bf16") {
  for (bool compress : {false, true}) {
    tk::nn::ParamArena<tk::Space::kDevice> arena;
    const auto w = arena.add("w", tk::Shape{1000});
    const auto b = arena.add("b", tk::Shape{3});
    arena.finalize();
    dist::BucketOptions o;
    o.bf16_compression = compress;
    o.first_bucket_bytes = 8;
    dist::GradBucketer<tk::Space::kDevice> ddp(arena, solo(), o);
    CHECK(ddp.buckets().size() == 2);
    std::vector<float> g(static_cast<std::size_t>(arena.buffer_numel()));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1.0f + static_cast<float>(i) / 3.0f;
    REQUIRE(cudaMemcpy(arena.grads_data(), g.data(), g.size() * 4, cudaMemcpyHostToDevice) ==
            cudaSuccess);
    tk::cuda::Stream stream;
    ddp.mark_ready(b, stream);
    ddp.mark_ready(w, stream);
    ddp.finish(stream);
    stream.synchronize();
    std::vector<float> out(g.size());
    REQUIRE(cudaMemcpy(out.data(), arena.grads_data(), g.size() * 4, cudaMemcpyDeviceToHost) ==
            cudaSuccess);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float want = compress ? static_cast<float>(tk::bf16(g[i])) : g[i];
      if (out[i] != want) {
        CHECK(out[i] == want);
        break;
      }
    }
  }
}

TEST_CASE("dist::init: a single process with device tensors gets NCCL on device 0") {
  // Every launcher dist::detect_launch reads (torchrun, Open MPI, Slurm, MPICH/Intel MPI's PMI):
  // a GPU machine's shell may carry one, which would make this a rank of a larger job.
  for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "SLURM_PROCID", "PMI_RANK", "PMI_SIZE"})
    ::unsetenv(v);
  auto ctx = dist::init({.space = tk::Space::kDevice});
  CHECK(ctx.backend() == dist::Backend::kNccl);
  CHECK(ctx.device() == 0);
  CHECK(ctx.comm().world_size() == 1);
  ctx.comm().barrier().wait();
}

#endif  // TRAINKIT_WITH_NCCL
