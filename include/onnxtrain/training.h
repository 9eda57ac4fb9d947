// training::TrainingSession — executes ModelProto.training_info (TrainingInfoProto) as the
// ONNX spec defines it (onnx.proto "TrainingInfoProto", IR.md "Training Related Information").
//
// Mutable variables (the state) are the initializers named as keys of any update_binding or
// initialization_binding; they start at their initializer values. Every other initializer is
// a constant.
//
//   initialize()  for each TrainingInfoProto in order: evaluate `initialization` (a graph
//                 without inputs) and assign its outputs through `initialization_binding`.
//   step(feeds)   for each TrainingInfoProto in order: evaluate the combined graph
//                 (ModelProto.graph followed by `algorithm`: inputs, initializers, nodes,
//                 outputs concatenated) with the current state, then assign every
//                 `update_binding` value to its key at once.
//   infer(feeds)  ModelProto.graph alone with the current state.
//
// A call that fails (a missing feed, a shape error, a bound value whose element type or
// shape differs from its variable's, NaN/Inf in a bound value with the NaN guard on) throws
// onnxtrain::Error and changes no variable. Plans are made once and reused across steps.
// Thread safety: one TrainingSession must not be used from several threads at once (every
// call reads or changes its state); serialize the calls (the Python package does) or use one
// session per thread. Different TrainingSessions, and Sessions, may run at the same time on
// different threads: they share no mutable state (tested under ThreadSanitizer:
// tests/reliability/concurrency_test.cpp). state() and the ValueInfo lists are references
// into the session, valid until its next call that changes them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "onnxtrain/session.h"
#include "onnxtrain/tensor.h"

namespace onnx {
class ModelProto;
}

namespace onnxtrain::distributed {
class WeightedMean;  // onnxtrain/distributed.h
class Communicator;
}

namespace onnxtrain::training {

struct TrainingOptions {
  // Threads for kernels (see runtime::SessionOptions::threads: 0 follows the machine's load
  // call by call, but with `reduce` set, where it keeps OpenMP's default).
  int threads = 0;
  // Reject a step or initialization whose bound values hold NaN or Inf.
  bool nan_guard = true;
  // Plan graphs with the runtime's rewrites: constant folding (src/runtime/constant_folding.h)
  // and fusions (src/runtime/fusion.h: the Div-Adam-Mul pattern of make-trainable's Adam;
  // Conv -> Relu -> MaxPool where nothing else reads the intermediates, as in an inference
  // graph; Conv -> Relu where only the Relu reads the convolution, as in a training step; the
  // backward pass of Relu -> MaxPool as one MaxPoolGrad). Results agree to rounding either way.
  bool fuse = true;
  // Seed of random ops without a `seed` attribute (RandomNormal in an initialization graph,
  // Dropout in training mode). Random numbers depend only on the seed, the node and the
  // number of earlier steps (or initializations), so runs are reproducible.
  uint64_t seed = 0;
  // Data-parallel training (docs/distributed.md): when set, each algorithm graph with Gradient
  // nodes is cut at their outputs into a forward-and-backward part and an update part
  // (src/distributed/split_program.h); step() runs the first, calls `reduce` on the values
  // that cross the cut (every Gradient output, every value the update part reads, every graph
  // output the first part computes, such as the loss), and runs the second on what `reduce`
  // leaves. The trainer averages them across ranks (distributed::Communicator::
  // begin_weighted_mean). The session hands the values to the returned WeightedMean in buckets
  // as the backward pass writes them (in the order it writes them: a first bucket of 1 MiB,
  // then 25 MiB, PyTorch DDP's defaults), so their allreduce overlaps the rest of the backward
  // pass, and runs the update part on finish()'s averages.
  std::function<std::unique_ptr<distributed::WeightedMean>()> reduce;
  // ZeRO stage 1 (docs/distributed.md, "ZeRO-1"; PyTorch's ZeroRedundancyOptimizer): with
  // `reduce` set and a communicator of N > 1 ranks, the parameters each algorithm's update
  // part writes are divided among the ranks by whole tensor (greedily by size, the same on
  // every rank); each rank runs the update of its own parameters only and holds only their
  // optimizer state (the variables whose update depends on one parameter or its gradient):
  // the other ranks' state is dropped from state(). After each update every parameter is
  // broadcast from its owner, so all ranks hold the same parameters. Every rank must call
  // step() and consolidate_state() at the same points. Needs `reduce` and one training_info
  // entry (an Error otherwise); an update node that reads the state of parameters other ranks
  // own is an Error naming it. nullptr or 1 rank: not sharded.
  std::shared_ptr<distributed::Communicator> shard_optimizer_state;
  // train --sync-batch-norm (docs/distributed.md, "BatchNormalization"): when set, every
  // BatchNormalization in training mode of an algorithm with Gradient nodes normalizes with the
  // statistics of the global batch (ai.onnxtrain.SyncBatchNormalization), and this sums its
  // per-channel partial sums across ranks, in place (the trainer's Communicator::sum). Unset:
  // each rank's share's statistics, as PyTorch DDP without SyncBatchNorm.
  std::function<void(std::span<double>)> sync_batch_norm;
};

class TrainingSession {
 public:
  // Loads and validates the model (validate_training_info) and plans every graph. Throws
  // Error for an unreadable model, an invalid training_info, or an unsupported operator.
  explicit TrainingSession(const std::filesystem::path& path, TrainingOptions options = {});
  // From a model in memory (copied, or moved in: std::move(model) spares a copy of its
  // tensors); `base_dir` resolves external data, `source` names it in errors.
  TrainingSession(onnx::ModelProto model, TrainingOptions options = {},
                  const std::filesystem::path& base_dir = {}, const std::string& source = "model");
  ~TrainingSession();
  TrainingSession(TrainingSession&&) noexcept;
  TrainingSession& operator=(TrainingSession&&) noexcept;

