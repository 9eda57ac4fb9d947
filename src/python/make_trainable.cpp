// make_trainable's keyword arguments: ONE table, a row per option of `onnxtrain make-trainable`
// (src/cli/app.cpp), named after its flag with '-' replaced by '_', taking the values the flag
// takes. A new field of MakeTrainableOptions is one row: its keyword, a converter for the field
// (field(&Options::x), choice(&Options::x, names), ...) and the CLI's help text.
#include <nanobind/stl/string.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "python/models.h"

namespace onnxtrain::python {

namespace {

using training::MakeTrainableOptions;
using Options = MakeTrainableOptions;

// Stores a Python value (not None) into the options; `name` is the keyword, for errors.
using Setter = std::function<void(Options&, nb::handle value, const std::string& name)>;

struct Row {
  const char* keyword;
  Setter set;
  const char* help;
};

[[noreturn]] void wrong_type(const std::string& name, const char* expected, nb::handle value) {
  throw nb::type_error((name + " must be " + expected + ", got " + nb::cast<std::string>(nb::type_name(value.type()))).c_str());
}

// Python values as the field types of MakeTrainableOptions: a float (or int) for double, an int
// for int64_t, a bool for bool, a str or os.PathLike for std::string, a str or a list of str for
// a list of strings (the CLI's repeatable flags); std::optional<T> as T.
void convert(nb::handle v, double& out, const std::string& name) {
  if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) wrong_type(name, "a number", v);
  out = nb::cast<double>(v);
}
void convert(nb::handle v, int64_t& out, const std::string& name) {
  if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) wrong_type(name, "an int", v);
  out = nb::cast<int64_t>(v);
}
void convert(nb::handle v, bool& out, const std::string& name) {
  if (!PyBool_Check(v.ptr())) wrong_type(name, "a bool", v);
  out = nb::cast<bool>(v);
}
void convert(nb::handle v, std::string& out, const std::string& name) {
  if (nb::isinstance<nb::str>(v)) {
    out = nb::cast<std::string>(v);
  } else if (nb::hasattr(v, "__fspath__")) {
    out = path_arg(v, name.c_str()).string();
  } else {
    wrong_type(name, "a str", v);
  }
}
void convert(nb::handle v, std::vector<std::string>& out, const std::string& name) {
  out.clear();
  if (nb::isinstance<nb::str>(v)) {
    out.push_back(nb::cast<std::string>(v));
    return;
  }
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) wrong_type(name, "a str or a list of str", v);
  for (nb::handle item : v) {
    if (!nb::isinstance<nb::str>(item)) wrong_type(name + " item", "a str", item);
    out.push_back(nb::cast<std::string>(item));
  }
}
template <class T>
void convert(nb::handle v, std::optional<T>& out, const std::string& name) {
  T value{};
  convert(v, value, name);
  out = value;
}

// A field set from its Python value; `check` (optional) validates the converted value as the
// CLI's flag does and returns an error message, or "" when it is fine.
template <class T>
Setter field(T Options::*member, std::function<std::string(const T&)> check = {}) {
  return [member, check](Options& o, nb::handle v, const std::string& name) {
    T value{};
    convert(v, value, name);
    if (check) {
      const std::string error = check(value);
      if (!error.empty()) throw Error(name + ": " + error);
    }
    o.*member = value;
  };
}

std::string positive(const double& x) { return x > 0 ? "" : "must be positive, got " + std::to_string(x); }

// A field set from one of the names the CLI accepts for it.
template <class E>
Setter choice(E Options::*member, std::map<std::string, E> names) {
  return [member, names](Options& o, nb::handle v, const std::string& name) {
    std::string text;
    convert(v, text, name);
    const auto it = names.find(text);
    if (it == names.end()) {
      std::string valid;
      for (const auto& [n, e] : names) valid += (valid.empty() ? "" : ", ") + n;
      throw Error(name + ": '" + text + "' is not one of " + valid);
    }
    o.*member = it->second;
  };
}

