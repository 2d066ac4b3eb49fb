// GradBucketer over ThreadComm: DDP's bucket assignment, data-parallel equivalence (2 ranks x
// batch B == 1 rank x batch 2B, bitwise; shards from data::DistributedSampler), no_sync gradient
// accumulation, bf16 compression, overlap (a bucket is reduced before finish()), parameters
// broadcast from rank 0, and the errors: mismatched layouts, unmarked or twice-marked parameters.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <trainkit/data/sampler.hpp>
#include <trainkit/dist/bucketer.hpp>
#include <trainkit/dist/thread_comm.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/activation.hpp>
#include <trainkit/nn/linear.hpp>
#include <trainkit/nn/param_arena.hpp>

#include "dist/dist_test_util.hpp"

namespace {

namespace tk = trainkit;
namespace dist = trainkit::dist;
namespace nn = trainkit::nn;

tk::HostView<float, 2> mat(float* p, std::int64_t r, std::int64_t c) {
  return tk::make_view(p, {r, c});
}

const tk::exec::Host& one_thread() {
  static tk::exec::Host host(1);
  return host;
}

// The data-parallel test problem: a Linear-ReLU-Linear MLP with MSE loss whose inputs, targets
// and initial weights are small dyadic numbers, so every product and sum in forward, backward
// and the average is exact: the bits then cannot depend on how the batch is split, and the
// test compares data-parallel training with single-process training bit for bit.
constexpr std::int64_t kIn = 8, kHidden = 16, kOut = 4, kExamples = 16;
constexpr float kLr = 1.0f / 16.0f;

struct Mlp {
  nn::ParamArena<> arena;
  nn::Linear<> fc1;
  nn::ReLU relu;
  nn::Linear<> fc2;

  explicit Mlp(std::uint64_t init_seed)
      : fc1(arena, "fc1", {.in_features = kIn, .out_features = kHidden}),
        fc2(arena, "fc2", {.in_features = kHidden, .out_features = kOut}) {
    arena.finalize();
    float* p = arena.params_data();
    for (const auto& info : arena.infos())
      for (std::int64_t i = 0; i < info.numel; ++i)
        p[info.offset + i] =
            static_cast<float>(
                static_cast<int>(disttest::mix(init_seed * 1000 + info.offset + i) % 9) - 4) /
            8.0f;
  }

  // One forward/backward over the examples `idx`; loss = mean over examples and outputs of
  // (y - t)^2. Calls mark(param) right after each layer's backward, as a DDP backward hook would.
  template <class Mark>
  void backward(const std::vector<std::int64_t>& idx, Mark&& mark) {
    const auto n = static_cast<std::int64_t>(idx.size());
    std::vector<float> x(n * kIn), t(n * kOut), h(n * kHidden), a(n * kHidden), y(n * kOut);
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < kIn; ++j)
        x[r * kIn + j] =
            static_cast<float>(static_cast<int>(disttest::mix(idx[r] * 100 + j) % 5) - 2);
      for (std::int64_t j = 0; j < kOut; ++j)
        t[r * kOut + j] =
            static_cast<float>(static_cast<int>(disttest::mix(7777 + idx[r] * 100 + j) % 7) - 3);
    }
    fc1.forward(one_thread(), mat(x.data(), n, kIn), mat(h.data(), n, kHidden));
    relu.forward(one_thread(), mat(h.data(), n, kHidden), mat(a.data(), n, kHidden));
    fc2.forward(one_thread(), mat(a.data(), n, kHidden), mat(y.data(), n, kOut));
    std::vector<float> dy(n * kOut), da(n * kHidden), dh(n * kHidden);
    const float scale = 2.0f / static_cast<float>(n * kOut);
    for (std::int64_t i = 0; i < n * kOut; ++i) dy[i] = (y[i] - t[i]) * scale;
    fc2.backward(one_thread(), mat(a.data(), n, kHidden), mat(dy.data(), n, kOut),
                 mat(da.data(), n, kHidden));
    mark(fc2.bias());
    mark(fc2.weight());
    relu.backward(one_thread(), mat(h.data(), n, kHidden), mat(da.data(), n, kHidden),
                  mat(dh.data(), n, kHidden));
    fc1.backward(one_thread(), mat(x.data(), n, kIn), mat(dh.data(), n, kHidden),
                 tk::HostView<float, 2>());
    mark(fc1.bias());
    mark(fc1.weight());
  }

  void sgd() {
    float* p = arena.params_data();
    const float* g = arena.grads_data();
    for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) p[i] -= kLr * g[i];
  }

  std::vector<float> params() const {
    return std::vector<float>(arena.params_data(), arena.params_data() + arena.buffer_numel());
  }
};

