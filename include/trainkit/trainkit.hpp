// SPDX-License-Identifier: MIT
// trainkit/trainkit.hpp: the umbrella header, and the index of the library. It includes every
// public header unconditionally (each header guards its own CUDA/NCCL/MPI parts, so this works in
// every tier), grouped by folder from the lowest layer up; the line above each include names the
// main public names that header defines. meta.umbrella_index checks that every public header is
// listed here with its `// defines:` line.
#ifndef TRAINKIT_TRAINKIT_HPP_
#define TRAINKIT_TRAINKIT_HPP_

// ---- top-level: version, capability macros, errors ----
// defines: TRAINKIT_VERSION, TRAINKIT_VERSION_STRING, TRAINKIT_NAMESPACE_BEGIN/END, version()
#include "trainkit/version.hpp"
// defines: TRAINKIT_WITH_CUDA/CUBLASLT/NCCL/MPI/CBLAS/OPENMP, TRAINKIT_HOST_DEVICE, capabilities()
#include "trainkit/config.hpp"
// defines: Error, TRAINKIT_CHECK, TRAINKIT_FAIL, TRAINKIT_FAIL_WITHOUT_CUDA, TRAINKIT_CUDA_CHECK
#include "trainkit/error.hpp"

// ---- core/: dtypes, shapes, tensors, bytes, RNG, state dicts ----
// defines: checked_add, checked_mul, checked_cast, checked_product
#include "trainkit/core/checked.hpp"
// defines: DType, kAllDTypes, dtype_size, dtype_name, parse_dtype, is_floating, dtype_of
#include "trainkit/core/dtype.hpp"
// defines: f16, bf16, float_to_f16_bits, f16_bits_to_float, float_to_bf16_bits, is_finite
#include "trainkit/core/half.hpp"
// defines: Philox4x32, PhiloxStream, philox_uniform, philox_normal, rng_stream_id
#include "trainkit/core/rng.hpp"
// defines: Space, space_name, Shape, kMaxRank
#include "trainkit/core/shape.hpp"
// defines: TensorView, HostView, DeviceView, Extents, contiguous_strides
#include "trainkit/core/tensor_view.hpp"
// defines: Allocation, MemoryKind, memory_kind_name, kHostAlignment, allocation_stats
#include "trainkit/core/allocator.hpp"
// defines: Tensor, HostTensor, DeviceTensor
#include "trainkit/core/tensor.hpp"
// defines: AnyTensorView, AnyTensor
#include "trainkit/core/any_tensor.hpp"
// defines: copy_bytes, zero_bytes, read_value
#include "trainkit/core/bytes.hpp"
// defines: copy (between tensor views in any pair of memory spaces)
#include "trainkit/core/copy.hpp"
// defines: detail::copy_streaming, detail::parallel_copy (checkpoint snapshot copies)
#include "trainkit/core/host_copy.hpp"
// defines: StateDict, StateDictRefill, Stateful, StateAdapter, state_dict_of, state_dict_into_of
#include "trainkit/core/state_dict.hpp"

// ---- cuda/: CUDA runtime wrappers ----
// defines: cuda::StreamRef, cuda::Stream
#include "trainkit/cuda/stream.hpp"
// defines: cuda::Event
#include "trainkit/cuda/event.hpp"
// defines: cuda::device_count, DeviceGuard, DeviceProperties, set_device, memory_info
#include "trainkit/cuda/device.hpp"
// defines: cuda::DeviceBuffer, cuda::PinnedBuffer
#include "trainkit/cuda/buffer.hpp"
// defines: cuda::copy_async
#include "trainkit/cuda/copy.hpp"

