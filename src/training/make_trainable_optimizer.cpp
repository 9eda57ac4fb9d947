// make_trainable's parameter groups and optimizer updates: torch.optim.SGD, Adagrad, Adam and
// AdamW as ai.onnx.preview.training ops where their float attributes are exact, else as plain
// ONNX ops that follow PyTorch's single-tensor formulas (torch/optim/sgd.py, adagrad.py,
// adam.py of PyTorch 2.13; the formulas are quoted above each writer).
#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "autodiff/builder.h"
#include "autodiff/gradient.h"
#include "onnxtrain/error.h"
#include "training/make_trainable_internal.h"

namespace onnxtrain::training::detail {

Family family_of(Optimizer o) {
  switch (o) {
    case Optimizer::Sgd:
    case Optimizer::Momentum:
    case Optimizer::Nesterov:
      return Family::Sgd;
    case Optimizer::Adagrad:
      return Family::Adagrad;
    case Optimizer::Adam:
    case Optimizer::AdamW:
      break;
  }
  return Family::Adam;
}

namespace {

const char* torch_name(Family f) {
  return f == Family::Sgd ? "torch.optim.SGD" : f == Family::Adagrad ? "torch.optim.Adagrad" : "torch.optim.Adam";
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The hyperparameters a group sets that neither its optimizer nor its schedule reads.
void reject_unread(const ParamGroup& pg, const MakeTrainableOptions& o, const std::string& label) {
  const Family f = family_of(o.optimizer);
  auto unread = [&](bool set, const char* key, const std::string& reader) {
    if (set) throw Error(label + " sets " + key + ", which only " + reader + " reads");
  };
  const std::string sgd = "--optimizer sgd, momentum or nesterov", adam = "--optimizer adam or adamw";
  unread(f != Family::Sgd && pg.momentum.has_value(), "momentum", sgd);
  unread(f != Family::Sgd && pg.dampening.has_value(), "dampening", sgd);
  unread(f != Family::Sgd && pg.nesterov.has_value(), "nesterov", sgd);
  unread(f != Family::Adam && pg.beta1.has_value(), "beta1", adam);
  unread(f != Family::Adam && pg.beta2.has_value(), "beta2", adam);
  unread(f == Family::Sgd && pg.eps.has_value(), "eps", "--optimizer adagrad, adam or adamw");
  unread(f != Family::Adagrad && pg.lr_decay.has_value(), "lr_decay", "--optimizer adagrad");
  unread(f != Family::Adagrad && pg.initial_accumulator_value.has_value(), "initial_accumulator_value",
         "--optimizer adagrad");
  const bool one_cycle = o.schedule == Schedule::OneCycle;
  unread(!one_cycle && pg.max_lr.has_value(), "max_lr", "--lr-schedule onecycle");
  unread(!one_cycle && pg.base_momentum.has_value(), "base_momentum", "--lr-schedule onecycle");
  unread(!one_cycle && pg.max_momentum.has_value(), "max_momentum", "--lr-schedule onecycle");
}

// PyTorch's constructor checks (ValueError in torch.optim) on the resolved values.
void check_ranges(const Group& g, Family f) {
  auto need = [&](bool ok, const char* key, double v, const char* range) {
    if (!ok || !std::isfinite(v)) {
      throw Error(g.label + ": " + key + " = " + number(v) + " is out of range: " + torch_name(f) + " needs " + key +
                  " " + range);
    }
  };
  need(g.lr >= 0, "lr", g.lr, ">= 0");
  need(g.weight_decay >= 0, "weight_decay", g.weight_decay, ">= 0");
  if (f == Family::Sgd) {
    need(g.momentum >= 0, "momentum", g.momentum, ">= 0");
    need(true, "dampening", g.dampening, "finite");
    if (g.nesterov && (g.momentum <= 0 || g.dampening != 0)) {
      throw Error(g.label + ": nesterov needs momentum > 0 and dampening 0 (torch.optim.SGD), got momentum " +
                  number(g.momentum) + " and dampening " + number(g.dampening));
    }
  } else {
    need(g.eps >= 0, "eps", g.eps, ">= 0");
  }
  if (f == Family::Adam) {
    need(g.beta1 >= 0 && g.beta1 < 1, "beta1", g.beta1, "in [0, 1)");
    need(g.beta2 >= 0 && g.beta2 < 1, "beta2", g.beta2, "in [0, 1)");
  }
  if (f == Family::Adagrad) {
    need(g.lr_decay >= 0, "lr_decay", g.lr_decay, ">= 0");
    need(g.initial_accumulator_value >= 0, "initial_accumulator_value", g.initial_accumulator_value, ">= 0");
  }
}

Group resolve(const ParamGroup& pg, const MakeTrainableOptions& o, std::string label, std::string prefix) {
  const Family f = family_of(o.optimizer);
  Group g;
  g.label = std::move(label);
  g.prefix = std::move(prefix);
  g.lr = pg.lr.value_or(o.lr);
  g.weight_decay = pg.weight_decay.value_or(o.weight_decay);
  g.momentum = pg.momentum.value_or(o.optimizer == Optimizer::Sgd ? 0.0 : o.momentum);
  g.dampening = pg.dampening.value_or(o.dampening);
  g.nesterov = pg.nesterov.value_or(o.optimizer == Optimizer::Nesterov);
  g.beta1 = pg.beta1.value_or(o.beta1);
  g.beta2 = pg.beta2.value_or(o.beta2);
  g.eps = pg.eps.value_or(o.eps.value_or(f == Family::Adagrad ? 1e-10 : 1e-8));
  g.lr_decay = pg.lr_decay.value_or(o.lr_decay);
  g.initial_accumulator_value = pg.initial_accumulator_value.value_or(o.initial_accumulator_value);
  g.max_lr = pg.max_lr ? pg.max_lr : o.max_lr;
  g.base_momentum = pg.base_momentum.value_or(o.base_momentum);
  g.max_momentum = pg.max_momentum.value_or(o.max_momentum);
  check_ranges(g, f);
  return g;
}

}  // namespace

std::vector<Group> resolve_groups(const MakeTrainableOptions& o, const std::vector<Param>& trainable,
                                  const std::vector<Param>& candidates, const std::string& source) {
  std::map<std::string, size_t> owner;  // candidate name -> group
  auto assign = [&](const std::string& name, size_t k) {
    const auto [it, fresh] = owner.emplace(name, k);
    if (!fresh && it->second != k) {
      throw Error(source + ": '" + name + "' is in param_groups[" + std::to_string(it->second) + "] and param_groups[" +
                  std::to_string(k) + "]; a parameter belongs to one group");
    }
  };
  std::vector<Group> groups;
  for (size_t k = 0; k < o.param_groups.size(); ++k) {
    const ParamGroup& pg = o.param_groups[k];
    const std::string label = "param_groups[" + std::to_string(k) + "]";
    reject_unread(pg, o, label);
    if (pg.params.empty() && pg.patterns.empty()) throw Error(label + " names no parameter (params and patterns are empty)");
    for (const auto& name : pg.params) {
      const bool known = std::any_of(candidates.begin(), candidates.end(), [&](const Param& p) { return p.name == name; });
      if (!known) throw Error(source + ": " + label + " names '" + name + "', which is no trainable initializer");
      assign(name, k);
    }
    for (const auto& pattern : pg.patterns) {
      std::regex re;
      try {
        re = std::regex(pattern);
      } catch (const std::regex_error& e) {
        throw Error(label + " pattern '" + pattern + "' is not a valid regular expression: " + e.what());
      }
      bool matched = false;
      for (const auto& p : candidates) {
        if (!std::regex_match(p.name, re)) continue;
        matched = true;
        assign(p.name, k);
      }
      if (!matched) throw Error(source + ": " + label + " pattern '" + pattern + "' matches no trainable initializer");
    }
    groups.push_back(resolve(pg, o, label, "param_groups." + std::to_string(k) + "."));
  }
  Group rest = resolve(ParamGroup{}, o, o.param_groups.empty() ? "options" : "the parameters in no group", "");
  for (size_t i = 0; i < trainable.size(); ++i) {
    const auto it = owner.find(trainable[i].name);
    (it == owner.end() ? rest : groups[it->second]).members.push_back(i);
  }
  if (!rest.members.empty() || groups.empty()) groups.push_back(std::move(rest));
  return groups;
}

namespace {

bool exact_in_float(double v) { return static_cast<double>(static_cast<float>(v)) == v; }

// Writes the update of one group. Scalars derived from hyperparameters and the counter are
// computed in float64 (as PyTorch computes them in Python) and cast once to the parameters'
// type f; element-wise math runs in f.
class UpdateWriter {
 public:
  UpdateWriter(GraphWriter& alg, Names& names, const UpdateInputs& in)
      : alg_(alg), P_(names), in_(in), f_(in.params.empty() ? onnx::TensorProto::FLOAT : in.params[0].elem_type) {}

