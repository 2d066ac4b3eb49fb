// SPDX-License-Identifier: MIT
// libFuzzer target: ckpt::detail::parse_manifest (the checkpoint.json reader resume trusts) on
// arbitrary bytes. Any input must either parse into a self-consistent CheckpointInfo or throw
// trainkit::Error; crashes, hangs, sanitizer reports and other exception types are bugs. The
// checksum makes almost every mutation fail early, so the target also parses each input with
// its checksum recomputed (the parser's later checks are reached) and checks that a manifest it
// accepts survives manifest_text -> parse_manifest unchanged and fails after any one-byte edit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <trainkit/ckpt/checkpointer.hpp>

namespace {

namespace ckpt = trainkit::ckpt;

void check_accepted(const ckpt::CheckpointInfo& info, std::string_view text) {
  if (info.world_size < 1 || info.files.size() < std::size_t(info.world_size)) std::abort();
  for (const auto& f : info.files)
    if (f.name.empty() || f.name.find('/') != std::string::npos) std::abort();
  // Round trip: what the writer makes of it parses to the same description.
  const std::string again = ckpt::detail::manifest_text(info);
  const ckpt::CheckpointInfo back = ckpt::detail::parse_manifest(again, info.path, "again");
  if (back.step != info.step || back.epoch != info.epoch || back.world_size != info.world_size ||
      back.metadata != info.metadata || back.model_file != info.model_file ||
      back.files.size() != info.files.size())
    std::abort();
  for (std::size_t i = 0; i < info.files.size(); ++i)
    if (back.files[i].name != info.files[i].name || back.files[i].bytes != info.files[i].bytes ||
        back.files[i].xxh64 != info.files[i].xxh64)
      std::abort();
  // The checksum covers every byte: one flipped bit anywhere must be rejected.
  std::string edited(text);
  const std::size_t at = static_cast<std::size_t>(ckpt::Xxh64::hash(text.data(), text.size()) %
                                                  std::max<std::size_t>(1, text.size()));
  edited[at] = static_cast<char>(edited[at] ^ 0x20);
  try {
    (void)ckpt::detail::parse_manifest(edited, info.path, "edited");
    std::abort();
  } catch (const trainkit::Error&) {
  }
}

void run(std::string_view text) {
  try {
    const ckpt::CheckpointInfo info = ckpt::detail::parse_manifest(text, "/ckpt/step_1", "fuzz");
    check_accepted(info, text);
  } catch (const trainkit::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  run(text);
  // The same bytes with a valid checksum, when they have room for one.
  const std::string_view prefix = ckpt::detail::kManifestPrefix;
  if (text.size() >= prefix.size() + 16 && text.starts_with(prefix)) {
    std::string summed(text);
    summed.replace(prefix.size(), 16, ckpt::hex64(ckpt::detail::manifest_checksum(summed)));
    run(summed);
  }
  return 0;
}
