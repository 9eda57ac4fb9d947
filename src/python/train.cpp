// onnxtrain._core._train: the training loop (include/onnxtrain/trainer.h) on a dataset path or
// on any Python iterable of batches; python/onnxtrain/_train.py is the public wrapper.
//
// The GIL is released while the loop runs; each call back into Python (the next batch, a
// callback, a progress line, the stop poll) takes it again. The stop poll runs Python's signal
// handlers (PyErr_CheckSignals) after every step: an exception they raise (KeyboardInterrupt
// for Ctrl-C) interrupts the loop, which writes its checkpoint and returns; the exception is
// handed back to the wrapper in the result's "interrupt", which raises it. A KeyboardInterrupt
// that arrives while Python code runs for the loop (a DataLoader's __next__, a callback) is
// taken the same way. Any other exception from Python code propagates unchanged.
#include "python/train.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <onnx/onnx_pb.h>

#include <csignal>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <streambuf>

#include "distributed/rank_report.h"
#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"
#include "onnxtrain/trainer.h"
#include "onnxtrain/training.h"
#include "python/arrays.h"
#include "python/models.h"

namespace onnxtrain::python {

using namespace nb::literals;

namespace {

// The interrupt a Python exception turned into, kept until the loop has returned.
class Interrupts {
 public:
  // Runs `f` with the GIL held; a KeyboardInterrupt it raises becomes the pending interrupt
  // (and `f` returns R{}).
  template <class F>
  auto call(F&& f) -> decltype(f()) {
    nb::gil_scoped_acquire gil;
    try {
      return f();
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_KeyboardInterrupt)) throw;
      keep(e);
      return decltype(f())();
    }
  }
  // The loop's stop poll: runs Python's signal handlers; any exception one raises interrupts.
  int poll() {
    if (!interrupted_) {
      nb::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        nb::python_error e;
        keep(e);
      }
    }
    return interrupted_ ? SIGINT : 0;
  }
  bool interrupted() const { return interrupted_; }
  // The exception to raise (None when there is none); call with the GIL held.
  nb::object pending() const { return pending_ ? pending_ : nb::none(); }

 private:
  void keep(nb::python_error& e) {
    interrupted_ = true;
    pending_ = nb::borrow(e.value());
  }
  bool interrupted_ = false;
  nb::object pending_;
};

// Lines the loop prints, written through a Python callable (sys.stderr.write, tqdm.write).
class PythonLog final : public std::streambuf {
 public:
  PythonLog(nb::object write, Interrupts& interrupts) : write_(std::move(write)), interrupts_(interrupts) {}
  int sync() override {
    if (text_.empty()) return 0;
    if (!write_.is_none()) interrupts_.call([&] { write_(nb::str(text_.data(), text_.size())); });
    text_.clear();
    return 0;
  }

 protected:
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) text_.push_back(static_cast<char>(c));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    text_.append(s, static_cast<size_t>(n));
    return n;
  }

 private:
  nb::object write_;
  Interrupts& interrupts_;
  std::string text_;
};

// Batches from a Python iterable: each element a mapping of column name to array, a tuple or
// list of arrays (columns "0", "1", ...), or one array (column "0"). Epoch e iterates anew
// (iter() again), except that the first epoch continues the iterator info() peeked into.
class IterableSource final : public training::BatchSource {
 public:
  IterableSource(nb::object iterable, std::string name, Interrupts& interrupts)
      : iterable_(std::move(iterable)), name_(std::move(name)), interrupts_(interrupts) {}

  training::SourceInfo info() override {
    nb::gil_scoped_acquire gil;
    iterator_ = nb::iter(iterable_);
    nb::object first = advance();
    if (!first.is_valid()) throw Error(name_ + ": yields no batches");
    peeked_ = convert(first, 1);
    fresh_ = true;
    training::SourceInfo info;
    info.name = name_;
    for (const auto& [column, t] : *peeked_) info.columns.push_back(column);
    info.positional = positional_;
    if (nb::hasattr(iterable_, "__len__")) {
      const Py_ssize_t n = PyObject_Length(iterable_.ptr());
      if (n >= 0) info.batches = n;
      else PyErr_Clear();  // an IterableDataset's DataLoader may have no length
    }
    return info;
  }

  void start_epoch(int, int64_t skip) override {
    index_ = 0;
    interrupts_.call([&] {
      if (!fresh_) {
        iterator_ = nb::iter(iterable_);
        peeked_.reset();
      }
      fresh_ = false;
      for (; index_ < skip; ++index_) {  // the batches done before a resumed checkpoint
        if (peeked_) {
          peeked_.reset();
        } else if (!advance().is_valid()) {
          break;
        }
      }
      return 0;
    });
  }

