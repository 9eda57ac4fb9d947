// The training loop's feeding (include/onnxtrain/trainer.h, "Feeding"): which column each
// step input reads, how a batch's columns become step inputs, and the evaluation's sums.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "onnxtrain/trainer.h"
#include "onnxtrain/training.h"

namespace onnxtrain::training::feeding {

// How one step input is fed from a column.
struct Feed {
  runtime::ValueInfo input;
  std::string column;
  double scale = 1.0;
  bool inference = false;  // also an input of the inference graph (fed when evaluating)
};

// The feeds of every step input of `session` from a source's columns, by the rules of
// "Feeding" and options.map and options.scale. Throws Error for an input that reads no column,
// a map naming no step input, a scale naming no column, or a fixed batch dim that differs from
// the source's fixed batch size.
std::vector<Feed> resolve(const TrainingSession& session, const SourceInfo& source, const TrainOptions& options);

// The step inputs from one batch. `where` ("epoch 1, batch 2") prefixes errors: a missing
// column, columns of different sample counts, a column that does not fit its input, NaN or Inf
// in a floating input (when `check_finite`). With `inference_only`, only the feeds of inference
// graph inputs.
runtime::NamedTensors inputs(const Batch& batch, const std::vector<Feed>& feeds, const std::string& where,
                             bool check_finite, bool inference_only = false);

// Mean cross-entropy and accuracy of class scores [B, C] against integer labels [B].
struct EvalSums {
  double loss = 0;
  int64_t correct = 0, count = 0;
  void add(const Tensor& logits, const Tensor& labels);
};

}  // namespace onnxtrain::training::feeding

namespace onnxtrain::training {

// Where checkpoints go (TrainOptions::checkpoint); empty: none.
std::filesystem::path checkpoint_path(const TrainOptions& options);
// Fails now, before any training, when an output path (output, checkpoint, export_inference,
// metrics) cannot be written.
void check_outputs(const TrainOptions& options);

}  // namespace onnxtrain::training