// ---- exec/: executors and the kernels written once for host and device ----
// defines: exec::Executor, HostExecutor, CudaExecutor, is_host_executor_v, is_cuda_executor_v
#include "trainkit/exec/executor.hpp"
// defines: exec::Host (the CPU thread pool, parallel_for)
#include "trainkit/exec/host.hpp"
// defines: exec::Cuda (the GPU executor: a CUDA stream)
#include "trainkit/exec/cuda.hpp"
// defines: exec::launch
#include "trainkit/exec/launch.hpp"
// defines: exec::reduce, reduce_into, Sum, Max, Min
#include "trainkit/exec/reduce.hpp"
// defines: exec::TensorList, multi_tensor_apply
#include "trainkit/exec/multi_tensor_apply.hpp"

// ---- io/: file formats ----
// defines: io::crc32c, mask_crc32c, masked_crc32c
#include "trainkit/io/crc32c.hpp"
// defines: io::ProtoWriter, WireType
#include "trainkit/io/protobuf.hpp"
// defines: io::EventFileWriter, read_tfrecords, encode_scalar_event, make_histogram
#include "trainkit/io/tfevents.hpp"
// defines: io::MappedFile, MapAccess
#include "trainkit/io/mmap.hpp"
// defines: io::NpyFile, NpyHeader, parse_npy_header, write_npy
#include "trainkit/io/npy.hpp"
// defines: io::TarReader, TarWriter, TarEntry, ByteSource, FileSource, MemorySource
#include "trainkit/io/tar.hpp"
// defines: io::is_valid_utf8, utf8_sequence_length, printable_bytes
#include "trainkit/io/utf8.hpp"
// defines: io::Json, JsonParseError, JsonLimits, append_json_string
#include "trainkit/io/json.hpp"
// defines: io::AtomicFile, write_file_atomic, fsync_directory, remove_stale_temp_files
#include "trainkit/io/atomic_file.hpp"
// defines: io::SafetensorsFile, save_safetensors, load_safetensors, SafetensorsShards
#include "trainkit/io/safetensors.hpp"

// ---- blas/: matrix multiplication ----
// defines: blas::GemmOptions, Op, Epilogue, ComputeType, HostBackend
#include "trainkit/blas/gemm_options.hpp"
// defines: nothing public (the built-in CPU backend of blas::gemm)
#include "trainkit/blas/host_gemm.hpp"
// defines: nothing public (the CBLAS backend of blas::gemm)
#include "trainkit/blas/cblas.hpp"
// defines: blas::CublasLt, CublasLtStats, gemm on a CUDA stream
#include "trainkit/blas/cublaslt.hpp"
// defines: blas::gemm
#include "trainkit/blas/gemm.hpp"

// ---- amp/: precision policies and scaler traits ----
// defines: amp::NoScaler, is_loss_scaler_v, is_dynamic_loss_scaler_v, Scaler
#include "trainkit/amp/scaler_fwd.hpp"
// defines: amp::Policy, Fp32, Tf32, Bf16, Fp16, master_t, compute_t, activation_t, OpClass
#include "trainkit/amp/policy.hpp"

// ---- nn/: layers and the parameter arena ----
// defines: nn::ParamArena, ParamId, ParamInfo, PaddingMask
#include "trainkit/nn/param_arena.hpp"
// defines: nn::Init, FanMode, fill_init, compute_fans
#include "trainkit/nn/init.hpp"
// defines: nn::Write, context_t, has_context_v (the conventions every layer follows)
#include "trainkit/nn/layer.hpp"
// defines: nothing public (branch-free exp, sigmoid and tanh-GELU of the host layers)
#include "trainkit/nn/math.hpp"
// defines: nn::ReLU, GELU
#include "trainkit/nn/activation.hpp"
// defines: nn::Dropout, DropoutOptions
#include "trainkit/nn/dropout.hpp"
// defines: nn::residual_forward, residual_backward
#include "trainkit/nn/residual.hpp"
// defines: nn::Linear, LinearOptions
#include "trainkit/nn/linear.hpp"
// defines: nn::LayerNorm, LayerNormOptions
#include "trainkit/nn/layer_norm.hpp"
// defines: nn::Embedding, EmbeddingOptions
#include "trainkit/nn/embedding.hpp"
// defines: nn::SoftmaxCrossEntropy, CrossEntropyOptions
#include "trainkit/nn/cross_entropy.hpp"
// defines: nn::detail::FusedAttentionArgs, the GPU's fused attention kernels and their block bodies
#include "trainkit/nn/fused_attention.hpp"
// defines: nn::CausalSelfAttention, AttentionOptions
#include "trainkit/nn/attention.hpp"
// defines: nn::TransformerBlock, TransformerBlockOptions
#include "trainkit/nn/transformer_block.hpp"
// defines: nn::Gpt, GptOptions (a GPT-2 language model)
#include "trainkit/nn/gpt.hpp"
// defines: nn::Sequential, StackableLayer
#include "trainkit/nn/sequential.hpp"

