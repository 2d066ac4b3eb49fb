// SPDX-License-Identifier: MIT
// The Prefetcher: batch order independent of worker count and thread timing, exact mid-epoch
// resume, worker errors with context, quick destruction, data-wait accounting, transforms and
// streaming datasets. Also built with -fsanitize=thread by tests/fuzz/CMakeLists.txt ("tsan").
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <pthread.h>

#include <trainkit/core/rng.hpp>
#include <trainkit/data/npy_dataset.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/data/tar_shards.hpp>

#include "data_test_util.hpp"

namespace tk = trainkit;
using data_test::check_contains;
using data_test::error_of;
using data_test::fixture;

namespace {

/// Sample i: "x" = {i, 2i, 3i} (I64 [3]), "y" = i / 2 (F32 scalar). Reads sleep a pseudo-random
/// few microseconds (different per call) so worker timing varies; index `fail` throws.
class SlowDataset {
 public:
  SlowDataset(std::size_t n, int max_sleep_us = 50, std::int64_t fail = -1)
      : n_(n), max_sleep_us_(max_sleep_us), fail_(fail) {}
  std::size_t size() const { return n_; }
  const std::vector<tk::data::FieldSpec>& fields() const { return fields_; }
  void read(std::size_t i, const tk::data::SampleRef& out) const {
    if (static_cast<std::int64_t>(i) == fail_) TRAINKIT_FAIL("disk on fire at row ", i);
    if (max_sleep_us_ > 0) {
      const std::uint32_t r = tk::philox_u32(99, 0, calls_.fetch_add(1));
      std::this_thread::sleep_for(std::chrono::microseconds(r % std::uint32_t(max_sleep_us_)));
    }
    const auto v = static_cast<std::int64_t>(i);
    const std::int64_t x[3] = {v, 2 * v, 3 * v};
    std::memcpy(out[0].data(), x, sizeof x);
    const float y = static_cast<float>(v) / 2;
    std::memcpy(out[1].data(), &y, sizeof y);
  }
  std::string describe(std::size_t i) const { return "synthetic row " + std::to_string(i); }

 private:
  std::size_t n_;
  int max_sleep_us_;
  std::int64_t fail_;
  mutable std::atomic<std::uint64_t> calls_{0};
  std::vector<tk::data::FieldSpec> fields_{{"x", tk::DType::kI64, {3}}, {"y", tk::DType::kF32, {}}};
};
static_assert(tk::data::Dataset<SlowDataset>);

/// SlowDataset whose fields() returns its list by value (the Dataset concept allows it).
class FieldsByValue : public SlowDataset {
 public:
  using SlowDataset::SlowDataset;
  std::vector<tk::data::FieldSpec> fields() const { return SlowDataset::fields(); }
};
static_assert(tk::data::Dataset<FieldsByValue>);

struct Seen {
  std::uint64_t epoch, index;
  bool last;
  std::vector<std::int64_t> indices;
  friend bool operator==(const Seen&, const Seen&) = default;
};

/// Records a batch after checking its fields hold the values of its indices.
Seen record(const tk::data::Batch& b) {
  const auto x = b.host<std::int64_t, 2>("x");
  const auto y = b.host<float, 1>("y");
  REQUIRE(x.size(0) == static_cast<std::int64_t>(b.size()));
  for (std::size_t r = 0; r < b.size(); ++r) {
    const std::int64_t i = b.indices()[r];
    const auto ri = static_cast<std::int64_t>(r);
    if (x(ri, 0) != i || x(ri, 2) != 3 * i || y(ri) != static_cast<float>(i) / 2) {
      FAIL_CHECK("batch " << b.index() << " row " << r << " does not hold sample " << i);
    }
  }
  return {b.epoch(), b.index(), b.last_in_epoch(), {b.indices().begin(), b.indices().end()}};
}

/// What a loader over `sampler` must produce: the sampler's indices cut into batches.
template <class S>
std::vector<Seen> expected(const S& sampler, std::size_t batch, bool drop_last,
                           std::uint64_t first_epoch, std::size_t count) {
  std::vector<Seen> out;
  for (std::uint64_t e = first_epoch; out.size() < count; ++e) {
    const std::vector<std::int64_t> idx = sampler.indices(e);
    const std::size_t n = drop_last ? idx.size() / batch : (idx.size() + batch - 1) / batch;
    for (std::size_t b = 0; b < n && out.size() < count; ++b) {
      const std::size_t lo = b * batch, hi = std::min(idx.size(), lo + batch);
      out.push_back(
          {e, b, b + 1 == n, {idx.begin() + std::ptrdiff_t(lo), idx.begin() + std::ptrdiff_t(hi)}});
    }
  }
  return out;
}

/// A sampler whose second index is negative, or, with fail_epoch set, that gives {0, 1} but
/// throws std::runtime_error for that epoch.
struct NegativeSampler {
  std::int64_t fail_epoch = -1;
  std::size_t size() const { return 2; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) const {
    if (fail_epoch < 0) return {0, -1};
    if (epoch == static_cast<std::uint64_t>(fail_epoch))
      throw std::runtime_error("index file gone");
    return {0, 1};
  }
};

std::vector<Seen> take(tk::data::Prefetcher& p, std::size_t count) {
  std::vector<Seen> out;
  for (std::size_t k = 0; k < count; ++k) out.push_back(record(p.next()));
  return out;
}

}  // namespace

TEST_CASE("Prefetcher: a dataset whose fields() returns a new list each call") {
  const FieldsByValue ds(23, 0);
  const tk::data::RandomSampler sampler(ds.size(), 7);
  tk::data::Prefetcher p(ds, sampler, {.batch_size = 4, .num_workers = 2});
  CHECK(take(p, 9) == expected(sampler, 4, false, 0, 9));
}

