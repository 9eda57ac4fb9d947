// onnxtrain <command>: parses flags and calls the library; see `onnxtrain --help`.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"
#include "onnxtrain/error.h"

int main(int argc, char** argv) {
  CLI::App app{"onnxtrain: runs and trains ONNX models as the ONNX standard describes training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "onnxtrain 0.1.0");

  std::string model;
  auto* info = app.add_subcommand("info", "Describe a model: opsets, inputs, outputs, initializers, training_info");
  info->add_option("model", model, "the .onnx file")->required();

  auto* check = app.add_subcommand("check", "Validate a model (ONNX checker and onnxtrain's own checks); exit 0 valid, 2 invalid");
  check->add_option("model", model, "the .onnx file")->required();

  onnxtrain::cli::RunArgs run_args;
  auto* run = app.add_subcommand("run", "Run the inference graph on inputs from .npy or .pb files");
  run->add_option("model", run_args.model, "the .onnx file")->required();
  run->add_option("-i,--input", run_args.inputs, "NAME=FILE, one per graph input (FILE: .npy or TensorProto .pb)");
  run->add_option("-o,--output-dir", run_args.output_dir, "write every graph output as DIR/NAME.npy");
  run->add_option("--threads", run_args.threads, "threads for kernels (default: all cores)")->check(CLI::NonNegativeNumber);

  onnxtrain::cli::StepArgs step_args;
  auto* step = app.add_subcommand("step", "Run training steps of the model's TrainingInfoProto on fixed feeds and save the result");
  step->add_option("model", step_args.model, "the .onnx file with training_info")->required();
  step->add_option("-i,--input", step_args.inputs, "NAME=FILE for each algorithm input (FILE: .npy or TensorProto .pb)");
  step->add_flag("--initialize", step_args.initialize, "run the initialization graphs first");
  step->add_option("--steps", step_args.steps, "number of steps (default 1)")->check(CLI::PositiveNumber);
  step->add_option("-o,--output", step_args.output, "where to write the updated model")->required();
  step->add_option("--threads", step_args.threads, "threads for kernels (default: all cores)")->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*info) return onnxtrain::cli::info(model);
    if (*check) return onnxtrain::cli::check(model);
    if (*run) return onnxtrain::cli::run(run_args);
    if (*step) return onnxtrain::cli::step(step_args);
  } catch (const onnxtrain::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
