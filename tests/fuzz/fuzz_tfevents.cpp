// SPDX-License-Identifier: MIT
// libFuzzer target: io::split_tfrecords (the TensorBoard event file reader) over arbitrary bytes.
// Any input must end cleanly or throw trainkit::Error; a clean result must be consistent: the
// records, framed again, are exactly the input's first valid_bytes bytes, and `truncated` is set
// exactly when bytes are left over. Memory use is bounded by the input (a declared record length
// past the end is a truncation, never an allocation).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <trainkit/io/tfevents.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace io = trainkit::io;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const io::TfRecords recs = io::split_tfrecords(bytes, "fuzz.tfevents");
    if (recs.valid_bytes > size) std::abort();
    if (recs.truncated != (recs.valid_bytes < size)) std::abort();
    std::string framed;
    for (const std::string& r : recs.records) io::append_tfrecord(framed, r);
    if (framed != bytes.substr(0, recs.valid_bytes)) std::abort();
  } catch (const trainkit::Error&) {
  }
  return 0;
}
