// The training loop of `onnxtrain train` and of Python's onnxtrain.train: a model that carries
// training_info, batches from a BatchSource, epochs fed to TrainingSession::step, evaluation,
// progress, metrics, checkpoints and exact resume.
//
// Batches. The loop takes each epoch's batches from a BatchSource: a batch is a set of named
// columns whose dim 0 indexes its samples. DatasetSource cuts a dataset read from a path
// (data::load_dataset) into shuffled batches of `batch_size`; a caller (Python) may provide its
// own. The loop restarts the source for every epoch, and for a resumed epoch asks it to skip
// the batches done before the checkpoint.
//
// Feeding. Each input of the step (algorithm and inference graph inputs) reads a column:
// `map` ("INPUT=COLUMN"), else the column of the same name, else, for an IDX dataset, its only
// image column for a floating input and its label column for an integer input, else, for a
// positional source (batches that are tuples), the i-th step input reads column "i". A column
// is converted to the input's element type (uint8 -> float32, labels -> int64), multiplied by
// its `scale` ("COLUMN=1/255" or "COLUMN=0.5") when the input is floating, and reshaped to the
// input's per-sample shape when the element counts match ([N, 28, 28] -> [N, 784] or
// [N, 1, 28, 28]). A symbolic batch dim takes any batch size; a fixed one that differs from a
// source's fixed batch size is an Error before training starts.
//
// Order. DatasetSource with `shuffle` visits the samples of epoch e in a permutation drawn
// from std::mt19937_64 seeded with (seed, e); without it, in order. A checkpoint records the
// epoch, the next batch and the number of steps done (ModelProto.metadata_props
// "onnxtrain.epoch", "onnxtrain.batch", "onnxtrain.steps_done", "onnxtrain.seed"), so `resume`
// continues with the same batches and the same random-op draws: with the same threads and
// seed, a resumed run ends with weights bit-identical to an uninterrupted one (for a caller's
// source, when it yields the same batches again).
//
// Errors (onnxtrain::Error): an unreadable dataset, a column that matches no input, a batch
// without a column the first batch had, a feed that cannot be converted, NaN or Inf in a batch
// (named by epoch and batch), a failed step, an epoch without batches; output paths are
// checked writable before training starts, and files are written atomically, so a failure
// leaves the previous checkpoint intact. An exception thrown by a source or a hook propagates
// unchanged (no checkpoint is written then).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/dataset.h"
#include "onnxtrain/session.h"
#include "onnxtrain/tensor.h"

namespace onnx {
class ModelProto;
}

namespace onnxtrain::distributed {
class Communicator;
}

