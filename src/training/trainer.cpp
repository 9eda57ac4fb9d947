// The training loop (include/onnxtrain/trainer.h).
#include "onnxtrain/trainer.h"

#include <omp.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/cpu_load.h"
#include "core/memory.h"
#include "distributed/rank_report.h"
#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/training.h"
#include "training/trainer_feeds.h"
#include "training/training_metadata.h"

namespace onnxtrain::training {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Rows [begin, end) of every column of `batch` (dim 0 indexes the samples).
Batch slice_rows(const Batch& batch, int64_t begin, int64_t end) {
  Batch rows;
  for (const auto& [name, column] : batch) {
    std::vector<int64_t> dims(column.shape().data(), column.shape().data() + column.shape().size());
    const int64_t n = dims.empty() ? 0 : dims[0];
    if (n < end) throw Error("column '" + name + "' has " + std::to_string(n) + " rows, fewer than the batch's " + std::to_string(end));
    dims[0] = end - begin;
    Tensor part(column.dtype(), Shape(dims));
    const int64_t row = n == 0 ? 0 : column.numel() / n;
    if (column.dtype() == DataType::String) {
      const auto* from = column.data<std::string>() + begin * row;
      std::copy(from, from + part.numel(), part.data<std::string>());
    } else {
      const size_t row_bytes = static_cast<size_t>(row) * dtype_size(column.dtype());
      std::memcpy(part.raw_data(), static_cast<const char*>(column.raw_data()) + begin * row_bytes,
                  static_cast<size_t>(end - begin) * row_bytes);
    }
    rows.emplace(name, std::move(part));
  }
  return rows;
}

// Fails now, before any training, when `path` cannot be written.
void check_writable(const fs::path& path, const char* what) {
  if (path.empty()) return;
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (!fs::is_directory(dir)) throw Error(std::string(what) + " " + path.string() + ": folder " + dir.string() + " does not exist");
  const fs::path probe = dir / (".onnxtrain-write-check-" + std::to_string(::getpid()));
  {
    std::ofstream out(probe);
    if (!out || !(out << "x") || !out.flush()) {
      std::error_code ignored;
      fs::remove(probe, ignored);
      throw Error(std::string(what) + " " + path.string() + ": cannot write to " + dir.string());
    }
  }
  fs::remove(probe);
}

double scalar_of(const runtime::NamedTensors& outputs, const std::string& name) {
  const auto it = outputs.find(name);
  if (it == outputs.end() || it->second.numel() != 1) return std::nan("");
  return it->second.to_double_vector()[0];
}

std::string metadata(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& e : model.metadata_props()) {
    if (e.key() == key) return e.value();
  }
  return {};
}

bool is_position_key(const onnx::StringStringEntryProto& entry) {
  return entry.key() == "onnxtrain.epoch" || entry.key() == "onnxtrain.batch" ||
         entry.key() == "onnxtrain.steps_done" || entry.key() == "onnxtrain.seed";
}