  void group(const Group& g, size_t k);
  std::vector<State> states() && { return std::move(states_); }

 private:
  // The ai.onnx.preview.training op computes exactly what PyTorch does when each of its float
  // attributes holds its hyperparameter exactly (always for float32 parameters).
  bool op_exact(std::initializer_list<double> attributes) const {
    if (f_ == onnx::TensorProto::FLOAT) return true;
    return std::all_of(attributes.begin(), attributes.end(), exact_in_float);
  }
  std::string const_f(const std::string& name, double v) { return alg_.scalar(P_(name), v, f_); }
  std::string const_d(const std::string& name, double v) { return alg_.scalar(P_(name), v, onnx::TensorProto::DOUBLE); }
  // A float64 scalar in the parameters' type.
  std::string to_f(const std::string& d, const std::string& name) {
    if (f_ == onnx::TensorProto::DOUBLE) return d;
    return alg_.node("Cast", {d}, P_(name), {autodiff::attr_int("to", f_)});
  }
  const std::string& t1();        // T + 1 (int64): Adam's 1-based step
  const std::string& t1_double();
  const std::string& t_double();
  const std::string& t_positive();  // T > 0 (bool)
  // A state variable of parameter i, its `next` value written by the caller.
  State state(const std::string& kind, size_t i, double initial);
  // g + wd p (torch.optim's L2 weight_decay) or g.
  std::string l2_grad(size_t i, double wd);
  std::vector<std::string> names_of(const Group& g, const std::vector<std::string>& all) const {
    std::vector<std::string> out;
    for (size_t i : g.members) out.push_back(all[i]);
    return out;
  }
  std::vector<std::string> params_of(const Group& g) const {
    std::vector<std::string> out;
    for (size_t i : g.members) out.push_back(in_.params[i].name);
    return out;
  }

