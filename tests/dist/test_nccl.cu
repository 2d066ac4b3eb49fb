// NcclComm with world_size 1 on one GPU (skipped, exit 77, without one): every op and dtype on
// device buffers, groups, stream ordering (wait_on), the GradBucketer on a device arena with and
// without bf16 compression (its kernels are registered by this nvcc TU; an unmarked parameter;
// when a bucket counts as reduced), Work of an open group, and dist::init choosing NCCL for device
// tensors.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
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

namespace {

/// Device gradients g[i] = 1 + i / 3 (not bf16 values), landed before any stream reads them.
std::vector<float> fill_grads(tk::nn::ParamArena<tk::Space::kDevice>& arena) {
  std::vector<float> g(static_cast<std::size_t>(arena.buffer_numel()));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1.0f + static_cast<float>(i % 4096) / 3.0f;
  REQUIRE(cudaMemcpy(arena.grads_data(), g.data(), g.size() * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // a pageable copy may return before it lands
  return g;
}

std::vector<float> read_grads(const tk::nn::ParamArena<tk::Space::kDevice>& arena) {
  std::vector<float> out(static_cast<std::size_t>(arena.buffer_numel()));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaMemcpy(out.data(), arena.grads_data(), out.size() * 4, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  return out;
}

}  // namespace

TEST_CASE("GradBucketer device arena: finish() without a stream reports an unmarked parameter") {
  // The NaN fill of the held-back buckets went through the host (std::fill on device memory).
  for (bool compress : {false, true}) {
    tk::nn::ParamArena<tk::Space::kDevice> arena;
    const auto w = arena.add("w", tk::Shape{1000});
    const auto b = arena.add("b", tk::Shape{3});
    arena.finalize();
    (void)w;
    dist::BucketOptions o;
    o.bf16_compression = compress;
    o.first_bucket_bytes = 8;
    dist::GradBucketer<tk::Space::kDevice> ddp(arena, solo(), o);
    REQUIRE(ddp.buckets().size() == 2);
    fill_grads(arena);
    tk::cuda::Stream stream;
    ddp.mark_ready(b, stream);
    CHECK_THROWS_WITH_AS(ddp.finish(), doctest::Contains("'w' (bucket 1) was never marked ready"),
                         tk::Error);
    const std::vector<float> out = read_grads(arena);
    const auto& bk = ddp.buckets()[1];
    for (std::int64_t i = bk.offset; i < bk.offset + bk.count; ++i)
      if (!std::isnan(out[static_cast<std::size_t>(i)])) {
        CHECK(std::isnan(out[static_cast<std::size_t>(i)]));
        break;
      }
    // The next pass works as usual.
    fill_grads(arena);
    ddp.mark_ready(b, stream);
    ddp.mark_ready(w, stream);
    ddp.finish();
    CHECK(!std::isnan(read_grads(arena)[0]));
  }
}

TEST_CASE("GradBucketer device arena, bf16: reduced(b) means the f32 gradients hold the average") {
  // The average reaches the f32 gradients in a kernel after the all-reduce; reduced() said true
  // as soon as the all-reduce was done. 2^26 elements make that kernel long enough to be seen.
  tk::nn::ParamArena<tk::Space::kDevice> arena;
  const auto w = arena.add("w", tk::Shape{std::int64_t{1} << 26});
  arena.finalize();
  dist::BucketOptions o;
  o.bf16_compression = true;
  dist::GradBucketer<tk::Space::kDevice> ddp(arena, solo(), o);
  REQUIRE(ddp.buckets().size() == 1);
  const std::vector<float> g = fill_grads(arena);
  tk::cuda::Stream stream;
  ddp.mark_ready(w, stream);
  while (!ddp.reduced(0)) {
  }
  // Nothing is queued on the communicator's stream after this bucket: it must be idle now.
  CHECK(cudaStreamQuery(solo().stream().get()) == cudaSuccess);
  ddp.finish(stream);
  stream.synchronize();
  const std::vector<float> out = read_grads(arena);
  for (std::size_t i = 0; i < g.size(); ++i)
    if (out[i] != static_cast<float>(tk::bf16(g[i]))) {
      CHECK(out[i] == static_cast<float>(tk::bf16(g[i])));
      break;
    }
}

TEST_CASE("GradBucketer device arena, bf16: after an unmarked parameter, the gradients are free") {
  // finish(stream) threw while the kernel storing a NaN bucket's average as f32 could still run
  // on the communicator's stream, and overwrite the zeros the caller writes next.
  tk::nn::ParamArena<tk::Space::kDevice> arena;
  const auto w = arena.add("w", tk::Shape{std::int64_t{1} << 26});
  const auto b = arena.add("b", tk::Shape{3});
  arena.finalize();
  (void)w;
  dist::BucketOptions o;
  o.bf16_compression = true;
  o.first_bucket_bytes = 8;
  dist::GradBucketer<tk::Space::kDevice> ddp(arena, solo(), o);
  REQUIRE(ddp.buckets().size() == 2);
  fill_grads(arena);
  tk::cuda::Stream stream;
  ddp.mark_ready(b, stream);
  CHECK_THROWS_AS(ddp.finish(stream), tk::Error);
  REQUIRE(cudaMemsetAsync(arena.grads_data(), 0, static_cast<std::size_t>(arena.buffer_numel()) * 4,
                          stream.get()) == cudaSuccess);
  stream.synchronize();
  const std::vector<float> out = read_grads(arena);
  for (std::size_t i = 0; i < out.size(); ++i)
    if (out[i] != 0.0f) {
      CHECK(out[i] == 0.0f);
      break;
    }
}

TEST_CASE("NcclComm: a Work of an open group cannot be waited on before the group ends") {
  // Its event is recorded only at ncclGroupEnd; CUDA counts a never-recorded event as complete,
  // so wait() returned and wait_on() ordered nothing, before the collective had run.
  auto& comm = solo();
  std::vector<float> got = round_trip(std::vector<float>{2.0f, 3.0f}, [&](float* d) {
    tk::cuda::Stream other;
    dist::Work w;
    {
      auto group = comm.group();
      w = comm.all_reduce(dist::device_buffer(d, 2), dist::ReduceOp::kSum);
      CHECK_FALSE(w.test());
      CHECK_THROWS_WITH_AS(w.wait(), doctest::Contains("inside the group() that issued it"),
                           tk::Error);
      CHECK_THROWS_AS(comm.wait_on(w, other), tk::Error);
    }
    comm.wait_on(w, other);
    w.wait();
    CHECK(w.test());
  });
  CHECK(got == std::vector<float>{2.0f, 3.0f});
  CHECK_FALSE(comm.failed());
}

TEST_CASE("NcclComm::barrier allocates on the communicator's device, whichever is current") {
  if (tk::cuda::device_count() < 2) return;  // needs a second device to be current
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  dist::NcclComm comm(0, 1, dist::NcclComm::make_unique_id());
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  comm.barrier().wait();
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CHECK_FALSE(comm.failed());
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
