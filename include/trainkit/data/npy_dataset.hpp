// SPDX-License-Identifier: MIT
// trainkit/data/npy_dataset.hpp: NpyDataset, a random-access dataset over one or more .npy files
// (features, labels, ...) that share their first axis: row i of every file is sample i. Files are
// memory-mapped, never read whole, so opening a 100 GB dataset is instant and worker threads
// share the page cache instead of copying it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/config.hpp"
#include "trainkit/data/dataset.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/npy.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace data {

/// Samples are rows of .npy files: `NpyDataset ds({{"x", "train_x.npy"}, {"y", "train_y.npy"}});`
/// gives fields "x" (dtype and row shape of train_x.npy) and "y". Any numeric dtype, C order.
/// Thread-safe reads; satisfies `Dataset`.
class NpyDataset {
 public:
  /// A field name and the .npy file holding it.
  struct Source {
    std::string name{};
    std::filesystem::path path{};
  };

  /// Maps every file and checks them. Throws trainkit::Error naming the file for anything a
  /// .npy reader refuses (see io::NpyFile), a 0-d array, an empty or duplicate field name, or
  /// files whose first axes differ ("label/feature count mismatch").
  TRAINKIT_INLINE explicit NpyDataset(std::vector<Source> sources,
                                      io::MapAccess access = io::MapAccess::kRandom);

  /// Number of samples (rows).
  std::size_t size() const noexcept { return size_; }
  const std::vector<FieldSpec>& fields() const noexcept { return fields_; }
  /// The mapped file of field k.
  const io::NpyFile& file(std::size_t k) const { return files_.at(k); }

  /// Copies row `i` of every file into `out`. Throws trainkit::Error for i >= size() and for
  /// an `out` whose fields or their sizes differ from fields().
  TRAINKIT_INLINE void read(std::size_t i, const SampleRef& out) const;

  /// "'train_x.npy' row 17 (+ 1 more file)", for error messages.
  TRAINKIT_INLINE std::string describe(std::size_t i) const;

 private:
  std::vector<io::NpyFile> files_;
  std::vector<FieldSpec> fields_;
  std::vector<std::size_t> row_bytes_;
  std::size_t size_ = 0;
};

#if TRAINKIT_IMPL

TRAINKIT_INLINE NpyDataset::NpyDataset(std::vector<Source> sources, io::MapAccess access) {
  TRAINKIT_CHECK(!sources.empty(), "NpyDataset: no files given");
  for (Source& s : sources) {
    TRAINKIT_CHECK(!s.name.empty(), "NpyDataset: empty field name for '", s.path.string(), "'");
    for (const FieldSpec& f : fields_)
      TRAINKIT_CHECK(f.name != s.name, "NpyDataset: field '", s.name, "' given twice");
    io::NpyFile file(s.path, access);
    TRAINKIT_CHECK(!file.shape().empty(), "NpyDataset: '", file.path(),
                   "' holds a 0-d array; samples are rows along the first axis");
    const auto rows = static_cast<std::size_t>(file.shape()[0]);
    if (files_.empty()) {
      size_ = rows;
    } else {
      TRAINKIT_CHECK(rows == size_, "NpyDataset: sample count mismatch: '", file.path(), "' (",
                     s.name, ") has ", rows, " rows but '", files_[0].path(), "' (",
                     fields_[0].name, ") has ", size_);
    }
    FieldSpec spec{s.name, file.dtype(), {file.shape().begin() + 1, file.shape().end()}};
    row_bytes_.push_back(spec.bytes());
    fields_.push_back(std::move(spec));
    files_.push_back(std::move(file));
  }
}

TRAINKIT_INLINE void NpyDataset::read(std::size_t i, const SampleRef& out) const {
  TRAINKIT_CHECK(i < size_, "NpyDataset: sample ", i, " out of range [0, ", size_, ") of '",
                 files_[0].path(), "'");
  TRAINKIT_CHECK(out.size() == files_.size(), "NpyDataset: destination has ", out.size(),
                 " fields, expected ", files_.size(), " (one per file, in fields() order)");
  for (std::size_t k = 0; k < files_.size(); ++k) {
    const std::size_t n = row_bytes_[k];
    TRAINKIT_CHECK(out[k].size() == n, "NpyDataset: destination for field '", fields_[k].name,
                   "' has ", out[k].size(), " bytes, expected ", n);
    if (n > 0) std::memcpy(out[k].data(), files_[k].data() + i * n, n);
  }
}

TRAINKIT_INLINE std::string NpyDataset::describe(std::size_t i) const {
  std::string s = "'" + files_[0].path() + "' row " + std::to_string(i);
  if (files_.size() > 1)
    s += " (and the same row of " + std::to_string(files_.size() - 1) + " more file" +
         (files_.size() > 2 ? "s)" : ")");
  return s;
}

#endif  // TRAINKIT_IMPL

}  // namespace data
TRAINKIT_NAMESPACE_END
