// The training loop (include/onnxtrain/trainer.h).
#include "onnxtrain/trainer.h"

#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/dispatch.h"
#include "onnxtrain/dataset.h"
#include "core/memory.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/training.h"

namespace onnxtrain::training {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::pair<std::string, std::string> split_pair(const std::string& s, const char* option) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(std::string(option) + " '" + s + "': expected NAME=VALUE");
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

double parse_factor(const std::string& text) {
  try {
    const auto slash = text.find('/');
    if (slash == std::string::npos) return std::stod(text);
    return std::stod(text.substr(0, slash)) / std::stod(text.substr(slash + 1));
  } catch (const std::exception&) {
    throw Error("--scale: '" + text + "' is not a number or a fraction like 1/255");
  }
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

// How one step input is fed from a column.
struct Feed {
  runtime::ValueInfo input;
  std::string column;
  double scale = 1.0;
  bool inference = false;  // also an input of the inference graph (fed when evaluating)
};

// The column's rows `batch` converted to the input's type and per-sample shape.
Tensor convert_feed(const Tensor& rows, const Feed& f) {
  const runtime::ValueInfo& in = f.input;
  const DataType to = in.dtype == DataType::Undefined ? rows.dtype() : in.dtype;
  Tensor t = rows;
  if (is_floating(to)) {
    // One pass: each value goes through double, is scaled, and lands in the input's type.
    t = Tensor(to, rows.shape());
    const int64_t count = rows.numel();
    visit_dtype<AllTypes>(rows.dtype(), "column '" + f.column + "'", [&]<class From>() {
      visit_dtype<FloatTypes>(to, "input '" + in.name + "'", [&]<class To>() {
        const From* src = rows.data<From>();
        To* dst = t.data<To>();
        for (int64_t i = 0; i < count; ++i) dst[i] = convert<To>(convert<double>(src[i]) * f.scale);
      });
    });
  } else if (rows.dtype() != to) {
    t = rows.cast(to);
  }
  if (!in.rank_known) return t;
  const int64_t batch = t.dim(0);
  const int64_t per_sample = batch ? t.numel() / batch : 0;
  Shape target;
  int64_t known = 1, unknown = -1;
  for (size_t d = 0; d < in.dims.size(); ++d) {
    int64_t dim = in.dims[d];
    if (d == 0) dim = batch;
    else if (dim < 0) unknown = static_cast<int64_t>(d);
    if (d > 0 && dim >= 0) known *= dim;
    target.push_back(dim < 0 ? 1 : dim);
  }
  if (unknown >= 0 && known > 0) target[static_cast<size_t>(unknown)] = per_sample / known;
  if (target.numel() != t.numel()) {
    throw Error("column '" + f.column + "' has samples of shape " + Shape(std::vector<int64_t>(
                    t.shape().begin() + 1, t.shape().end())).to_string() + ", which do not fit input '" + in.name + "' " +
                in.type_string());
  }
  return t.view(target);
}

void check_finite(const Tensor& t, const std::string& what) {
  if (!is_floating(t.dtype())) return;
  visit_dtype<FloatTypes>(t.dtype(), what, [&]<class T>() {
    const T* p = t.data<T>();
    const int64_t count = t.numel();
    for (int64_t i = 0; i < count; ++i) {
      const auto v = static_cast<compute_t<T>>(p[i]);
      if (!std::isfinite(v)) throw Error(what + " holds " + (std::isnan(v) ? "NaN" : "Inf") + " at element " + std::to_string(i));
    }
  });
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

// Mean cross-entropy and accuracy of class scores [B, C] against integer labels [B].
struct EvalSums {
  double loss = 0;
  int64_t correct = 0, count = 0;
};
void accumulate(EvalSums& sums, const Tensor& logits, const Tensor& labels) {
  const auto scores = logits.cast(DataType::Float64);
  const auto y = labels.to_int64_vector("labels");
  const int64_t b = scores.dim(0), c = scores.numel() / std::max<int64_t>(b, 1);
  const double* s = scores.data<double>();
  for (int64_t i = 0; i < b; ++i) {
    const double* row = s + i * c;
    const int64_t best = std::max_element(row, row + c) - row;
    const double m = row[best];
    double z = 0;
    for (int64_t k = 0; k < c; ++k) z += std::exp(row[k] - m);
    const int64_t label = y[static_cast<size_t>(i)];
    if (label < 0 || label >= c) throw Error("label " + std::to_string(label) + " is out of range for " + std::to_string(c) + " classes");
    sums.loss += -(row[label] - m - std::log(z));
    sums.correct += best == label;
    ++sums.count;
  }
}

}  // namespace

TrainResult train(const TrainOptions& o, std::ostream& log, const std::atomic<int>* stop) {
  if (o.batch_size <= 0) throw Error("--batch-size must be positive");
  if (o.epochs <= 0) throw Error("--epochs must be positive");
  const fs::path checkpoint = !o.checkpoint.empty() ? o.checkpoint : fs::path(o.output).replace_extension(".ckpt.onnx");
  check_writable(o.output, "output");
  check_writable(checkpoint, "checkpoint");
  check_writable(o.export_inference, "--export-inference");
  check_writable(o.metrics, "--metrics");

  const data::Splits data = data::load_dataset(o.data);
  const fs::path model_path = o.resume.empty() ? o.model : o.resume;
  const onnx::ModelProto model = io::load_model(model_path);
  TrainingOptions session_options;
  session_options.threads = o.threads;
  session_options.seed = o.seed;
  TrainingSession session(model, session_options, model_path.parent_path(), model_path.string());
  if (session.num_algorithms() == 0) throw Error(model_path.string() + ": the model has no training_info (see onnxtrain make-trainable)");

  // Loop position.
  int start_epoch = 0;
  int64_t start_batch = 0;
  if (!o.resume.empty()) {
    try {
      start_epoch = std::stoi(metadata(model, "onnxtrain.epoch"));
      start_batch = std::stoll(metadata(model, "onnxtrain.batch"));
      session.set_steps_done(std::stoull(metadata(model, "onnxtrain.steps_done")));
    } catch (const std::exception&) {
      throw Error(o.resume.string() + ": not an onnxtrain checkpoint (metadata_props onnxtrain.epoch/batch/steps_done missing)");
    }
    if (metadata(model, "onnxtrain.seed") != std::to_string(o.seed)) {
      log << "warning: the checkpoint was written with --seed " << metadata(model, "onnxtrain.seed")
          << "; resuming with " << o.seed << " changes the batch order\n";
    }
  } else if (o.initialize) {
    session.initialize();
  }

  // Feeds: which column each step input reads.
  std::map<std::string, std::string> mapping;
  for (const auto& m : o.map) mapping.insert(split_pair(m, "--map"));
  std::map<std::string, double> scales;
  for (const auto& s : o.scale) {
    const auto [column, factor] = split_pair(s, "--scale");
    if (!data.train.columns.contains(column)) throw Error("--scale: no column '" + column + "' in " + o.data.string());
    scales[column] = parse_factor(factor);
  }
  std::vector<Feed> feeds;
  for (const auto& in : session.step_inputs(0)) {
    std::string column;
    if (mapping.contains(in.name)) {
      column = mapping.at(in.name);
      mapping.erase(in.name);
    } else if (data.train.columns.contains(in.name)) {
      column = in.name;
    } else if (data.format == "idx") {
      column = is_floating(in.dtype) || in.dtype == DataType::Undefined ? "image" : "label";
    }
    if (column.empty() || !data.train.columns.contains(column)) {
      std::string have;
      for (const auto& [name, t] : data.train.columns) have += (have.empty() ? "" : ", ") + name;
      throw Error("input '" + in.name + "' " + in.type_string() + " reads no column of " + o.data.string() + " (columns: " +
                  have + "); choose one with --map " + in.name + "=COLUMN");
    }
    if (in.rank_known && !in.dims.empty() && in.dims[0] >= 0 && in.dims[0] != o.batch_size) {
      throw Error("input '" + in.name + "' has a fixed batch dim of " + std::to_string(in.dims[0]) + " but --batch-size is " +
                  std::to_string(o.batch_size));
    }
    const bool inference = std::any_of(session.inference_inputs().begin(), session.inference_inputs().end(),
                                       [&](const auto& v) { return v.name == in.name; });
    feeds.push_back({in, column, scales.contains(column) ? scales.at(column) : 1.0, inference});
  }
  for (const auto& [input, column] : mapping) throw Error("--map " + input + "=" + column + ": the model has no step input '" + input + "'");

  // Outputs reported per step, and what evaluation reads.
  std::string loss_name, lr_name;
  for (const auto& out : session.step_outputs(0)) {
    if (out.name == "onnxtrain.loss") loss_name = out.name;
    if (out.name == "onnxtrain.lr") lr_name = out.name;
  }
  const auto& inference_outputs = session.inference_outputs();
  std::string logits, label_column;
  if (inference_outputs.size() == 1 && is_floating(inference_outputs[0].dtype)) logits = inference_outputs[0].name;
  for (const auto& f : feeds) {
    if (!f.inference && !is_floating(f.input.dtype)) label_column = f.column;
  }

  const int64_t n = data.train.size();
  const int64_t batches_per_epoch = o.drop_last ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
  if (batches_per_epoch == 0) throw Error("--batch-size " + std::to_string(o.batch_size) + " with --drop-last leaves no batch of " + std::to_string(n) + " samples");
  const int64_t total = o.max_steps > 0 ? std::min<int64_t>(o.max_steps, batches_per_epoch * o.epochs)
                                        : batches_per_epoch * o.epochs;

  std::ofstream metrics;
  if (!o.metrics.empty()) {
    metrics.open(o.metrics, std::ios::app);
    if (!metrics) throw Error("--metrics " + o.metrics.string() + ": cannot open");
  }
  const bool tty = !o.quiet && &log == &std::cout && ::isatty(STDOUT_FILENO);
  const int64_t log_every = std::max<int64_t>(1, batches_per_epoch / 10);

  TrainResult result;
  result.steps = static_cast<int64_t>(session.steps_done());
  auto save_checkpoint = [&](int epoch, int64_t next_batch) {
    session.save(checkpoint, {{"onnxtrain.epoch", std::to_string(epoch)},
                              {"onnxtrain.batch", std::to_string(next_batch)},
                              {"onnxtrain.steps_done", std::to_string(session.steps_done())},
                              {"onnxtrain.seed", std::to_string(o.seed)}});
  };
  auto evaluate = [&](int epoch) {
    if (!data.test || logits.empty() || label_column.empty() || !data.test->columns.contains(label_column)) return;
    trim_block_cache();  // the training step's spare blocks: evaluation needs other sizes
    EvalSums sums;
    const int64_t m = data.test->size();
    for (int64_t begin = 0; begin < m; begin += o.batch_size) {
      std::vector<int64_t> idx;
      for (int64_t i = begin; i < std::min(m, begin + o.batch_size); ++i) idx.push_back(i);
      const data::Dataset rows = data.test->rows(idx);
      runtime::NamedTensors in;
      for (const auto& f : feeds) {
        if (f.inference) in[f.input.name] = convert_feed(rows.columns.at(f.column), f);
      }
      accumulate(sums, session.infer(in).at(logits), rows.columns.at(label_column));
    }
    result.test_loss = sums.loss / static_cast<double>(sums.count);
    result.test_accuracy = static_cast<double>(sums.correct) / static_cast<double>(sums.count);
    if (!o.quiet) {
      log << (tty ? "\n" : "") << "eval  epoch " << epoch + 1 << "  step " << session.steps_done() << "  test loss "
          << std::setprecision(4) << *result.test_loss << "  test accuracy " << *result.test_accuracy << std::endl;
    }
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"type", "eval"}, {"step", session.steps_done()}, {"epoch", epoch + 1},
                                {"test_loss", *result.test_loss}, {"test_accuracy", *result.test_accuracy}}
                     .dump()
              << "\n" << std::flush;
    }
  };

  const auto started = Clock::now();
  int64_t steps_this_run = 0;
  double loss_avg = std::nan("");
  for (int epoch = start_epoch; epoch < o.epochs; ++epoch) {
    if (result.steps >= total) break;
    bool stopped_early = false;
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    if (o.shuffle) {
      std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
      std::shuffle(order.begin(), order.end(), rng);
    }
    for (int64_t b = epoch == start_epoch ? start_batch : 0; b < batches_per_epoch; ++b) {
      if (result.steps >= total) {
        stopped_early = true;
        break;
      }
      const int64_t begin = b * o.batch_size, end = std::min(n, begin + o.batch_size);
      const data::Dataset rows = data.train.rows(std::vector<int64_t>(order.begin() + begin, order.begin() + end));
      const std::string where = "epoch " + std::to_string(epoch + 1) + ", batch " + std::to_string(b + 1);
      runtime::NamedTensors in;
      for (const auto& f : feeds) {
        Tensor t = convert_feed(rows.columns.at(f.column), f);
        check_finite(t, where + ": input '" + f.input.name + "'");
        in[f.input.name] = std::move(t);
      }
      runtime::NamedTensors out;
      try {
        out = session.step(in);
      } catch (const Error& e) {
        throw Error(where + ": " + e.what() + " (the last checkpoint, if any, is " + checkpoint.string() + ")");
      }
      ++steps_this_run;
      result.steps = static_cast<int64_t>(session.steps_done());
      result.last_loss = loss_name.empty() ? std::nan("") : scalar_of(out, loss_name);
      loss_avg = std::isnan(loss_avg) ? result.last_loss : 0.95 * loss_avg + 0.05 * result.last_loss;
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      const double rate = static_cast<double>(steps_this_run) / std::max(elapsed, 1e-9);
      const bool logged = result.steps % log_every == 0 || b + 1 == batches_per_epoch;
      if (!o.quiet && (tty || logged)) {
        std::ostringstream line;
        line << "epoch " << epoch + 1 << "/" << o.epochs << "  step " << result.steps << "/" << total << "  loss "
             << std::fixed << std::setprecision(4) << loss_avg << "  " << std::setprecision(1) << rate << " steps/s  ETA "
             << static_cast<int64_t>(static_cast<double>(total - result.steps) / std::max(rate, 1e-9)) << "s";
        log << (tty ? "\r" + line.str() + "   " : line.str() + "\n") << std::flush;
      }
      if (metrics.is_open()) {  // every step: the file is for machines, the console for people
        nlohmann::json record{{"type", "step"}, {"step", result.steps}, {"epoch", epoch + 1}, {"loss", result.last_loss},
                              {"steps_per_s", rate}};
        if (!lr_name.empty()) record["lr"] = scalar_of(out, lr_name);
        metrics << record.dump() << "\n" << std::flush;
      }
      const int64_t next_batch = b + 1;
      const bool epoch_done = next_batch == batches_per_epoch;
      if (stop && stop->load() != 0) {
        epoch_done ? save_checkpoint(epoch + 1, 0) : save_checkpoint(epoch, next_batch);
        result.signal = stop->load();
        if (!o.quiet) log << (tty ? "\n" : "") << "interrupted: checkpoint written to " << checkpoint.string() << std::endl;
        return result;
      }
      if (o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0 && !epoch_done) save_checkpoint(epoch, next_batch);
      if (o.eval_every > 0 && result.steps % o.eval_every == 0 && !epoch_done) evaluate(epoch);
    }
    if (stopped_early) {  // --max-steps ended the run inside this epoch
      evaluate(epoch);
      break;
    }
    save_checkpoint(epoch + 1, 0);
    evaluate(epoch);
  }
  session.save(o.output);
  if (!o.export_inference.empty()) {
    io::save_model(export_inference(io::load_model(o.output)), o.export_inference,
                   {.source_dir = fs::path(o.output).parent_path()});
  }
  if (!o.quiet) {
    log << "trained " << result.steps << " steps in " << std::fixed << std::setprecision(1)
        << std::chrono::duration<double>(Clock::now() - started).count() << " s; wrote " << o.output.string();
    if (!o.export_inference.empty()) log << " and " << o.export_inference.string();
    log << std::endl;
  }
  return result;
}

}  // namespace onnxtrain::training
