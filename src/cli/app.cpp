// onnxtrain <command>: parses flags and calls the library; see `onnxtrain --help`.
#include "cli/app.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/make_trainable_flags.h"
#include "onnxtrain/error.h"

namespace onnxtrain::cli {

int main(int argc, char** argv) {
  // Checkpoint import and export read and write PyTorch's files: the Python package does them.
  if (argc > 1 && (std::string(argv[1]) == "import-checkpoint" || std::string(argv[1]) == "export-checkpoint")) {
    std::cerr << "error: " << argv[1]
              << " needs PyTorch: use the Python package's onnxtrain command (pip install onnxtrain; "
                 "see docs/python.md, Checkpoints)\n";
    return 2;
  }
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
  run->add_option("--threads", run_args.threads, "threads for kernels (default: one per CPU other processes leave free)")->check(CLI::NonNegativeNumber);

  onnxtrain::cli::StepArgs step_args;
  auto* step = app.add_subcommand("step", "Run training steps of the model's TrainingInfoProto on fixed feeds and save the result");
  step->add_option("model", step_args.model, "the .onnx file with training_info")->required();
  step->add_option("-i,--input", step_args.inputs, "NAME=FILE for each algorithm input (FILE: .npy or TensorProto .pb)");
  step->add_flag("--initialize", step_args.initialize, "run the initialization graphs first");
  step->add_option("--steps", step_args.steps, "number of steps (default 1)")->check(CLI::PositiveNumber);
  step->add_option("-o,--output", step_args.output, "where to write the updated model")->required();
  step->add_option("--threads", step_args.threads, "threads for kernels (default: one per CPU other processes leave free)")->check(CLI::NonNegativeNumber);

  onnxtrain::cli::MakeTrainableFlags mt;
  auto* make = onnxtrain::cli::add_make_trainable(app, mt);

  onnxtrain::training::TrainOptions tr;
  auto* train = app.add_subcommand("train", "Train a model that carries training_info on a dataset");
  train->add_option("model", tr.model, "the .onnx file with training_info (see make-trainable)")->required();
  train->add_option("--data", tr.data, "a folder of IDX or .npy files, a .npz or a .csv file")->required();
  train->add_option("-o,--output", tr.output, "where to write the trained model")->required();
  train->add_option("--map", tr.map, "INPUT=COLUMN: the dataset column an input reads (repeatable)");
  train->add_option("--scale", tr.scale, "COLUMN=FACTOR, e.g. image=1/255 (repeatable)");
  train->add_option("--epochs", tr.epochs, "passes over the training split (default 1)")->check(CLI::PositiveNumber);
  train->add_option("--batch-size", tr.batch_size, "samples per step (default 32)")->check(CLI::PositiveNumber);
  train->add_flag("--shuffle,!--no-shuffle", tr.shuffle, "shuffle every epoch (default on)");
  train->add_option("--seed", tr.seed, "seed of shuffling and of random ops (default 0)");
  train->add_flag("--drop-last", tr.drop_last, "skip a last batch smaller than --batch-size");
  train->add_option("--max-steps", tr.max_steps, "stop after this many steps in all");
  train->add_option("--eval-every", tr.eval_every, "also evaluate on the test split every N steps");
  train->add_flag("-q,--quiet", tr.quiet, "no progress output");
  train->add_option("--metrics", tr.metrics, "append JSON lines (steps and evaluations) to this file");
  train->add_option("--checkpoint-every", tr.checkpoint_every, "also checkpoint every N steps");
  train->add_option("--checkpoint", tr.checkpoint, "checkpoint file (default: OUTPUT with .ckpt.onnx)");
  train->add_option("--resume", tr.resume, "continue from a checkpoint");
  train->add_flag("--initialize", tr.initialize, "run the initialization graphs first");
  train->add_option("--export-inference", tr.export_inference, "also write the inference-only model here");
  train->add_option("--threads", tr.threads,
                    "threads for kernels (default: one per CPU that other processes leave free, followed as training goes; "
                    "OMP_NUM_THREADS where set)")->check(CLI::NonNegativeNumber);
  train->add_option("--collective-timeout", tr.collective_timeout,
                    "under mpirun: seconds a rank waits for the others in a collective before ending the run (default 600, 0: forever)")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--checksum-every", tr.checksum_every,
                    "under mpirun, a debug check: every N steps compare every rank's state with rank 0's")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--shard-optimizer-state", tr.shard_optimizer_state,
                  "under mpirun: ZeRO stage 1, each rank holds and updates the optimizer state of 1/N of the parameters "
                  "(docs/distributed.md)");
  train->add_flag("--sync-batch-norm", tr.sync_batch_norm,
                  "under mpirun: BatchNormalization in training mode uses the whole global batch's statistics (PyTorch's SyncBatchNorm); default: each rank's share's, running statistics averaged");

  onnxtrain::cli::ExportArgs ex;
  auto* exp = app.add_subcommand("export", "Write the inference model (training_info dropped, current weights kept) and/or its weights as .safetensors");
  exp->add_option("model", ex.model, "the .onnx file")->required();
  exp->add_option("-o,--output", ex.output, "where to write the inference model");
  exp->add_option("--weights", ex.weights, "also (or only) write the graph's initializers to this .safetensors file");
  exp->add_flag("--optimizer-state", ex.optimizer_state, "with --weights: add the training state (optimizer state, step counter)");

  onnxtrain::cli::LoadWeightsArgs lw;
  auto* load = app.add_subcommand("load-weights", "Replace a model's initializers by name from a .safetensors file");
  load->add_option("model", lw.model, "the .onnx file")->required();
  load->add_option("--weights", lw.weights, "the .safetensors file")->required();
  load->add_option("-o,--output", lw.output, "where to write the model")->required();
  load->add_flag("--allow-extra", lw.allow_extra, "skip tensors of the file that name no initializer");

  try {
    app.parse(argc, argv);
    if (*make) onnxtrain::cli::resolve_make_trainable(mt);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (*info) return onnxtrain::cli::info(model);
    if (*check) return onnxtrain::cli::check(model);
    if (*run) return onnxtrain::cli::run(run_args);
    if (*step) return onnxtrain::cli::step(step_args);
    if (*make) return onnxtrain::cli::make_trainable(mt.args);
    if (*train) return onnxtrain::cli::train(tr);
    if (*exp) return onnxtrain::cli::export_model(ex);
    if (*load) return onnxtrain::cli::load_weights(lw);
  } catch (const onnxtrain::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace onnxtrain::cli