TEST_CASE("Prefetcher: same batches in the same order for 1..8 workers and any depth") {
  const SlowDataset ds(103, 30);
  const tk::data::RandomSampler sampler(ds.size(), 5);
  const std::vector<Seen> want = expected(sampler, 10, false, 2, 27);  // 2.5 epochs of 11 batches
  CHECK(want[10].last);
  CHECK(want[10].indices.size() == 3);
  for (std::size_t workers = 1; workers <= 8; ++workers) {
    CAPTURE(workers);
    tk::data::Prefetcher p(
        ds, sampler,
        {.batch_size = 10, .num_workers = workers, .depth = 2 + workers % 5, .epoch = 2});
    CHECK(p.batches_per_epoch() == 11);
    CHECK(take(p, 27) == want);
    CHECK(p.stats().batches == 27);
  }
}

TEST_CASE("Prefetcher: drop_last, DistributedSampler and a real NpyDataset") {
  const SlowDataset ds(10, 0);
  const tk::data::SequentialSampler seq(ds.size());
  tk::data::Prefetcher p(ds, seq, {.batch_size = 4, .num_workers = 3, .drop_last = true});
  CHECK(p.batches_per_epoch() == 2);
  CHECK(take(p, 5) == expected(seq, 4, true, 0, 5));

  const tk::data::DistributedSampler dist(ds.size(), {.world_size = 3, .rank = 2, .seed = 8});
  tk::data::Prefetcher q(ds, dist, {.batch_size = 2, .num_workers = 2});
  CHECK(take(q, 6) == expected(dist, 2, false, 0, 6));

  tk::data::NpyDataset npy({{"x", fixture("npy/features.npy")}, {"y", fixture("npy/labels.npy")}});
  tk::data::Prefetcher r(npy, tk::data::RandomSampler(npy.size(), 1), {.batch_size = 8});
  for (int k = 0; k < 10; ++k) {
    const tk::data::Batch b = r.next();
    const auto x = b.host<float, 2>("x");
    const auto y = b.host<std::int64_t, 1>("y");
    for (std::size_t row = 0; row < b.size(); ++row) {
      const std::int64_t i = b.indices()[row];
      CHECK(x(std::int64_t(row), 4) == 0.5f * float(i * 5 + 4));
      CHECK(y(std::int64_t(row)) == i % 10);
    }
  }
  check_contains(error_of([&] { (void)r.next().host<double, 2>("x"); }),
                 {"field 'x' is F32, not F64"});
  check_contains(error_of([&] { (void)r.next().host<float, 3>("x"); }), {"rank 2", "not 3"});
  check_contains(error_of([&] { (void)r.next().host<float, 2>("z"); }),
                 {"no field 'z'", "'x', 'y'"});
}

TEST_CASE("Prefetcher: state()/restore() resume exactly mid-epoch, across epochs and runs") {
  const SlowDataset ds(57, 20);
  const tk::data::RandomSampler sampler(ds.size(), 42);
  const tk::data::PrefetchOptions opts{.batch_size = 5, .num_workers = 4, .depth = 3};
  const std::vector<Seen> want = expected(sampler, 5, false, 0, 60);
  tk::data::Prefetcher a(ds, sampler, opts);
  CHECK(a.state() == tk::data::PrefetchState{0, 0});
  const std::vector<Seen> head = take(a, 7);
  const tk::data::PrefetchState mid = a.state();
  CHECK(mid == tk::data::PrefetchState{0, 7});
  const std::vector<Seen> tail = take(a, 20);
  CHECK(head == std::vector<Seen>(want.begin(), want.begin() + 7));
  CHECK(tail == std::vector<Seen>(want.begin() + 7, want.begin() + 27));

  // A fresh run restored to `mid` continues with exactly the same batches.
  tk::data::Prefetcher b(ds, sampler, opts);
  (void)take(b, 2);  // in flight batches are discarded by restore
  b.restore(mid);
  CHECK(b.state() == mid);
  CHECK(take(b, 20) == tail);
  // End of an epoch: state points at the next epoch's first batch.
  b.restore({0, 11});
  const Seen last = record(b.next());
  CHECK(last.last);
  CHECK(b.state() == tk::data::PrefetchState{1, 0});
  CHECK(take(b, 3) == std::vector<Seen>(want.begin() + 12, want.begin() + 15));
  b.restore({3, 4});
  CHECK(take(b, 2) == std::vector<Seen>(want.begin() + 3 * 12 + 4, want.begin() + 3 * 12 + 6));
  check_contains(error_of([&] {
                   b.restore({0, 12});
                 }),
                 {"restore() to batch 12", "has 12 batches"});
  // The refused restore left the loader where it was (it hung here: its workers were stopped).
  CHECK(b.state() == tk::data::PrefetchState{3, 6});
  CHECK(take(b, 8) == std::vector<Seen>(want.begin() + 3 * 12 + 6, want.begin() + 3 * 12 + 14));
}

TEST_CASE("Prefetcher: a worker's exception reaches the consumer in order, with context") {
  const SlowDataset ds(40, 10, /*fail=*/13);
  const tk::data::SequentialSampler seq(ds.size());
  tk::data::Prefetcher p(ds, seq, {.batch_size = 4, .num_workers = 4, .name = "train loader"});
  for (int k = 0; k < 3; ++k) CHECK(p.next().index() == std::uint64_t(k));  // rows 0..11 fine
  const std::string what = error_of([&] { (void)p.next(); });
  check_contains(what, {"train loader", "sample 13", "synthetic row 13", "row 1 of batch 3",
                        "epoch 0", "disk on fire at row 13"});
  check_contains(error_of([&] { (void)p.next(); }), {"sample 13"});  // sticky until restore
  p.restore({0, 4});
  CHECK(p.next().index() == 4);
  CHECK(p.next().index() == 5);
}