// ---- optim/: optimizers, loss scalers, schedules ----
// defines: optim::GradScaler, DynamicScaler, StaticScaler, ScalerView, DynamicScalerOptions
#include "trainkit/optim/grad_scaler.hpp"
// defines: optim::LrGroups, GroupRule, assign_groups, no_weight_decay, glob_match
#include "trainkit/optim/param_groups.hpp"
// defines: optim::grad_norm, clip_grad_norm_, clip_grad_value_, GradNorm
#include "trainkit/optim/grad_norm.hpp"
// defines: optim::StepHeader, saved_option (the contract of an update rule)
#include "trainkit/optim/rule.hpp"
// defines: optim::FusedOptimizer, StepInputs, ClipGradNorm
#include "trainkit/optim/optimizer.hpp"
// defines: optim::SGD, SGDOptions
#include "trainkit/optim/sgd.hpp"
// defines: optim::AdamW, AdamWOptions
#include "trainkit/optim/adamw.hpp"
// defines: optim::LAMB, LAMBOptions
#include "trainkit/optim/lamb.hpp"
// defines: optim::LRScheduler, CosineAnnealingLR, SequentialLR, warmup_cosine, ReduceLROnPlateau
#include "trainkit/optim/lr_schedule.hpp"
// defines: optim::Ema, EmaOptions
#include "trainkit/optim/ema.hpp"
// defines: optim::GradAccumulation
#include "trainkit/optim/grad_accumulation.hpp"
// defines: optim::Pruner, PrunerOptions, PruneScope, SparsitySchedule, PruneReport
#include "trainkit/optim/prune.hpp"

// ---- data/: datasets, samplers, the prefetching loader ----
// defines: data::Dataset, StreamingDataset, Sampler, FieldSpec, SampleRef
#include "trainkit/data/dataset.hpp"
// defines: data::SequentialSampler, RandomSampler, DistributedSampler, DistributedOptions
#include "trainkit/data/sampler.hpp"
// defines: data::expand_shard_pattern
#include "trainkit/data/shard_pattern.hpp"
// defines: data::NpyDataset
#include "trainkit/data/npy_dataset.hpp"
// defines: data::TokenShardDataset, TokenShardOptions
#include "trainkit/data/token_shards.hpp"
// defines: data::TarShardDataset, TarShardOptions, TarField
#include "trainkit/data/tar_shards.hpp"
// defines: data::Prefetcher, PrefetchOptions, PrefetchState, PrefetchStats, Batch
#include "trainkit/data/prefetcher.hpp"
// defines: data::ImageAugment, RandomCrop, HorizontalFlip, Normalize, augment_batch_device
#include "trainkit/data/augment.hpp"

