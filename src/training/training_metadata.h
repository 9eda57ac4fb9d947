// The training metadata schema (docs/training-info-extensions.md): one metadata_props entry,
// key "onnxtrain.training", whose value is a JSON object with "schema_version": 1 that records
// the hyperparameters and provenance of the model's training program — the optimizer and its
// param_groups (PyTorch's names and parameter order), the initializer of each parameter's
// optimizer state under PyTorch's state key, the iteration counter, the schedule (as
// torch.optim.lr_scheduler names it), the loss, and the progress (epochs and global step done,
// batch size, seed, data). make_trainable writes it; the training loop updates "progress";
// the Python package's import_checkpoint writes it too; `onnxtrain info` shows it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "training/make_trainable_internal.h"

namespace onnx {
class ModelProto;
}

namespace onnxtrain::training {

inline constexpr const char* kTrainingMetadataKey = "onnxtrain.training";
inline constexpr int kTrainingMetadataVersion = 1;

// metadata_props[key] of `model`, or "" when absent.
std::string metadata_value(const onnx::ModelProto& model, const std::string& key);
// Sets metadata_props[key] (replacing an equal key).
void set_metadata_value(onnx::ModelProto& model, const std::string& key, const std::string& value);

// What the training loop records in "progress". Unset fields keep their recorded value.
struct TrainingProgress {
  std::optional<int64_t> epochs_done;  // complete epochs
  std::optional<int64_t> global_step;  // optimizer steps done (the iteration counter's value)
  std::optional<int64_t> batch_size;
  std::optional<uint64_t> seed;
  std::optional<std::string> data;     // a description of the training data (a path, a name)
  std::string updated_by;              // "train", ...: appended to "history"
};

// `json` (a schema value) with its "progress" fields set from `progress`. Throws Error naming
// the key when `json` is not a JSON object of a known schema_version.
std::string with_progress(const std::string& json, const TrainingProgress& progress);

// The iteration counter's initializer recorded in `json` ("" when none). Throws like with_progress.
std::string step_counter_of(const std::string& json);

// Readable lines (no newline) that summarize a schema value, for `onnxtrain info`. A value that
// is not valid JSON gives one line saying so (info shows a model, it does not reject it).
std::vector<std::string> training_metadata_summary(const std::string& json);

namespace detail {

// The schema value make_trainable writes: `params` the trainable parameters (graph order),
// `groups` resolved, `states` the optimizer's variables, `counter` the iteration counter,
// `output`/`label` what the loss reads.
std::string training_metadata_json(const MakeTrainableOptions& options, const std::vector<Param>& params,
                                   const std::vector<Group>& groups, const std::vector<State>& states,
                                   const std::string& counter, const std::string& output, const std::string& label);

}  // namespace detail

}  // namespace onnxtrain::training
