// SPDX-License-Identifier: MIT
// trainkit/data/sampler.hpp: which dataset indices a rank visits in an epoch. SequentialSampler,
// RandomSampler and DistributedSampler, the last index for index equal to PyTorch's
// torch.utils.data.DistributedSampler: torch.randperm under manual_seed(seed + epoch) (its mt19937
// and swap loop are reproduced here), padding from the head, strided shards, drop_last. Every
// order is a pure function of (seed, epoch, rank, world_size): resuming needs only those numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/state_dict.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, bit for bit.
/// torch's CPU generator is a standard mt19937 seeded with the low 32 bits of the seed. For
/// n < 2^32 / 20, randperm starts from 0..n-1 and swaps element i with i + random() % (n - i)
/// (one 32-bit draw per swap); for larger n it runs the "inside-out" Fisher-Yates shuffle with
/// 64-bit draws (two words, high first) (aten/src/ATen/native/TensorFactories.cpp `randperm_cpu`).
TRAINKIT_INLINE std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed);

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler {
 public:
  explicit SequentialSampler(std::size_t n) noexcept : n_(n) {}
  std::size_t size() const noexcept { return n_; }
  std::vector<std::int64_t> indices(std::uint64_t /*epoch*/) const {
    std::vector<std::int64_t> r(n_);
    std::iota(r.begin(), r.end(), std::int64_t{0});
    return r;
  }

  /// Samplers are pure functions of (seed, epoch, rank, world_size): nothing to restore, but their
  /// configuration is saved and checked on load, so a resumed run with another seed or
  /// world_size fails loudly instead of visiting other samples.
  TRAINKIT_INLINE StateDict state_dict() const;
  void load_state_dict(const StateDict& sd) const {
    const char* who = "restoring a SequentialSampler";
    check_saved_setting<std::string>(who, "kind", sd.get_string("kind"), "SequentialSampler");
    check_saved_setting<std::uint64_t>(who, "size", sd.get_u64("size"), n_);
  }

 private:
  std::size_t n_;
};

/// A fresh permutation of 0..n-1 each epoch: torch_randperm(n, seed + epoch), i.e. exactly the
/// order of PyTorch's DistributedSampler with one replica (not of torch's RandomSampler, whose
/// order depends on the global RNG state and cannot be resumed from numbers alone).
class RandomSampler {
 public:
  explicit RandomSampler(std::size_t n, std::uint64_t seed = 0) noexcept : n_(n), seed_(seed) {}
  std::size_t size() const noexcept { return n_; }
  std::uint64_t seed() const noexcept { return seed_; }
  std::vector<std::int64_t> indices(std::uint64_t epoch) const {
    return torch_randperm(static_cast<std::int64_t>(n_), seed_ + epoch);
  }

  /// Configuration only, checked on load (see SequentialSampler::state_dict).
  TRAINKIT_INLINE StateDict state_dict() const;
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd) const;

 private:
  std::size_t n_;
  std::uint64_t seed_;
};

/// Options of DistributedSampler, PyTorch's defaults.
struct DistributedOptions {
  std::size_t world_size = 1;  ///< num_replicas
  std::size_t rank = 0;        ///< this replica, in [0, world_size)
  bool shuffle = true;
  std::uint64_t seed = 0;  ///< must be the same on every rank
  bool drop_last = false;  ///< drop the tail so every rank gets floor-ish N/world_size samples
};

/// PyTorch's DistributedSampler: every rank draws the same permutation (torch_randperm(N,
/// seed + epoch), or 0..N-1 without shuffle), pads it by repeating its head until it divides
/// evenly (or, with drop_last, cuts the tail), and takes every world_size-th index starting at
/// rank.
class DistributedSampler {
 public:
  /// Throws trainkit::Error when world_size is 0 or rank >= world_size.
  TRAINKIT_INLINE DistributedSampler(std::size_t n, const DistributedOptions& options);

  /// Samples this rank visits per epoch (PyTorch's num_samples).
  std::size_t size() const noexcept { return num_samples_; }
  /// num_samples * world_size.
  std::size_t total_size() const noexcept { return total_size_; }
  const DistributedOptions& options() const noexcept { return o_; }

  /// This rank's indices in epoch `epoch` (what iterating PyTorch's sampler yields after
  /// set_epoch(epoch)).
  TRAINKIT_INLINE std::vector<std::int64_t> indices(std::uint64_t epoch) const;

  /// Configuration only, checked on load (see SequentialSampler::state_dict): a plain list of
  /// settings, alike in shape to other key/value writers (the checkpoint manifest). The key
  /// "world" holds world_size.
  TRAINKIT_INLINE StateDict state_dict() const;
  TRAINKIT_INLINE void load_state_dict(const StateDict& sd) const;