  std::optional<training::Batch> next() override {
    if (interrupts_.interrupted()) return std::nullopt;
    if (peeked_) {
      ++index_;
      std::optional<training::Batch> batch = std::move(peeked_);
      peeked_.reset();
      return batch;
    }
    return interrupts_.call([&]() -> std::optional<training::Batch> {
      nb::object item = advance();
      if (!item.is_valid()) return std::nullopt;
      return convert(item, ++index_);
    });
  }

 private:
  // The iterator's next element, or an invalid object at its end; call with the GIL held.
  nb::object advance() {
    PyObject* item = PyIter_Next(iterator_.ptr());
    if (!item && PyErr_Occurred()) throw nb::python_error();
    return nb::steal(item);
  }

  training::Batch convert(nb::handle item, int64_t index) {
    const std::string where = name_ + ", batch " + std::to_string(index);
    training::Batch batch;
    if (nb::hasattr(item, "keys") && nb::hasattr(item, "items")) {
      positional_ = false;
      for (nb::handle pair : item.attr("items")()) {
        nb::handle key = pair[0];
        if (!nb::isinstance<nb::str>(key)) {
          throw Error(where + ": a batch's column names must be str, got " + nb::cast<std::string>(nb::repr(key)));
        }
        const std::string column = nb::cast<std::string>(key);
        batch[column] = tensor_from_array(pair[1], where + ": column '" + column + "'");
      }
    } else if (nb::isinstance<nb::tuple>(item) || nb::isinstance<nb::list>(item)) {
      positional_ = true;
      size_t i = 0;
      for (nb::handle value : item) {
        const std::string column = std::to_string(i++);
        batch[column] = tensor_from_array(value, where + ": element " + column);
      }
    } else {
      positional_ = true;
      batch["0"] = tensor_from_array(item, where);
    }
    if (batch.empty()) throw Error(where + ": an empty batch");
    return batch;
  }

  nb::object iterable_, iterator_;
  std::string name_;
  Interrupts& interrupts_;
  std::optional<training::Batch> peeked_;
  bool fresh_ = false, positional_ = false;
  int64_t index_ = 0;
};

// TrainOptions from the wrapper's dict (python/onnxtrain/_train.py normalizes every value:
// paths as str, "" for none; map and scale as lists of "NAME=VALUE").
training::TrainOptions options_from(const nb::dict& d) {
  auto text = [&](const char* key) { return nb::cast<std::string>(d[key]); };
  training::TrainOptions o;
  o.output = text("output");
  o.map = nb::cast<std::vector<std::string>>(d["map"]);
  o.scale = nb::cast<std::vector<std::string>>(d["scale"]);
  o.epochs = nb::cast<int>(d["epochs"]);
  o.batch_size = nb::cast<int64_t>(d["batch_size"]);
  o.shuffle = nb::cast<bool>(d["shuffle"]);
  o.seed = nb::cast<uint64_t>(d["seed"]);
  o.drop_last = nb::cast<bool>(d["drop_last"]);
  o.max_steps = nb::cast<int64_t>(d["max_steps"]);
  o.eval_every = nb::cast<int64_t>(d["eval_every"]);
  o.quiet = nb::cast<bool>(d["quiet"]);
  o.metrics = text("metrics");
  o.checkpoint_every = nb::cast<int64_t>(d["checkpoint_every"]);
  o.checkpoint = text("checkpoint");
  o.resume = text("resume");
  o.initialize = nb::cast<bool>(d["initialize"]);
  o.export_inference = text("export_inference");
  o.threads = nb::cast<int>(d["threads"]);
  o.collective_timeout = nb::cast<double>(d["collective_timeout"]);
  o.checksum_every = nb::cast<int64_t>(d["checksum_every"]);
  o.sync_batch_norm = nb::cast<bool>(d["sync_batch_norm"]);
  o.shard_optimizer_state = nb::cast<bool>(d["shard_optimizer_state"]);
  if (o.collective_timeout < 0) throw Error("collective_timeout must be >= 0 (0: forever), got " + std::to_string(o.collective_timeout));
  if (o.checksum_every < 0) throw Error("checksum_every must be >= 0, got " + std::to_string(o.checksum_every));
  o.communicator = distributed::world();  // under mpirun: data-parallel (docs/distributed.md)
  if (o.epochs <= 0) throw Error("epochs must be positive, got " + std::to_string(o.epochs));
  if (o.batch_size <= 0) throw Error("batch_size must be positive, got " + std::to_string(o.batch_size));
  if (o.threads < 0) throw Error("threads must be >= 0 (0: the OpenMP default), got " + std::to_string(o.threads));
  return o;
}

