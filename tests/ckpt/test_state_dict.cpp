// Tests of the state protocol (core/state_dict.hpp) as checkpoints use it, and of
// ckpt/train_state.hpp: the state dicts of the Prefetcher, samplers, Philox streams, Dropout and
// ParamArena round-trip and reject a differently configured component by name; TrainState composes
// components under
// "<name>.<key>", restores counters and metadata, and checks missing/unexpected components.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <trainkit/ckpt/train_state.hpp>
#include <trainkit/core/state_dict.hpp>
#include <trainkit/core/rng.hpp>
#include <trainkit/data/prefetcher.hpp>
#include <trainkit/data/sampler.hpp>
#include <trainkit/error.hpp>
#include <trainkit/exec/host.hpp>
#include <trainkit/nn/dropout.hpp>
#include <trainkit/nn/param_arena.hpp>
#include <trainkit/optim/adamw.hpp>
#include <trainkit/optim/ema.hpp>
#include <trainkit/optim/grad_scaler.hpp>
#include <trainkit/optim/lr_schedule.hpp>

namespace {
namespace tk = trainkit;
namespace ckpt = trainkit::ckpt;
namespace data = trainkit::data;
namespace nn = trainkit::nn;
namespace optim = trainkit::optim;

/// Sample i is the single int64 i.
class Indices {
 public:
  explicit Indices(std::size_t n) : n_(n) {}
  std::size_t size() const noexcept { return n_; }
  std::span<const data::FieldSpec> fields() const noexcept { return fields_; }
  void read(std::size_t i, const data::SampleRef& out) const {
    const auto v = static_cast<std::int64_t>(i);
    std::memcpy(out[0].data(), &v, 8);
  }
  std::string describe(std::size_t i) const { return "index " + std::to_string(i); }

 private:
  std::size_t n_;
  std::vector<data::FieldSpec> fields_{{"i", tk::DType::kI64, {}}};
};

/// Same keys, scalars, dtypes, shapes and bytes.
bool same_state(const tk::StateDict& a, const tk::StateDict& b) {
  if (a.values != b.values || a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [k, t] : a.tensors) {
    const auto it = b.tensors.find(k);
    if (it == b.tensors.end() || it->second.dtype() != t.dtype() ||
        it->second.shape() != t.shape() ||
        (t.bytes() != 0 && std::memcmp(it->second.data(), t.data(), t.bytes()) != 0))
      return false;
  }
  return true;
}

std::vector<std::int64_t> rows(const data::Batch& b) {
  const auto v = b.host<std::int64_t, 1>("i");
  return std::vector<std::int64_t>(v.data(), v.data() + b.size());
}

}  // namespace

TEST_CASE("Prefetcher state dict: resumes at the same batch, checks the batching") {
  const Indices ds(20);
  const data::RandomSampler sampler(ds.size(), 5);
  const data::PrefetchOptions opts{
      .batch_size = 3, .num_workers = 2, .pin_memory = false, .name = "train"};
  std::vector<std::vector<std::int64_t>> straight;
  tk::StateDict saved;
  {
    data::Prefetcher p(ds, sampler, opts);
    for (int k = 0; k < 12; ++k) {
      if (k == 9) saved = tk::state_dict_of(p);  // mid second epoch (7 batches per epoch)
      straight.push_back(rows(p.next()));
    }
  }
  CHECK(saved.get_string("epoch") == "1");
  CHECK(saved.get_string("batch") == "2");
  data::Prefetcher resumed(ds, sampler, opts);
  tk::load_state_dict_into(resumed, saved);
  for (int k = 9; k < 12; ++k) CHECK(rows(resumed.next()) == straight[std::size_t(k)]);

  data::PrefetchOptions other = opts;
  other.batch_size = 4;
  data::Prefetcher different(ds, sampler, other);
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(different, saved),
                       doctest::Contains("batch_size = 3 but this one has batch_size = 4"),
                       tk::Error);
}