std::vector<std::int64_t> range(std::int64_t begin, std::int64_t end) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = begin; i < end; ++i) v.push_back(i);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

dist::BucketOptions small_buckets() {
  dist::BucketOptions o;
  o.first_bucket_bytes = 16;  // fc2.bias | fc2.weight + fc1.bias | fc1.weight
  o.bucket_bytes = 300;
  return o;
}

}  // namespace

TEST_CASE("GradBucketer: DDP's bucket assignment (reverse order, first cap, then cap)") {
  nn::ParamArena<> arena;
  arena.add("a", tk::Shape{100});  // 400 B
  arena.add("b", tk::Shape{300});  // 1200 B
  arena.add("c", tk::Shape{50});   // 200 B
  arena.add("d", tk::Shape{500});  // 2000 B
  arena.add("e", tk::Shape{10});   // 40 B
  arena.finalize();
  dist::BucketOptions o;
  o.first_bucket_bytes = 1000;
  o.bucket_bytes = 1300;
  dist::ThreadComm::run(1, [&](dist::ThreadComm& comm) {
    dist::GradBucketer<> bucketer(arena, comm, o);
    const auto& b = bucketer.buckets();
    REQUIRE(b.size() == 3);
    // e (40 B) + d (2000 B) >= 1000 B; then c + b = 1400 B >= 1300 B; then a.
    CHECK(b[0].params == std::vector<nn::ParamId>{arena.at("e"), arena.at("d")});
    CHECK(b[1].params == std::vector<nn::ParamId>{arena.at("c"), arena.at("b")});
    CHECK(b[2].params == std::vector<nn::ParamId>{arena.at("a")});
    // Slices of the gradient buffer, back to front, covering it exactly (padding included).
    CHECK(b[0].offset == arena.info(arena.at("d")).offset);
    CHECK(b[0].offset + b[0].count == arena.buffer_numel());
    CHECK(b[1].offset == arena.info(arena.at("b")).offset);
    CHECK(b[1].offset + b[1].count == b[0].offset);
    CHECK(b[2].offset == 0);
    CHECK(b[2].count == b[1].offset);
    CHECK(bucketer.bucket_of(arena.at("c")) == 1);
  });

  SUBCASE("defaults: 1 MiB first bucket, then 25 MiB") {
    nn::ParamArena<> big;
    for (int i = 0; i < 12; ++i)
      big.add(trainkit::detail::concat("w", i), tk::Shape{1 << 20});  // 4 MiB each
    big.add("head", tk::Shape{1000});
    big.finalize();
    dist::ThreadComm::run(1, [&](dist::ThreadComm& comm) {
      dist::GradBucketer<> bucketer(big, comm);
      const auto& b = bucketer.buckets();
      // head + w11 (>= 1 MiB) | w10..w4 (7 x 4 MiB = 28 MiB >= 25) | w3..w0
      REQUIRE(b.size() == 3);
      CHECK(b[0].params.size() == 2);
      CHECK(b[1].params.size() == 7);
      CHECK(b[2].params.size() == 4);
    });
  }
}

