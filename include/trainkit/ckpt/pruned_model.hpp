// SPDX-License-Identifier: MIT
// trainkit/ckpt/pruned_model.hpp: the export of a pruned model for PyTorch. The weights go to a
// dense safetensors file under their PyTorch names with exact zeros where an optim::Pruner prunes
// (`model.load_state_dict(load_file(path))` as for any model), the masks to a second file under
// torch.nn.utils.prune's buffer names (`<param>_mask`, F32 ones and zeros), so that
// `prune.custom_from_mask(module, "weight", mask)` puts the pruning back on the module. Two files,
// because a strict load_state_dict of an unpruned module refuses the `_mask` keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "trainkit/ckpt/checksum.hpp"
#include "trainkit/ckpt/model.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/dtype.hpp"
#include "trainkit/error.hpp"
#include "trainkit/io/safetensors.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/optim/prune.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace ckpt {

/// Writes every parameter of the pruner's arena to `path` like save_model (F32, PyTorch names,
/// checksummed, crash-safe), with the entries `pruner` prunes written as +0 whether or not
/// apply() ran since the last update (the arena is not changed). Returns the file's size and
/// checksum; throws trainkit::Error naming the file.
template <Space S>
FileDigest save_pruned_model(const std::filesystem::path& path, const optim::Pruner<S>& pruner,
                             ModelSaveOptions options = {}) {
  const nn::ParamArena<S>& arena = pruner.arena();
  AnyTensor buffer;
  const std::vector<io::NamedTensor> views = detail::model_views(arena, true, {}, buffer);
  float* w = reinterpret_cast<float*>(buffer.data());
  const std::uint8_t* m = pruner.host_mask();
  for (nn::ParamId id : pruner.targets()) {
    const nn::ParamInfo& p = arena.info(id);
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
      if (m[i] == 0) w[i] = 0.0f;
  }
  if (options.metadata.find("format") == options.metadata.end())
    options.metadata.emplace("format", "pt");
  return save_checksummed_safetensors(
      path, views, std::move(options.metadata),
      io::SafetensorsWriteOptions{.alignment = options.alignment, .durable = options.durable});
}

/// Writes the masks of `pruner` to `path`: one F32 tensor "<param>_mask" (1 kept, 0 pruned, the
/// parameter's shape) per pruned parameter, torch.nn.utils.prune's names and dtype. Metadata
/// {"format": "pt", "pattern": "unstructured" or "N:M", "sparsity": the pruned fraction}.
/// Returns the file's size and checksum; throws trainkit::Error naming the file.
template <Space S>
FileDigest save_pruning_masks(const std::filesystem::path& path, const optim::Pruner<S>& pruner,
                              bool durable = true) {
  const nn::ParamArena<S>& arena = pruner.arena();
  std::vector<AnyTensor> masks;
  std::vector<io::NamedTensor> views;
  const std::uint8_t* m = pruner.host_mask();
  for (nn::ParamId id : pruner.targets()) {
    const nn::ParamInfo& p = arena.info(id);
    AnyTensor t(DType::kF32, p.shape);
    float* out = reinterpret_cast<float*>(t.data());
    for (std::int64_t i = 0; i < p.numel; ++i) out[i] = m[p.offset + i] != 0 ? 1.0f : 0.0f;
    masks.push_back(std::move(t));
  }
  for (std::size_t i = 0; i < masks.size(); ++i)
    views.push_back({arena.info(pruner.targets()[i]).name + "_mask", masks[i].view()});
  io::SafetensorsMetadata metadata{{"format", "pt"},
                                   {"pattern", pruner.pattern()},
                                   {"sparsity", StateDict::number_to_string(pruner.sparsity())}};
  return save_checksummed_safetensors(
      path, views, std::move(metadata),
      io::SafetensorsWriteOptions{.alignment = 64, .durable = durable});
}

}  // namespace ckpt
TRAINKIT_NAMESPACE_END