nb::object optional_float(const std::optional<double>& v) { return v ? nb::object(nb::float_(*v)) : nb::none(); }

// Returns true when a callback's result asks to stop (any true value).
bool call_hook(const nb::object& hook, Interrupts& interrupts, const std::function<nb::dict()>& event) {
  if (hook.is_none()) return false;
  return interrupts.call([&] {
    const nb::object answer = hook(event());
    const int stop = PyObject_IsTrue(answer.ptr());
    if (stop < 0) throw nb::python_error();
    return stop == 1;
  });
}

training::TrainHooks hooks_for(const nb::object& on_step, const nb::object& on_eval, const nb::object& on_epoch_end,
                               Interrupts& interrupts) {
  training::TrainHooks hooks;
  hooks.stop = [&interrupts] { return interrupts.poll(); };
  hooks.on_step = [&](const training::StepEvent& e) {
    return call_hook(on_step, interrupts, [&] {
      nb::dict d;
      d["epoch"] = e.epoch;
      d["batch"] = e.batch;
      d["step"] = e.step;
      d["total"] = e.total > 0 ? nb::object(nb::int_(e.total)) : nb::none();
      d["batches"] = e.batches ? nb::object(nb::int_(*e.batches)) : nb::none();
      d["loss"] = e.loss;
      d["lr"] = optional_float(e.lr);
      d["steps_per_s"] = e.steps_per_s;
      return d;
    });
  };
  hooks.on_eval = [&](const training::EvalEvent& e) {
    return call_hook(on_eval, interrupts, [&] {
      nb::dict d;
      d["epoch"] = e.epoch;
      d["step"] = e.step;
      d["epoch_end"] = e.epoch_end;
      d["test_loss"] = e.test_loss;
      d["test_accuracy"] = e.test_accuracy;
      return d;
    });
  };
  hooks.on_epoch_end = [&](const training::EpochEvent& e) {
    return call_hook(on_epoch_end, interrupts, [&] {
      nb::dict d;
      d["epoch"] = e.epoch;
      d["step"] = e.step;
      d["checkpoint"] = e.checkpoint.empty() ? nb::none() : nb::object(nb::str(e.checkpoint.string().c_str()));
      return d;
    });
  };
  return hooks;
}

bool is_path(nb::handle h) { return nb::isinstance<nb::str>(h) || nb::hasattr(h, "__fspath__"); }

bool is_mapping(nb::handle h) {
  return PyDict_Check(h.ptr()) || nb::isinstance(h, nb::module_::import_("collections.abc").attr("Mapping"));
}

// A dataset in memory: a mapping of column name to array, dim 0 indexing the samples.
data::Dataset dataset_from_mapping(nb::handle mapping, const std::string& name) {
  data::Dataset d;
  for (nb::handle pair : mapping.attr("items")()) {
    nb::handle key = pair[0];
    if (!nb::isinstance<nb::str>(key)) throw Error(name + ": column names must be str, got " + nb::cast<std::string>(nb::repr(key)));
    const std::string column = nb::cast<std::string>(key);
    d.columns[column] = tensor_from_array(pair[1], name + ": column '" + column + "'");
  }
  if (d.columns.empty()) throw Error(name + ": no columns");
  const auto& [first, t0] = *d.columns.begin();
  for (const auto& [column, t] : d.columns) {
    if (t.rank() == 0 || t.dim(0) != t0.dim(0) || t0.rank() == 0) {
      throw Error(name + ": column '" + column + "' has " + (t.rank() ? std::to_string(t.dim(0)) : "no") +
                  " samples, but '" + first + "' has " + (t0.rank() ? std::to_string(t0.dim(0)) : "none"));
    }
  }
  if (d.size() == 0) throw Error(name + ": the dataset is empty");
  return d;
}

// The trained session, kept by the result until its model is asked for.
struct Trained {
  std::shared_ptr<training::TrainingSession> session;
  std::map<std::string, std::string> metadata;  // what the run's output is written with
};

// The sources of a dataset path (its splits, loaded without the GIL) or of a dict of arrays.
struct PathSources {
  std::optional<training::DatasetSource> train, test;
};