// One run of the loop: the session, the feeds, the position and what is reported.
class Loop {
 public:
  Loop(const TrainOptions& o, BatchSource& train, BatchSource* eval, const TrainHooks& hooks, std::ostream& log,
       bool memory_line)
      : o_(o), train_(train), eval_(eval), hooks_(hooks), log_(log), checkpoint_(checkpoint_path(o)), memory_line_(memory_line) {}
  // The calling thread's OpenMP thread count as it was before the loop chose its own.
  ~Loop() {
    if (followed_) omp_set_num_threads(threads_before_);
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;
  // The loop, then the result's metadata (what the output is written with).
  TrainResult run() {
    TrainResult result = run_loop();
    result.metadata = progress_metadata({});
    return result;
  }

 private:
  TrainResult run_loop();
  enum class End { Epoch, Early };  // the epoch's batches are done; max_steps or a hook ended it
  void load_session();
  void resolve_feeds();
  // Without a thread count from the caller (TrainOptions::threads 0, no OMP_NUM_THREADS) and
  // outside data-parallel training, the loop runs on the count that follows the machine's load
  // (cpu_load::followed_threads, the process's governor that sessions share): start_governor
  // takes the first and logs it when it leaves CPUs to other processes; follow_load, before each
  // step, takes the count as it is then and logs a change. Either sets it in the calling thread,
  // where the session's step runs on it (a count set there holds: cpu_load::session_threads).
  void start_governor();
  void follow_load();
  // Runs the epoch from batch `first`; returns how it ended, or nullopt when interrupted.
  std::optional<End> run_epoch(int epoch, int64_t first);
  void step(const Batch& batch, int epoch, int64_t b);
  // Data-parallel: this rank's rows of `batch` (sets share_).
  Batch share_of(const Batch& batch, const std::string& where);
  void report(const runtime::NamedTensors& out, int epoch, int64_t b);
  // Records an evaluation (unless interrupted); returns false when interrupted.
  bool evaluate(int epoch, bool epoch_end);
  void save_checkpoint(int epoch, int64_t next_batch);
  void interrupt(int epoch, int64_t next_batch);
  void finish();
  // The metadata save() sets: the training metadata's progress (training_metadata.h), when the
  // model has it, plus `extra`.
  std::map<std::string, std::string> progress_metadata(std::map<std::string, std::string> extra) const;
  int poll() {
    if (signal_ == 0 && hooks_.stop) signal_ = hooks_.stop();
    if (o_.communicator) agree();
    return signal_;
  }
  // Data-parallel: every rank stops where any rank got a signal (Ctrl-C reaches the ranks at
  // different moments) or a step hook asked to stop, so no rank is left waiting in a collective.
  void agree();
  // Data-parallel, --checksum-every: fails when this rank's state differs from rank 0's.
  void check_replicas();

  const TrainOptions& o_;
  BatchSource& train_;
  BatchSource* eval_;
  const TrainHooks& hooks_;
  std::ostream& log_;
  const fs::path checkpoint_;
  std::shared_ptr<TrainingSession> session_;
  std::vector<feeding::Feed> feeds_;
  std::string source_name_, eval_name_, loss_name_, lr_name_, logits_, label_column_;
  std::optional<int64_t> batches_;
  int start_epoch_ = 0, epochs_done_ = 0;
  std::string training_metadata_;  // the model's metadata_props onnxtrain.training, or ""
  int64_t batch_size_ = 0;         // of the training source, 0 when it varies
  int64_t start_batch_ = 0, total_ = 0, log_every_ = 1, steps_this_run_ = 0;
  int64_t next_batch_ = 0;  // of the epoch run_epoch ran last
  std::string last_checkpoint_;  // the position last saved
  std::ofstream metrics_;
  bool tty_ = false, early_ = false, evaluated_ = false;
  int signal_ = 0;
  double loss_avg_ = std::nan("");
  double share_ = 0;  // samples of this rank's share of the current batch (data-parallel)
  Clock::time_point started_, last_line_;
  TrainResult result_;
  const bool memory_line_;  // data-parallel: each rank prints distributed::rank_memory_line at the end
  std::optional<cpu_load::Followed> followed_;  // while the loop follows the load
  int threads_before_ = 0;
};

void Loop::start_governor() {
  if (o_.threads > 0 || o_.communicator) return;
  followed_ = cpu_load::followed_threads();
  if (!followed_) return;
  threads_before_ = omp_get_max_threads();
  omp_set_num_threads(followed_->threads);
  if (followed_->threads < cpu_load::usable_cpus() && !o_.quiet) {
    log_ << "threads: " << cpu_load::describe(*followed_) << "; --threads sets the count" << std::endl;
  }
}

void Loop::follow_load() {
  if (!followed_) return;
  const std::optional<cpu_load::Followed> now = cpu_load::followed_threads();
  if (!now || now->threads == followed_->threads) return;
  followed_ = now;
  omp_set_num_threads(now->threads);
  if (!o_.quiet) log_ << (tty_ ? "\n" : "") << "threads: " << cpu_load::describe(*now) << std::endl;
}

void Loop::load_session() {
  const fs::path model_path = o_.resume.empty() ? o_.model : o_.resume;
  const std::string source = model_path.empty() ? "model" : model_path.string();
  onnx::ModelProto model = o_.resume.empty() && o_.model_proto ? *o_.model_proto : io::load_model(model_path);
  // The model moves into the session (no second copy of its tensors); its metadata stays here.
  onnx::ModelProto meta;
  *meta.mutable_metadata_props() = model.metadata_props();
  // A checkpoint's position (onnxtrain.epoch/batch/steps_done/seed) describes that file only:
  // dropped from the model, so the output of a resumed run is the output of an uninterrupted
  // one, byte for byte, and never claims the position it was resumed from (the checkpoints
  // written from here set it again).
  if (!o_.resume.empty()) {
    auto* props = model.mutable_metadata_props();
    props->erase(std::remove_if(props->begin(), props->end(), is_position_key), props->end());
  }
  TrainingOptions session_options;
  session_options.threads = o_.threads;
  session_options.seed = o_.seed;
  if (o_.communicator) {
    session_options.reduce = [this] { return o_.communicator->begin_weighted_mean(share_); };
    if (o_.sync_batch_norm) {
      session_options.sync_batch_norm = [this](std::span<double> d) { o_.communicator->sum(d, "the sums of --sync-batch-norm"); };
    }
  }
  if (o_.shard_optimizer_state) {
    if (!o_.communicator) throw Error("--shard-optimizer-state: needs data-parallel training (run under mpirun)");
    session_options.shard_optimizer_state = o_.communicator;
  }
  session_ = std::make_shared<TrainingSession>(std::move(model), session_options, model_path.parent_path(), source);
  training_metadata_ = metadata_value(meta, kTrainingMetadataKey);
  try {
    if (!training_metadata_.empty()) step_counter_of(training_metadata_);
  } catch (const Error& e) {
    log_ << "warning: " << source << ": " << e.what() << "; the saved models keep it as it is\n";
    training_metadata_.clear();
  }
  if (session_->num_algorithms() == 0) throw Error(source + ": the model has no training_info (see onnxtrain make-trainable)");
  if (!o_.resume.empty()) {
    try {
      start_epoch_ = std::stoi(metadata(meta, "onnxtrain.epoch"));
      start_batch_ = std::stoll(metadata(meta, "onnxtrain.batch"));
      session_->set_steps_done(std::stoull(metadata(meta, "onnxtrain.steps_done")));
    } catch (const std::exception&) {
      throw Error(o_.resume.string() + ": not an onnxtrain checkpoint (metadata_props onnxtrain.epoch/batch/steps_done missing)");
    }
    if (metadata(meta, "onnxtrain.seed") != std::to_string(o_.seed)) {
      log_ << "warning: the checkpoint was written with --seed " << metadata(meta, "onnxtrain.seed")
           << "; resuming with " << o_.seed << " changes the batch order\n";
    }
  } else if (o_.initialize) {
    session_->initialize();
  }
}

// Which column each step input reads, what a step reports, and whether eval_ can be used.
void Loop::resolve_feeds() {
  const SourceInfo info = train_.info();
  source_name_ = info.name;
  batch_size_ = info.batch_size;
  batches_ = info.batches;
  feeds_ = feeding::resolve(*session_, info, o_);
  for (const auto& out : session_->step_outputs(0)) {
    if (out.name == "onnxtrain.loss") loss_name_ = out.name;
    if (out.name == "onnxtrain.lr") lr_name_ = out.name;
  }
  const auto& inference_outputs = session_->inference_outputs();
  if (inference_outputs.size() == 1 && is_floating(inference_outputs[0].dtype)) logits_ = inference_outputs[0].name;
  for (const auto& f : feeds_) {
    if (!f.inference && !is_floating(f.input.dtype)) label_column_ = f.column;
  }
  if (!eval_) return;
  const SourceInfo eval = eval_->info();
  eval_name_ = eval.name;
  std::string why;
  if (logits_.empty()) why = "the inference graph has no single floating output of class scores";
  if (why.empty() && label_column_.empty()) why = "no integer input of the step reads class labels";
  for (const auto& f : feeds_) {
    const std::string& column = f.inference ? f.column : label_column_;
    if (why.empty() && std::find(eval.columns.begin(), eval.columns.end(), column) == eval.columns.end()) {
      why = "no column '" + column + "'";
    }
  }
  if (why.empty()) return;
  if (!eval.optional) throw Error(eval.name + ": cannot evaluate: " + why);
  eval_ = nullptr;
}

TrainResult Loop::run_loop() {
  if (o_.epochs <= 0) throw Error("--epochs must be positive");
  if (o_.checkpoint_every > 0 && checkpoint_.empty()) throw Error("--checkpoint-every needs a checkpoint or output path");
  if (!o_.communicator || o_.communicator->rank() == 0) check_outputs(o_);
  load_session();
  resolve_feeds();
  start_governor();
  if (batches_) total_ = o_.max_steps > 0 ? std::min<int64_t>(o_.max_steps, *batches_ * o_.epochs) : *batches_ * o_.epochs;
  else total_ = std::max<int64_t>(o_.max_steps, 0);
  if (!o_.metrics.empty()) {
    metrics_.open(o_.metrics, std::ios::app);
    if (!metrics_) throw Error("--metrics " + o_.metrics.string() + ": cannot open");
  }
  tty_ = !o_.quiet && &log_ == &std::cout && ::isatty(STDOUT_FILENO);
  log_every_ = batches_ ? std::max<int64_t>(1, *batches_ / 10) : 100;
  result_.steps = static_cast<int64_t>(session_->steps_done());
  result_.session = session_;
  started_ = last_line_ = Clock::now();
  epochs_done_ = start_epoch_;
  for (int epoch = start_epoch_; epoch < o_.epochs; ++epoch) {
    if (total_ > 0 && result_.steps >= total_) break;
    const std::optional<End> end = run_epoch(epoch, epoch == start_epoch_ ? start_batch_ : 0);
    if (!end) return result_;
    if (*end == End::Early) {  // max_steps or a hook ended the run inside this epoch
      if (!evaluated_ && !evaluate(epoch, false)) {
        interrupt(epoch, next_batch_);
        return result_;
      }
      break;
    }
    epochs_done_ = epoch + 1;
    save_checkpoint(epoch + 1, 0);
    if (!evaluate(epoch, true)) {
      interrupt(epoch + 1, 0);
      return result_;
    }
    if (hooks_.on_epoch_end && hooks_.on_epoch_end({epoch, result_.steps, checkpoint_})) {
      early_ = true;
      result_.stopped_early = true;
    }
    if (early_) break;
  }
  finish();
  return result_;
}

std::optional<Loop::End> Loop::run_epoch(int epoch, int64_t first) {
  train_.start_epoch(epoch, first);
  int64_t& b = next_batch_;
  b = first;
  for (;;) {
    if (batches_ && b >= *batches_) break;
    if (total_ > 0 && result_.steps >= total_) return End::Early;
    std::optional<Batch> batch = train_.next();
    if (!batch) {
      if (poll() == 0) break;
      interrupt(epoch, b);
      return std::nullopt;
    }
    evaluated_ = false;
    step(*batch, epoch, b);
    ++b;
    const bool epoch_done = batches_ && b == *batches_;
    if (poll() != 0) {
      epoch_done ? interrupt(epoch + 1, 0) : interrupt(epoch, b);
      return std::nullopt;
    }
    if (early_) return End::Early;
    if (o_.communicator && o_.checksum_every > 0 && result_.steps % o_.checksum_every == 0) check_replicas();
    if (o_.checkpoint_every > 0 && result_.steps % o_.checkpoint_every == 0 && !epoch_done) save_checkpoint(epoch, b);
    if (o_.eval_every > 0 && result_.steps % o_.eval_every == 0 && !epoch_done) {
      if (!evaluate(epoch, false)) {
        interrupt(epoch, b);
        return std::nullopt;
      }
      evaluated_ = true;
      if (early_) return End::Early;
    }
  }
  if (b == 0) throw Error(source_name_ + ": epoch " + std::to_string(epoch + 1) + " has no batches");
  return End::Epoch;
}

void Loop::step(const Batch& batch, int epoch, int64_t b) {
  const std::string where = "epoch " + std::to_string(epoch + 1) + ", batch " + std::to_string(b + 1);
  const runtime::NamedTensors in =
      feeding::inputs(o_.communicator ? share_of(batch, where) : batch, feeds_, where, true);
  runtime::NamedTensors out;
  follow_load();
  try {
    out = session_->step(in);
  } catch (const Error& e) {
    throw Error(where + ": " + e.what() +
                (checkpoint_.empty() ? "" : " (the last checkpoint, if any, is " + checkpoint_.string() + ")"));
  }
  ++steps_this_run_;
  result_.steps = static_cast<int64_t>(session_->steps_done());
  result_.last_loss = loss_name_.empty() ? std::nan("") : scalar_of(out, loss_name_);
  loss_avg_ = std::isnan(loss_avg_) ? result_.last_loss : 0.95 * loss_avg_ + 0.05 * result_.last_loss;
  report(out, epoch, b);
}

// Rank r of N's rows [n*r/N, n*(r+1)/N) of a batch of n rows.
struct RankRows {
  int64_t begin, end, n;
};
RankRows rows_of_rank(const Batch& batch, const distributed::Communicator& communicator) {
  const int64_t rank = communicator.rank(), ranks = communicator.size();
  const Shape& first = batch.empty() ? Shape() : batch.begin()->second.shape();
  const int64_t n = first.size() == 0 ? 0 : first[0];
  return {n * rank / ranks, n * (rank + 1) / ranks, n};
}

Batch Loop::share_of(const Batch& batch, const std::string& where) {
  const RankRows rows = rows_of_rank(batch, *o_.communicator);
  share_ = static_cast<double>(rows.end - rows.begin);
  if (rows.end > rows.begin) return slice_rows(batch, rows.begin, rows.end);
  // A batch of fewer rows than ranks leaves this rank none. It still takes part in the step's
  // collectives: it runs the batch's first row and weighs what it computes 0
  // (Communicator::begin_weighted_mean), so the average is that of the other ranks' rows.
  if (rows.n == 0) throw Error(where + ": the batch has no rows");
  if (o_.sync_batch_norm) {  // its row would count in the global batch statistics
    throw Error(where + ": the batch's rows leave rank " + std::to_string(o_.communicator->rank()) +
                " none, which --sync-batch-norm does not support (use --drop-last or a larger --batch-size)");
  }
  return slice_rows(batch, 0, 1);
}

void Loop::agree() {
  double votes[3] = {signal_ != 0 ? 1.0 : 0.0, static_cast<double>(signal_), early_ ? 1.0 : 0.0};
  o_.communicator->sum(votes, "the agreement on stopping");
  if (signal_ == 0 && votes[0] > 0) signal_ = static_cast<int>(std::lround(votes[1] / votes[0]));
  if (votes[2] > 0 && !early_) {
    early_ = true;
    result_.stopped_early = true;
  }
}

namespace {
// A 64-bit hash of the tensor's bytes (words mixed by a multiply and a shift): equal tensors
// hash equal; a difference anywhere changes the hash but for a 2^-64 chance.
uint64_t hash_bytes(const Tensor& t) {
  const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
  const size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  uint64_t h = 0x243F6A8885A308D3ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = ((h ^ bytes[i]) * 0x9E3779B97F4A7C15ull) ^ (h >> 29);
  return h;
}
}  // namespace

void Loop::check_replicas() {
  // Rank 0's hashes by name, as "NAME\0" + 8 bytes per variable; each rank compares those of
  // the variables it holds too. With --shard-optimizer-state the optimizer state of a
  // parameter is held by its owner alone, so it is not compared; everything else is.
  std::string blob;
  for (const auto& [name, t] : session_->state()) {
    if (t.dtype() == DataType::String) continue;
    const uint64_t h = hash_bytes(t);
    blob += name;
    blob.push_back('\0');
    blob.append(reinterpret_cast<const char*>(&h), sizeof h);
  }
  const std::string what = "the checksum of the state (--checksum-every)";
  uint64_t size = blob.size();
  o_.communicator->broadcast_bytes(&size, sizeof size, 0, what);
  std::string first = o_.communicator->rank() == 0 ? blob : std::string(size, '\0');
  o_.communicator->broadcast_bytes(first.data(), first.size(), 0, what);
  const auto& state = session_->state();
  for (size_t at = 0; at < first.size();) {
    const size_t end = first.find('\0', at);
    if (end == std::string::npos || end + 1 + sizeof(uint64_t) > first.size()) break;
    const std::string name = first.substr(at, end - at);
    uint64_t h;
    std::memcpy(&h, first.data() + end + 1, sizeof h);
    at = end + 1 + sizeof h;
    const auto it = state.find(name);
    if (it != state.end() && hash_bytes(it->second) != h) {
      throw Error("--checksum-every: after step " + std::to_string(result_.steps) + " '" + name + "' on rank " +
                  std::to_string(o_.communicator->rank()) + " differs from rank 0's (the ranks' models have diverged)");
    }
  }
}

// Progress on the console, a metrics record and the on_step hook.
void Loop::report(const runtime::NamedTensors& out, int epoch, int64_t b) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  const double rate = static_cast<double>(steps_this_run_) / std::max(elapsed, 1e-9);
  // Without a known length: every 100 steps, and at least every 5 s.
  const bool logged = result_.steps % log_every_ == 0 || (batches_ && b + 1 == *batches_) ||
                      (!batches_ && std::chrono::duration<double>(Clock::now() - last_line_).count() >= 5);
  if (!o_.quiet && (tty_ || logged)) {
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << o_.epochs << "  step " << result_.steps;
    if (total_ > 0) line << "/" << total_;
    line << "  loss " << std::fixed << std::setprecision(4) << loss_avg_ << "  " << std::setprecision(1) << rate << " steps/s";
    if (total_ > 0) line << "  ETA " << static_cast<int64_t>(static_cast<double>(total_ - result_.steps) / std::max(rate, 1e-9)) << "s";
    log_ << (tty_ ? "\r" + line.str() + "   " : line.str() + "\n") << std::flush;
    last_line_ = Clock::now();
  }
  const std::optional<double> lr = lr_name_.empty() ? std::nullopt : std::optional(scalar_of(out, lr_name_));
  if (metrics_.is_open()) {  // every step: the file is for machines, the console for people
    nlohmann::json record{{"type", "step"}, {"step", result_.steps}, {"epoch", epoch + 1}, {"loss", result_.last_loss},
                          {"steps_per_s", rate}, {"threads", omp_get_max_threads()},
                          {"step_arena_bytes", session_->step_arena_bytes()}};
    if (lr) record["lr"] = *lr;
    if (o_.communicator) {  // this rank's, so far
      record["bytes_reduced"] = o_.communicator->bytes_reduced();
      record["collective_s"] = o_.communicator->seconds_in_collectives();
    }
    metrics_ << record.dump() << "\n" << std::flush;
  }
  if (hooks_.on_step) {
    const StepEvent event{epoch, b, result_.steps, total_, batches_, result_.last_loss, lr, rate, &out};
    if (hooks_.on_step(event)) {
      early_ = true;
      result_.stopped_early = true;
    }
  }
}