 private:
  std::size_t n_;
  DistributedOptions o_;
  std::size_t num_samples_ = 0;
  std::size_t total_size_ = 0;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE std::vector<std::int64_t> torch_randperm(std::int64_t n, std::uint64_t seed) {
  TRAINKIT_CHECK(n >= 0, "torch_randperm: negative n ", n);
  std::vector<std::int64_t> r(static_cast<std::size_t>(n));
  std::mt19937 engine(static_cast<std::uint32_t>(seed));
  if (n < static_cast<std::int64_t>(0xffffffffu / 20)) {
    std::iota(r.begin(), r.end(), std::int64_t{0});
    for (std::int64_t i = 0; i + 1 < n; ++i) {
      const auto z = static_cast<std::int64_t>(engine() % static_cast<std::uint64_t>(n - i));
      std::swap(r[static_cast<std::size_t>(i)], r[static_cast<std::size_t>(z + i)]);
    }
    return r;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t hi = engine();
    const std::uint64_t lo = engine();
    const auto z = static_cast<std::size_t>(((hi << 32) | lo) % static_cast<std::uint64_t>(i + 1));
    r[static_cast<std::size_t>(i)] = r[z];
    r[z] = i;
  }
  return r;
}

TRAINKIT_INLINE StateDict SequentialSampler::state_dict() const {
  StateDict sd;
  sd.set("kind", "SequentialSampler");
  sd.set_u64("size", n_);
  return sd;
}

TRAINKIT_INLINE StateDict RandomSampler::state_dict() const {
  StateDict sd;
  sd.set("kind", "RandomSampler");
  sd.set_u64("size", n_);
  sd.set_u64("seed", seed_);
  return sd;
}

TRAINKIT_INLINE void RandomSampler::load_state_dict(const StateDict& sd) const {
  const char* who = "restoring a RandomSampler";
  check_saved_setting<std::string>(who, "kind", sd.get_string("kind"), "RandomSampler");
  check_saved_setting<std::uint64_t>(who, "size", sd.get_u64("size"), n_);
  check_saved_setting<std::uint64_t>(who, "seed", sd.get_u64("seed"), seed_);
}

TRAINKIT_INLINE DistributedSampler::DistributedSampler(std::size_t n,
                                                       const DistributedOptions& options)
    : n_(n), o_(options) {
  TRAINKIT_CHECK(o_.world_size >= 1, "DistributedSampler: world_size must be >= 1");
  TRAINKIT_CHECK(o_.rank < o_.world_size, "DistributedSampler: rank ", o_.rank,
                 " is not in [0, world_size=", o_.world_size, ")");
  if (o_.drop_last && n_ % o_.world_size != 0) {
    // ceil((N - R) / R), as math.ceil does for the (possibly negative) float.
    num_samples_ =
        n_ > o_.world_size ? (n_ - o_.world_size + o_.world_size - 1) / o_.world_size : 0;
  } else {
    num_samples_ = (n_ + o_.world_size - 1) / o_.world_size;
  }
  total_size_ = num_samples_ * o_.world_size;
}

TRAINKIT_INLINE std::vector<std::int64_t> DistributedSampler::indices(std::uint64_t epoch) const {
  std::vector<std::int64_t> all;
  if (o_.shuffle) {
    all = torch_randperm(static_cast<std::int64_t>(n_), o_.seed + epoch);
  } else {
    all.resize(n_);
    std::iota(all.begin(), all.end(), std::int64_t{0});
  }
  std::vector<std::int64_t> out;
  out.reserve(num_samples_);
  // Position p of the padded list is all[p % N] (padding repeats the list from its head).
  for (std::size_t p = o_.rank; p < total_size_; p += o_.world_size) out.push_back(all[p % n_]);
  return out;
}

TRAINKIT_INLINE StateDict DistributedSampler::state_dict() const {
  StateDict sd;
  sd.set("kind", "DistributedSampler");
  sd.set_u64("size", n_);
  sd.set_u64("num_samples", num_samples_);
  sd.set_u64("total_size", total_size_);
  sd.set_u64("world", o_.world_size);
  sd.set_u64("rank", o_.rank);
  sd.set_u64("seed", o_.seed);
  sd.set("shuffle", o_.shuffle);
  sd.set("drop_last", o_.drop_last);
  return sd;
}

TRAINKIT_INLINE void DistributedSampler::load_state_dict(const StateDict& sd) const {
  const char* who = "restoring a DistributedSampler";
  check_saved_setting<std::string>(who, "kind", sd.get_string("kind"), "DistributedSampler");
  check_saved_setting<std::uint64_t>(who, "world_size", sd.get_u64("world"), o_.world_size);
  check_saved_setting<std::uint64_t>(who, "rank", sd.get_u64("rank"), o_.rank);
  check_saved_setting<std::uint64_t>(who, "seed", sd.get_u64("seed"), o_.seed);
  if (sd.contains("size"))  // (states saved before it was recorded have only total_size)
    check_saved_setting<std::uint64_t>(who, "size", sd.get_u64("size"), n_);
  check_saved_setting<std::uint64_t>(who, "total_size", sd.get_u64("total_size"), total_size_);
  check_saved_setting<bool>(who, "shuffle", sd.get_int("shuffle") != 0, o_.shuffle);
  check_saved_setting<bool>(who, "drop_last", sd.get_int("drop_last") != 0, o_.drop_last);
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
