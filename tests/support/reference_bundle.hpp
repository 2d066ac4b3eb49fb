// Reading the PyTorch reference values that tests/fixtures/<area>/make_reference.py scripts commit
// (CI has no PyTorch: the values are generated once and read back here).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tktest {

/// One stored reference tensor, widened to double.
struct RefTensor {
  std::vector<std::int64_t> shape;
  std::vector<double> values;
  std::int64_t numel() const { return static_cast<std::int64_t>(values.size()); }
};

/// A bundle of reference tensors written by a tests/fixtures/*/make_reference.py script:
/// <stem>.txt lists "key dtype offset rank dims..." per tensor, <stem>.bin holds the values
/// (f4, f8 or i8 little-endian), all widened to double here.
class ReferenceBundle {
 public:
  bool has(const std::string& key) const { return tensors_.count(key) != 0; }
  const RefTensor& operator[](const std::string& key) const {
    const auto it = tensors_.find(key);
    if (it == tensors_.end()) throw std::runtime_error("no reference tensor '" + key + "'");
    return it->second;
  }

  explicit ReferenceBundle(const std::string& stem) {
    std::ifstream blob(stem + ".bin", std::ios::binary);
    std::ifstream index(stem + ".txt");
    if (!blob || !index) throw std::runtime_error("cannot open " + stem + ".{txt,bin}");
    const std::vector<char> bytes((std::istreambuf_iterator<char>(blob)),
                                  std::istreambuf_iterator<char>());
    std::string line;
    while (std::getline(index, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream in(line);
      std::string key, dtype;
      std::size_t offset = 0;
      int rank = 0;
      in >> key >> dtype >> offset >> rank;
      RefTensor t;
      std::int64_t n = 1;
      for (int d = 0; d < rank; ++d) {
        std::int64_t e = 0;
        in >> e;
        t.shape.push_back(e);
        n *= e;
      }
      const std::size_t size = dtype == "f4" ? 4 : 8;
      if (offset + static_cast<std::size_t>(n) * size > bytes.size())
        throw std::runtime_error("reference tensor '" + key + "' runs past the end of the blob");
      for (std::int64_t i = 0; i < n; ++i) {
        const char* p = bytes.data() + offset + static_cast<std::size_t>(i) * size;
        if (dtype == "f4") {
          float f;
          std::memcpy(&f, p, 4);
          t.values.push_back(f);
        } else if (dtype == "f8") {
          double d;
          std::memcpy(&d, p, 8);
          t.values.push_back(d);
        } else {
          std::int64_t v;
          std::memcpy(&v, p, 8);
          t.values.push_back(static_cast<double>(v));
        }
      }
      tensors_.emplace(key, std::move(t));
    }
  }

 private:
  std::map<std::string, RefTensor> tensors_;
};

}  // namespace tktest
