// InferenceSession (runtime::Session) and TrainingSession (training::TrainingSession), and the
// ValueInfo of their inputs and outputs.
//
// Threads (session.h, training.h): every call releases the GIL. An inference session may run
// from several threads at once, as in C++. A training session is not safe to use from several
// threads at once in C++: each Python TrainingSession holds a mutex that every call takes
// after releasing the GIL, so its calls from several threads run one after the other. Calls on
// different sessions run in parallel while Python code keeps running.
#include "python/sessions.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "onnxtrain/error.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "python/arrays.h"
#include "python/models.h"

namespace onnxtrain::python {

using namespace nb::literals;

namespace {

// A graph input or output as Python sees it.
struct PyValueInfo {
  std::string name;
  nb::object dtype;  // numpy.dtype of a tensor's elements; None for sequences and optionals
  nb::object shape;  // tuple of int | str (dim_param) | None (unknown); None when the rank is unknown
  std::string type;  // "float32[N,784]", "sequence(float32)"
};

nb::list value_infos(const std::vector<runtime::ValueInfo>& infos) {
  nb::list result;
  for (const auto& info : infos) {
    PyValueInfo v{info.name, nb::none(), nb::none(), info.type_string()};
    if (info.type.is_tensor()) {
      v.dtype = numpy_dtype(info.dtype);
      if (info.rank_known) {
        nb::list dims;
        for (size_t i = 0; i < info.dims.size(); ++i) {
          if (info.dims[i] >= 0) {
            dims.append(info.dims[i]);
          } else if (i < info.dim_params.size() && !info.dim_params[i].empty()) {
            dims.append(info.dim_params[i]);
          } else {
            dims.append(nb::none());
          }
        }
        v.shape = nb::tuple(dims);
      }
    }
    result.append(nb::cast(std::move(v)));
  }
  return result;
}

// Runs `f` with the GIL released and the session's mutex held (in that order, so that a thread
// waiting for the mutex never holds the GIL that the running call may need to free an array).
template <class F>
auto locked(std::mutex& mutex, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard lock(mutex);
  return f();
}

// Runs `f` with the GIL released.
template <class F>
auto released(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

// SessionOptions or TrainingOptions: the fields both have.
template <class Options>
Options session_options(std::optional<int> threads, uint64_t seed, bool fuse) {
  if (threads && *threads < 0) throw Error("threads must be >= 0 (0: the OpenMP default), got " + std::to_string(*threads));
  Options options;
  options.threads = threads.value_or(0);
  options.seed = seed;
  options.fuse = fuse;
  return options;
}

// A Session or TrainingSession of `model` (a path, ModelProto or bytes), loaded and planned with
// the GIL released.
template <class S, class Options>
std::unique_ptr<S> make_session(nb::handle model, const Options& options) {
  const ModelArg arg = model_arg(model);
  nb::gil_scoped_release release;
  return arg.path ? std::make_unique<S>(*arg.path, options)
                  : std::make_unique<S>(arg.load(), options, arg.base_dir(), arg.source);
}

struct InferenceSession {
  std::unique_ptr<runtime::Session> session;
  bool tensors_only = true;  // else run() goes through run_values (sequences, optionals)
  std::vector<runtime::ValueInfo> declared;  // inputs and optional inputs
};

void init_inference(InferenceSession* self, nb::handle model, std::optional<int> threads, uint64_t seed, bool fuse) {
  auto session = make_session<runtime::Session>(model, session_options<runtime::SessionOptions>(threads, seed, fuse));
  auto* s = new (self) InferenceSession();
  s->session = std::move(session);
  s->declared = s->session->inputs();
  s->declared.insert(s->declared.end(), s->session->optional_inputs().begin(), s->session->optional_inputs().end());
  const auto is_tensor = [](const runtime::ValueInfo& info) { return info.type.is_tensor(); };
  s->tensors_only = std::all_of(s->declared.begin(), s->declared.end(), is_tensor) &&
                    std::all_of(s->session->outputs().begin(), s->session->outputs().end(), is_tensor);
}

nb::dict run(InferenceSession& self, nb::handle feeds) {
  if (self.tensors_only) {
    const runtime::NamedTensors inputs = feeds_from_dict(feeds);
    runtime::NamedTensors outputs = released([&] { return self.session->run(inputs); });
    return dict_from_tensors(std::move(outputs));
  }
  runtime::NamedValues inputs;
  for (const auto& [name, value] : mapping_items(feeds, "feeds")) {
    const auto it = std::find_if(self.declared.begin(), self.declared.end(), [&](const auto& i) { return i.name == name; });
    const ValueType type = it == self.declared.end() ? ValueType() : it->type;  // an unknown name: Session says so
    inputs[name] = value_from_object(value, type, "feed '" + name + "'");
  }
  runtime::NamedValues outputs = released([&] { return self.session->run_values(inputs); });
  nb::dict result;
  for (auto& [name, value] : outputs) result[name.c_str()] = object_from_value(std::move(value));
  return result;
}

struct TrainingSession {
  std::unique_ptr<training::TrainingSession> session;
  std::mutex mutex;
};

void init_training(TrainingSession* self, nb::handle model, uint64_t seed, std::optional<int> threads, bool nan_guard,
                   bool fuse) {
  auto options = session_options<training::TrainingOptions>(threads, seed, fuse);
  options.nan_guard = nan_guard;
  new (self) TrainingSession{make_session<training::TrainingSession>(model, options), {}};
}

size_t algorithm_index(const TrainingSession& self, size_t i) {
  if (i >= self.session->num_algorithms()) {
    throw nb::index_error(("algorithm " + std::to_string(i) + " out of range: the model has " +
                           std::to_string(self.session->num_algorithms()) + " training_info entries")
                              .c_str());
  }
  return i;
}

nb::dict step(TrainingSession& self, nb::handle feeds, std::optional<size_t> algorithm) {
  if (algorithm) algorithm_index(self, *algorithm);
  const runtime::NamedTensors inputs = feeds_from_dict(feeds);
  runtime::NamedTensors outputs = locked(self.mutex, [&] {
    return algorithm ? self.session->step(*algorithm, inputs) : self.session->step(inputs);
  });
  return dict_from_tensors(std::move(outputs));
}

// set_state(name, value) or set_state({name: value, ...}): every value is converted first, and
// a failure part of the way restores the variables already replaced.
void set_state(TrainingSession& self, nb::handle first, nb::handle value) {
  std::vector<std::pair<std::string, Tensor>> values;
  if (nb::isinstance<nb::str>(first)) {
    if (value.is_none()) throw nb::type_error("set_state(name, value) needs a value");
    const auto name = nb::cast<std::string>(first);
    values.emplace_back(name, owned_tensor_from_array(value, "state '" + name + "'"));
  } else {
    if (!value.is_none()) throw nb::type_error("set_state(mapping) takes no second argument");
    for (const auto& [name, v] : mapping_items(first, "state")) {
      values.emplace_back(name, owned_tensor_from_array(v, "state '" + name + "'"));
    }
  }
  locked(self.mutex, [&] {
    runtime::NamedTensors before;
    try {
      for (const auto& [name, tensor] : values) {
        const auto it = self.session->state().find(name);
        if (it != self.session->state().end()) before.emplace(name, it->second);
        self.session->set_state(name, tensor);
      }
    } catch (...) {
      for (const auto& [name, tensor] : before) self.session->set_state(name, tensor);
      throw;
    }
    return 0;
  });
}

}  // namespace

void bind_sessions(nb::module_& m) {
  nb::class_<PyValueInfo>(m, "ValueInfo",
                          "A graph input or output as the model declares it (ONNX ValueInfoProto).")
      .def_ro("name", &PyValueInfo::name, "The value's name.")
      .def_ro("dtype", &PyValueInfo::dtype,
              "numpy.dtype of a tensor's elements (ml_dtypes' for bfloat16, float8, int4, ...; object for "
              "strings); None for sequences and optionals, and for tensors whose element type the model leaves open.")
      .def_ro("shape", &PyValueInfo::shape,
              "Tuple of dims: an int, the dim_param name (str) of a symbolic dim, or None for an unknown dim; "
              "None when the model gives no shape.")
      .def_ro("type", &PyValueInfo::type, "The type as text: 'float32[N,784]', 'sequence(float32)'.")
      .def("__repr__", [](const PyValueInfo& v) {
        return "ValueInfo(name=" + nb::cast<std::string>(nb::repr(nb::str(v.name.c_str()))) + ", type='" + v.type + "')";
      });

  nb::class_<InferenceSession>(m, "InferenceSession", kInferenceSessionDoc)
      .def("__init__", &init_inference, "model"_a, nb::kw_only(), "threads"_a = nb::none(), "seed"_a = 0,
           "fuse"_a = true)
      .def("run", &run, "feeds"_a, kRunDoc)
      .def_prop_ro("inputs", [](InferenceSession& s) { return value_infos(s.session->inputs()); },
                   "The inputs run() needs (graph inputs without an initializer), as ValueInfo.")
      .def_prop_ro("optional_inputs", [](InferenceSession& s) { return value_infos(s.session->optional_inputs()); },
                   "Graph inputs with an initializer (IR < 4): run() may feed them to override it.")
      .def_prop_ro("outputs", [](InferenceSession& s) { return value_infos(s.session->outputs()); },
                   "The graph outputs run() returns, as ValueInfo.");

  nb::class_<TrainingSession>(m, "TrainingSession", kTrainingSessionDoc)
      .def("__init__", &init_training, "model"_a, nb::kw_only(), "seed"_a = 0, "threads"_a = nb::none(),
           "nan_guard"_a = true, "fuse"_a = true)
      .def(
          "initialize", [](TrainingSession& s) { locked(s.mutex, [&] { s.session->initialize(); return 0; }); },
          kInitializeDoc)
      .def("step", &step, "feeds"_a, "algorithm"_a = nb::none(), kStepDoc)
      .def(
          "infer",
          [](TrainingSession& s, nb::handle feeds) {
            const runtime::NamedTensors inputs = feeds_from_dict(feeds);
            runtime::NamedTensors outputs = locked(s.mutex, [&] { return s.session->infer(inputs); });
            return dict_from_tensors(std::move(outputs));
          },
          "feeds"_a, kInferDoc)
      .def_prop_ro(
          "state",
          [](TrainingSession& s) {
            const runtime::NamedTensors state = locked(s.mutex, [&] { return s.session->state(); });
            nb::dict result;
            for (const auto& [name, tensor] : state) result[name.c_str()] = readonly_array_from_tensor(tensor);
            return result;
          },
          kStateDoc)
      .def("set_state", &set_state, "state"_a, "value"_a = nb::none(), kSetStateDoc)
      .def_prop_rw(
          "steps_done", [](TrainingSession& s) { return locked(s.mutex, [&] { return s.session->steps_done(); }); },
          [](TrainingSession& s, uint64_t n) { locked(s.mutex, [&] { s.session->set_steps_done(n); return 0; }); },
          "Successful steps so far: the run index random ops (Dropout) draw with. Set it to resume a training "
          "loop exactly where it stopped.")
      .def(
          "save",
          [](TrainingSession& s, nb::handle path, std::optional<std::map<std::string, std::string>> metadata) {
            const std::filesystem::path file = path_arg(path, "path");
            locked(s.mutex, [&] { s.session->save(file, metadata.value_or(std::map<std::string, std::string>{})); return 0; });
          },
          "path"_a, "metadata"_a = nb::none(), kSaveDoc)
      .def(
          "model",
          [](TrainingSession& s) {
            const onnx::ModelProto model = locked(s.mutex, [&] { return s.session->model(); });
            return model_to_python(model);
          },
          kModelDoc)
      .def_prop_ro("num_algorithms", [](TrainingSession& s) { return s.session->num_algorithms(); },
                   "Number of TrainingInfoProto entries (training algorithms) in the model.")
      .def(
          "step_inputs",
          [](TrainingSession& s, size_t i) { return value_infos(s.session->step_inputs(algorithm_index(s, i))); },
          "algorithm"_a = 0,
          "The inputs step() feeds to algorithm `algorithm` (those of the inference graph it reads, then the "
          "algorithm's own, e.g. the label), as ValueInfo. IndexError for an algorithm out of range.")
      .def(
          "step_outputs",
          [](TrainingSession& s, size_t i) { return value_infos(s.session->step_outputs(algorithm_index(s, i))); },
          "algorithm"_a = 0,
          "The outputs step() returns for algorithm `algorithm` (the inference graph's, then the algorithm's, "
          "e.g. the loss), as ValueInfo.")
      .def_prop_ro("inference_inputs", [](TrainingSession& s) { return value_infos(s.session->inference_inputs()); },
                   "The inputs infer() needs, as ValueInfo.")
      .def_prop_ro("inference_outputs", [](TrainingSession& s) { return value_infos(s.session->inference_outputs()); },
                   "The outputs infer() returns, as ValueInfo.");
}

}  // namespace onnxtrain::python