TEST_CASE("sampler state dicts: configuration saved and checked") {
  data::RandomSampler a(100, 7);
  data::RandomSampler same(100, 7);
  data::RandomSampler other_seed(100, 8);
  const tk::StateDict sd = tk::state_dict_of(a);
  CHECK_NOTHROW(tk::load_state_dict_into(same, sd));
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(other_seed, sd),
                       doctest::Contains("seed = 7 but this one has seed = 8"), tk::Error);

  data::DistributedSampler d(100, {.world_size = 4, .rank = 1, .seed = 3});
  data::DistributedSampler d_world(100, {.world_size = 2, .rank = 1, .seed = 3});
  const tk::StateDict dsd = tk::state_dict_of(d);
  data::DistributedSampler d_same(100, {.world_size = 4, .rank = 1, .seed = 3});
  CHECK_NOTHROW(tk::load_state_dict_into(d_same, dsd));
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(d_world, dsd), doctest::Contains("world_size"),
                       tk::Error);
  // Another dataset size with the same padded total (101 / 4 ranks pads to 104 like 102..104):
  // the order differs, so it is refused by the size.
  data::DistributedSampler d_size(101, {.world_size = 4, .rank = 1, .seed = 3});
  data::DistributedSampler d_size_src(102, {.world_size = 4, .rank = 1, .seed = 3});
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(d_size, tk::state_dict_of(d_size_src)),
                       doctest::Contains("size = 102 but this one has size = 101"), tk::Error);
  tk::StateDict older = tk::state_dict_of(d_size_src);  // saved before "size" was recorded
  older.values.erase("size");
  CHECK_NOTHROW(tk::load_state_dict_into(d_size_src, older));
  data::SequentialSampler seq(10);
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(seq, sd), doctest::Contains("kind"), tk::Error);
}

TEST_CASE("PhiloxStream and nn::Dropout state dicts") {
  tk::PhiloxStream s(0xfedcba9876543210ULL, 4, 0);
  for (int i = 0; i < 13; ++i) (void)s.next_u32();
  const tk::StateDict sd = tk::state_dict_of(s);
  CHECK(sd.get_string("seed") == "18364758544493064720");  // > 2^63: kept exactly
  tk::PhiloxStream r(1, 1, 1);
  tk::load_state_dict_into(r, sd);
  CHECK(r.seed() == s.seed());
  CHECK(r.stream() == 4);
  for (int i = 0; i < 5; ++i) CHECK(r.next_u32() == s.next_u32());

  nn::Dropout d({.p = 0.3f, .seed = 5, .site = 2});
  d.set_step(41);
  d.eval();
  const tk::StateDict dsd = tk::state_dict_of(d);
  nn::Dropout e({.p = 0.3f, .seed = 5, .site = 2});
  tk::load_state_dict_into(e, dsd);
  CHECK(e.step() == 41);
  CHECK_FALSE(e.training());
  nn::Dropout f({.p = 0.3f, .seed = 6, .site = 2});
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(f, dsd), doctest::Contains("seed = 5"), tk::Error);
}

TEST_CASE("ParamArena state dict: names, shapes, values") {
  nn::ParamArena<> a;
  a.add("w", tk::Shape{2, 3});
  a.add("b", tk::Shape{3});
  a.finalize();
  a.initialize(3);
  const tk::StateDict sd = tk::state_dict_of(a);
  CHECK(sd.tensors.size() == 2);
  nn::ParamArena<> b;
  b.add("w", tk::Shape{2, 3});
  b.add("b", tk::Shape{3});
  b.finalize();
  tk::load_state_dict_into(b, sd);
  CHECK(std::memcmp(a.params_data(), b.params_data(), a.buffer_numel() * 4) == 0);
  nn::ParamArena<> c;
  c.add("w", tk::Shape{3, 2});
  c.add("b", tk::Shape{3});
  c.finalize();
  CHECK_THROWS_WITH_AS(tk::load_state_dict_into(c, sd), doctest::Contains("'w' is F32 [2, 3]"),
                       tk::Error);
}

