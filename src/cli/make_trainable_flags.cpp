// `onnxtrain make-trainable` flags: one per MakeTrainableOptions field (PyTorch's names with
// dashes), plus --param-group and --scheduler specs of the form HEAD:key=value,key=value.
#include "cli/make_trainable_flags.h"

#include <CLI/CLI.hpp>

#include "onnxtrain/error.h"

#include <map>
#include <type_traits>

namespace onnxtrain::cli {

namespace {

using training::Init;
using training::LrScheduler;
using training::Loss;
using training::Optimizer;
using training::ParamGroup;
using training::Reduction;
using training::Schedule;


// A named choice (training::choice_named) as a flag's validation error.
template <class T>
T pick(const std::map<std::string, T>& choices, const std::string& value, const std::string& flag) {
  try {
    return training::choice_named(choices, value, flag);
  } catch (const Error& e) {
    throw CLI::ValidationError(std::string(e.what()));
  }
}

// "HEAD:key=value,key=value": the head, then each key with its values (a token without '='
// adds a value to the key before it: milestones=3,7). The head is split off at the last ':'
// when it is a regex (which may hold ':'), else at the first.
struct Spec {
  std::string head;
  std::vector<std::pair<std::string, std::vector<std::string>>> pairs;
};

Spec split_spec(const std::string& text, const std::string& flag, const std::string& form, bool regex_head) {
  const size_t colon = regex_head ? text.rfind(':') : text.find(':');
  if (colon == std::string::npos) throw CLI::ValidationError(flag, "'" + text + "' is not of the form " + form);
  Spec spec{text.substr(0, colon), {}};
  const std::string rest = text.substr(colon + 1);
  size_t begin = 0;
  while (begin < rest.size()) {
    size_t end = rest.find(',', begin);
    if (end == std::string::npos) end = rest.size();
    const std::string token = rest.substr(begin, end - begin);
    begin = end + 1;
    const size_t eq = token.find('=');
    if (eq != std::string::npos) {
      spec.pairs.push_back({token.substr(0, eq), {token.substr(eq + 1)}});
    } else if (!spec.pairs.empty() && !token.empty()) {
      spec.pairs.back().second.push_back(token);
    } else {
      throw CLI::ValidationError(flag, "'" + text + "': '" + token + "' is not key=value (form " + form + ")");
    }
  }
  return spec;
}

const std::string& single(const std::pair<std::string, std::vector<std::string>>& pair, const std::string& flag) {
  if (pair.second.size() != 1) throw CLI::ValidationError(flag, pair.first + " takes one value");
  return pair.second[0];
}

// `text` as a double (std::stod) or an int64_t (std::stoll), all of it.
template <class T>
T parsed(const std::string& text, const std::string& flag, const std::string& key) {
  size_t used = 0;
  T v{};
  try {
    if constexpr (std::is_same_v<T, double>) {
      v = std::stod(text, &used);
    } else {
      v = std::stoll(text, &used);
    }
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw CLI::ValidationError(flag, key + "=" + text + (std::is_same_v<T, double> ? " is not a number" : " is not an integer"));
  }
  return v;
}

// Appends the keys of a table of fields to a list for messages.
template <class Map>
void append_keys(std::string& out, const Map& fields) {
  for (const auto& entry : fields) out += (out.empty() ? "" : ", ") + entry.first;
}

// --param-group 'REGEX:lr=0.1,weight_decay=0,nesterov=true'
ParamGroup param_group_of(const std::string& text) {
  const std::string flag = "--param-group";
  const Spec spec = split_spec(text, flag, "REGEX:key=value,...", true);
  ParamGroup group;
  group.patterns.push_back(spec.head);
  const auto& numbers = training::param_group_numbers();
  for (const auto& pair : spec.pairs) {
    const std::string& value = single(pair, flag);
    if (const auto it = numbers.find(pair.first); it != numbers.end()) {
      group.*(it->second) = parsed<double>(value, flag, pair.first);
    } else if (pair.first == "nesterov") {
      if (value != "true" && value != "false" && value != "1" && value != "0") {
        throw CLI::ValidationError(flag, "nesterov=" + value + " is not true or false");
      }
      group.nesterov = value == "true" || value == "1";
    } else {
      std::string keys;
      append_keys(keys, numbers);
      throw CLI::ValidationError(flag, "'" + pair.first + "' is not a parameter group key (keys: " + keys + ", nesterov)");
    }
  }
  return group;
}

// --scheduler 'NAME:key=value,...', a scheduler of a sequential schedule.
LrScheduler scheduler_of(const std::string& text) {
  const std::string flag = "--scheduler";
  const Spec spec = split_spec(text.find(':') == std::string::npos ? text + ":" : text, flag, "NAME:key=value,...", false);
  LrScheduler s;
  s.schedule = pick(training::schedule_names(), spec.head, flag);
  const auto& numbers = training::scheduler_numbers();
  const auto& integers = training::scheduler_integers();
  for (const auto& pair : spec.pairs) {
    if (const auto it = numbers.find(pair.first); it != numbers.end()) {
      s.*(it->second) = parsed<double>(single(pair, flag), flag, pair.first);
    } else if (const auto jt = integers.find(pair.first); jt != integers.end()) {
      s.*(jt->second) = parsed<int64_t>(single(pair, flag), flag, pair.first);
    } else if (pair.first == "milestones") {
      for (const auto& v : pair.second) s.milestones.push_back(parsed<int64_t>(v, flag, pair.first));
    } else {
      std::string keys;
      append_keys(keys, numbers);
      append_keys(keys, integers);
      throw CLI::ValidationError(flag, "'" + pair.first + "' is not a scheduler key (keys: " + keys + ", milestones)");
    }
  }
  return s;
}

}  // namespace

CLI::App* add_make_trainable(CLI::App& app, MakeTrainableFlags& flags) {
  auto& o = flags.args.options;
  auto* make = app.add_subcommand("make-trainable", "Add the standard training program (training_info) to an inference model");
  make->add_option("model", flags.args.model, "the inference .onnx file")->required();
  make->add_option("-o,--output", flags.args.output, "where to write the trainable model")->required();
  make->add_option("--loss", flags.loss, "cross_entropy (default), nll, mse, l1, bce_with_logits");
  make->add_option("--reduction", flags.reduction, "mean (default) or sum");
  make->add_option("--output-name", o.output, "the model output the loss reads (default: the only output)");
  make->add_option("--label", o.label, "name of the new label input (default: label)");
  make->add_option("--loss-graph", o.loss_graph, "a model computing a custom scalar loss from model outputs and labels");
  // The optimizer (torch.optim).
  make->add_option("--optimizer", flags.optimizer, "sgd (default), momentum, nesterov, adagrad, adam, adamw");
  make->add_option("--lr", o.lr, "learning rate (default 0.01)")->check(CLI::PositiveNumber);
  make->add_option("--momentum", o.momentum, "momentum and nesterov (default 0.9)");
  make->add_option("--dampening", o.dampening, "sgd, momentum: gradient weight 1 - dampening (default 0)");
  make->add_option("--beta1", o.beta1, "adam, adamw (default 0.9)");
  make->add_option("--beta2", o.beta2, "adam, adamw (default 0.999)");
  make->add_option("--eps", o.eps, "adam, adamw (default 1e-8), adagrad (default 1e-10)");
  make->add_option("--weight-decay", o.weight_decay, "L2 penalty; decoupled for adamw (default 0)");
  make->add_option("--lr-decay", o.lr_decay, "adagrad: lr / (1 + t lr_decay) (default 0)");
  make->add_option("--initial-accumulator-value", o.initial_accumulator_value, "adagrad: initial sum of squares (default 0)");
  make->add_option("--param-group", flags.param_groups,
                   "REGEX:key=value,... a parameter group (repeatable): the initializers REGEX matches with their own "
                   "lr, weight_decay, momentum, dampening, nesterov, beta1, beta2, eps, lr_decay, "
                   "initial_accumulator_value, max_lr, base_momentum, max_momentum");
  // The schedule (torch.optim.lr_scheduler).
  make->add_option("--lr-schedule", flags.schedule,
                   "constant (default), step, multistep, exponential, cosine, cosine_annealing, linear, polynomial, "
                   "onecycle, sequential");
  make->add_option("--step-size", o.step_size, "step: steps between decays");
  make->add_option("--gamma", o.gamma, "step, multistep, exponential: decay factor (default 0.1)");
  make->add_option("--milestones", o.milestones, "multistep: steps of the decays; sequential: steps where the next "
                                                 "scheduler starts (comma-separated)")
      ->delimiter(',');
  make->add_option("--factor", o.factor, "constant: factor before --total-iters (default 1)");
  make->add_option("--total-iters", o.total_iters, "constant, linear, polynomial: steps of the schedule");
  make->add_option("--start-factor", o.start_factor, "linear: factor of step 0 (default 1)");
  make->add_option("--end-factor", o.end_factor, "linear: factor from --total-iters on (default 0)");
  make->add_option("--power", o.power, "polynomial: exponent (default 1)");
  make->add_option("--t-max", o.T_max, "cosine_annealing: steps of the half period (PyTorch's T_max)");
  make->add_option("--eta-min", o.eta_min, "cosine, cosine_annealing: lowest learning rate (default 0)");
  make->add_option("--total-steps", o.total_steps, "onecycle: steps of the cycle; cosine: steps of the decay; "
                                                   "linear: --total-iters when that is not given");
  make->add_option("--max-lr", o.max_lr, "onecycle: peak learning rate");
  make->add_option("--pct-start", o.pct_start, "onecycle: fraction of the steps spent rising (default 0.3)");
  make->add_option("--anneal-strategy", o.anneal_strategy, "onecycle: cos (default) or linear");
  make->add_option("--div-factor", o.div_factor, "onecycle: initial lr = max_lr / div_factor (default 25)");
  make->add_option("--final-div-factor", o.final_div_factor, "onecycle: final lr = initial lr / final_div_factor (default 1e4)");
  make->add_flag("--three-phase", o.three_phase, "onecycle: rise, fall to the initial lr, then to the final lr");
  make->add_flag("--cycle-momentum,!--no-cycle-momentum", o.cycle_momentum,
                 "onecycle: cycle SGD's momentum or Adam's beta1 (default on)");
  make->add_option("--base-momentum", o.base_momentum, "onecycle: momentum at the peak lr (default 0.85)");
  make->add_option("--max-momentum", o.max_momentum, "onecycle: momentum at the initial and final lr (default 0.95)");
  make->add_option("--scheduler", flags.schedulers,
                   "sequential: NAME:key=value,... one scheduler (repeatable, in order), e.g. "
                   "linear:start_factor=0.1,total_iters=5");
  make->add_option("--warmup-steps", o.warmup_steps, "linear warm-up over the first N steps");
  make->add_option("--grad-clip-norm", o.grad_clip_norm, "clip gradients to this global L2 norm");
  make->add_option("--freeze", o.freeze, "regex of initializers to keep fixed (repeatable)");
  make->add_option("--train", o.train, "regex of the only initializers to train (repeatable)");
  make->add_option("--init", flags.init, "keep (default), xavier, he, normal:STD: re-draw weights in initialize()");
  make->add_flag("--replace", o.replace, "replace an existing training_info");
  return make;
}

void resolve_make_trainable(MakeTrainableFlags& flags) {
  auto& o = flags.args.options;
  o.loss = pick(training::loss_names(), flags.loss, "--loss");
  o.reduction = pick(training::reduction_names(), flags.reduction, "--reduction");
  o.optimizer = pick(training::optimizer_names(), flags.optimizer, "--optimizer");
  o.schedule = pick(training::schedule_names(), flags.schedule, "--lr-schedule");
  // `--lr-schedule linear --total-steps N` (the flag before --total-iters existed).
  if (o.schedule == Schedule::Linear && o.total_iters == 0) o.total_iters = o.total_steps;
  for (const auto& spec : flags.param_groups) o.param_groups.push_back(param_group_of(spec));
  for (const auto& spec : flags.schedulers) o.schedulers.push_back(scheduler_of(spec));
  try {
    training::set_init(o, flags.init, "--init");
  } catch (const Error& e) {
    throw CLI::ValidationError(std::string(e.what()));
  }
}

}  // namespace onnxtrain::cli