bool Loop::evaluate(int epoch, bool epoch_end) {
  if (!eval_) return poll() == 0;
  trim_block_cache();  // the training step's spare blocks: evaluation needs other sizes
  feeding::EvalSums sums;
  eval_->start_epoch(0, 0);
  for (int64_t b = 0;; ++b) {
    std::optional<Batch> batch = eval_->next();
    if (!batch) break;
    if (o_.communicator) {  // sharded: this rank's rows of every evaluation batch
      const RankRows rows = rows_of_rank(*batch, *o_.communicator);
      if (rows.begin == rows.end) continue;
      batch = slice_rows(*batch, rows.begin, rows.end);
    }
    const std::string where = eval_name_ + ", batch " + std::to_string(b + 1);
    const runtime::NamedTensors in = feeding::inputs(*batch, feeds_, where, false, true);
    const auto labels = batch->find(label_column_);
    if (labels == batch->end()) throw Error(where + ": no column '" + label_column_ + "' (the labels)");
    try {
      sums.add(session_->infer(in).at(logits_), labels->second);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  if (o_.communicator) {  // the ranks' sums added up: every rank gets the whole split's figures
    double totals[3] = {sums.loss, static_cast<double>(sums.correct), static_cast<double>(sums.count)};
    o_.communicator->sum(totals, "the sum of the evaluation's results");
    sums.loss = totals[0];
    sums.correct = static_cast<int64_t>(totals[1]);
    sums.count = static_cast<int64_t>(totals[2]);
  }
  if (poll() != 0) return false;
  if (sums.count == 0) throw Error(eval_name_ + ": no evaluation batches");
  result_.test_loss = sums.loss / static_cast<double>(sums.count);
  result_.test_accuracy = static_cast<double>(sums.correct) / static_cast<double>(sums.count);
  if (!o_.quiet) {
    log_ << (tty_ ? "\n" : "") << "eval  epoch " << epoch + 1 << "  step " << session_->steps_done() << "  test loss "
         << std::setprecision(4) << *result_.test_loss << "  test accuracy " << *result_.test_accuracy << std::endl;
  }
  if (metrics_.is_open()) {
    metrics_ << nlohmann::json{{"type", "eval"}, {"step", session_->steps_done()}, {"epoch", epoch + 1},
                               {"test_loss", *result_.test_loss}, {"test_accuracy", *result_.test_accuracy}}
                    .dump()
             << "\n" << std::flush;
  }
  if (hooks_.on_eval) {
    const EvalEvent event{epoch, result_.steps, epoch_end, *result_.test_loss, *result_.test_accuracy};
    if (hooks_.on_eval(event)) {
      early_ = true;
      result_.stopped_early = true;
    }
  }
  return true;
}

void Loop::save_checkpoint(int epoch, int64_t next_batch) {
  const std::string position = std::to_string(epoch) + "/" + std::to_string(next_batch) + "/" + std::to_string(result_.steps);
  if (checkpoint_.empty() || position == last_checkpoint_) return;
  last_checkpoint_ = position;
  if (o_.shard_optimizer_state) session_->consolidate_state(0);  // every rank: a collective
  if (o_.communicator && o_.communicator->rank() != 0) return;   // ZeRO-1 ranks > 0 reach here
  session_->save(checkpoint_, progress_metadata({{"onnxtrain.epoch", std::to_string(epoch)},
                                                 {"onnxtrain.batch", std::to_string(next_batch)},
                                                 {"onnxtrain.steps_done", std::to_string(session_->steps_done())},
                                                 {"onnxtrain.seed", std::to_string(o_.seed)}}));
  session_->drop_consolidated_state();
  result_.checkpoint = checkpoint_;
}

// Writes a checkpoint at (epoch, next_batch) and marks the result interrupted.
void Loop::interrupt(int epoch, int64_t next_batch) {
  save_checkpoint(epoch, next_batch);
  result_.signal = signal_;
  if (!o_.quiet) {
    log_ << (tty_ ? "\n" : "")
         << (checkpoint_.empty() ? "interrupted (no checkpoint or output path: no checkpoint written)"
                                 : "interrupted: checkpoint written to " + checkpoint_.string())
         << std::endl;
  }
}

std::map<std::string, std::string> Loop::progress_metadata(std::map<std::string, std::string> extra) const {
  if (training_metadata_.empty()) return extra;
  TrainingProgress progress;
  progress.epochs_done = epochs_done_;
  // The iteration counter holds the optimizer steps done, also those before an import.
  const std::string counter = step_counter_of(training_metadata_);
  const auto& state = session_->state();
  const auto it = state.find(counter);
  if (it != state.end() && it->second.dtype() == DataType::Int64 && it->second.numel() == 1) {
    progress.global_step = it->second.data<int64_t>()[0];
  }
  if (batch_size_ > 0) progress.batch_size = batch_size_;
  progress.seed = o_.seed;
  progress.data = source_name_;
  progress.updated_by = "train";
  extra[kTrainingMetadataKey] = with_progress(training_metadata_, progress);
  return extra;
}

void Loop::finish() {
  if (o_.communicator && memory_line_) {  // before consolidate_state gathers the optimizer state on rank 0
    const int rank = o_.communicator->rank(), ranks = o_.communicator->size();
    log_ << distributed::rank_memory_line(rank, ranks, session_->state(), o_.shard_optimizer_state && ranks > 1) << std::endl;
  }
  if (!o_.output.empty() && o_.shard_optimizer_state) session_->consolidate_state(0);  // every rank
  if (o_.communicator && o_.communicator->rank() != 0) return;  // ZeRO-1 ranks > 0 reach here
  if (!o_.output.empty()) session_->save(o_.output, progress_metadata({}));
  if (!o_.export_inference.empty()) {
    // The session's current model (external data read in), without its training_info.
    io::save_model(export_inference(session_->model(progress_metadata({}))), o_.export_inference);
  }
  if (!o_.quiet) {
    if (!o_.communicator) log_ << distributed::memory_line(session_->state(), session_->step_arena_bytes()) << "\n";
    log_ << "trained " << result_.steps << " steps in " << std::fixed << std::setprecision(1)
         << std::chrono::duration<double>(Clock::now() - started_).count() << " s";
    if (!o_.output.empty()) log_ << "; wrote " << o_.output.string();
    if (!o_.export_inference.empty()) log_ << (o_.output.empty() ? "; wrote " : " and ") << o_.export_inference.string();
    log_ << std::endl;
  }
}

}  // namespace

fs::path checkpoint_path(const TrainOptions& options) {
  if (!options.checkpoint.empty()) return options.checkpoint;
  if (options.output.empty()) return {};
  return fs::path(options.output).replace_extension(".ckpt.onnx");
}

void check_outputs(const TrainOptions& options) {
  check_writable(options.output, "output");
  check_writable(checkpoint_path(options), "checkpoint");
  check_writable(options.export_inference, "--export-inference");
  check_writable(options.metrics, "--metrics");
}

TrainResult train(const TrainOptions& options, BatchSource& train_data, BatchSource* eval_data, const TrainHooks& hooks,
                  std::ostream& log) {
  if (options.communicator) options.communicator->set_timeout(options.collective_timeout);
  const bool memory_line = !options.quiet;
  if (!options.communicator || options.communicator->rank() == 0) {
    return Loop(options, train_data, eval_data, hooks, log, memory_line).run();
  }
  // Data-parallel, ranks other than 0: the same steps and their share of each evaluation,
  // without output or files.
  TrainOptions quiet = options;
  quiet.quiet = true;
  if (!options.shard_optimizer_state) {  // ZeRO-1: the same saves, to gather the state on rank 0
    quiet.output.clear();
    quiet.checkpoint.clear();
    quiet.checkpoint_every = 0;
  }
  quiet.metrics.clear();
  quiet.export_inference.clear();
  return Loop(quiet, train_data, eval_data, hooks, log, memory_line).run();
}

}  // namespace onnxtrain::training
