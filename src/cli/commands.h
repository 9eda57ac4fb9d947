// The `onnxtrain` subcommands. Each returns the process exit status: 0 success, 2 bad input
// (an onnxtrain::Error was reported), 1 internal failure.
#pragma once

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

int info(const std::string& model_path);
int check(const std::string& model_path);
int run(const RunArgs& args);
int step(const StepArgs& args);
int make_trainable(const MakeTrainableArgs& args);
// Exit status 130 after SIGINT, 143 after SIGTERM (a checkpoint was written).
int train(const training::TrainOptions& options);
int export_model(const std::string& model_path, const std::string& output);

}  // namespace onnxtrain::cli
