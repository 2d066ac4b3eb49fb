// SPDX-License-Identifier: MIT
// trainkit/train/causal_lm.hpp: `train::CausalLmTask`, the step and the evaluation of a causal
// language model for train::Loop, on the host or the device and in any precision policy. The
// batches ("input" and "target" token ids [B, T], as TokenShardDataset gives them) come from a
// Prefetcher (in device mode on the GPU); the model (e.g. nn::Gpt) maps ids to logits
// [B*T, V]; the loss is the mean cross-entropy. On the device the step returns the loss as a
// LossHandle, so nothing waits for the GPU between logging steps. With a communicator the task
// is data parallel (gradients averaged over the ranks through a dist::GradBucketer).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "trainkit/amp/policy.hpp"
#include "trainkit/ckpt/checkpointer.hpp"
#include "trainkit/config.hpp"
#include "trainkit/core/bytes.hpp"
#include "trainkit/core/tensor.hpp"
#include "trainkit/core/tensor_view.hpp"
#include "trainkit/data/prefetcher.hpp"
#include "trainkit/dist/bucketer.hpp"
#include "trainkit/dist/comm.hpp"
#include "trainkit/dist/nccl_comm.hpp"
#include "trainkit/error.hpp"
#include "trainkit/exec/cuda.hpp"
#include "trainkit/exec/host.hpp"
#include "trainkit/monitor/monitor.hpp"
#include "trainkit/nn/cross_entropy.hpp"
#include "trainkit/nn/param_arena.hpp"
#include "trainkit/train/loop.hpp"

TRAINKIT_NAMESPACE_BEGIN
namespace train {

/// What a CausalLmTask reads.
struct CausalLmOptions {
  data::Prefetcher* train = nullptr;  ///< training batches (required)
  /// evaluate() runs one epoch of these; null: no metric. With `comm`, each rank reports the
  /// loss of its own loader: give every rank the whole validation set (train_gpt does), so all
  /// ranks report, log and keep checkpoints by the same value.
  data::Prefetcher* val = nullptr;
  std::string metric = "val/loss";  ///< the name evaluate() reports the mean loss under
  /// The loss scale in the arena's memory space (a loss scaler's scale_data()), multiplied into
  /// the gradients without a host read; null: 1.
  const float* loss_scale = nullptr;
  /// Called after the Loop restored a checkpoint (Loop's on_resume hook), e.g. to switch schedules.
  std::function<void(const ckpt::CheckpointInfo&)> on_resume = {};
  /// Data parallelism (null or one rank: none): each rank trains on its own batches (e.g. from
  /// a data::DistributedSampler), and the gradients are averaged over the communicator's ranks by
  /// a dist::GradBucketer the task owns, each bucket's all-reduce starting as soon as backward
  /// completed its gradients, overlapping the rest of backward. The reported loss is the mean
  /// over the ranks. The task's construction is collective: it broadcasts rank 0's parameters.
  /// The communicator moves memory of the model's space (NcclComm for a device model).
  dist::Comm* comm = nullptr;
  dist::BucketOptions buckets = {};  ///< bucket sizes, bf16 compression (DDP's defaults)
};

/// The step and evaluation of a causal LM. Model: `static constexpr Space space`,
/// `options().vocab_size`, `Context`, `forward<P>(exec, ctx, ids, logits)`,
/// `backward<P>(exec, ctx, ids, dlogits)`, `set_step`, `train()`, `eval()` (nn::Gpt has them).
/// logits and dlogits are [N, V] views whose rows are padded to nn::logits_row_stride(V) (row
/// stride >= V, column stride 1): the model must accept such rows, as nn::Gpt does.
/// Exec is exec::Host for a host model and exec::Cuda for a device one. For a low-precision
/// policy the arena's compute copy is refreshed before each forward (the optimizer updates the
/// f32 master weights). The task, the model, the arena and the loaders must outlive the run.
template <class Model, amp::Policy P = amp::Fp32>
class CausalLmTask {
 public:
  static constexpr Space S = Model::space;
  using T = amp::activation_t<P>;
  using Exec = std::conditional_t<S == Space::kHost, exec::Host, exec::Cuda>;

  CausalLmTask(const Exec& exec, Model& model, nn::ParamArena<S>& arena, CausalLmOptions options)
      : exec_(&exec), model_(&model), arena_(&arena), options_(std::move(options)) {
    TRAINKIT_CHECK(options_.train != nullptr, "train::CausalLmTask: no training loader");
    if (options_.comm != nullptr && options_.comm->world_size() > 1)
      ddp_ = std::make_unique<dist::GradBucketer<S>>(arena, *options_.comm, options_.buckets);
  }

  /// One step: the next training batch, forward, the mean cross-entropy, backward (the
  /// gradients are added to the arena). Returns the loss (a handle into device memory on the
  /// device).
  auto step(StepContext& ctx) {
    data::Batch batch;
    {
      auto span = ctx.monitor->span(monitor::Phase::kDataWait);
      batch = options_.train->next();
    }
    const auto ids = tokens(batch, "input");
    const auto targets = flat_tokens(batch, "target");
    const auto logits = logits_view(ids.numel());
    {
      auto span = ctx.monitor->span(monitor::Phase::kForward);
      refresh_weights();
      model_->set_step(static_cast<std::uint32_t>(ctx.step));
      model_->template forward<P>(*exec_, ctx_, ids, logits);
      ce_.template forward<P>(*exec_, ce_ctx_, logits, targets, loss_.template view<1>());
    }
    {
      auto span = ctx.monitor->span(monitor::Phase::kBackward);
      const auto dlogits = padded_rows(dlogits_, logits.size(0));
      if (options_.loss_scale != nullptr)
        ce_.template backward<P>(*exec_, ce_ctx_, logits, targets, dlogits, options_.loss_scale);
      else ce_.template backward<P>(*exec_, ce_ctx_, logits, targets, dlogits);
      if (ddp_ == nullptr) {
        model_->template backward<P>(*exec_, ctx_, ids, dlogits);
      } else {
        model_->template backward<P>(*exec_, ctx_, ids, dlogits,
                                     [&](nn::ParamId id) { mark_ready(id); });
        average_over_ranks();
      }
    }
    if constexpr (S == Space::kHost) {
      return loss_.data()[0];
    } else {
      return LossHandle{loss_.data(), S};
    }
  }

