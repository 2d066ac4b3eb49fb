// SPDX-License-Identifier: MIT
// bench/ddp_overlap worker: two data-parallel ranks (threads, ThreadComm) train the same MLP,
// each with its own one-thread exec::Host. Cases, each one training step on both ranks:
//   compute     forward + backward only (no communication): the floor
//   overlap     GradBucketer::mark_ready after each layer's backward, finish() at the end: the
//               buckets' all-reduces run on the progress threads while backward continues
//   no_overlap  backward first, then every parameter marked and finish(): communication after
// step(case) - step(compute) is the communication the step exposes.
#include <bench.hpp>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>

namespace tk = trainkit;
namespace dist = trainkit::dist;
namespace nn = trainkit::nn;

namespace {

enum class Mode { kCompute, kOverlap, kNoOverlap, kQuit };

struct Shared {
  std::mutex mutex;
  std::condition_variable cv;
  Mode mode = Mode::kCompute;
  std::uint64_t generation = 0;
  int done = 0;
};

tk::HostView<float, 2> mat(float* p, std::int64_t r, std::int64_t c) {
  return tk::HostView<float, 2>(p, tk::Extents<2>{{r, c}});
}

void rank_main(dist::ThreadComm& comm, Shared& shared, int layers, std::int64_t width,
               std::int64_t batch, std::int64_t bucket_bytes) {
  const tk::exec::Host host(1);
  nn::ParamArena<> arena;
  std::vector<nn::Linear<>> fc;
  for (int l = 0; l < layers; ++l)
    fc.emplace_back(arena, "fc" + std::to_string(l),
                    nn::LinearOptions{.in_features = width, .out_features = width});
  arena.finalize();
  arena.initialize(1);
  dist::BucketOptions options;
  options.bucket_bytes = bucket_bytes;
  dist::GradBucketer<> ddp(arena, comm, options);
  const nn::ReLU relu;
  const std::int64_t n = batch * width;
  std::vector<std::vector<float>> h(layers + 1, std::vector<float>(n)), a = h;
  std::vector<float> dy(n), da(n), dh(n), target(n, 0.5f);
  for (std::int64_t i = 0; i < n; ++i)
    a[0][i] = static_cast<float>((i * 7 + comm.rank()) % 13) / 13.0f - 0.5f;

  auto step = [&](Mode mode) {
    arena.zero_grad();
    for (int l = 0; l < layers; ++l) {
      fc[l].forward(host, mat(a[l].data(), batch, width), mat(h[l + 1].data(), batch, width));
      relu.forward(host, mat(h[l + 1].data(), batch, width), mat(a[l + 1].data(), batch, width));
    }
    for (std::int64_t i = 0; i < n; ++i) da[i] = (a[layers][i] - target[i]) * (2.0f / n);
    for (int l = layers - 1; l >= 0; --l) {
      relu.backward(host, mat(h[l + 1].data(), batch, width), mat(da.data(), batch, width),
                    mat(dh.data(), batch, width));
      fc[l].backward(host, mat(a[l].data(), batch, width), mat(dh.data(), batch, width),
                     l > 0 ? mat(da.data(), batch, width) : tk::HostView<float, 2>());
      if (mode == Mode::kOverlap) {
        ddp.mark_ready(fc[l].bias());
        ddp.mark_ready(fc[l].weight());
      }
    }
    if (mode == Mode::kNoOverlap)
      for (int l = layers - 1; l >= 0; --l) {
        ddp.mark_ready(fc[l].bias());
        ddp.mark_ready(fc[l].weight());
      }
    if (mode != Mode::kCompute) ddp.finish();
  };

  std::uint64_t seen = 0;
  for (;;) {
    Mode mode;
    {
      std::unique_lock<std::mutex> lock(shared.mutex);
      shared.cv.wait(lock, [&] { return shared.generation != seen; });
      seen = shared.generation;
      mode = shared.mode;
    }
    if (mode == Mode::kQuit) return;
    step(mode);
    {
      std::lock_guard<std::mutex> lock(shared.mutex);
      ++shared.done;
    }
    shared.cv.notify_all();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = std::stoi(trainkit_bench::arg(argc, argv, "layers", "6"));
  const std::int64_t width = std::stoll(trainkit_bench::arg(argc, argv, "width", "1024"));
  const std::int64_t batch = std::stoll(trainkit_bench::arg(argc, argv, "batch", "32"));
  const std::int64_t bucket =
      std::stoll(trainkit_bench::arg(argc, argv, "bucket-bytes", "4194304"));
  Shared shared;
  auto group = std::make_shared<dist::ThreadGroup>(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      dist::ThreadComm comm(group, r);
      rank_main(comm, shared, layers, width, batch, bucket);
    });
  auto run = [&](Mode mode) {
    std::unique_lock<std::mutex> lock(shared.mutex);
    shared.mode = mode;
    shared.done = 0;
    ++shared.generation;
    shared.cv.notify_all();
    shared.cv.wait(lock, [&] { return shared.done == 2; });
  };
  const std::int64_t params = layers * (width * width + width);
  const int rc = trainkit_bench::serve({{"params", std::to_string(params)},
                                        {"grad_mib", std::to_string(params * 4 >> 20)},
                                        {"buckets_mib", std::to_string(bucket >> 20)}},
                                       {{"compute", [&] { run(Mode::kCompute); }},
                                        {"overlap", [&] { run(Mode::kOverlap); }},
                                        {"no_overlap", [&] { run(Mode::kNoOverlap); }}});
  run(Mode::kQuit);
  for (auto& t : ranks) t.join();
  return rc;
}
