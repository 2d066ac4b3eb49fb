// SPDX-License-Identifier: MIT
// trainkit/data/dataset.hpp: what a dataset is to the Prefetcher. A sample is a fixed set of named
// fields (FieldSpec: dtype + per-sample shape), written by the dataset straight into the batch slot
// it will be sent in (SampleRef), so no per-sample allocation or copy happens on the way.
// Two kinds: random-access (`Dataset`: size() and read(i)) and streaming (`StreamingDataset`:
// start(epoch, skip) and next(), for tar shards read front to back).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/error.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// One field of every sample: a name ("x", "label", "input"), an element type and the shape of
/// one sample (without the batch axis; empty for a scalar such as a class label).
struct FieldSpec {
  std::string name{};
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape{};

  /// Elements per sample (1 for a scalar field).
  std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  /// Bytes per sample.
  std::size_t bytes() const noexcept { return numel() * dtype_size(dtype); }
};

/// Index of the field called `name` in `fields`; throws trainkit::Error listing the names.
inline std::size_t field_index(std::span<const FieldSpec> fields, std::string_view name) {
  for (std::size_t k = 0; k < fields.size(); ++k)
    if (fields[k].name == name) return k;
  std::string names;
  for (const FieldSpec& f : fields) names += (names.empty() ? "'" : ", '") + f.name + "'";
  TRAINKIT_FAIL("no field '", name, "' (fields: ", names, ")");
}

/// Where a dataset writes one sample: one writable byte span per field, in fields() order, each
/// exactly fields()[k].bytes() long. The spans point into a batch slot (pinned host memory).
class SampleRef {
 public:
  explicit SampleRef(std::span<const std::span<std::byte>> fields) noexcept : fields_(fields) {}

  std::size_t size() const noexcept { return fields_.size(); }
  std::span<std::byte> operator[](std::size_t k) const noexcept { return fields_[k]; }

  /// Field k as elements of T (the caller knows the field's dtype).
  template <class T>
  std::span<T> as(std::size_t k) const noexcept {
    return {reinterpret_cast<T*>(fields_[k].data()), fields_[k].size() / sizeof(T)};
  }

 private:
  std::span<const std::span<std::byte>> fields_;
};

/// A random-access dataset. `read(i, out)` must be safe to call from several threads at once
/// (workers read different samples concurrently) and deterministic. `describe(i)` says where
/// sample i comes from ("train_x.npy row 17"), for error messages.
template <class D>
concept Dataset = requires(const D& d, std::size_t i, const SampleRef& out) {
  { d.size() } -> std::convertible_to<std::size_t>;
  { d.fields() } -> std::convertible_to<std::span<const FieldSpec>>;
  d.read(i, out);
  { d.describe(i) } -> std::convertible_to<std::string>;
};

/// A streaming dataset, read by one thread. `start(epoch, skip)` positions it at sample `skip` of
/// epoch `epoch` (its order must be a pure function of the epoch and its own options, so a
/// restart reproduces it); `next(out)` writes the next sample and returns false at the end of the
/// epoch; `describe_current()` names the file and sample last produced or being read. A dataset
/// whose skip can take long may also offer `bool start(epoch, skip, const std::atomic<bool>&
/// stop)`, which gives up (returns false) once `stop` is set: the Prefetcher then passes its own
/// stop flag, so destroying or restoring it does not wait out the skip.
template <class S>
concept StreamingDataset = requires(S& s, const S& cs, std::uint64_t epoch, std::uint64_t skip,
                                    const SampleRef& out) {
  { cs.fields() } -> std::convertible_to<std::span<const FieldSpec>>;
  s.start(epoch, skip);
  { s.next(out) } -> std::same_as<bool>;
  { cs.describe_current() } -> std::convertible_to<std::string>;
};

/// A sampler: the dataset indices one rank visits in an epoch, a pure function of the epoch.
template <class S>
concept Sampler = requires(const S& s, std::uint64_t epoch) {
  { s.size() } -> std::convertible_to<std::size_t>;
  { s.indices(epoch) } -> std::convertible_to<std::vector<std::int64_t>>;
};

}  // namespace data
TRAINKIT_NAMESPACE_END