TEST_CASE("Prefetcher: destruction mid-epoch is quick; data-wait is recorded") {
  const SlowDataset slow(100000, 2000);  // up to 2 ms per sample
  const auto t0 = std::chrono::steady_clock::now();
  {
    tk::data::Prefetcher p(slow, tk::data::RandomSampler(slow.size(), 0),
                           {.batch_size = 64, .num_workers = 4, .depth = 8});
    const tk::data::Batch b = p.next();
    CHECK(b.size() == 64);
    CHECK(p.stats().wait_seconds > 0.0);
    CHECK(p.stats().last_wait_seconds == p.stats().wait_seconds);
    CHECK(p.slot_bytes() >= 64 * (24 + 4 + 8));
    CHECK(p.slot_bytes() < 64 * (24 + 4 + 8) + 3 * 256);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Workers stop between samples: destruction costs at most one sample read, not a batch.
  CHECK(seconds < 2.0);
}

TEST_CASE("Prefetcher: per-sample transforms, in place and into new fields") {
  const SlowDataset ds(20, 0);
  tk::data::PrefetchOptions in_place{.batch_size = 4, .num_workers = 3};
  in_place.transform = [](const tk::data::SampleInfo& info, const tk::data::SampleRef& in,
                          const tk::data::SampleRef& out) {
    CHECK(in[0].data() == out[0].data());
    auto x = out.as<std::int64_t>(0);
    x[1] = static_cast<std::int64_t>(info.epoch * 1000 + info.position);
  };
  tk::data::Prefetcher p(ds, tk::data::SequentialSampler(ds.size()), in_place);
  for (int k = 0; k < 7; ++k) {
    const tk::data::Batch b = p.next();
    const auto x = b.host<std::int64_t, 2>("x");
    for (std::size_t r = 0; r < b.size(); ++r)
      CHECK(x(std::int64_t(r), 1) == std::int64_t(b.epoch() * 1000 + b.index() * 4 + r));
  }

  tk::data::PrefetchOptions widen{.batch_size = 4};
  widen.output_fields = {{"x", tk::DType::kF64, {3}}};
  widen.transform = [](const tk::data::SampleInfo&, const tk::data::SampleRef& in,
                       const tk::data::SampleRef& out) {
    for (std::size_t j = 0; j < 3; ++j)
      out.as<double>(0)[j] = static_cast<double>(in.as<std::int64_t>(0)[j]) + 0.25;
  };
  tk::data::Prefetcher q(ds, tk::data::RandomSampler(ds.size(), 3), widen);
  REQUIRE(q.fields().size() == 1);
  const tk::data::Batch b = q.next();
  const auto x = b.host<double, 2>("x");
  CHECK(x(0, 2) == 3.0 * double(b.indices()[0]) + 0.25);
}

TEST_CASE("Prefetcher: streaming tar shards, batches across epochs, exact resume") {
  tk::data::TarShardOptions o;
  o.fields = {{"x", "npy", tk::DType::kF32, {4}}, {"label", "cls", tk::DType::kI64, {}}};
  o.shuffle_buffer = 4;
  o.seed = 3;
  tk::data::TarShardDataset direct(fixture("tar/wds-{000000..000002}.tar"), o);
  // Reference: read epochs 0 and 1 sample by sample.
  std::vector<std::int64_t> keys[2];
  for (std::uint64_t e = 0; e < 2; ++e) {
    direct.start(e, 0);
    float x[4];
    std::int64_t label = 0;
    std::span<std::byte> spans[2] = {std::as_writable_bytes(std::span(x)),
                                     std::as_writable_bytes(std::span(&label, 1))};
    while (direct.next(tk::data::SampleRef(spans))) keys[e].push_back(std::int64_t(x[0]) / 10);
    REQUIRE(keys[e].size() == 21);
  }
  tk::data::TarShardDataset ds(fixture("tar/wds-{000000..000002}.tar"), o);
  auto run = [&](tk::data::Prefetcher& p, std::size_t batches) {
    std::vector<std::tuple<std::uint64_t, std::uint64_t, bool, std::vector<std::int64_t>>> out;
    for (std::size_t k = 0; k < batches; ++k) {
      const tk::data::Batch b = p.next();
      const auto x = b.host<float, 2>("x");
      const auto label = b.host<std::int64_t, 1>("label");
      std::vector<std::int64_t> ks;
      for (std::size_t r = 0; r < b.size(); ++r) {
        const auto key = std::int64_t(x(std::int64_t(r), 0)) / 10;
        CHECK(label(std::int64_t(r)) == key % 10);
        CHECK(b.indices()[r] == std::int64_t(b.index() * 5 + r));
        ks.push_back(key);
      }
      out.emplace_back(b.epoch(), b.index(), b.last_in_epoch(), ks);
    }
    return out;
  };
  tk::data::Prefetcher p(ds, {.batch_size = 5, .depth = 3});
  CHECK(p.batches_per_epoch() == 0);
  const auto batches = run(p, 8);  // epoch 0: 5+5+5+5+1, epoch 1: ...
  CHECK(std::get<0>(batches[4]) == 0);
  CHECK(std::get<2>(batches[4]));
  CHECK(std::get<3>(batches[4]).size() == 1);
  CHECK(std::get<0>(batches[5]) == 1);
  std::vector<std::int64_t> flat;
  for (std::size_t k = 0; k < 5; ++k)
    flat.insert(flat.end(), std::get<3>(batches[k]).begin(), std::get<3>(batches[k]).end());
  CHECK(flat == keys[0]);
  CHECK(std::vector<std::int64_t>(keys[1].begin(), keys[1].begin() + 5) == std::get<3>(batches[5]));

  tk::data::TarShardDataset ds2(fixture("tar/wds-{000000..000002}.tar"), o);
  tk::data::Prefetcher q(ds2, {.batch_size = 5, .depth = 2});
  q.restore({0, 3});
  const auto resumed = run(q, 5);
  CHECK(resumed == std::vector(batches.begin() + 3, batches.end()));

  // A position saved under other stream settings (ranks, seed, shuffles) means other samples:
  // load_state_dict refuses it; the same settings load.
  const tk::StateDict saved = q.state_dict();
  CHECK(saved.get_string("stream_settings") ==
        "3 shards, seed 3, shuffle_shards on, shuffle_buffer 4, world_size 1");
  for (int change = 0; change < 3; ++change) {
    tk::data::TarShardOptions other = o;
    if (change == 0) other.world_size = 2;
    if (change == 1) other.seed = 4;
    if (change == 2) other.shuffle_buffer = 0;
    tk::data::TarShardDataset od(fixture("tar/wds-{000000..000002}.tar"), other);
    tk::data::Prefetcher r(od, {.batch_size = 5, .depth = 2});
    check_contains(error_of([&] { r.load_state_dict(saved); }),
                   {"the checkpoint's position is one in a stream of 3 shards, seed 3",
                    "this run's dataset has", "would hold other samples"});
    (void)r.next();  // still running
  }
  tk::data::TarShardDataset same(fixture("tar/wds-{000000..000002}.tar"), o);
  tk::data::Prefetcher again(same, {.batch_size = 5, .depth = 2});
  again.load_state_dict(saved);
  CHECK(run(again, 2) == run(q, 2));

  // drop_last: 21 samples per epoch in batches of 5 are four batches, the fourth the last of its
  // epoch (one sample dropped); of 7, exactly three; of 4, five (one dropped); of 22, none.
  for (const std::size_t bs : {std::size_t(5), std::size_t(7), std::size_t(4)}) {
    CAPTURE(bs);
    const std::size_t per_epoch = 21 / bs;
    tk::data::TarShardDataset dd(fixture("tar/wds-{000000..000002}.tar"), o);
    tk::data::Prefetcher d(dd, {.batch_size = bs, .depth = 2, .drop_last = true});
    std::vector<std::tuple<std::uint64_t, std::uint64_t, bool, std::vector<float>>> got;
    for (std::size_t k = 0; k < 2 * per_epoch; ++k) {
      const tk::data::Batch b = d.next();
      CHECK(b.size() == bs);
      CHECK(b.epoch() == k / per_epoch);
      CHECK(b.index() == k % per_epoch);
      CHECK(b.last_in_epoch() == (k % per_epoch == per_epoch - 1));
      const auto x = b.host<float, 2>("x");
      std::vector<float> firsts;
      for (std::size_t r = 0; r < bs; ++r) firsts.push_back(x(std::int64_t(r), 0));
      CHECK(std::vector<std::int64_t>(keys[k / per_epoch].begin() + (k % per_epoch) * bs,
                                      keys[k / per_epoch].begin() + (k % per_epoch + 1) * bs) ==
            [&] {
              std::vector<std::int64_t> ks;
              for (const float f : firsts) ks.push_back(std::int64_t(f) / 10);
              return ks;
            }());
      got.emplace_back(b.epoch(), b.index(), b.last_in_epoch(), firsts);
      if (k == per_epoch - 1) CHECK(d.state() == tk::data::PrefetchState{1, 0});
    }
    // Resumed at every batch of the first epoch: the same batches follow.
    for (std::uint64_t at = 0; at < per_epoch; ++at) {
      tk::data::TarShardDataset dr(fixture("tar/wds-{000000..000002}.tar"), o);
      tk::data::Prefetcher r(dr, {.batch_size = bs, .depth = 2, .drop_last = true});
      r.restore({0, at});
      for (std::size_t k = at; k < 2 * per_epoch; ++k) {
        const tk::data::Batch b = r.next();
        const auto x = b.host<float, 2>("x");
        std::vector<float> firsts;
        for (std::size_t row = 0; row < b.size(); ++row) firsts.push_back(x(std::int64_t(row), 0));
        CHECK(std::make_tuple(b.epoch(), b.index(), b.last_in_epoch(), firsts) == got[k]);
      }
    }
  }
  {
    tk::data::TarShardDataset dd(fixture("tar/wds-{000000..000002}.tar"), o);
    tk::data::Prefetcher d(dd, {.batch_size = 22, .drop_last = true, .name = "short"});
    check_contains(error_of([&] { (void)d.next(); }), {"short", "21 samples", "drop_last"});
  }

  o.fields.push_back({"missing", "nope", tk::DType::kU8, {1}});
  tk::data::TarShardDataset bad(fixture("tar/wds-{000000..000002}.tar"), o);
  tk::data::Prefetcher r(bad, {.batch_size = 5, .name = "tar loader"});
  check_contains(error_of([&] { (void)r.next(); }),
                 {"tar loader", "wds-00000", "has no member '.nope'"});
}

/// A streaming dataset whose start() is slow (a long skip through many shards): it waits in
/// start() until its stop flag is set, or `patience` runs out (then it stands where asked).
/// The two-argument start() has no flag to watch and waits the whole `patience`.
class SlowStartStream {
 public:
  explicit SlowStartStream(std::chrono::milliseconds patience) : patience_(patience) {}
  const std::vector<tk::data::FieldSpec>& fields() const { return fields_; }
  void start(std::uint64_t epoch, std::uint64_t skip) {
    const std::atomic<bool> never{false};
    (void)start(epoch, skip, never);
  }
  bool start(std::uint64_t, std::uint64_t skip, const std::atomic<bool>& stop) {
    started.store(true);
    const auto until = std::chrono::steady_clock::now() + patience_;
    while (std::chrono::steady_clock::now() < until) {
      if (stop.load(std::memory_order_relaxed)) {
        saw_stop.store(true);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    position_ = skip;
    return true;
  }
  bool next(const tk::data::SampleRef& out) {
    if (position_ >= 1000) return false;
    const float v = static_cast<float>(position_++);
    std::memcpy(out[0].data(), &v, sizeof v);
    return true;
  }
  std::string describe_current() const { return "sample " + std::to_string(position_); }

  std::atomic<bool> started{false}, saw_stop{false};

 private:
  std::chrono::milliseconds patience_;
  std::uint64_t position_ = 0;
  std::vector<tk::data::FieldSpec> fields_{{"x", tk::DType::kF32, {}}};
};

TEST_CASE("Prefetcher: a stop reaches a streaming dataset's start() that takes a stop flag") {
  // Restored far into an epoch, the worker's first act is the dataset's long skip; destroying
  // the Prefetcher then must not wait it out (tar shards stop between samples).
  SlowStartStream ds(std::chrono::seconds(60));
  const auto t0 = std::chrono::steady_clock::now();
  {
    tk::data::Prefetcher p(ds, {.batch_size = 4, .depth = 2});
    p.restore({0, 200});
    while (!ds.started.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(ds.started.load());
  }
  CHECK(ds.saw_stop.load());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  // A start() that finishes positions the stream as before.
  SlowStartStream quick(std::chrono::milliseconds(0));
  tk::data::Prefetcher q(quick, {.batch_size = 4, .depth = 2});
  q.restore({0, 3});
  const tk::data::Batch b = q.next();
  CHECK(b.host<float, 1>("x")(0) == 12.0f);
  CHECK(!quick.saw_stop.load());
}

namespace {

/// Samples 0..9 of one I64 field; reading sample `bad` throws (every time it is reached).
class FailingStream {
 public:
  explicit FailingStream(std::uint64_t bad) : bad_(bad) {}
  const std::vector<tk::data::FieldSpec>& fields() const { return fields_; }
  void start(std::uint64_t, std::uint64_t skip) { position_ = skip; }
  bool next(const tk::data::SampleRef& out) {
    if (position_ == bad_) TRAINKIT_FAIL("sample ", bad_, " is corrupt");
    if (position_ >= 10) return false;
    out.as<std::int64_t>(0)[0] = static_cast<std::int64_t>(position_++);
    return true;
  }
  std::string describe_current() const { return "failing stream"; }

 private:
  std::uint64_t bad_;
  std::uint64_t position_ = 0;
  std::vector<tk::data::FieldSpec> fields_{{"x", tk::DType::kI64, {}}};
};

}  // namespace

TEST_CASE("Prefetcher: a streaming read error arrives with the batch of the failed sample") {
  // Batch 0 (samples 0..3) is whole; reading ahead into batch 1 fails at sample 4. The error
  // came with batch 0, which was never delivered, with or without drop_last.
  for (const bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    FailingStream ds(4);
    tk::data::Prefetcher p(ds, {.batch_size = 4, .depth = 3, .drop_last = drop_last});
    const tk::data::Batch b = p.next();
    CHECK(b.index() == 0);
    CHECK(!b.last_in_epoch());
    REQUIRE(b.size() == 4);
    for (std::int64_t r = 0; r < 4; ++r) CHECK(b.host<std::int64_t, 1>("x")(r) == r);
    CHECK(p.state() == tk::data::PrefetchState{0, 1});
    for (int twice = 0; twice < 2; ++twice)  // sticky until restore
      check_contains(error_of([&] { (void)p.next(); }), {"failed reading sample 4 of epoch 0",
                                                         "failing stream", "sample 4 is corrupt"});
    p.restore({0, 0});
    CHECK(p.next().index() == 0);
  }
  // A failure mid-batch: the samples before it are used, then the batch reports the error.
  FailingStream mid(6);
  tk::data::Prefetcher p(mid, {.batch_size = 4, .depth = 2});
  CHECK(p.next().size() == 4);
  check_contains(error_of([&] { (void)p.next(); }), {"failed reading sample 6 of epoch 0"});
  // A failure at the first sample of an epoch reports the first batch.
  FailingStream first(0);
  tk::data::Prefetcher f(first, {.batch_size = 4, .depth = 2});
  check_contains(error_of([&] { (void)f.next(); }), {"failed reading sample 0 of epoch 0"});
}

TEST_CASE("Prefetcher: option errors") {
  const SlowDataset ds(10, 0);
  const tk::data::SequentialSampler seq(ds.size());
  check_contains(
      error_of([&] { tk::data::Prefetcher p(ds, seq, {.batch_size = 11, .drop_last = true}); }),
      {"yields 10 samples", "one batch of 11"});
  for (const std::size_t depth : {std::size_t{1}, std::size_t{4097}, std::size_t{1} << 40})
    check_contains(
        error_of([&] { tk::data::Prefetcher p(ds, seq, {.batch_size = 2, .depth = depth}); }),
        {"depth must be 2", "to 4096, got " + std::to_string(depth)});
  // Output fields whose shapes are negative or overflow a size (a slot too small for them).
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{-1, -1}, {std::int64_t{1} << 62, 4}, {1 << 30, 1 << 30}}) {
    tk::data::PrefetchOptions o{.batch_size = 2};
    o.output_fields = {{"z", tk::DType::kF32, shape}};
    o.transform = [](const tk::data::SampleInfo&, const tk::data::SampleRef&,
                     const tk::data::SampleRef&) {};
    check_contains(error_of([&] { tk::data::Prefetcher p(ds, seq, o); }), {"output field 'z'"});
  }
  // Batches whose size overflows (they crashed in a worker): refused up front. Without
  // drop_last such a batch holds the whole epoch.
  for (const std::size_t huge : {std::size_t{1} << 62, ~std::size_t{0}, std::size_t{1} << 57})
    check_contains(
        error_of([&] { tk::data::Prefetcher p(ds, seq, {.batch_size = huge, .name = "big"}); }),
        {"big: batch_size ", std::to_string(huge), "larger than any memory"});
  tk::data::PrefetchOptions no_transform{.batch_size = 2};
  no_transform.output_fields = {{"x", tk::DType::kF32, {}}};
  check_contains(error_of([&] { tk::data::Prefetcher p(ds, seq, no_transform); }),
                 {"output_fields given without a transform"});
}

TEST_CASE("Prefetcher: a sampler for another dataset size is refused, at load and when read") {
  // A position saved over 100 samples is another batch over 95, though both have 10 batches of
  // 10 per epoch.
  const SlowDataset hundred(100, 0), ninety_five(95, 0);
  const tk::data::RandomSampler sampler(100, 1);
  const tk::data::PrefetchOptions opts{.batch_size = 10, .num_workers = 2};
  tk::data::Prefetcher a(hundred, sampler, opts);
  (void)take(a, 3);
  const tk::StateDict saved = a.state_dict();
  tk::data::Prefetcher b(ninety_five, tk::data::RandomSampler(95, 1), opts);
  CHECK(b.batches_per_epoch() == a.batches_per_epoch());
  check_contains(error_of([&] { b.load_state_dict(saved); }),
                 {"samples_per_epoch = 100 but this one has samples_per_epoch = 95"});
  tk::data::Prefetcher same(hundred, sampler, opts);
  same.load_state_dict(saved);
  const std::vector<Seen> want = expected(sampler, 10, false, 0, 5);
  CHECK(take(same, 2) == std::vector<Seen>(want.begin() + 3, want.end()));

  // A sampler over more samples than the dataset holds: refused before any read (a dataset
  // that trusts its index would read past its end), naming the index.
  tk::data::Prefetcher wide(ninety_five, tk::data::SequentialSampler(100),
                            {.batch_size = 50, .num_workers = 2, .name = "wide"});
  check_contains(
      error_of([&] { (void)wide.next(); }),
      {"wide: worker ", "the sampler's index 95 of epoch 0 is 95", "dataset has 95 samples"});
  tk::data::Prefetcher negative(ninety_five, NegativeSampler{},
                                {.batch_size = 2, .num_workers = 1});
  check_contains(error_of([&] { (void)negative.next(); }), {"is -1", "dataset has 95 samples"});
  // The sampler's own exception reaches next() as a trainkit::Error naming the loader and the
  // epoch (it came through as the sampler's std::runtime_error).
  tk::data::Prefetcher failing(ninety_five, NegativeSampler{.fail_epoch = 1},
                               {.batch_size = 2, .num_workers = 1, .name = "lm"});
  CHECK(failing.next().index() == 0);
  check_contains(error_of([&] { (void)failing.next(); }),
                 {"lm: worker 0 failed on the sampler's indices for epoch 1", "index file gone"});
}

namespace {

/// A streaming dataset of SlowDataset's fields: epoch e holds n + (vary ? e % 3 : 0) samples;
/// the sample at position p of epoch e has key e * 1000 + (7p + 3e) % 1000 ("x" = {key, 2 key,
/// 3 key}, "y" = key / 2). One read in four, pseudo-randomly, sleeps.
class KeyStream {
 public:
  KeyStream(std::size_t n, bool vary) : n_(n), vary_(vary) {}
  const std::vector<tk::data::FieldSpec>& fields() const { return fields_; }
  void start(std::uint64_t epoch, std::uint64_t skip) {
    epoch_ = epoch;
    position_ = skip;
    if (skip > length(epoch)) TRAINKIT_FAIL("skip ", skip, " past the end of epoch ", epoch);
  }
  bool next(const tk::data::SampleRef& out) {
    if (position_ >= length(epoch_)) return false;
    if (tk::philox_u32(5, 0, calls_++) % 4 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(1));
    const auto key = static_cast<std::int64_t>(epoch_ * 1000 + (7 * position_ + 3 * epoch_) % 1000);
    const std::int64_t x[3] = {key, 2 * key, 3 * key};
    std::memcpy(out[0].data(), x, sizeof x);
    const float y = static_cast<float>(key) / 2;
    std::memcpy(out[1].data(), &y, sizeof y);
    ++position_;
    return true;
  }
  std::string describe_current() const { return "key stream at " + std::to_string(position_); }

 private:
  std::uint64_t length(std::uint64_t epoch) const { return n_ + (vary_ ? epoch % 3 : 0); }
  std::size_t n_;
  bool vary_;
  std::uint64_t epoch_ = 0, position_ = 0, calls_ = 0;
  std::vector<tk::data::FieldSpec> fields_{{"x", tk::DType::kI64, {3}}, {"y", tk::DType::kF32, {}}};
};
static_assert(tk::data::StreamingDataset<KeyStream>);

/// A batch as compared across runs: position, rows' indices and the bytes of every field.
struct Taken {
  std::uint64_t epoch, index;
  bool last;
  std::vector<std::int64_t> indices;
  std::vector<std::byte> bytes;
  friend bool operator==(const Taken&, const Taken&) = default;
};

Taken take_one(tk::data::Prefetcher& p) {
  const tk::data::Batch b = p.next();
  Taken t{b.epoch(), b.index(), b.last_in_epoch(), {b.indices().begin(), b.indices().end()}, {}};
  for (std::size_t k = 0; k < b.fields().size(); ++k)
    t.bytes.insert(t.bytes.end(), b.host_bytes(k).begin(), b.host_bytes(k).end());
  return t;
}

}  // namespace

TEST_CASE(
    "Prefetcher: resumed at random points and at every epoch boundary, fresh loaders "
    "continue exactly as an uninterrupted run") {
  // Random configurations over an indexed dataset, a streaming one (epochs of equal or varying
  // length) and tar shards (shuffles, ranks), with and without drop_last, with and without a
  // partial last batch. Each stop point's state() is restored into a fresh Prefetcher (which
  // sometimes hands out a batch first), and the batches after it must equal the uninterrupted
  // run's, bit for bit. Past an epoch's last batch a streaming position is refused by name.
  std::uint64_t draw = 0;
  const auto rnd = [&](std::uint32_t n) { return tk::philox_u32(2024, 1, draw++) % n; };
  for (int config = 0; config < 120; ++config) {
    const std::uint32_t kind = rnd(3);  // 0 indexed, 1 KeyStream, 2 tar shards
    const bool drop_last = rnd(2) == 0, vary = kind == 1 && rnd(2) == 0;
    const std::size_t batch = 1 + rnd(6);
    const std::size_t n = (drop_last ? batch : 1) + rnd(static_cast<std::uint32_t>(3 * batch + 2));
    tk::data::TarShardOptions tar;
    tar.fields = {{"x", "npy", tk::DType::kF32, {4}}, {"label", "cls", tk::DType::kI64, {}}};
    tar.shuffle_buffer = rnd(6);
    tar.seed = rnd(10);
    tar.shuffle_shards = rnd(2) == 0;
    tar.world_size = 1 + rnd(2);  // 21 samples per epoch; 14 and 7 on two ranks
    tar.rank = rnd(static_cast<std::uint32_t>(tar.world_size));
    const tk::data::PrefetchOptions opts{.batch_size = batch,
                                         .num_workers = 1 + rnd(4),
                                         .depth = 2 + rnd(4),
                                         .drop_last = drop_last,
                                         .epoch = rnd(3)};
    CAPTURE(config);
    CAPTURE(kind);
    CAPTURE(drop_last);
    CAPTURE(vary);
    CAPTURE(batch);
    CAPTURE(n);
    CAPTURE(opts.num_workers);
    CAPTURE(opts.depth);
    const SlowDataset indexed(n, 5);
    const tk::data::RandomSampler sampler(n, config);
    // A loader over its own copy of the dataset (a streaming dataset is read by one loader).
    struct Loader {
      std::unique_ptr<KeyStream> stream;
      std::unique_ptr<tk::data::TarShardDataset> shards;
      std::unique_ptr<tk::data::Prefetcher> p;
    };
    const auto make = [&] {
      Loader l;
      if (kind == 0) {
        l.p = std::make_unique<tk::data::Prefetcher>(indexed, sampler, opts);
      } else if (kind == 1) {
        l.stream = std::make_unique<KeyStream>(n, vary);
        l.p = std::make_unique<tk::data::Prefetcher>(*l.stream, opts);
      } else {
        l.shards = std::make_unique<tk::data::TarShardDataset>(
            fixture("tar/wds-{000000..000002}.tar"), tar);
        l.p = std::make_unique<tk::data::Prefetcher>(*l.shards, opts);
      }
      return l;
    };
    // The uninterrupted run over three epochs, with the state before every batch.
    const Loader whole = make();
    std::vector<Taken> run;
    std::vector<tk::data::PrefetchState> before;
    for (std::uint64_t epochs = 0; epochs < 3;) {
      before.push_back(whole.p->state());
      run.push_back(take_one(*whole.p));
      epochs += run.back().last;
    }
    before.push_back(whole.p->state());
    std::vector<std::size_t> stops;
    for (std::size_t k = 0; k < run.size(); ++k)
      if (run[k].last || rnd(4) == 0) stops.push_back(k + 1);  // every epoch boundary
    for (const std::size_t stop : stops) {
      CAPTURE(stop);
      const tk::data::PrefetchState at = before[stop];
      const Loader fresh = make();
      if (rnd(2) == 0) (void)take_one(*fresh.p);  // a batch in use when restore() comes
      if (run[stop - 1].last) {
        const Taken& last = run[stop - 1];
        CHECK(at == tk::data::PrefetchState{last.epoch + 1, 0});
        // The epoch's end written as the batch after its last: refused (indexed datasets by
        // restore(), streaming ones by next()) without claiming the epoch is short or empty.
        const std::string what = error_of([&] {
          fresh.p->restore({last.epoch, last.index + 1});
          (void)fresh.p->next();
        });
        CHECK(what.find("has no samples") == std::string::npos);
        CHECK(what.find("epoch " + std::to_string(last.epoch) + " has ") == std::string::npos);
      }
      fresh.p->restore(at);
      CHECK(fresh.p->state() == at);
      for (std::size_t k = stop; k < run.size(); ++k) {
        CAPTURE(k);
        const Taken got = take_one(*fresh.p);
        REQUIRE(got == run[k]);
      }
    }
  }
}

TEST_CASE("Prefetcher: restore() past a streaming epoch's last batch is refused by name") {
  // 12 samples in batches of 4 are batches 0..2; 10 with drop_last are batches 0 and 1 (two
  // samples dropped). The position after the last batch is batch 0 of epoch 1; batch 3 (batch 2
  // with drop_last) lies past the epoch's end and said "epoch 0 ... has no samples" (or "has 2
  // samples, fewer than one batch"), which the epoch does not.
  for (const bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    KeyStream ds(drop_last ? 10 : 12, false);
    tk::data::Prefetcher p(ds, {.batch_size = 4, .depth = 2, .drop_last = drop_last});
    const std::uint64_t batches = drop_last ? 2 : 3;
    p.restore({0, batches});
    const std::string what = error_of([&] { (void)p.next(); });
    check_contains(what, {"restore() to batch " + std::to_string(batches) + " of epoch 0",
                          "key stream at", "batch 0 of the next epoch"});
    CHECK(what.find("has no samples") == std::string::npos);
    CHECK(what.find("fewer than one batch of 4 with drop_last") ==
          (drop_last ? what.find("fewer") : std::string::npos));
    p.restore({1, 0});
    const tk::data::Batch b = p.next();
    CHECK(b.epoch() == 1);
    CHECK(b.index() == 0);
    CHECK(b.host<std::int64_t, 2>("x")(0, 0) == 1003);
  }
}

namespace {

/// KeyStream whose start() throws while `refuse` is set.
class RefusingStream : public KeyStream {
 public:
  using KeyStream::KeyStream;
  void start(std::uint64_t epoch, std::uint64_t skip) {
    if (refuse.load()) TRAINKIT_FAIL("shard index unreadable");
    KeyStream::start(epoch, skip);
  }
  std::atomic<bool> refuse{false};
};

#ifdef __GLIBC__
/// While alive, new threads get a stack no machine can map, so starting one fails.
class NoThreads {
 public:
  NoThreads() {
    REQUIRE(pthread_getattr_default_np(&saved_) == 0);
    pthread_attr_t huge;
    REQUIRE(pthread_attr_init(&huge) == 0);
    REQUIRE(pthread_attr_setstacksize(&huge, std::size_t{1} << 62) == 0);
    REQUIRE(pthread_setattr_default_np(&huge) == 0);
    pthread_attr_destroy(&huge);
  }
  ~NoThreads() {
    pthread_setattr_default_np(&saved_);
    pthread_attr_destroy(&saved_);
  }
  NoThreads(const NoThreads&) = delete;
  NoThreads& operator=(const NoThreads&) = delete;

 private:
  pthread_attr_t saved_;
};
#endif

}  // namespace

TEST_CASE("Prefetcher: after a restore() that fails, next() throws instead of waiting forever") {
  // A streaming dataset whose start() throws in the restored run: next() reports it, naming the
  // position, and a later restore() recovers.
  RefusingStream stream(10, false);
  tk::data::Prefetcher s(stream, {.batch_size = 4, .depth = 2, .name = "shards"});
  (void)s.next();
  stream.refuse.store(true);
  s.restore({1, 1});
  for (int twice = 0; twice < 2; ++twice)
    check_contains(error_of([&] { (void)s.next(); }),
                   {"shards", "starting epoch 1 at sample 4", "shard index unreadable"});
  stream.refuse.store(false);
  s.restore({1, 1});
  CHECK(s.next().host<std::int64_t, 2>("x")(0, 0) == 1000 + 28 + 3);

#ifdef __GLIBC__
  // Workers that cannot be started: restore() throws, and so does every next() after it (it
  // waited forever for a batch no worker would fill), until a restore() starts them.
  const SlowDataset ds(20, 0);
  const tk::data::SequentialSampler seq(ds.size());
  tk::data::Prefetcher p(ds, seq, {.batch_size = 2, .num_workers = 3, .name = "rows"});
  CHECK(p.next().index() == 0);
  {
    const NoThreads no_threads;
    check_contains(error_of([&] {
                     p.restore({0, 4});
                   }),
                   {"rows: restore() to batch 4 of epoch 0 failed", "cannot start worker 1 of 3",
                    "lower num_workers"});
  }
  CHECK(p.state() == tk::data::PrefetchState{0, 4});
  for (int twice = 0; twice < 2; ++twice)
    check_contains(error_of([&] { (void)p.next(); }),
                   {"rows: restore() to batch 4 of epoch 0 failed", "until a restore() succeeds"});
  p.restore(p.state());
  const std::vector<Seen> want = expected(seq, 2, false, 0, 7);
  CHECK(take(p, 3) == std::vector<Seen>(want.begin() + 4, want.end()));
#endif
}

TEST_CASE(
    "Prefetcher: a streaming error names the sample it is about, not one read before or "
    "after it") {
  data_test::TempDir dir;
  {
    tk::io::TarWriter w(dir / "a.tar");
    for (int k = 0; k < 6; ++k) w.add("a" + std::to_string(k) + ".cls", std::to_string(k));
    w.close();
  }
  data_test::write_file(dir / "b.tar", std::vector<std::byte>(1024, std::byte{'z'}));
  tk::data::TarShardOptions o;
  o.fields = {{"label", "cls", tk::DType::kI64, {}}};
  o.shuffle_buffer = 0;
  o.shuffle_shards = false;
  const std::vector<std::string> shards = {(dir / "a.tar").string(), (dir / "b.tar").string()};

  // Right after start() the dataset has read nothing of the epoch: it named the sample it read
  // last in the previous one.
  tk::data::TarShardDataset ds(shards, o);
  std::int64_t label = 0;
  const std::span<std::byte> spans[1] = {std::as_writable_bytes(std::span(&label, 1))};
  CHECK(ds.next(tk::data::SampleRef(spans)));
  check_contains(ds.describe_current(), {"a.tar", "sample key 'a0'"});
  ds.start(1, 0);
  CHECK(ds.describe_current() == "epoch 1 before its first tar shard");

  // A shard that is no tar archive, opened after a.tar: the error named b.tar with a.tar's
  // last key ("tar shard '.../b.tar', sample key 'a5'").
  tk::data::Prefetcher p(ds, {.batch_size = 4, .depth = 2});
  CHECK(p.next().size() == 4);
  const std::string what = error_of([&] { (void)p.next(); });
  check_contains(what, {"failed reading sample 6 of epoch 0", "b.tar"});
  CHECK(what.find("sample key") == std::string::npos);

  // A transform's error with drop_last (the stream is read a batch ahead) named the sample the
  // dataset had read last, three after the one refused.
  for (const bool drop_last : {false, true}) {
    CAPTURE(drop_last);
    tk::data::TarShardDataset one(std::vector<std::string>{shards[0]}, o);
    tk::data::PrefetchOptions opts{.batch_size = 3, .depth = 2, .drop_last = drop_last};
    opts.transform = [](const tk::data::SampleInfo&, const tk::data::SampleRef& in,
                        const tk::data::SampleRef&) {
      if (in.as<std::int64_t>(0)[0] == 1) TRAINKIT_FAIL("label 1 refused");
    };
    tk::data::Prefetcher t(one, opts);
    check_contains(error_of([&] { (void)t.next(); }),
                   {"failed on sample 1 of epoch 0", "sample key 'a1'", "label 1 refused"});
  }
}
