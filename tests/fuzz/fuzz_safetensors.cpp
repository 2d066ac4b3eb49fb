// SPDX-License-Identifier: MIT
// libFuzzer target for the safetensors reader (trainkit/io/safetensors.hpp) and the JSON parser
// under it (trainkit/io/json.hpp). Any input must either be refused with trainkit::Error or give
// views that lie inside the buffer; a valid file must survive write -> read unchanged, and parsed
// JSON must survive dump -> parse. Seeds: tests/fuzz/corpus/safetensors/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "trainkit/io/json.hpp"
#include "trainkit/io/safetensors.hpp"

namespace io = trainkit::io;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void fuzz_file(std::span<const std::byte> bytes) {
  std::optional<io::SafetensorsFile> file;
  try {
    file.emplace(io::SafetensorsFile::from_buffer(bytes, "fuzz input"));
  } catch (const trainkit::Error&) {
    return;  // refused: fine
  }
  const std::byte* lo = bytes.data();
  const std::byte* hi = bytes.data() + bytes.size();
  std::vector<io::NamedTensor> tensors;
  bool all_supported = true;
  unsigned sum = 0;
  for (std::size_t i = 0; i < file->size(); ++i) {
    const io::SafetensorsTensorInfo& info = file->tensors()[i];
    const std::span<const std::byte> raw = file->raw_bytes(info.name);
    check(raw.size() == info.bytes());
    // Views point into the input, except tensors copied because they were misaligned.
    check(raw.empty() || !file->zero_copy() || (raw.data() >= lo && raw.data() + raw.size() <= hi));
    if (!info.dtype) {
      all_supported = false;
      continue;
    }
    const trainkit::AnyTensorView v = file->tensor_at(i);
    check(v.bytes() == info.bytes());
    check(v.bytes() == 0 ||
          reinterpret_cast<std::uintptr_t>(v.data()) % trainkit::dtype_size(v.dtype()) == 0);
    for (std::size_t j = 0; j < v.bytes(); ++j) sum += unsigned(v.data()[j]);  // ASan reads
    tensors.push_back({info.name, v});
  }
  (void)sum;
  if (!all_supported) return;
  // Whatever we accept, we can write again and read back identically.
  const std::vector<std::byte> again = io::safetensors_bytes(tensors, file->metadata());
  const io::SafetensorsFile back = io::SafetensorsFile::from_buffer(again, "rewritten");
  check(back.size() == tensors.size());
  check(back.metadata() == file->metadata());
  for (const io::NamedTensor& t : tensors) {
    const trainkit::AnyTensorView v = back.tensor(t.name);
    check(v.dtype() == t.tensor.dtype() && v.shape() == t.tensor.shape());
    check(v.bytes() == 0 || std::memcmp(v.data(), t.tensor.data(), v.bytes()) == 0);
  }
}

void fuzz_json(std::string_view text) {
  const std::optional<io::Json> v = io::Json::try_parse(text);
  if (!v) return;
  const std::string compact = v->dump();
  const std::optional<io::Json> again = io::Json::try_parse(compact);
  check(again.has_value() && *again == *v);
  check(again->dump() == compact);
  const std::optional<io::Json> pretty = io::Json::try_parse(v->dump(2));
  check(pretty.has_value() && *pretty == *v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_file(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  // The header alone, as JSON text (skipping the length field when there is one).
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz_json(size >= 8 ? text.substr(8) : text);
  return 0;
}