TEST_CASE("GradBucketer: 2 ranks x batch B == 1 rank x batch 2B, bitwise (ThreadComm)") {
  // The first step is exact arithmetic (see Mlp), hence bitwise; after it the weights carry more
  // bits than a float product keeps, the batch split changes the rounding of the gradient sums
  // (in any data-parallel system), and later steps agree to rounding.
  constexpr int kSteps = 3;
  Mlp ref(1);  // one process, the whole batch
  std::vector<float> ref_step1;
  for (int s = 0; s < kSteps; ++s) {
    ref.arena.zero_grad();
    ref.backward(range(0, kExamples), [](nn::ParamId) {});
    ref.sgd();
    if (s == 0) ref_step1 = ref.params();
  }

  for (bool compress : {false, true}) {
    CAPTURE(compress);
    std::vector<std::vector<float>> result(2), step1(2);
    std::vector<std::size_t> buckets(2);
    dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
      // Rank 1 starts from different weights: the bucketer broadcasts rank 0's.
      Mlp model(comm.rank() == 0 ? 1 : 2);
      dist::BucketOptions o = small_buckets();
      o.bf16_compression = compress;
      dist::GradBucketer<> ddp(model.arena, comm, o);
      buckets[static_cast<std::size_t>(comm.rank())] = ddp.buckets().size();
      tk::data::DistributedSampler sampler(kExamples,
                                           {.world_size = 2,
                                            .rank = static_cast<std::size_t>(comm.rank()),
                                            .shuffle = true,
                                            .seed = 3});
      for (int s = 0; s < kSteps; ++s) {
        model.arena.zero_grad();
        model.backward(sampler.indices(static_cast<std::uint64_t>(s)),
                       [&](nn::ParamId p) { ddp.mark_ready(p); });
        ddp.finish();
        model.sgd();
        if (s == 0) step1[static_cast<std::size_t>(comm.rank())] = model.params();
      }
      result[static_cast<std::size_t>(comm.rank())] = model.params();
    });
    CHECK(buckets[0] == 3);
    CHECK(same_bits(step1[0], step1[1]));
    CHECK(same_bits(result[0], result[1]));
    if (!compress) {
      CHECK(same_bits(step1[0], ref_step1));
      const auto want = ref.params();
      double worst = 0.0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(result[0][i]) - want[i]) /
                                    std::max(1.0, std::fabs(static_cast<double>(want[i]))));
      CHECK(worst < 1e-6);
    } else {
      // bf16 on the wire: close to the reference, not equal.
      const auto want = ref.params();
      double worst = 0.0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(result[0][i] - want[i])));
      CHECK(worst < 0.02);
    }
  }
}

TEST_CASE("GradBucketer: no_sync accumulates locally; the next pass averages the sum") {
  // Reference: one process, two micro-batches of 2B examples accumulated, one step.
  Mlp ref(1);
  ref.arena.zero_grad();
  ref.backward(range(0, 16), [](nn::ParamId) {});
  ref.backward(range(16, 32), [](nn::ParamId) {});
  ref.sgd();

  std::vector<std::vector<float>> result(2);
  std::vector<int> local_after_no_sync(2);
  dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
    const int r = comm.rank();
    Mlp model(1);
    dist::GradBucketer<> ddp(model.arena, comm, small_buckets());
    model.arena.zero_grad();
    {
      auto guard = ddp.no_sync();
      CHECK_FALSE(ddp.syncing());
      model.backward(range(r * 8, r * 8 + 8), [&](nn::ParamId p) { ddp.mark_ready(p); });
      ddp.finish();  // nothing to wait for
    }
    CHECK(ddp.syncing());
    // Still this rank's own gradient: compare with a fresh local computation.
    Mlp local(1);
    local.arena.zero_grad();
    local.backward(range(r * 8, r * 8 + 8), [](nn::ParamId) {});
    local_after_no_sync[static_cast<std::size_t>(r)] =
        std::memcmp(local.arena.grads_data(), model.arena.grads_data(),
                    static_cast<std::size_t>(model.arena.buffer_numel()) * sizeof(float)) == 0;
    model.backward(range(16 + r * 8, 16 + r * 8 + 8), [&](nn::ParamId p) { ddp.mark_ready(p); });
    ddp.finish();
    model.sgd();
    result[static_cast<std::size_t>(r)] = model.params();
  });
  CHECK(local_after_no_sync[0]);
  CHECK(local_after_no_sync[1]);
  CHECK(same_bits(result[0], result[1]));
  CHECK(same_bits(result[0], ref.params()));
}