namespace onnxtrain::training {

class TrainingSession;

struct TrainOptions {
  std::filesystem::path model;            // a model with training_info
  // The model in memory instead of reading `model` (which then names it in messages and
  // resolves its external data relative to its folder).
  std::shared_ptr<const onnx::ModelProto> model_proto;
  std::filesystem::path data;             // see data::load_dataset (the path overload of train)
  std::filesystem::path output;           // the trained model (with training_info); empty: none
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
  // JSON lines: one record per step ("type": "step", step, epoch, loss, lr, steps_per_s, the
  // OpenMP threads it ran on, step_arena_bytes: TrainingSession::step_arena_bytes) and per
  // evaluation ("type": "eval", step, epoch, test_loss, test_accuracy).
  std::filesystem::path metrics;
  int64_t checkpoint_every = 0;           // also checkpoint every N steps
  // Where checkpoints go; empty: OUTPUT with .ckpt.onnx, or no checkpoints when OUTPUT is
  // empty too.
  std::filesystem::path checkpoint;
  std::filesystem::path resume;           // continue from this checkpoint
  bool initialize = false;                // run the initialization graphs first (not on resume)
  std::filesystem::path export_inference; // also write the inference-only model here (with or without OUTPUT)
  // Threads for kernels. 0: OMP_NUM_THREADS where set; else, in one process, one per CPU that
  // other processes leave free (runtime/cpu_load.h, as runtime::SessionOptions::threads: their
  // runnable threads in /proc, read at the start and at most every 0.25 s; a change of load
  // counts after 2 s; a change of count is logged unless quiet), and the calling thread's OpenMP
  // count as it was afterwards; with a communicator, OpenMP's default (one per CPU mpirun binds
  // the rank to). Kernels' sums may round differently on another count, so runs that must be
  // bit-identical (a resume against an uninterrupted run) set it.
  int threads = 0;
  // Data-parallel training (docs/distributed.md): with a communicator of N ranks, each rank
  // trains on its share of every batch (rows [n*r/N, n*(r+1)/N) of a batch of n), the values
  // up to the Gradient outputs are averaged across ranks weighted by the shares' sizes, and
  // rank 0 alone prints, evaluates and writes metrics, checkpoints and outputs. nullptr: one
  // process. The CLI passes distributed::world().
  std::shared_ptr<distributed::Communicator> communicator;
  // Seconds a collective waits for the other ranks before the run ends with an error naming
  // the waiting rank (Communicator::set_timeout); 0: forever.
  double collective_timeout = 600;
  // Data-parallel, a debug check: every K steps each rank hashes its state (every variable:
  // weights, optimizer state, counters; with shard_optimizer_state, the optimizer state only
  // its owner holds is not compared) and compares with rank 0's; a difference is an Error
  // naming the rank and the variable. 0: never.
  int64_t checksum_every = 0;
  // ZeRO stage 1 (docs/distributed.md, "ZeRO-1"): each rank holds and updates the optimizer
  // state of its share of the parameters only (TrainingOptions::shard_optimizer_state); rank
  // 0 gathers the whole state to write checkpoints and the output. Needs a communicator (an
  // Error otherwise); with 1 rank nothing is sharded.
  bool shard_optimizer_state = false;
  // With a communicator: BatchNormalization in training mode normalizes with the statistics of
  // the global batch, summed across ranks in the forward and backward passes (PyTorch's
  // SyncBatchNorm), so N ranks equal one process (TrainingOptions::sync_batch_norm). Without
  // it, each rank normalizes with its share's and the running statistics are averaged. No
  // effect in one process, whose batch is the global batch.
  bool sync_batch_norm = false;
};

// One batch: columns by name, dim 0 of each indexing the batch's samples.
using Batch = std::map<std::string, Tensor>;

// What the loop knows of a source before it iterates it.
struct SourceInfo {
  std::string name;                   // names the source in messages: a path, "train_data"
  std::vector<std::string> columns;   // the columns of every batch
  std::optional<int64_t> batches;     // batches per epoch, where known in advance
  int64_t batch_size = 0;             // samples per batch when fixed by the source (else 0)
  bool idx = false;                   // an IDX dataset: image/label defaults (see Feeding)
  bool positional = false;            // columns "0", "1", ...: step input i reads column "i"
  // For an evaluation source: skip evaluation, silently, when the model cannot be evaluated
  // (the test split found beside a dataset) instead of an Error (data the caller chose).
  bool optional = false;
};

// The batches of each epoch, restartable. Not used from several threads at once.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Called once, before the first epoch.
  virtual SourceInfo info() = 0;
  // Restarts the source at epoch `epoch` (0-based), skipping its first `skip` batches.
  virtual void start_epoch(int epoch, int64_t skip) = 0;
  // The next batch of the epoch, or nullopt when the epoch is over (or the source was
  // interrupted: the loop then polls TrainHooks::stop).
  virtual std::optional<Batch> next() = 0;
};

// Rows of a dataset in batches of `batch_size`: shuffled per epoch as "Order" describes, the
// last one smaller unless `drop_last`.
class DatasetSource : public BatchSource {
 public:
  DatasetSource(data::Dataset dataset, std::string name, int64_t batch_size, bool shuffle, uint64_t seed,
                bool drop_last, bool idx);
  SourceInfo info() override;
  void start_epoch(int epoch, int64_t skip) override;
  std::optional<Batch> next() override;
  bool optional = false;  // see SourceInfo::optional

 private:
  data::Dataset dataset_;
  std::string name_;
  int64_t batch_size_;
  bool shuffle_, drop_last_, idx_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  int64_t next_ = 0;  // the next batch
};