  void sgd(const Group& g, const std::string& lr_f);
  void momentum_op(const Group& g, const std::string& lr_f);
  void momentum_plain(const Group& g, const std::string& lr_f, const std::string& momentum_d);
  void adagrad_op(const Group& g, const std::string& lr_f);
  void adagrad_plain(const Group& g, const std::string& lr_d);
  void adam_op(const Group& g, const std::string& lr_d, const std::string& lr_f);
  void adam_plain(const Group& g, const std::string& lr_d, const std::string& beta1_d);
  std::string adamw_keep(const Group& g, const std::string& lr_d);

  GraphWriter& alg_;
  Names& P_;
  const UpdateInputs& in_;
  int32_t f_;
  std::vector<State> states_;
  std::string t1_, t1_float_, t1_double_, t_double_, t_positive_;
};

const std::string& UpdateWriter::t1() {
  if (t1_.empty()) {
    // PyTorch counts Adam's steps from 1 for the bias correction.
    t1_ = alg_.node("Add", {in_.T, alg_.scalar(P_("adam.one"), 1, onnx::TensorProto::INT64)}, P_("adam.t"));
  }
  return t1_;
}
const std::string& UpdateWriter::t1_double() {
  if (t1_double_.empty()) {
    t1_double_ = alg_.node("Cast", {t1()}, P_("adam.t_double"), {autodiff::attr_int("to", onnx::TensorProto::DOUBLE)});
  }
  return t1_double_;
}
const std::string& UpdateWriter::t_double() {
  if (t_double_.empty()) {
    t_double_ = alg_.node("Cast", {in_.T}, P_("update.t_double"), {autodiff::attr_int("to", onnx::TensorProto::DOUBLE)});
  }
  return t_double_;
}
const std::string& UpdateWriter::t_positive() {
  if (t_positive_.empty()) {
    t_positive_ = alg_.node("Greater", {in_.T, alg_.scalar(P_("update.zero"), 0, onnx::TensorProto::INT64)},
                            P_("update.t_positive"));
  }
  return t_positive_;
}

State UpdateWriter::state(const std::string& kind, size_t i, double initial) {
  const Param& p = in_.params[i];
  const std::string s = P_(kind + "." + p.name);
  alg_.initializer(s, filled_like(p, initial));
  states_.push_back({s, P_(kind + ".new." + p.name), &p, initial, kind});
  return states_.back();
}

std::string UpdateWriter::l2_grad(size_t i, double wd) {
  if (wd == 0) return in_.grads[i];
  const std::string& name = in_.params[i].name;
  return alg_.node("Add", {in_.grads[i], alg_.node("Mul", {name, alg_.scalar(P_("wd." + name), wd, f_)}, P_("decay." + name))},
                   P_("reg_grad." + name));
}

void UpdateWriter::group(const Group& g, size_t k) {
  const std::string& lr_d = in_.lr[k];
  const std::string lr_f = to_f(lr_d, g.prefix + "lr.typed");
  const std::string momentum_d = in_.momentum.empty() ? "" : in_.momentum[k];
  switch (family_of(in_.options.optimizer)) {
    case Family::Sgd:
      if (momentum_d.empty() && g.momentum == 0) {
        sgd(g, lr_f);
      } else if (momentum_d.empty() && op_exact({g.momentum, 1 - g.dampening, g.weight_decay})) {
        momentum_op(g, lr_f);
      } else {
        momentum_plain(g, lr_f, momentum_d.empty() ? const_d(g.prefix + "sgd.momentum", g.momentum) : momentum_d);
      }
      break;
    case Family::Adagrad:
      if (op_exact({g.lr_decay, g.eps, g.weight_decay})) {
        adagrad_op(g, lr_f);
      } else {
        adagrad_plain(g, lr_d);
      }
      break;
    case Family::Adam:
      if (momentum_d.empty() && op_exact({g.beta1, g.beta2, g.eps})) {
        adam_op(g, lr_d, lr_f);
      } else {
        adam_plain(g, lr_d, momentum_d.empty() ? const_d(g.prefix + "adam.beta1_double", g.beta1) : momentum_d);
      }
      break;
  }
}

// torch.optim.SGD without momentum: p - lr (g + wd p).
void UpdateWriter::sgd(const Group& g, const std::string& lr_f) {
  for (size_t i : g.members) {
    const std::string& name = in_.params[i].name;
    alg_.node("Sub", {name, alg_.node("Mul", {l2_grad(i, g.weight_decay), lr_f}, P_("update." + name))}, in_.new_params[i]);
  }
}

// ONNX Momentum: V_new = alpha V + beta_adjusted (G + norm_coefficient X), beta_adjusted = 1 at
// T = 0, which is PyTorch's first step (buf = g) and its dampening (beta = 1 - dampening) after.
void UpdateWriter::momentum_op(const Group& g, const std::string& lr_f) {
  std::vector<std::string> v, v_new;
  for (size_t i : g.members) {
    const State s = state("momentum", i, 0);
    v.push_back(s.name);
    v_new.push_back(s.next);
  }
  if (g.members.empty()) return;
  alg_.nodes("Momentum", joined({{lr_f, in_.T}, params_of(g), names_of(g, in_.grads), v}), joined({names_of(g, in_.new_params), v_new}),
             {autodiff::attr_float("alpha", static_cast<float>(g.momentum)),
              autodiff::attr_float("beta", static_cast<float>(1 - g.dampening)),
              autodiff::attr_float("norm_coefficient", static_cast<float>(g.weight_decay)),
              autodiff::attr_string("mode", g.nesterov ? "nesterov" : "standard")},
             autodiff::kTrainingDomain);
}

// torch.optim.SGD with momentum m: g' = g + wd p; buf = g' at the first step, else
// m buf + (1 - dampening) g'; p - lr (nesterov ? g' + m buf : buf). The state starts at zero, so
// m buf + b g' with b = 1 at T = 0 and 1 - dampening after is both.
void UpdateWriter::momentum_plain(const Group& g, const std::string& lr_f, const std::string& momentum_d) {
  const std::string m = to_f(momentum_d, g.prefix + "sgd.momentum_typed");
  std::string b;
  if (g.dampening != 0) {
    b = to_f(alg_.node("Where", {t_positive(), const_d(g.prefix + "sgd.undamped", 1 - g.dampening), const_d(g.prefix + "sgd.unit", 1)},
                       P_(g.prefix + "sgd.grad_weight")),
             g.prefix + "sgd.grad_weight_typed");
  }
  for (size_t i : g.members) {
    const std::string& name = in_.params[i].name;
    const std::string grad = l2_grad(i, g.weight_decay);
    const State s = state("momentum", i, 0);
    const std::string carried = alg_.node("Mul", {m, s.name}, P_("sgd.carried." + name));
    const std::string added = b.empty() ? grad : alg_.node("Mul", {b, grad}, P_("sgd.damped." + name));
    const std::string buf = alg_.node("Add", {carried, added}, s.next);
    std::string direction = buf;
    if (g.nesterov) {
      direction = alg_.node("Add", {grad, alg_.node("Mul", {m, buf}, P_("sgd.lookahead." + name))}, P_("sgd.nesterov." + name));
    }
    alg_.node("Sub", {name, alg_.node("Mul", {direction, lr_f}, P_("update." + name))}, in_.new_params[i]);
  }
}

// ONNX Adagrad: r = R / (1 + T decay_factor), H_new = H + G_r^2, X - r G_r / (sqrt(H_new) + eps),
// G_r = G + norm_coefficient X: PyTorch's Adagrad with lr_decay = decay_factor (T = steps done).
void UpdateWriter::adagrad_op(const Group& g, const std::string& lr_f) {
  std::vector<std::string> h, h_new;
  for (size_t i : g.members) {
    const State s = state("adagrad_sum", i, g.initial_accumulator_value);
    h.push_back(s.name);
    h_new.push_back(s.next);
  }
  if (g.members.empty()) return;
  alg_.nodes("Adagrad", joined({{lr_f, in_.T}, params_of(g), names_of(g, in_.grads), h}), joined({names_of(g, in_.new_params), h_new}),
             {autodiff::attr_float("decay_factor", static_cast<float>(g.lr_decay)),
              autodiff::attr_float("epsilon", static_cast<float>(g.eps)),
              autodiff::attr_float("norm_coefficient", static_cast<float>(g.weight_decay))},
             autodiff::kTrainingDomain);
}

// torch.optim.Adagrad: g' = g + wd p; clr = lr / (1 + (step - 1) lr_decay) with step 1-based;
// sum += g'^2; p - clr g' / (sqrt(sum) + eps).
void UpdateWriter::adagrad_plain(const Group& g, const std::string& lr_d) {
  const std::string decayed = alg_.node(
      "Add", {const_d(g.prefix + "adagrad.one", 1), alg_.node("Mul", {t_double(), const_d(g.prefix + "adagrad.lr_decay", g.lr_decay)},
                                                              P_(g.prefix + "adagrad.t_decay"))},
      P_(g.prefix + "adagrad.divisor"));
  const std::string clr = to_f(alg_.node("Div", {lr_d, decayed}, P_(g.prefix + "adagrad.clr")), g.prefix + "adagrad.clr_typed");
  const std::string eps = const_f(g.prefix + "adagrad.eps", g.eps);
  for (size_t i : g.members) {
    const std::string& name = in_.params[i].name;
    const std::string grad = l2_grad(i, g.weight_decay);
    const State s = state("adagrad_sum", i, g.initial_accumulator_value);
    const std::string sum = alg_.node("Add", {s.name, alg_.node("Mul", {grad, grad}, P_("adagrad.square." + name))}, s.next);
    const std::string denom = alg_.node("Add", {alg_.node("Sqrt", {sum}, P_("adagrad.root." + name)), eps}, P_("adagrad.std." + name));
    const std::string step = alg_.node("Mul", {clr, alg_.node("Div", {grad, denom}, P_("adagrad.ratio." + name))},
                                       P_("update." + name));
    alg_.node("Sub", {name, step}, in_.new_params[i]);
  }
}

// AdamW's decoupled decay of the step's learning rate, 1 - lr_t wd (PyTorch: param.mul_(1 - lr * wd)
// before the update), in the parameters' type; empty without decay.
std::string UpdateWriter::adamw_keep(const Group& g, const std::string& lr_d) {
  if (in_.options.optimizer != Optimizer::AdamW || g.weight_decay == 0) return "";
  const std::string decay = alg_.node("Mul", {lr_d, const_d(g.prefix + "adamw.wd", g.weight_decay)}, P_(g.prefix + "adamw.decay"));
  return to_f(alg_.node("Sub", {const_d(g.prefix + "adamw.one", 1), decay}, P_(g.prefix + "adamw.keep")), g.prefix + "adamw.keep_typed");
}


// The state holds PyTorch's moments m and v. ONNX's Adam adds epsilon to sqrt(H) where
// PyTorch adds it to sqrt(v / bc2), bc2 = 1 - beta2^t; feeding the op G / s, m / s and
// v / s^2 with s = sqrt(bc2), and scaling its outputs back, makes its update exactly
// PyTorch's: R sqrt(bc2) / bc1 (m / s) / (sqrt(v) / s + eps) = lr / bc1 m / (sqrt(v / bc2) + eps).
// AdamW feeds the op p (1 - lr_t wd), PyTorch's decayed parameter (norm_coefficient_post,
// which decays after the update by a constant, stays 0).
void UpdateWriter::adam_op(const Group& g, const std::string& lr_d, const std::string& lr_f) {
  std::vector<State> m, v;
  for (size_t i : g.members) m.push_back(state("adam_m", i, 0));
  for (size_t i : g.members) v.push_back(state("adam_v", i, 0));
  if (g.members.empty()) return;
  if (t1_float_.empty()) t1_float_ = alg_.node("Cast", {t1()}, P_("adam.t_float"), {autodiff::attr_int("to", f_)});
  // bc2 uses the beta2 the Adam op uses: its float attribute (0.999 becomes 0.99900001287).
  // A float64 program computing bc2 from the double 0.999 would scale v by (1 - 0.999) /
  // (1 - float(0.999)) and move float64 weights 6e-6 (relative to the update) off PyTorch's.
  const double beta2 = static_cast<float>(g.beta2);
  const std::string bc2 = alg_.node(
      "Sub", {const_f(g.prefix + "adam.unit", 1), alg_.node("Pow", {const_f(g.prefix + "adam.beta2", beta2), t1_float_}, P_(g.prefix + "adam.beta2_t"))},
      P_(g.prefix + "adam.bc2"));
  const std::string s_bc = alg_.node("Sqrt", {bc2}, P_(g.prefix + "adam.s"));
  const std::string keep = adamw_keep(g, lr_d);
  std::vector<std::string> x_in, g_in, m_in, v_in, m_out, v_out;
  for (size_t j = 0; j < g.members.size(); ++j) {
    const size_t i = g.members[j];
    const std::string& name = in_.params[i].name;
    const std::string grad = in_.options.optimizer == Optimizer::Adam ? l2_grad(i, g.weight_decay) : in_.grads[i];
    x_in.push_back(keep.empty() ? name : alg_.node("Mul", {name, keep}, P_("adamw.decayed." + name)));
    g_in.push_back(alg_.node("Div", {grad, s_bc}, P_("adam.g_in." + name)));
    m_in.push_back(alg_.node("Div", {m[j].name, s_bc}, P_("adam.m_in." + name)));
    v_in.push_back(alg_.node("Div", {v[j].name, bc2}, P_("adam.v_in." + name)));
    m_out.push_back(P_("adam.m_out." + name));
    v_out.push_back(P_("adam.v_out." + name));
  }
  alg_.nodes("Adam", joined({{lr_f, t1()}, x_in, g_in, m_in, v_in}), joined({names_of(g, in_.new_params), m_out, v_out}),
             {autodiff::attr_float("alpha", static_cast<float>(g.beta1)), autodiff::attr_float("beta", static_cast<float>(beta2)),
              autodiff::attr_float("epsilon", static_cast<float>(g.eps))},
             autodiff::kTrainingDomain);
  for (size_t j = 0; j < g.members.size(); ++j) {
    alg_.node("Mul", {m_out[j], s_bc}, m[j].next);
    alg_.node("Mul", {v_out[j], bc2}, v[j].next);
  }
}

// torch.optim.Adam and AdamW, with step = T + 1: g' = g + wd p (Adam), p' = p (1 - lr wd)
// (AdamW), m = lerp(m, g', 1 - beta1), v = beta2 v + (1 - beta2) g'^2, bc_i = 1 - beta_i^step,
// p' - lr / bc1 m / (sqrt(v) / sqrt(bc2) + eps). beta1 may change each step (OneCycleLR).
void UpdateWriter::adam_plain(const Group& g, const std::string& lr_d, const std::string& beta1_d) {
  const std::string one = const_d(g.prefix + "adam.unit", 1);
  const std::string bc1 = alg_.node("Sub", {one, alg_.node("Pow", {beta1_d, t1_double()}, P_(g.prefix + "adam.beta1_t"))},
                                    P_(g.prefix + "adam.bc1"));
  const std::string bc2 = alg_.node(
      "Sub", {one, alg_.node("Pow", {const_d(g.prefix + "adam.beta2", g.beta2), t1_double()}, P_(g.prefix + "adam.beta2_t"))},
      P_(g.prefix + "adam.bc2"));
  const std::string step_size = to_f(alg_.node("Div", {lr_d, bc1}, P_(g.prefix + "adam.step_size")), g.prefix + "adam.step_size_typed");
  const std::string bc2_sqrt = to_f(alg_.node("Sqrt", {bc2}, P_(g.prefix + "adam.bc2_sqrt")), g.prefix + "adam.bc2_sqrt_typed");
  const std::string w1 = to_f(alg_.node("Sub", {one, beta1_d}, P_(g.prefix + "adam.one_minus_beta1")), g.prefix + "adam.one_minus_beta1_typed");
  const std::string beta2 = const_f(g.prefix + "adam.beta2_typed", g.beta2);
  const std::string w2 = const_f(g.prefix + "adam.one_minus_beta2", 1 - g.beta2);
  const std::string eps = const_f(g.prefix + "adam.eps", g.eps);
  const std::string keep = adamw_keep(g, lr_d);
  for (size_t i : g.members) {
    const std::string& name = in_.params[i].name;
    const std::string grad = in_.options.optimizer == Optimizer::Adam ? l2_grad(i, g.weight_decay) : in_.grads[i];
    const std::string x = keep.empty() ? name : alg_.node("Mul", {name, keep}, P_("adamw.decayed." + name));
    const State m = state("adam_m", i, 0);
    const State v = state("adam_v", i, 0);
    const std::string toward = alg_.node("Sub", {grad, m.name}, P_("adam.toward." + name));
    alg_.node("Add", {m.name, alg_.node("Mul", {w1, toward}, P_("adam.m_step." + name))}, m.next);
    const std::string square = alg_.node("Mul", {alg_.node("Mul", {grad, grad}, P_("adam.square." + name)), w2}, P_("adam.v_step." + name));
    alg_.node("Add", {alg_.node("Mul", {v.name, beta2}, P_("adam.v_kept." + name)), square}, v.next);
    const std::string root = alg_.node("Div", {alg_.node("Sqrt", {v.next}, P_("adam.root." + name)), bc2_sqrt}, P_("adam.root_corrected." + name));
    const std::string denom = alg_.node("Add", {root, eps}, P_("adam.denom." + name));
    const std::string step = alg_.node("Mul", {step_size, alg_.node("Div", {m.next, denom}, P_("adam.ratio." + name))}, P_("update." + name));
    alg_.node("Sub", {x, step}, in_.new_params[i]);
  }
}

}  // namespace

std::vector<State> write_update(GraphWriter& alg, Names& names, const std::vector<Group>& groups, const UpdateInputs& in) {
  UpdateWriter w(alg, names, in);
  for (size_t k = 0; k < groups.size(); ++k) w.group(groups[k], k);
  return std::move(w).states();
}

}  // namespace onnxtrain::training::detail