TEST_CASE("TrainState: composes components, counters and metadata; checks the component set") {
  tk::exec::Host exec(1);
  nn::ParamArena<> arena;
  arena.add("w", tk::Shape{4});
  arena.finalize();
  optim::AdamW<> opt(arena, {.lr = 0.1});
  auto sched = optim::warmup_cosine(opt.lr_groups(), {.warmup_steps = 2, .total_steps = 10});
  tk::PhiloxStream rng(9);
  tk::optim::DynamicScaler scaler(exec, {.init_scale = 1024.0, .growth_interval = 7});
  for (int k = 0; k < 3; ++k) {
    for (std::int64_t i = 0; i < 4; ++i) arena.grads_data()[i] = float(i + k) - 1.5f;
    opt.step(exec);
    sched->step();
  }
  ckpt::TrainState state;
  state.model(arena)
      .add("optimizer", opt)
      .add("schedule", *sched)
      .add("rng", rng)
      .add("scaler", scaler);
  state.step = 3;
  state.epoch = 1;
  state.metadata["run"] = "abc";
  tk::StateDict sd = state.state_dict();
  CHECK(sd.get_int("trainer.step") == 3);
  CHECK(sd.get_string("user.run") == "abc");
  CHECK(sd.tensors.count("optimizer.w.exp_avg") == 1);
  CHECK(sd.values.count("schedule.last_epoch") == 1);
  CHECK(sd.get_string("rng.seed") == "9");
  // PyTorch's five GradScaler keys.
  CHECK(sd.get_double("scaler.scale") == 1024.0);
  CHECK(sd.get_int("scaler.growth_interval") == 7);
  CHECK(sd.values.count("scaler._growth_tracker") == 1);
  CHECK(sd.values.count("scaler.growth_factor") == 1);
  CHECK(sd.values.count("scaler.backoff_factor") == 1);

  // Restore into fresh objects: the optimizer's step and lr and the schedule continue.
  nn::ParamArena<> arena2;
  arena2.add("w", tk::Shape{4});
  arena2.finalize();
  optim::AdamW<> opt2(arena2, {.lr = 0.1});
  auto sched2 = optim::warmup_cosine(opt2.lr_groups(), {.warmup_steps = 2, .total_steps = 10});
  tk::PhiloxStream rng2(1);
  tk::optim::DynamicScaler scaler2(exec);
  ckpt::TrainState state2;
  state2.model(arena2)
      .add("optimizer", opt2)
      .add("schedule", *sched2)
      .add("rng", rng2)
      .add("scaler", scaler2);
  state2.load_state_dict(state.state_dict());
  CHECK(state2.step == 3);
  CHECK(state2.epoch == 1);
  CHECK(state2.metadata.at("run") == "abc");
  CHECK(opt2.step_count() == 3);
  CHECK(opt2.lr() == opt.lr());
  CHECK(sched2->last_epoch() == sched->last_epoch());
  CHECK(rng2.seed() == 9);
  CHECK(scaler2.scale() == 1024.0f);
  CHECK(scaler2.options().growth_interval == 7);

  // Missing and unexpected components.
  ckpt::TrainState fewer;
  fewer.add("optimizer", opt2);
  CHECK_THROWS_WITH_AS(fewer.load_state_dict(state.state_dict()),
                       doctest::Contains("component(s) 'rng', 'scaler', 'schedule' that are not "
                                         "registered"),
                       tk::Error);
  CHECK_NOTHROW(fewer.load_state_dict(state.state_dict(), {.strict = false}));
  ckpt::TrainState more;
  tk::PhiloxStream extra(1);
  more.add("optimizer", opt2)
      .add("schedule", *sched2)
      .add("rng", rng2)
      .add("scaler", scaler2)
      .add("extra", extra);
  CHECK_THROWS_WITH_AS(more.load_state_dict(state.state_dict()),
                       doctest::Contains("no state for component(s) 'extra'"), tk::Error);

  // A component that rejects its state is named.
  nn::ParamArena<> arena3;
  arena3.add("w", tk::Shape{4});
  arena3.finalize();
  optim::AdamW<> amsgrad(arena3, {.lr = 0.1, .amsgrad = true});
  ckpt::TrainState bad;
  bad.add("optimizer", amsgrad);
  CHECK_THROWS_WITH_AS(bad.load_state_dict(state.state_dict(), {.strict = false}),
                       doctest::Contains("restoring component 'optimizer' failed"), tk::Error);

  // A component that saved nothing (a disabled scaler) is known to the checkpoint and skipped.
  tk::optim::DynamicScaler off(exec, {.enabled = false}), off2(exec, {.enabled = false});
  ckpt::TrainState s_off, s_off2;
  s_off.add("scaler", off);
  s_off2.add("scaler", off2);
  CHECK(s_off.state_dict().get_string("trainer.components") == "scaler");
  CHECK_NOTHROW(s_off2.load_state_dict(s_off.state_dict()));

  // Names.
  ckpt::TrainState names;
  CHECK_THROWS_AS(names.add("a.b", rng), tk::Error);
  CHECK_THROWS_AS(names.add("trainer", rng), tk::Error);
  names.add("x", rng);
  CHECK_THROWS_AS(names.add("x", rng), tk::Error);
  CHECK_THROWS_AS(names.model(arena).model(arena), tk::Error);
}

