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
void convert(nb::handle v, std::vector<int64_t>& out, const std::string& name) {
  out.clear();
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) wrong_type(name, "a list of int", v);
  for (nb::handle item : v) {
    int64_t x = 0;
    convert(item, x, name + " item");
    out.push_back(x);
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
template <class T, class C>
Setter field(T C::*member, std::function<std::string(const T&)> check = {}) {
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

// A field set from one of the names the CLI accepts for it (training::loss_names(), ...).
template <class E, class C>
Setter choice(E C::*member, const std::map<std::string, E>& (*names)()) {
  return [member, names](Options& o, nb::handle v, const std::string& name) {
    std::string text;
    convert(v, text, name);
    o.*member = training::choice_named(names(), text, name);
  };
}

void set_init(Options& o, nb::handle v, const std::string& name) {
  std::string text;
  convert(v, text, name);
  training::set_init(o, text, name);
}


// A dict, or each dict of a list, as a list of dicts; `name` (the keyword) names it in errors.
std::vector<nb::dict> dicts(nb::handle v, const std::string& name) {
  std::vector<nb::dict> out;
  if (nb::isinstance<nb::dict>(v)) {
    out.push_back(nb::borrow<nb::dict>(v));
    return out;
  }
  if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v)) wrong_type(name, "a dict or a list of dicts", v);
  for (nb::handle item : v) {
    if (!nb::isinstance<nb::dict>(item)) wrong_type(name + " item", "a dict", item);
    out.push_back(nb::borrow<nb::dict>(item));
  }
  return out;
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& key, const std::string& valid) {
  throw Error(name + ": '" + key + "' is not a key (keys: " + valid + ")");
}

// param_group: a dict (or a list of dicts) as torch.optim's param_groups entries: "params"
// (exact initializer names), "patterns" (regexes) and ParamGroup's hyperparameters.
void set_param_groups(Options& o, nb::handle v, const std::string& name) {
  using training::ParamGroup;
  const auto& numbers = training::param_group_numbers();
  std::string valid = "params, patterns, nesterov";
  for (const auto& entry : numbers) valid += ", " + entry.first;
  o.param_groups.clear();
  for (const nb::dict& d : dicts(v, name)) {
    ParamGroup group;
    for (auto [k, value] : d) {
      const std::string key = nb::cast<std::string>(nb::str(k));
      const std::string what = name + "[" + std::to_string(o.param_groups.size()) + "]." + key;
      if (value.is_none()) continue;
      if (key == "params") {
        convert(value, group.params, what);
      } else if (key == "patterns") {
        convert(value, group.patterns, what);
      } else if (key == "nesterov") {
        convert(value, group.nesterov, what);
      } else if (const auto it = numbers.find(key); it != numbers.end()) {
        convert(value, group.*(it->second), what);
      } else {
        unknown_key(name, key, valid);
      }
    }
    o.param_groups.push_back(std::move(group));
  }
}

// scheduler: a dict (or a list of dicts) per scheduler of a sequential schedule: "lr_schedule"
// (its name) and LrScheduler's fields by their keyword names.
void set_schedulers(Options& o, nb::handle v, const std::string& name) {
  using training::LrScheduler;
  const auto& numbers = training::scheduler_numbers();
  const auto& integers = training::scheduler_integers();
  std::string valid = "lr_schedule, milestones";
  for (const auto& entry : numbers) valid += ", " + entry.first;
  for (const auto& entry : integers) valid += ", " + entry.first;
  o.schedulers.clear();
  for (const nb::dict& d : dicts(v, name)) {
    LrScheduler s;
    const std::string where = name + "[" + std::to_string(o.schedulers.size()) + "]";
    if (!d.contains("lr_schedule")) throw Error(where + ": needs 'lr_schedule' (the scheduler's name)");
    for (auto [k, value] : d) {
      const std::string key = nb::cast<std::string>(nb::str(k));
      const std::string what = where + "." + key;
      if (value.is_none()) continue;
      if (key == "lr_schedule") {
        std::string text;
        convert(value, text, what);
        s.schedule = training::choice_named(training::schedule_names(), text, what);
      } else if (key == "milestones") {
        convert(value, s.milestones, what);
      } else if (const auto it = numbers.find(key); it != numbers.end()) {
        convert(value, s.*(it->second), what);
      } else if (const auto jt = integers.find(key); jt != integers.end()) {
        convert(value, s.*(jt->second), what);
      } else {
        unknown_key(name, key, valid);
      }
    }
    o.schedulers.push_back(std::move(s));
  }
}

