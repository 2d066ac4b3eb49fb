// SPDX-License-Identifier: MIT
// trainkit/trainkit.hpp: the umbrella header. It includes every public header unconditionally;
// each header guards its own CUDA/NCCL/MPI parts, so this works in every tier.
#ifndef TRAINKIT_TRAINKIT_HPP_
#define TRAINKIT_TRAINKIT_HPP_

#include "trainkit/version.hpp"
#include "trainkit/config.hpp"
#include "trainkit/error.hpp"

#include "trainkit/core/dtype.hpp"
#include "trainkit/core/half.hpp"
#include "trainkit/core/rng.hpp"
#include "trainkit/core/shape.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/core/allocator.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/any_tensor.hpp"
#include "trainkit/core/copy.hpp"

#include "trainkit/cuda/stream.hpp"
#include "trainkit/cuda/event.hpp"
#include "trainkit/cuda/device.hpp"
#include "trainkit/cuda/buffer.hpp"

#include "trainkit/exec/executor.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/launch.hpp"
#include "trainkit/exec/reduce.hpp"
#include "trainkit/exec/multi_tensor_apply.hpp"

#include "trainkit/blas/gemm_options.hpp"
#include "trainkit/blas/host_gemm.hpp"
#include "trainkit/blas/cblas.hpp"
#include "trainkit/blas/cublaslt.hpp"
#include "trainkit/blas/gemm.hpp"

#include "trainkit/amp/scaler_fwd.hpp"
#include "trainkit/amp/policy.hpp"

#include "trainkit/nn/param_arena.hpp"
#include "trainkit/nn/init.hpp"
#include "trainkit/nn/layer.hpp"
#include "trainkit/nn/math.hpp"
#include "trainkit/nn/activation.hpp"
#include "trainkit/nn/dropout.hpp"
#include "trainkit/nn/residual.hpp"
#include "trainkit/nn/linear.hpp"
#include "trainkit/nn/layer_norm.hpp"
#include "trainkit/nn/embedding.hpp"
#include "trainkit/nn/cross_entropy.hpp"
#include "trainkit/nn/attention.hpp"
#include "trainkit/nn/transformer_block.hpp"
#include "trainkit/nn/sequential.hpp"

#include "trainkit/io/crc32c.hpp"
#include "trainkit/io/protobuf.hpp"
#include "trainkit/io/tfevents.hpp"
#include "trainkit/io/mmap.hpp"
#include "trainkit/io/npy.hpp"
#include "trainkit/io/tar.hpp"
#include "trainkit/io/json.hpp"
#include "trainkit/io/atomic_file.hpp"
#include "trainkit/io/safetensors.hpp"

#include "trainkit/data/dataset.hpp"
#include "trainkit/data/sampler.hpp"
#include "trainkit/data/shard_pattern.hpp"
#include "trainkit/data/npy_dataset.hpp"
#include "trainkit/data/token_shards.hpp"
#include "trainkit/data/tar_shards.hpp"
#include "trainkit/data/prefetcher.hpp"
#include "trainkit/data/augment.hpp"

#include "trainkit/monitor/json_writer.hpp"
#include "trainkit/monitor/nvtx.hpp"
#include "trainkit/monitor/timeline.hpp"
#include "trainkit/monitor/throughput.hpp"
#include "trainkit/monitor/memory.hpp"
#include "trainkit/monitor/gpu_monitor.hpp"
#include "trainkit/monitor/progress.hpp"
#include "trainkit/monitor/metrics_file.hpp"
#include "trainkit/monitor/tensorboard.hpp"
#include "trainkit/monitor/monitor.hpp"

#endif  // TRAINKIT_TRAINKIT_HPP_