TEST_CASE(
    "TrainState::state_dict_into: the bytes of state_dict(), in reused memory, random arenas") {
  tk::exec::Host exec(2);
  std::mt19937 gen(20261205);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    // Random parameter shapes (empty ones included) and optimizer flavours.
    nn::ParamArena<> arena;
    const int params = 1 + static_cast<int>(gen() % 6);
    for (int p = 0; p < params; ++p) {
      const std::int64_t rows = gen() % 4 == 0 ? 0 : 1 + gen() % 40, cols = 1 + gen() % 70;
      arena.add("p" + std::to_string(p) + ".weight", tk::Shape{rows, cols},
                nn::Init::normal(0.0f, 0.1f));
    }
    arena.finalize();
    arena.initialize(trial);
    const bool amsgrad = gen() % 2 == 0, bf16 = gen() % 3 == 0;
    optim::AdamW<> opt(arena, {.lr = 1e-2, .amsgrad = amsgrad, .bf16_state = bf16, .seed = 5});
    optim::Ema<> ema(arena, {.decay = 0.9});
    int user_calls = 0;
    ckpt::TrainState state;
    state.model(arena)
        .add("optimizer", opt)
        .add("ema", ema)
        .add(
            "counter",
            [&] {
              tk::StateDict sd;
              sd.set("calls", ++user_calls);
              return sd;
            },
            [](const tk::StateDict&) {});
    const auto train = [&](int steps) {
      for (int k = 0; k < steps; ++k) {
        for (std::int64_t i = 0; i < arena.buffer_numel(); ++i)
          arena.grads_data()[i] =
              std::sin(0.37f * float(i + 13 * k)) * (arena.padding_mask().real(i) ? 1.0f : 0.0f);
        opt.step(exec);
        ema.update(exec);
      }
      ++state.step;
    };
    // A staging dict that starts with junk under the components' names: entries the state does
    // not have, a tensor of a wrong shape under a real key, a scalar no one writes.
    tk::StateDict staging;
    staging.tensors.emplace("optimizer.nope", tk::AnyTensor(tk::DType::kF32, tk::Shape{3}));
    staging.tensors.emplace("optimizer.p0.weight.exp_avg",
                            tk::AnyTensor(tk::DType::kF32, tk::Shape{2, 2}));
    staging.values["ema.stale"] = "1";
    staging.values["trainer.stale"] = "1";
    std::map<std::string, const void*> memory;
    for (int save = 0; save < 3; ++save) {
      CAPTURE(save);
      train(1 + static_cast<int>(gen() % 3));
      state.state_dict_into(staging);
      --user_calls;  // state_dict() below must see the same user counter
      const tk::StateDict fresh = state.state_dict();
      CHECK(same_state(staging, fresh));
      // From the second save on, every optimizer and EMA tensor is the memory of the first.
      for (const auto& [k, t] : staging.tensors) {
        if (save == 0) {
          memory[k] = t.data();
        } else {
          CHECK_MESSAGE(memory.at(k) == t.data(), k);
        }
      }
    }
    // What state_dict_into wrote restores as state_dict() does.
    nn::ParamArena<> arena2;
    for (const auto& p : arena.infos()) arena2.add(p.name, p.shape);
    arena2.finalize();
    optim::AdamW<> opt2(arena2, {.lr = 1.0, .amsgrad = amsgrad, .bf16_state = bf16, .seed = 5});
    ckpt::TrainState state2;
    state2.add("optimizer", opt2);
    state2.load_state_dict(staging, {.strict = false});
    CHECK(same_state(opt2.state_dict(), opt.state_dict()));
  }
}
