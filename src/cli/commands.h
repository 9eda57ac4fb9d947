// The `onnxtrain` subcommands. Each returns the process exit status: 0 success, 2 bad input
// (an onnxtrain::Error was reported), 1 internal failure.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "onnxtrain/make_trainable.h"
#include "onnxtrain/trainer.h"

namespace onnxtrain::cli {

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE
  std::string output_dir;
  int threads = 0;
};

struct StepArgs {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE
  bool initialize = false;
  int steps = 1;
  std::string output;
  int threads = 0;
};

struct MakeTrainableArgs {
  std::string model, output;
  training::MakeTrainableOptions options;
};

// The folder external data paths are relative to: that of the model file ("." for a bare name).
std::filesystem::path model_folder(const std::string& model_path);

int info(const std::string& model_path);
int check(const std::string& model_path);
int run(const RunArgs& args);
int step(const StepArgs& args);
int make_trainable(const MakeTrainableArgs& args);
// Exit status 130 after SIGINT, 143 after SIGTERM (a checkpoint was written).
int train(const training::TrainOptions& options);

// `onnxtrain export` (src/cli/weights.cpp): the inference model to `output` and/or the weights
// to `weights` (safetensors): ModelProto.graph's initializers and, with optimizer_state, the
// training_info state that update_binding writes (optimizer state, step counter).
struct ExportArgs {
  std::string model, output, weights;
  bool optimizer_state = false;
};
int export_model(const ExportArgs& args);

// `onnxtrain load-weights`: replaces initializers (graph and training state) by name from a
// safetensors file; a tensor that names no initializer (unless allow_extra) or differs in dtype
// or shape is an Error, and nothing is written.
struct LoadWeightsArgs {
  std::string model, weights, output;
  bool allow_extra = false;
};
int load_weights(const LoadWeightsArgs& args);

}  // namespace onnxtrain::cli