TEST_CASE("GradBucketer: a bucket is reduced as soon as its last gradient is marked") {
  for (const bool bf16 : {false, true}) {  // with compression too: averaged into the arena
    CAPTURE(bf16);
    std::vector<int> early(2, 0);
    dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
      nn::ParamArena<> arena;
      const auto w = arena.add("w", tk::Shape{1000});
      const auto v = arena.add("v", tk::Shape{1000});
      arena.finalize();
      dist::BucketOptions o;
      o.first_bucket_bytes = 4;  // v alone, then w
      o.bucket_bytes = 4;
      o.bf16_compression = bf16;
      dist::GradBucketer<> ddp(arena, comm, o);
      REQUIRE(ddp.buckets().size() == 2);
      float* g = arena.grads_data();
      for (std::int64_t i = 0; i < arena.buffer_numel(); ++i) g[i] = comm.rank() == 0 ? 1.0f : 3.0f;
      ddp.mark_ready(v);
      // Without finish(): the progress thread averages v's bucket while we "compute" w.
      const float* gv = arena.grads_data() + arena.info(v).offset;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!ddp.reduced(0) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      early[static_cast<std::size_t>(comm.rank())] =
          ddp.reduced(0) && !ddp.reduced(1) && gv[999] == 2.0f && gv[0] == 2.0f;
      // w's bucket has not started: its gradient is still this rank's own.
      const float* gw = arena.grads_data() + arena.info(w).offset;
      early[static_cast<std::size_t>(comm.rank())] &= gw[0] == (comm.rank() == 0 ? 1.0f : 3.0f);
      ddp.mark_ready(w);
      ddp.finish();
      CHECK(gw[0] == 2.0f);
    });
    CHECK(early[0] == 1);
    CHECK(early[1] == 1);
  }
}

TEST_CASE(
    "GradBucketer: a parameter one rank forgot poisons that step on every rank, and the "
    "ranks stay in step") {
  // Rank 1 forgets p1 in the first pass and goes on after the error (it used to issue fewer
  // all-reduces, so the next pass paired its buckets with the others' earlier ones: wrong
  // averages on every rank, and no error).
  std::vector<std::vector<float>> step0(3), step1(3);
  std::vector<std::string> errors(3);
  dist::ThreadComm::run(3, [&](dist::ThreadComm& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    nn::ParamArena<> arena;
    std::vector<nn::ParamId> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(arena.add("p" + std::to_string(i), tk::Shape{8}));
    arena.finalize();
    dist::BucketOptions o;
    o.first_bucket_bytes = 4;  // one bucket per parameter
    o.bucket_bytes = 4;
    dist::GradBucketer<> ddp(arena, comm, o);
    for (int step = 0; step < 2; ++step) {
      float* g = arena.grads_data();
      for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
        g[i] = static_cast<float>(1000 * step + 3 * comm.rank() + 1);
      for (int i = 3; i >= 0; --i)
        if (!(step == 0 && comm.rank() == 1 && i == 1))
          ddp.mark_ready(ids[static_cast<std::size_t>(i)]);
      try {
        ddp.finish();
      } catch (const tk::Error& e) {
        errors[r] = e.what();
      }
      auto& seen = (step == 0 ? step0 : step1)[r];
      seen.clear();
      for (const nn::ParamId id : ids)  // p0..p3, 8 values each
        seen.insert(seen.end(), g + arena.info(id).offset, g + arena.info(id).offset + 8);
    }
  });
  CHECK(errors[0].empty());
  CHECK(errors[2].empty());
  CHECK(errors[1].find("parameter 'p1' (bucket 2) was never marked ready") != std::string::npos);
  CHECK(errors[1].find("reduced as NaN on every rank") != std::string::npos);
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    // Step 0: p0 and p1 (buckets 3 and 2, launched after the forgotten one) are NaN everywhere;
    // p2 and p3 hold the average (1 + 4 + 7) / 3 = 4.
    for (std::size_t i = 0; i < 32; ++i) {
      if (i < 16) {
        CHECK(std::isnan(step0[r][i]));
      } else {
        CHECK(step0[r][i] == 4.0f);
      }
    }
    // Step 1: every rank has the right average again, (1001 + 1004 + 1007) / 3.
    for (float v : step1[r]) CHECK(v == 1004.0f);
  }
}