// ---- dist/: communicators and data-parallel training ----
// defines: dist::Comm, Communicator, Work, Buffer, ReduceOp
#include "trainkit/dist/comm.hpp"
// defines: nothing public (the element-wise combine step of host collectives)
#include "trainkit/dist/host_reduce.hpp"
// defines: dist::ThreadComm, ThreadGroup, ThreadCommOptions
#include "trainkit/dist/thread_comm.hpp"
// defines: dist::MpiComm, MpiOptions
#include "trainkit/dist/mpi_comm.hpp"
// defines: dist::NcclComm, NcclOptions
#include "trainkit/dist/nccl_comm.hpp"
// defines: nothing public (the device kernels of NcclComm and GradBucketer)
#include "trainkit/dist/device_kernels.hpp"
// defines: dist::tcp_broadcast
#include "trainkit/dist/rendezvous.hpp"
// defines: dist::TcpComm, TcpCommOptions
#include "trainkit/dist/tcp_comm.hpp"
// defines: dist::init, Context, InitOptions, LaunchInfo, detect_launch, Backend, Launcher
#include "trainkit/dist/bootstrap.hpp"
// defines: dist::GradBucketer, BucketOptions, Bucket
#include "trainkit/dist/bucketer.hpp"

// ---- ckpt/: checkpoints ----
// defines: ckpt::Xxh64, save_checksummed_safetensors, verify_checksum, verify_checksum_file
#include "trainkit/ckpt/checksum.hpp"
// defines: ckpt::load_model, save_model, ModelLoadOptions, ModelLoadReport, ModelSaveOptions
#include "trainkit/ckpt/model.hpp"
// defines: ckpt::save_pruned_model, save_pruning_masks
#include "trainkit/ckpt/pruned_model.hpp"
// defines: ckpt::TrainState, RestoreOptions
#include "trainkit/ckpt/train_state.hpp"
// defines: ckpt::Checkpointer, CheckpointerOptions, CheckpointInfo, LoadOptions, SaveStats
#include "trainkit/ckpt/checkpointer.hpp"

// ---- monitor/: metrics, traces, progress ----
// defines: monitor::JsonWriter
#include "trainkit/monitor/json_writer.hpp"
// defines: monitor::NvtxRange, nvtx_push, nvtx_pop, nvtx_mark
#include "trainkit/monitor/nvtx.hpp"
// defines: monitor::Timeline, TimelineOptions, Phase, phase_name
#include "trainkit/monitor/timeline.hpp"
// defines: monitor::mfu, achieved_flops, transformer_flops_per_token, device_peak_flops
#include "trainkit/monitor/throughput.hpp"
// defines: monitor::host_memory, device_memory_used, HostMemory
#include "trainkit/monitor/memory.hpp"
// defines: monitor::GpuMonitor, GpuMonitorOptions, GpuStats
#include "trainkit/monitor/gpu_monitor.hpp"
// defines: monitor::Progress, ProgressOptions, ProgressStyle, format_duration
#include "trainkit/monitor/progress.hpp"
// defines: monitor::MetricsFile, keep_metrics_through_step
#include "trainkit/monitor/metrics_file.hpp"
// defines: monitor::TensorBoardWriter, TensorBoardOptions, RankMode
#include "trainkit/monitor/tensorboard.hpp"
// defines: monitor::Monitor, MonitorOptions, StepMetrics, StepSummary, format_summary
#include "trainkit/monitor/monitor.hpp"

// ---- plan/: memory, fit, time and cost of a run before it starts ----
// defines: plan::GptRun, MemoryLine, MemoryPlan, GptSizes, gpt_sizes, gpt_memory, check_run
#include "trainkit/plan/memory.hpp"
// defines: plan::Device, known_devices, PlanOptions, Report, DeviceRow, gpt, to_text, to_json
#include "trainkit/plan/planner.hpp"

// ---- train/: the training loop and its flags ----
// defines: train::Flags, FlagRole
#include "trainkit/train/flags.hpp"
// defines: train::Loop, LoopOptions, StepContext, LoopResult
#include "trainkit/train/loop.hpp"
// defines: train::CausalLmTask, CausalLmOptions (a language model's step and evaluation)
#include "trainkit/train/causal_lm.hpp"
// defines: train::SearchSpace, Params, ParamValue, Dimension, DimensionKind
#include "trainkit/train/search_space.hpp"
// defines: train::Search, SearchOptions, SearchResult, SearchStrategy, Trial, TrialContext
#include "trainkit/train/search.hpp"

#endif  // TRAINKIT_TRAINKIT_HPP_