PathSources path_sources(nb::handle train_data, nb::handle eval_data, const training::TrainOptions& o) {
  PathSources s;
  if (is_mapping(train_data)) s.train.emplace(training::train_split_source(dataset_from_mapping(train_data, "train_data"), "train_data", o, false));
  if (is_mapping(eval_data)) s.test.emplace(training::test_split_source(dataset_from_mapping(eval_data, "eval_data"), "eval_data", o, false));
  std::optional<std::filesystem::path> train_path, eval_path;
  if (is_path(train_data)) train_path = path_arg(train_data, "train_data");
  if (is_path(eval_data)) eval_path = path_arg(eval_data, "eval_data");
  nb::gil_scoped_release release;
  if (train_path) {
    data::Splits splits = data::load_dataset(*train_path);
    const bool idx = splits.format == "idx";
    s.train.emplace(training::train_split_source(std::move(splits.train), train_path->string(), o, idx));
    if (splits.test && eval_data.is_none()) {
      s.test.emplace(training::test_split_source(std::move(*splits.test), train_path->string() + " (test split)", o, idx));
      s.test->optional = true;  // as the CLI: evaluated when the model can be
    }
  }
  if (eval_path) {
    data::Splits splits = data::load_dataset(*eval_path);
    if (!splits.test) throw Error("eval_data " + eval_path->string() + ": the dataset has no test split to evaluate on");
    s.test.emplace(training::test_split_source(std::move(*splits.test), eval_path->string() + " (test split)", o,
                                               splits.format == "idx"));
  }
  return s;
}

nb::dict train(nb::handle model, nb::handle train_data, nb::handle eval_data, const nb::dict& options,
               const nb::object& on_step, const nb::object& on_eval, const nb::object& on_epoch_end, nb::object log) {
  training::TrainOptions o = options_from(options);
  const ModelArg arg = model_arg(model);
  if (arg.path) o.model = *arg.path;
  Interrupts interrupts;
  PathSources paths = path_sources(train_data, eval_data, o);
  std::optional<IterableSource> train_iterable, eval_iterable;
  if (!paths.train) train_iterable.emplace(nb::borrow(train_data), "train_data", interrupts);
  if (!eval_data.is_none() && !paths.test) eval_iterable.emplace(nb::borrow(eval_data), "eval_data", interrupts);
  training::BatchSource& source = paths.train ? static_cast<training::BatchSource&>(*paths.train) : *train_iterable;
  training::BatchSource* eval = paths.test ? static_cast<training::BatchSource*>(&*paths.test)
                                           : eval_iterable ? &*eval_iterable : nullptr;
  const training::TrainHooks hooks = hooks_for(on_step, on_eval, on_epoch_end, interrupts);
  PythonLog log_buffer(std::move(log), interrupts);
  std::ostream log_stream(&log_buffer);
  training::TrainResult r;
  {  // the sources and hooks hold Python objects: they end after this scope, with the GIL held
    nb::gil_scoped_release release;
    if (!arg.path) o.model_proto = std::make_shared<const onnx::ModelProto>(arg.load());
    if (!o.communicator) {
      r = training::train(o, source, eval, hooks, log_stream);
    } else {
      // As the CLI: a rank that fails would leave the others waiting in a collective, so it
      // names itself and ends every rank (the exception cannot reach Python).
      try {
        r = training::train(o, source, eval, hooks, log_stream);
      } catch (const std::exception& e) {
        distributed::print_rank_error(o.communicator->rank(), o.communicator->size(), e.what());
        o.communicator->abort(1);
      }
    }
    log_stream.flush();
  }
  nb::dict d;
  d["steps"] = r.steps;
  d["last_loss"] = r.last_loss;
  d["test_loss"] = optional_float(r.test_loss);
  d["test_accuracy"] = optional_float(r.test_accuracy);
  d["stopped_early"] = r.stopped_early;
  d["checkpoint"] = r.checkpoint.empty() ? nb::none() : nb::object(nb::str(r.checkpoint.string().c_str()));
  d["interrupt"] = r.signal != 0 ? interrupts.pending() : nb::none();
  d["trained"] = nb::cast(Trained{r.session, r.metadata});
  return d;
}

}  // namespace

void bind_train(nb::module_& m) {
  m.def("_world", [] {
    const auto world = distributed::world();
    return world ? nb::object(nb::make_tuple(world->rank(), world->size())) : nb::none();
  }, "(rank, number of ranks) under mpirun, None otherwise (docs/distributed.md).");
  nb::class_<Trained>(m, "_Trained", "The session a training run ended with (onnxtrain.TrainResult keeps it).")
      .def("model", [](const Trained& t) {
        const onnx::ModelProto model = [&] {
          nb::gil_scoped_release release;
          return t.session->model(t.metadata);
        }();
        return model_to_python(model);
      });
  m.def("_train", &train, "model"_a, "train_data"_a, "eval_data"_a.none(), "options"_a, "on_step"_a.none(),
        "on_eval"_a.none(), "on_epoch_end"_a.none(), "log"_a.none(),
        "The training loop; onnxtrain.train (python/onnxtrain/_train.py) documents it and calls it.");
}

}  // namespace onnxtrain::python