const std::vector<Row>& table() {
  using training::Loss;
  using training::Optimizer;
  using training::Reduction;
  using training::Schedule;
  static const std::vector<Row> rows = {
      {"loss", choice(&Options::loss, &training::loss_names), "cross_entropy (default), nll, mse, l1, bce_with_logits"},
      {"reduction", choice(&Options::reduction, &training::reduction_names), "mean (default) or sum"},
      {"output_name", field(&Options::output), "the model output the loss reads (default: the only output)"},
      {"label", field(&Options::label), "name of the new label input (default: label)"},
      {"loss_graph", field(&Options::loss_graph),
       "a model (path or onnx.ModelProto) computing a custom scalar loss from model outputs and labels"},
      // The optimizer (torch.optim).
      {"optimizer", choice(&Options::optimizer, &training::optimizer_names),
       "sgd (default), momentum, nesterov, adagrad, adam, adamw"},
      {"lr", field<double, Options>(&Options::lr, positive), "learning rate (default 0.01)"},
      {"momentum", field(&Options::momentum), "momentum and nesterov (default 0.9)"},
      {"dampening", field(&Options::dampening), "sgd, momentum: gradient weight 1 - dampening (default 0)"},
      {"beta1", field(&Options::beta1), "adam, adamw (default 0.9)"},
      {"beta2", field(&Options::beta2), "adam, adamw (default 0.999)"},
      {"eps", field(&Options::eps), "adam, adamw (default 1e-8), adagrad (default 1e-10)"},
      {"weight_decay", field(&Options::weight_decay), "L2 penalty; decoupled for adamw (default 0)"},
      {"lr_decay", field(&Options::lr_decay), "adagrad: lr / (1 + t lr_decay) (default 0)"},
      {"initial_accumulator_value", field(&Options::initial_accumulator_value),
       "adagrad: initial sum of squares (default 0)"},
      {"param_group", set_param_groups,
       "a dict (or list of dicts) per parameter group, as torch.optim's param_groups: 'params' (initializer "
       "names) or 'patterns' (regexes), and lr, weight_decay, momentum, dampening, nesterov, beta1, beta2, eps, "
       "lr_decay, initial_accumulator_value, max_lr, base_momentum, max_momentum"},
      // The schedule (torch.optim.lr_scheduler).
      {"lr_schedule", choice(&Options::schedule, &training::schedule_names),
       "constant (default), step, multistep, exponential, cosine, cosine_annealing, linear, polynomial, onecycle, "
       "sequential"},
      {"step_size", field(&Options::step_size), "step: steps between decays"},
      {"gamma", field(&Options::gamma), "step, multistep, exponential: decay factor (default 0.1)"},
      {"milestones", field(&Options::milestones),
       "multistep: steps of the decays; sequential: steps where the next scheduler starts (list of int)"},
      {"factor", field(&Options::factor), "constant: factor before total_iters (default 1)"},
      {"total_iters", field(&Options::total_iters), "constant, linear, polynomial: steps of the schedule"},
      {"start_factor", field(&Options::start_factor), "linear: factor of step 0 (default 1)"},
      {"end_factor", field(&Options::end_factor), "linear: factor from total_iters on (default 0)"},
      {"power", field(&Options::power), "polynomial: exponent (default 1)"},
      {"t_max", field(&Options::T_max), "cosine_annealing: steps of the half period (PyTorch's T_max)"},
      {"eta_min", field(&Options::eta_min), "cosine, cosine_annealing: lowest learning rate (default 0)"},
      {"total_steps", field(&Options::total_steps),
       "onecycle: steps of the cycle; cosine: steps of the decay; linear: total_iters when that is not given"},
      {"max_lr", field(&Options::max_lr), "onecycle: peak learning rate"},
      {"pct_start", field(&Options::pct_start), "onecycle: fraction of the steps spent rising (default 0.3)"},
      {"anneal_strategy", field(&Options::anneal_strategy), "onecycle: cos (default) or linear"},
      {"div_factor", field(&Options::div_factor), "onecycle: initial lr = max_lr / div_factor (default 25)"},
      {"final_div_factor", field(&Options::final_div_factor),
       "onecycle: final lr = initial lr / final_div_factor (default 1e4)"},
      {"three_phase", field(&Options::three_phase), "onecycle: rise, fall to the initial lr, then to the final lr"},
      {"cycle_momentum", field(&Options::cycle_momentum), "onecycle: cycle SGD's momentum or Adam's beta1 (default True)"},
      {"base_momentum", field(&Options::base_momentum), "onecycle: momentum at the peak lr (default 0.85)"},
      {"max_momentum", field(&Options::max_momentum), "onecycle: momentum at the initial and final lr (default 0.95)"},
      {"scheduler", set_schedulers,
       "sequential: a dict per scheduler, in order: 'lr_schedule' (its name) and its options, e.g. "
       "{'lr_schedule': 'linear', 'start_factor': 0.1, 'total_iters': 5}"},
      {"warmup_steps", field(&Options::warmup_steps), "linear warm-up over the first N steps"},
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
