// Helpers of the causal-LM tests in tests/train: a small learnable token shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include <trainkit/core/rng.hpp>
#include <trainkit/data/token_shards.hpp>

#include "support/temp_dir.hpp"

namespace trainkit_test {

/// A token shard of 3000 tokens below `vocab`: a repeating pattern (i * 7 % vocab) with one in
/// eight tokens random, so a model can learn it and the loss falls.
inline std::filesystem::path write_lm_shard(const TempDir& dir, const char* name,
                                            std::uint64_t seed, std::uint32_t vocab = 50) {
  trainkit::PhiloxStream rng(seed);
  std::vector<std::uint16_t> tokens(3000);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = std::uint16_t(rng.next_u32() % 8 == 0 ? rng.next_u32() % vocab : (i * 7) % vocab);
  const auto path = dir / name;
  trainkit::data::write_token_shard(path, tokens);
  return path;
}

}  // namespace trainkit_test