// The train split of a dataset in batches as options.batch_size, shuffle, seed and drop_last
// say; an Error when drop_last leaves no batch.
DatasetSource train_split_source(data::Dataset dataset, std::string name, const TrainOptions& options, bool idx);
// A test split in order, in batches of options.batch_size.
DatasetSource test_split_source(data::Dataset dataset, std::string name, const TrainOptions& options, bool idx);

// What a hook sees after each step.
struct StepEvent {
  int epoch = 0;                   // 0-based
  int64_t batch = 0;               // 0-based, within the epoch
  int64_t step = 0;                // steps done in all, this one included (1-based)
  int64_t total = 0;               // steps the run will take, where known (else 0)
  std::optional<int64_t> batches;  // batches per epoch, where known
  double loss = 0;                 // onnxtrain.loss of this step (NaN when the model has none)
  std::optional<double> lr;        // onnxtrain.lr, when the model outputs it
  double steps_per_s = 0;          // steps of this run per second of this run so far
  const runtime::NamedTensors* outputs = nullptr;  // every step output (valid during the call)
};

// What a hook sees after each evaluation (mean cross-entropy and accuracy over eval batches).
struct EvalEvent {
  int epoch = 0;      // 0-based
  int64_t step = 0;   // steps done in all
  bool epoch_end = false;  // after the epoch's last batch (else eval_every or an early stop)
  double test_loss = 0;
  double test_accuracy = 0;
};

// What a hook sees at the end of each epoch (after its checkpoint and evaluation).
struct EpochEvent {
  int epoch = 0;                       // 0-based
  int64_t step = 0;                    // steps done in all
  std::filesystem::path checkpoint;    // the checkpoint just written (empty: none)
};

// Callbacks of the loop; any may be empty.
struct TrainHooks {
  // Polled after every step, after every evaluation and when a source ends an epoch; a nonzero
  // value (a signal number) interrupts: the loop writes a checkpoint and returns with `signal`.
  std::function<int()> stop;
  // After every step; returning true stops early: the run ends as at --max-steps (it
  // evaluates, unless it just did, and writes the output).
  std::function<bool(const StepEvent&)> on_step;
  // After every evaluation; returning true stops early as on_step does.
  std::function<bool(const EvalEvent&)> on_eval;
  // After each epoch's checkpoint and evaluation; returning true ends the run there.
  std::function<bool(const EpochEvent&)> on_epoch_end;
};

struct TrainResult {
  int64_t steps = 0;                  // steps run, in all (including those before a resume)
  double last_loss = 0;
  std::optional<double> test_loss;    // mean cross-entropy of the last evaluation
  std::optional<double> test_accuracy;
  int signal = 0;                     // the stop hook's value when interrupted, else 0
  bool stopped_early = false;         // a hook asked to stop
  std::filesystem::path checkpoint;   // the last checkpoint written (empty: none)
  // The trained session (the interrupted one when `signal` is set): its state, infer, save.
  std::shared_ptr<TrainingSession> session;
  // The metadata_props entries the output is written with (metadata_props onnxtrain.training
  // with its progress updated: training_metadata.h), also when no output is written; empty
  // when the model has no training metadata. session->model(metadata) is the output in memory.
  std::map<std::string, std::string> metadata;
};

// Runs the loop on `options.data`, printing progress to `log`. `stop` is polled after every
// step (the CLI sets it from SIGINT/SIGTERM): the loop then writes a checkpoint and returns
// with `signal` set.
TrainResult train(const TrainOptions& options, std::ostream& log, const std::atomic<int>* stop = nullptr);

// Runs the loop on batches from `train_data`, evaluating on `eval_data` (may be null) after
// each epoch and every eval_every steps. options.data, batch_size, shuffle and drop_last are
// not used (the sources decide). max_steps and the progress total need source.info().batches
// to be known for a total; otherwise progress shows steps without a total.
TrainResult train(const TrainOptions& options, BatchSource& train_data, BatchSource* eval_data,
                  const TrainHooks& hooks, std::ostream& log);

}  // namespace onnxtrain::training