  /// The mean loss over one epoch of the validation loader (dropout off), as {metric: value};
  /// no loader: no metrics. Reads each batch's loss (a host sync per batch on the device).
  ckpt::Metrics evaluate() {
    if (options_.val == nullptr) return {};
    double sum = 0.0, rows = 0.0;
    refresh_weights();
    model_->eval();
    // An indexed loader knows its epoch's batch count; a streaming one (0) says which batch
    // is the epoch's last.
    const std::size_t per_epoch = options_.val->batches_per_epoch();
    for (std::size_t b = 0; per_epoch == 0 || b < per_epoch; ++b) {
      const data::Batch batch = options_.val->next();
      const auto ids = tokens(batch, "input");
      const auto logits = logits_view(ids.numel());
      model_->template forward<P>(*exec_, eval_ctx_, ids, logits);
      ce_.template forward<P>(*exec_, ce_ctx_, logits, flat_tokens(batch, "target"),
                              loss_.template view<1>());
      const float loss = read_value(loss_.data(), S, "train::CausalLmTask");
      sum += static_cast<double>(loss) * static_cast<double>(ids.size(0));
      rows += static_cast<double>(ids.size(0));
      if (per_epoch == 0 && batch.last_in_epoch()) break;
    }
    model_->train();
    TRAINKIT_CHECK(rows > 0.0,
                   "train::CausalLmTask::evaluate: the validation loader gave no "
                   "rows (a loss of 0 would look perfect)");
    return {{options_.metric, sum / rows}};
  }

  void on_resume(const ckpt::CheckpointInfo& info) {
    if (options_.on_resume) options_.on_resume(info);
  }

  Model& model() noexcept { return *model_; }
  /// The gradient bucketer of a data-parallel task (null without one): its last_wait_seconds()
  /// is the communication backward did not hide.
  const dist::GradBucketer<S>* bucketer() const noexcept { return ddp_.get(); }
  /// Refreshes the arena's compute copy for P (a no-op for f32 policies): after the optimizer's
  /// last step, before using the model outside the task (generation, export).
  void refresh_weights() {
    if constexpr (!std::is_same_v<T, float>) arena_->template refresh_compute_copy<T>(*exec_);
  }

 private:
  /// Field `name` of a batch: token ids [B, T] in space S.
  static TensorView<const std::int32_t, 2, S> tokens(const data::Batch& batch, const char* name) {
    if constexpr (S == Space::kHost) {
      return batch.host<const std::int32_t, 2>(name);
    } else {
      return batch.device<const std::int32_t, 2>(name);
    }
  }
  /// The same flattened to [B*T] (the targets of the cross-entropy).
  static TensorView<const std::int32_t, 1, S> flat_tokens(const data::Batch& batch,
                                                          const char* name) {
    const auto v = tokens(batch, name);
    return v.template reshape<1>(Extents<1>{{v.numel()}});
  }
  void mark_ready(nn::ParamId id) {
    if constexpr (S == Space::kHost) {
      ddp_->mark_ready(id);
    } else {
      ddp_->mark_ready(id, exec_->stream());
    }
  }
  /// Waits for the gradient all-reduces (on the device: makes the compute stream wait) and
  /// averages the loss over the ranks.
  void average_over_ranks() {
    const dist::Buffer loss(loss_.data(), 1, DType::kF32, S);
    if constexpr (S == Space::kHost) {
      ddp_->finish();
      options_.comm->all_reduce(loss, dist::ReduceOp::kAvg).wait();
    } else {
#if TRAINKIT_WITH_NCCL
      ddp_->finish(exec_->stream());
      auto& nccl = dynamic_cast<dist::NcclComm&>(*options_.comm);  // GradBucketer checked it
      nccl.set_stream(exec_->stream());
      nccl.wait_on(nccl.all_reduce(loss, dist::ReduceOp::kAvg), exec_->stream());
#endif
    }
  }

  TensorView<T, 2, S> logits_view(std::int64_t rows) { return padded_rows(logits_, rows); }

  /// [rows, V] in `buffer` with the row stride nn::logits_row_stride(V): aligned rows for the
  /// lm_head's products. The padding is never read; the results do not depend on it.
  TensorView<T, 2, S> padded_rows(nn::detail::Bytes<S>& buffer, std::int64_t rows) {
    const std::int64_t V = model_->options().vocab_size, ld = nn::logits_row_stride(V);
    return TensorView<T, 2, S>(buffer.template get<T>(rows * ld), Extents<2>{{rows, V}},
                               Extents<2>{{ld, 1}});
  }

  const Exec* exec_;
  Model* model_;
  nn::ParamArena<S>* arena_;
  CausalLmOptions options_;
  typename Model::Context ctx_, eval_ctx_;
  nn::SoftmaxCrossEntropy<S> ce_;
  typename nn::SoftmaxCrossEntropy<S>::Context ce_ctx_;
  nn::detail::Bytes<S> logits_, dlogits_;
  Tensor<float, S> loss_{Shape{1}};
  std::unique_ptr<dist::GradBucketer<S>> ddp_;
};

}  // namespace train
TRAINKIT_NAMESPACE_END