  // Number of TrainingInfoProto entries.
  size_t num_algorithms() const;
  // Inputs the caller feeds to step(i, ...) and the outputs it returns (those of the
  // inference graph, then those of the algorithm).
  const std::vector<runtime::ValueInfo>& step_inputs(size_t i) const;
  const std::vector<runtime::ValueInfo>& step_outputs(size_t i) const;
  // Inputs and outputs of the inference graph.
  const std::vector<runtime::ValueInfo>& inference_inputs() const;
  const std::vector<runtime::ValueInfo>& inference_outputs() const;

  // Runs every initialization graph in order (see the file comment).
  void initialize();
  // One training step over every TrainingInfoProto in order. Each algorithm receives the feeds
  // named after its inputs; a feed no algorithm takes is an Error. Returns the outputs of
  // every combined graph by name (a later algorithm's output replaces an earlier one of the
  // same name).
  runtime::NamedTensors step(const runtime::NamedTensors& feeds);
  // One step of the i-th TrainingInfoProto only (IR.md allows invoking one algorithm).
  runtime::NamedTensors step(size_t i, const runtime::NamedTensors& feeds);
  // The inference graph with the current state.
  runtime::NamedTensors infer(const runtime::NamedTensors& feeds);

  // Every mutable variable by name.
  const runtime::NamedTensors& state() const;
  // Replaces a variable's value. Throws Error for an unknown name or a value whose element
  // type or shape differs from the variable's.
  void set_state(const std::string& name, const Tensor& value);
  // Writes the model with every initializer that is a variable replaced by its current value
  // (inference graph and algorithms), training_info preserved, atomically (io::save_model).
  // `metadata` entries are set in ModelProto.metadata_props (replacing equal keys).
  void save(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata = {}) const;
  // The model save() writes, in memory, with the same `metadata`: every variable initializer at
  // its current value, training_info preserved, tensors stored as external data read in (from
  // the model's folder) so that the result stands alone. Throws Error when external data is
  // unreadable.
  onnx::ModelProto model(const std::map<std::string, std::string>& metadata = {}) const;

  // With TrainingOptions::shard_optimizer_state: a collective every rank calls at the same
  // point, after which rank `to` holds every variable (the optimizer state other ranks own is
  // sent to it), so its save() and model() write the whole state (PyTorch:
  // ZeroRedundancyOptimizer.consolidate_state_dict), until drop_consolidated_state() or the
  // next step() drops it again. Without sharding both do nothing.
  void consolidate_state(int to = 0);
  void drop_consolidated_state();

  // Successful steps so far: the run index random ops (Dropout) draw with. A resumed training
  // loop restores it so that it continues exactly as if it had never stopped.
  uint64_t steps_done() const;
  void set_steps_done(uint64_t steps);

  // Bytes the steps' memory plans hold for the values kernels compute in a step (the forward
  // pass's activations the gradients read, the gradients, temporaries), laid out by liveness
  // in one arena per plan (runtime/memory_plan.h): the largest plan of each algorithm, summed
  // over the algorithms. 0 before the first step. The variables (state()) are not in it.
  size_t step_arena_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks what the spec requires of ModelProto.training_info, throwing Error with the entry,
// binding and tensor named: update_binding keys unique across all entries; keys are
// initializers of ModelProto.graph or of that entry's algorithm; update_binding values are
// outputs of the algorithm or of ModelProto.graph; initialization has no inputs;
// initialization_binding keys obey the key rule and its values are outputs of that
// initialization; an initialization is present when there are initialization_bindings; each
// combined graph is valid SSA with every input defined; inference nodes read no algorithm
// input or output; the ONNX checker passes on the inference graph and on each combined graph.
// `base_dir` resolves external data of initializers.
void validate_training_info(const onnx::ModelProto& model, const std::string& source,
                            const std::filesystem::path& base_dir = {});

}  // namespace onnxtrain::training