TEST_CASE("GradBucketer: mismatched layouts are caught at construction on every rank") {
  std::mutex m;
  std::vector<std::string> errors;
  auto run = [&](auto register_params) {
    errors.clear();
    dist::ThreadComm::run(3, [&](dist::ThreadComm& comm) {
      nn::ParamArena<> arena;
      register_params(arena, comm.rank());
      arena.finalize();
      try {
        dist::GradBucketer<> ddp(arena, comm);
        std::lock_guard<std::mutex> lock(m);
        errors.push_back("no error on rank " + std::to_string(comm.rank()));
      } catch (const tk::Error& e) {
        std::lock_guard<std::mutex> lock(m);
        errors.push_back(e.what());
      }
    });
  };
  run([](nn::ParamArena<>& a, int rank) {
    a.add("fc.weight", tk::Shape{8, 4});
    a.add("fc.bias", rank == 2 ? tk::Shape{4} : tk::Shape{8});
  });
  REQUIRE(errors.size() == 3);
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("parameter #1 is 'fc.bias' [8] F32 on rank 0 but 'fc.bias' [4] F32 on rank 2") !=
          std::string::npos);
  }
  run([](nn::ParamArena<>& a, int rank) {
    a.add("w", tk::Shape{3});
    if (rank == 1) a.add("extra", tk::Shape{2});
  });
  REQUIRE(errors.size() == 3);
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("parameter #1 is nothing (rank 0 registered only 1 parameters) on rank 0 but "
                 "'extra' [2] F32 on rank 1") != std::string::npos);
  }
}

TEST_CASE("GradBucketer: unmarked and twice-marked parameters are errors") {
  std::mutex m;
  std::vector<std::string> errors;
  dist::ThreadComm::run(2, [&](dist::ThreadComm& comm) {
    Mlp model(1);
    dist::GradBucketer<> ddp(model.arena, comm, small_buckets());
    auto note = [&](const tk::Error& e) {
      std::lock_guard<std::mutex> lock(m);
      errors.push_back(e.what());
    };
    ddp.mark_ready(model.fc2.bias());
    try {
      ddp.mark_ready(model.fc2.bias());
    } catch (const tk::Error& e) {
      note(e);
    }
    ddp.mark_ready(model.fc2.weight());
    ddp.mark_ready(model.fc1.bias());  // fc1.weight is forgotten: its bucket never starts
    try {
      ddp.finish();
    } catch (const tk::Error& e) {
      note(e);
    }
    // The next pass works normally.
    model.arena.zero_grad();
    model.backward(range(0, 4), [&](nn::ParamId p) { ddp.mark_ready(p); });
    ddp.finish();
  });
  REQUIRE(errors.size() == 4);
  int twice = 0, never = 0;
  for (const auto& e : errors) {
    twice += e.find("'fc2.bias' marked ready twice") != std::string::npos;
    never +=
        e.find("parameter 'fc1.weight' (bucket 2) was never marked ready") != std::string::npos;
  }
  CHECK(twice == 2);
  CHECK(never == 2);
}
