// The training metadata schema (training_metadata.h, docs/training-info-extensions.md).
#include "training/training_metadata.h"

#include <onnx/onnx_pb.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "onnxtrain/error.h"

#ifndef ONNXTRAIN_VERSION
#define ONNXTRAIN_VERSION "unknown"
#endif
#ifndef ONNXTRAIN_ONNX_VERSION
#define ONNXTRAIN_ONNX_VERSION "unknown"
#endif

namespace onnxtrain::training {

using nlohmann::json;

namespace {

json parse_schema(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw Error(std::string("metadata_props ") + kTrainingMetadataKey + " is not a JSON object");
  }
  const auto version = j.find("schema_version");
  if (version == j.end() || !version->is_number_integer() || version->get<int>() != kTrainingMetadataVersion) {
    throw Error(std::string("metadata_props ") + kTrainingMetadataKey + ": schema_version must be " +
                std::to_string(kTrainingMetadataVersion));
  }
  return j;
}

// PyTorch's optimizer class.
const char* torch_optimizer(Optimizer o) {
  switch (o) {
    case Optimizer::Adagrad: return "Adagrad";
    case Optimizer::Adam: return "Adam";
    case Optimizer::AdamW: return "AdamW";
    default: return "SGD";
  }
}

// PyTorch's key in optimizer.state[param] for a state kind of make_trainable_optimizer.cpp.
const char* torch_state_key(const std::string& kind) {
  if (kind == "momentum") return "momentum_buffer";
  if (kind == "adagrad_sum") return "sum";
  if (kind == "adam_m") return "exp_avg";
  if (kind == "adam_v") return "exp_avg_sq";
  return "";
}

const char* torch_loss(Loss l) {
  switch (l) {
    case Loss::CrossEntropy: return "CrossEntropyLoss";
    case Loss::Nll: return "NLLLoss";
    case Loss::Mse: return "MSELoss";
    case Loss::L1: return "L1Loss";
    default: return "BCEWithLogitsLoss";
  }
}

template <class T>
std::string name_of(const std::map<std::string, T>& names, T value) {
  for (const auto& [name, v] : names) {
    if (v == value) return name;
  }
  return "";
}

// The scheduler as torch.optim.lr_scheduler names it and its arguments; null for none.
json scheduler_json(const LrScheduler& s) {
  switch (s.schedule) {
    case Schedule::Constant:
      if (s.factor == 1.0) return nullptr;
      return {{"type", "ConstantLR"}, {"factor", s.factor}, {"total_iters", s.total_iters}};
    case Schedule::Step: return {{"type", "StepLR"}, {"step_size", s.step_size}, {"gamma", s.gamma}};
    case Schedule::MultiStep: return {{"type", "MultiStepLR"}, {"milestones", s.milestones}, {"gamma", s.gamma}};
    case Schedule::Exponential: return {{"type", "ExponentialLR"}, {"gamma", s.gamma}};
    case Schedule::Cosine:
      // CosineAnnealingLR(T_max=total_steps) held at eta_min after T_max: no PyTorch class.
      return {{"type", "onnxtrain.cosine"}, {"T_max", s.total_steps}, {"eta_min", s.eta_min}};
    case Schedule::CosineAnnealing: return {{"type", "CosineAnnealingLR"}, {"T_max", s.T_max}, {"eta_min", s.eta_min}};
    case Schedule::Linear:
      return {{"type", "LinearLR"}, {"start_factor", s.start_factor}, {"end_factor", s.end_factor}, {"total_iters", s.total_iters}};
    case Schedule::Polynomial: return {{"type", "PolynomialLR"}, {"total_iters", s.total_iters}, {"power", s.power}};
    case Schedule::OneCycle: {
      json j{{"type", "OneCycleLR"},         {"total_steps", s.total_steps},         {"pct_start", s.pct_start},
             {"anneal_strategy", s.anneal_strategy}, {"div_factor", s.div_factor}, {"final_div_factor", s.final_div_factor},
             {"three_phase", s.three_phase},   {"cycle_momentum", s.cycle_momentum}, {"base_momentum", s.base_momentum},
             {"max_momentum", s.max_momentum}};
      if (s.max_lr) j["max_lr"] = *s.max_lr;
      return j;
    }
    case Schedule::Sequential: {
      json list = json::array();
      for (const auto& inner : s.schedulers) list.push_back(scheduler_json(inner));
      return {{"type", "SequentialLR"}, {"milestones", s.milestones}, {"schedulers", list}};
    }
  }
  return nullptr;
}

// A group's hyperparameters under PyTorch's param_groups keys.
json group_json(const detail::Group& g, Optimizer o, const LrScheduler& s) {
  json j{{"lr", g.lr}, {"weight_decay", g.weight_decay}};
  if (o == Optimizer::Adam || o == Optimizer::AdamW) {
    j["betas"] = {g.beta1, g.beta2};
    j["eps"] = g.eps;
  } else if (o == Optimizer::Adagrad) {
    j["lr_decay"] = g.lr_decay;
    j["initial_accumulator_value"] = g.initial_accumulator_value;
    j["eps"] = g.eps;
  } else {
    j["momentum"] = g.momentum;
    j["dampening"] = g.dampening;
    j["nesterov"] = g.nesterov;
  }
  if (s.schedule == Schedule::OneCycle) {
    if (g.max_lr) j["max_lr"] = *g.max_lr;
    j["base_momentum"] = g.base_momentum;
    j["max_momentum"] = g.max_momentum;
  }
  return j;
}

// The group's parameter names in PyTorch's order: a param_groups entry's exact names as given,
// then its pattern matches (and the group of parameters in no group) in graph order.
std::vector<std::string> group_params(const detail::Group& g, const MakeTrainableOptions& o,
                                      const std::vector<detail::Param>& params) {
  std::vector<std::string> members;
  for (size_t i : g.members) members.push_back(params[i].name);
  const std::string head = "param_groups.";
  if (g.prefix.rfind(head, 0) != 0) return members;
  const size_t k = std::stoul(g.prefix.substr(head.size()));
  if (k >= o.param_groups.size()) return members;
  std::vector<std::string> ordered;
  std::set<std::string> placed;
  const std::set<std::string> in_group(members.begin(), members.end());
  for (const auto& name : o.param_groups[k].params) {
    if (in_group.contains(name) && placed.insert(name).second) ordered.push_back(name);
  }
  for (const auto& name : members) {
    if (placed.insert(name).second) ordered.push_back(name);
  }
  return ordered;
}

std::string number(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

std::string metadata_value(const onnx::ModelProto& model, const std::string& key) {
  for (const auto& e : model.metadata_props()) {
    if (e.key() == key) return e.value();
  }
  return {};
}

void set_metadata_value(onnx::ModelProto& model, const std::string& key, const std::string& value) {
  for (auto& e : *model.mutable_metadata_props()) {
    if (e.key() == key) {
      e.set_value(value);
      return;
    }
  }
  auto* e = model.add_metadata_props();
  e->set_key(key);
  e->set_value(value);
}

std::string with_progress(const std::string& text, const TrainingProgress& p) {
  json j = parse_schema(text);
  json& progress = j["progress"];
  if (!progress.is_object()) progress = json::object();
  if (p.epochs_done) progress["epochs_done"] = *p.epochs_done;
  if (p.global_step) progress["global_step"] = *p.global_step;
  if (p.batch_size) progress["batch_size"] = *p.batch_size;
  if (p.seed) progress["seed"] = *p.seed;
  if (p.data) progress["data"] = *p.data;
  if (!p.updated_by.empty()) {
    json& history = j["history"];
    if (!history.is_array()) history = json::array();
    // One entry per writer in a row: a training run's checkpoints do not pile up.
    if (history.empty() || history.back().value("by", "") != p.updated_by) {
      history.push_back({{"by", p.updated_by}, {"producer", "onnxtrain " ONNXTRAIN_VERSION}});
    }
  }
  return j.dump();
}

std::string step_counter_of(const std::string& text) {
  const json j = parse_schema(text);
  const auto it = j.find("step_counter");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

std::vector<std::string> training_metadata_summary(const std::string& text) {
  json j;
  try {
    j = parse_schema(text);
  } catch (const Error& e) {
    return {std::string("invalid: ") + e.what()};
  }
  std::vector<std::string> lines;
  const json& opt = j.value("optimizer", json::object());
  lines.push_back("optimizer: " + number(opt.value("type", json())) + " (torch.optim), " +
                  std::to_string(j.value("param_groups", json::array()).size()) + " param_groups");
  size_t k = 0;
  for (const auto& g : j.value("param_groups", json::array())) {
    std::string line = "  param_groups[" + std::to_string(k++) + "]:";
    for (const auto& [key, value] : g.items()) {
      if (key != "params") line += " " + key + "=" + number(value);
    }
    line += "; " + std::to_string(g.value("params", json::array()).size()) + " params";
    lines.push_back(line);
  }
  const json& sched = j.value("lr_scheduler", json());
  std::string s = "lr_scheduler: ";
  if (sched.is_object()) {
    s += number(sched.value("type", json()));
    for (const auto& [key, value] : sched.items()) {
      if (key != "type") s += " " + key + "=" + number(value);
    }
  } else {
    s += "none";
  }
  lines.push_back(s);
  const json& loss = j.value("loss", json::object());
  lines.push_back("loss: " + number(loss.value("type", json())) + " (reduction " + number(loss.value("reduction", json())) +
                  ") of output " + number(loss.value("output", json())) + ", label " + number(loss.value("label", json())));
  lines.push_back("step counter: " + number(j.value("step_counter", json())));
  const json& p = j.value("progress", json::object());
  lines.push_back("progress: epochs_done " + number(p.value("epochs_done", json())) + ", global_step " +
                  number(p.value("global_step", json())) + ", batch_size " + number(p.value("batch_size", json())) +
                  ", seed " + number(p.value("seed", json())) + ", data " + number(p.value("data", json())));
  std::string history;
  for (const auto& h : j.value("history", json::array())) history += (history.empty() ? "" : ", ") + number(h.value("by", json()));
  lines.push_back("written by: " + (history.empty() ? std::string("-") : history) + " (schema_version " +
                  std::to_string(kTrainingMetadataVersion) + ")");
  return lines;
}

namespace detail {

std::string training_metadata_json(const MakeTrainableOptions& o, const std::vector<Param>& params,
                                   const std::vector<Group>& groups, const std::vector<State>& states,
                                   const std::string& counter, const std::string& output, const std::string& label) {
  json j;
  j["schema_version"] = kTrainingMetadataVersion;
  j["producer"] = {{"name", "onnxtrain"}, {"version", ONNXTRAIN_VERSION}, {"onnx", ONNXTRAIN_ONNX_VERSION}};
  j["optimizer"] = {{"type", torch_optimizer(o.optimizer)}, {"onnxtrain", name_of(optimizer_names(), o.optimizer)}};
  json list = json::array();
  for (const auto& g : groups) {
    json entry = group_json(g, o.optimizer, o);
    entry["params"] = group_params(g, o, params);
    list.push_back(entry);
  }
  j["param_groups"] = list;
  json state = json::object();
  for (const auto& s : states) state[s.param->name][torch_state_key(s.kind)] = s.name;
  j["state"] = state;
  j["step_counter"] = counter;
  j["lr_scheduler"] = scheduler_json(o);
  j["warmup_steps"] = o.warmup_steps;
  j["grad_clip_norm"] = o.grad_clip_norm ? json(*o.grad_clip_norm) : json();
  if (o.loss_graph.empty()) {
    j["loss"] = {{"type", torch_loss(o.loss)}, {"onnxtrain", name_of(loss_names(), o.loss)},
                 {"reduction", name_of(reduction_names(), o.reduction)}, {"output", output}, {"label", label}};
  } else {
    j["loss"] = {{"type", "graph"}, {"graph", o.loss_graph}, {"output", output}, {"label", label}};
  }
  j["progress"] = {{"epochs_done", 0}, {"global_step", 0}, {"batch_size", nullptr}, {"seed", nullptr}, {"data", nullptr}};
  j["history"] = json::array({{{"by", "make-trainable"}, {"producer", "onnxtrain " ONNXTRAIN_VERSION}}});
  return j.dump();
}

}  // namespace detail

}  // namespace onnxtrain::training