// init: keep, xavier, he or normal:STD (Init::Normal with init_std = STD).
void set_init(Options& o, nb::handle v, const std::string& name) {
  using training::Init;
  std::string text;
  convert(v, text, name);
  if (text == "keep" || text == "xavier" || text == "he") {
    o.init = text == "keep" ? Init::Keep : text == "xavier" ? Init::Xavier : Init::He;
    return;
  }
  if (text.rfind("normal:", 0) == 0) {
    size_t used = 0;
    try {
      o.init_std = std::stod(text.substr(7), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used > 0 && used == text.size() - 7) {
      o.init = Init::Normal;
      return;
    }
    throw Error(name + ": normal:STD needs a number, got '" + text + "'");
  }
  throw Error(name + ": expected keep, xavier, he or normal:STD, got '" + text + "'");
}

const std::vector<Row>& table() {
  using training::Loss;
  using training::Optimizer;
  using training::Reduction;
  using training::Schedule;
  static const std::vector<Row> rows = {
      {"loss",
       choice(&Options::loss, {{"cross_entropy", Loss::CrossEntropy}, {"nll", Loss::Nll}, {"mse", Loss::Mse},
                               {"l1", Loss::L1}, {"bce_with_logits", Loss::BceWithLogits}}),
       "cross_entropy (default), nll, mse, l1, bce_with_logits"},
      {"reduction", choice(&Options::reduction, {{"mean", Reduction::Mean}, {"sum", Reduction::Sum}}),
       "mean (default) or sum"},
      {"output_name", field(&Options::output), "the model output the loss reads (default: the only output)"},
      {"label", field(&Options::label), "name of the new label input (default: label)"},
      {"loss_graph", field(&Options::loss_graph),
       "a model (path or onnx.ModelProto) computing a custom scalar loss from model outputs and labels"},
      {"optimizer",
       choice(&Options::optimizer, {{"sgd", Optimizer::Sgd}, {"momentum", Optimizer::Momentum},
                                    {"nesterov", Optimizer::Nesterov}, {"adagrad", Optimizer::Adagrad},
                                    {"adam", Optimizer::Adam}, {"adamw", Optimizer::AdamW}}),
       "sgd (default), momentum, nesterov, adagrad, adam, adamw"},
      {"lr", field<double>(&Options::lr, positive), "learning rate (default 0.01)"},
      {"momentum", field(&Options::momentum), "momentum and nesterov (default 0.9)"},
      {"beta1", field(&Options::beta1), "adam, adamw (default 0.9)"},
      {"beta2", field(&Options::beta2), "adam, adamw (default 0.999)"},
      {"eps", field(&Options::eps), "adam, adamw (default 1e-8), adagrad (default 1e-10)"},
      {"weight_decay", field(&Options::weight_decay), "L2 penalty; decoupled for adamw (default 0)"},
      {"lr_schedule",
       choice(&Options::schedule, {{"constant", Schedule::Constant}, {"step", Schedule::Step},
                                   {"exponential", Schedule::Exponential}, {"cosine", Schedule::Cosine},
                                   {"linear", Schedule::Linear}}),
       "constant (default), step, exponential, cosine, linear"},
      {"warmup_steps", field(&Options::warmup_steps), "linear warm-up over the first N steps"},
      {"total_steps", field(&Options::total_steps), "length of cosine and linear schedules"},
      {"step_size", field(&Options::step_size), "steps between decays of the step schedule"},
      {"gamma", field(&Options::gamma), "decay factor of step and exponential schedules (default 0.1)"},
      {"grad_clip_norm", field(&Options::grad_clip_norm), "clip gradients to this global L2 norm"},
      {"freeze", field(&Options::freeze), "regex or list of regexes of initializers to keep fixed"},
      {"train", field(&Options::train), "regex or list of regexes of the only initializers to train"},
      {"init", set_init, "keep (default), xavier, he, normal:STD: re-draw weights in initialize()"},
      {"replace", field(&Options::replace), "replace an existing training_info (default False)"},
  };
  return rows;
}

}  // namespace

training::MakeTrainableOptions make_trainable_options(const nb::kwargs& kwargs) {
  MakeTrainableOptions options;
  for (auto [key, value] : kwargs) {
    const auto name = nb::cast<std::string>(key);
    const auto& rows = table();
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return name == r.keyword; });
    if (row == rows.end()) {
      std::string valid;
      for (const Row& r : rows) valid += (valid.empty() ? "" : ", ") + std::string(r.keyword);
      throw nb::type_error(("make_trainable() got an unexpected keyword argument '" + name + "'; the options are: " + valid).c_str());
    }
    if (!value.is_none()) row->set(options, value, name);
  }
  return options;
}

nb::list make_trainable_keywords() {
  nb::list result;
  for (const Row& r : table()) result.append(nb::make_tuple(r.keyword, r.help));
  return result;
}

}  // namespace onnxtrain::python
