// SPDX-License-Identifier: MIT
// trainkit/trainkit.hpp: the umbrella header. It includes every public header unconditionally;
// each header guards its own CUDA/NCCL/MPI parts, so this works in every tier.
#ifndef TRAINKIT_TRAINKIT_HPP_
#define TRAINKIT_TRAINKIT_HPP_

#include "trainkit/version.hpp"
#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#include "trainkit/cuda/stream.hpp"
#include "trainkit/cuda/event.hpp"

#endif  // TRAINKIT_TRAINKIT_HPP_
