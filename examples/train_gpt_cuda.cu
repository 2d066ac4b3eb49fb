// SPDX-License-Identifier: MIT
// train_gpt_cuda: examples/train_gpt.cpp compiled by nvcc (the CUDA tier), so that
// `--device cuda --precision bf16` trains on the GPU: parameters, activations and optimizer state
// in device memory, batches copied from pinned buffers on a side stream, the loss read only when
// it is logged. Without --device cuda it is the CPU trainer.
#include "train_gpt.cpp"
