// The training loop of `onnxtrain train`: a model that carries training_info, a dataset,
// epochs of shuffled batches fed to TrainingSession::step, evaluation on the test split,
// progress, metrics, checkpoints and exact resume.
//
// Feeding. Each input of the step (algorithm and inference graph inputs) reads a dataset
// column: `map` ("INPUT=COLUMN"), else the column of the same name, else, for an IDX dataset,
// its only image column for a floating input and its label column for an integer input.
// A column is converted to the input's element type (uint8 -> float32, labels -> int64),
// multiplied by its `scale` ("COLUMN=1/255" or "COLUMN=0.5") when the input is floating, and
// reshaped to the input's per-sample shape when the element counts match ([N, 28, 28] ->
// [N, 784] or [N, 1, 28, 28]). A symbolic batch dim takes any batch size; a fixed one that
// differs from batch_size is an Error before training starts.
//
// Order. With `shuffle`, epoch e visits the samples in a permutation drawn from
// std::mt19937_64 seeded with (seed, e); without it, in order. A checkpoint records the epoch,
// the next batch and the number of steps done (ModelProto.metadata_props "onnxtrain.epoch",
// "onnxtrain.batch", "onnxtrain.steps_done", "onnxtrain.seed"), so `resume` continues with
// the same batches and the same random-op draws: with the same threads and seed, a resumed
// run ends with weights bit-identical to an uninterrupted one.
//
// Errors (onnxtrain::Error): an unreadable dataset, a column that matches no input, a feed
// that cannot be converted, NaN or Inf in a batch (named by epoch and batch), a failed step;
// output paths are checked writable before training starts, and files are written
// atomically, so a failure leaves the previous checkpoint intact.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace onnxtrain::training {

struct TrainOptions {
  std::filesystem::path model;            // a model with training_info
  std::filesystem::path data;             // see data::load_dataset
  std::filesystem::path output;           // the trained model (with training_info)
  std::vector<std::string> map;           // INPUT=COLUMN
  std::vector<std::string> scale;         // COLUMN=FACTOR, FACTOR a number or a fraction "1/255"
  int epochs = 1;
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;                      // shuffling and random ops without a seed attribute
  bool drop_last = false;                 // skip a last batch smaller than batch_size
  int64_t max_steps = 0;                  // stop after this many steps in all (0: no limit)
  int64_t eval_every = 0;                 // also evaluate every N steps (0: only after each epoch)
  bool quiet = false;                     // no progress output
  std::filesystem::path metrics;          // JSON lines: one record per step and per evaluation
  int64_t checkpoint_every = 0;           // also checkpoint every N steps
  std::filesystem::path checkpoint;       // where checkpoints go (default: OUTPUT with .ckpt.onnx)
  std::filesystem::path resume;           // continue from this checkpoint
  bool initialize = false;                // run the initialization graphs first (not on resume)
  std::filesystem::path export_inference; // also write the inference-only model here
  int threads = 0;
};

struct TrainResult {
  int64_t steps = 0;                  // steps run, in all (including those before a resume)
  double last_loss = 0;
  std::optional<double> test_loss;    // mean cross-entropy of the last evaluation
  std::optional<double> test_accuracy;
  int signal = 0;                     // SIGINT or SIGTERM when interrupted, else 0
};

// Runs the loop, printing progress to `log`. `stop` is polled after every step (the CLI sets
// it from SIGINT/SIGTERM): the loop then writes a checkpoint and returns with `signal` set.
TrainResult train(const TrainOptions& options, std::ostream& log, const std::atomic<int>* stop = nullptr);

}  // namespace onnxtrain::training
