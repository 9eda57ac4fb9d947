// make_trainable's learning-rate schedules: the closed forms of torch.optim.lr_scheduler's
// schedulers (PyTorch 2.13's lr_scheduler.py computes most of them recursively from the previous
// rate; both agree up to rounding), written as float64 ops on [G] vectors, one entry per
// parameter group, from the step counter.
#include <cmath>
#include <numbers>
#include <sstream>

#include "autodiff/builder.h"
#include "onnxtrain/error.h"
#include "training/make_trainable_internal.h"

namespace onnxtrain::training::detail {

namespace {

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Constant: return "constant";
    case Schedule::Step: return "step";
    case Schedule::Exponential: return "exponential";
    case Schedule::Cosine: return "cosine";
    case Schedule::Linear: return "linear";
    case Schedule::MultiStep: return "multistep";
    case Schedule::CosineAnnealing: return "cosine_annealing";
    case Schedule::Polynomial: return "polynomial";
    case Schedule::OneCycle: return "onecycle";
    case Schedule::Sequential: break;
  }
  return "sequential";
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

constexpr int32_t kDouble = onnx::TensorProto::DOUBLE;

class ScheduleWriter {
 public:
  ScheduleWriter(GraphWriter& alg, Names& names, const MakeTrainableOptions& options, const std::vector<Group>& groups)
      : alg_(alg), P_(names), options_(options), groups_(groups) {}

  // The [G] learning rates of `s` at step t (a float64 scalar); node names start with `prefix`;
  // `where` names the scheduler in errors.
  std::string lrs(const LrScheduler& s, const std::string& t, const std::string& prefix, const std::string& where);
  // OneCycle's cycled momenta, once lrs() has run on it; empty without cycle_momentum.
  const std::string& momenta() const { return momenta_; }

 private:
  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::string& name,
                   const std::vector<onnx::AttributeProto>& attrs = {}) {
    return alg_.node(op, inputs, P_(name), attrs);
  }
  std::string k(const std::string& name, double v) { return alg_.scalar(P_(name), v, kDouble); }
  std::string vec(const std::string& name, const std::vector<double>& v) {
    const std::string n = P_(name);
    alg_.initializer(n, Tensor::from_vector<double>({static_cast<int64_t>(v.size())}, v));
    return n;
  }
  template <class F>
  std::vector<double> per_group(F&& f) const {
    std::vector<double> out;
    for (const auto& g : groups_) out.push_back(f(g));
    return out;
  }
  const std::string& base();
  // eta_min + (base - eta_min) (1 + cos(pi frac)) / 2.
  std::string cosine(const std::string& frac, double eta_min, const std::string& p);
  // min(t, total) / total.
  std::string clamped_fraction(const std::string& t, int64_t total, const std::string& p);
  std::string one_cycle(const LrScheduler& s, const std::string& t, const std::string& p, const std::string& where);
  std::string sequential(const LrScheduler& s, const std::string& t, const std::string& p, const std::string& where);

  GraphWriter& alg_;
  Names& P_;
  const MakeTrainableOptions& options_;
  const std::vector<Group>& groups_;
  std::string base_, momenta_;
};

// PyTorch's `float(scale * pct_start * total_steps) - minus`: the product rounded before the
// subtraction (a fused multiply-add, which the compiler may form from a * b - c, would not round
// it and could move a phase's end across a step).
double phase_end(double scale, double pct_start, double total, double minus) {
  const volatile double product = scale * pct_start * total;
  return product - minus;
}

void need(bool ok, const std::string& where, const std::string& what) {
  if (!ok) throw Error(where + " needs " + what);
}

const std::string& ScheduleWriter::base() {
  if (base_.empty()) base_ = vec("lr.base", per_group([](const Group& g) { return g.lr; }));
  return base_;
}

std::string ScheduleWriter::cosine(const std::string& frac, double eta_min, const std::string& p) {
  const std::string angle = node("Mul", {frac, k(p + "pi", std::numbers::pi)}, p + "angle");
  const std::string c = node("Mul", {node("Add", {node("Cos", {angle}, p + "cos"), k(p + "one", 1)}, p + "cos1"), k(p + "half", 0.5)},
                             p + "cos_factor");
  if (eta_min == 0) return node("Mul", {base(), c}, p + "cosine");
  const std::string eta = k(p + "eta_min", eta_min);
  return node("Add", {eta, node("Mul", {node("Sub", {base(), eta}, p + "above_eta_min"), c}, p + "cos_scaled")}, p + "cosine");
}

std::string ScheduleWriter::clamped_fraction(const std::string& t, int64_t total, const std::string& p) {
  const std::string n = k(p + "total", static_cast<double>(total));
  return node("Div", {node("Min", {t, n}, p + "t_clamped"), n}, p + "frac");
}

std::string ScheduleWriter::lrs(const LrScheduler& s, const std::string& t, const std::string& p, const std::string& where) {
  switch (s.schedule) {
    case Schedule::Constant: {
      if (s.factor == 1) return base();
      need(s.factor >= 0 && s.factor <= 1, where, "factor in [0, 1] (torch.optim.lr_scheduler.ConstantLR), got " + number(s.factor));
      need(s.total_iters > 0, where, "total_iters > 0 (--total-iters) with a factor other than 1");
      const std::string before = node("Less", {t, k(p + "total_iters", static_cast<double>(s.total_iters))}, p + "before_total");
      return node("Mul", {base(), node("Where", {before, k(p + "factor", s.factor), k(p + "unit", 1)}, p + "factor_t")}, p + "constant");
    }
    case Schedule::Step: {
      need(s.step_size > 0, where, "--step-size > 0");
      const std::string n = node("Floor", {node("Div", {t, k(p + "step_size", static_cast<double>(s.step_size))}, p + "t_over_step")},
                                 p + "k");
      return node("Mul", {base(), node("Pow", {k(p + "gamma", s.gamma), n}, p + "gamma_k")}, p + "step");
    }
    case Schedule::MultiStep: {
      need(!s.milestones.empty(), where, "milestones (--milestones)");
      std::vector<double> ms(s.milestones.begin(), s.milestones.end());
      const std::string passed = node("Cast", {node("LessOrEqual", {vec(p + "milestones", ms), t}, p + "passed_bool")}, p + "passed",
                                      {autodiff::attr_int("to", kDouble)});
      const std::string n = node("ReduceSum", {passed}, p + "milestones_passed", {autodiff::attr_int("keepdims", 0)});
      return node("Mul", {base(), node("Pow", {k(p + "gamma", s.gamma), n}, p + "gamma_k")}, p + "multistep");
    }
    case Schedule::Exponential:
      return node("Mul", {base(), node("Pow", {k(p + "gamma", s.gamma), t}, p + "gamma_t")}, p + "exponential");
    case Schedule::Cosine:
      need(s.total_steps > 0, where, "total_steps > 0 (--total-steps)");
      return cosine(clamped_fraction(t, s.total_steps, p), s.eta_min, p);
    case Schedule::CosineAnnealing:
      need(s.T_max > 0, where, "T_max > 0 (--t-max)");
      return cosine(node("Div", {t, k(p + "T_max", static_cast<double>(s.T_max))}, p + "frac"), s.eta_min, p);
    case Schedule::Linear: {
      need(s.total_iters > 0, where, "total_iters > 0 (--total-iters)");
      need(s.start_factor > 0 && s.start_factor <= 1, where,
           "start_factor in (0, 1] (torch.optim.lr_scheduler.LinearLR), got " + number(s.start_factor));
      need(s.end_factor >= 0 && s.end_factor <= 1, where,
           "end_factor in [0, 1] (torch.optim.lr_scheduler.LinearLR), got " + number(s.end_factor));
      const std::string frac = clamped_fraction(t, s.total_iters, p);
      const std::string factor = node(
          "Add", {k(p + "start_factor", s.start_factor), node("Mul", {frac, k(p + "factor_span", s.end_factor - s.start_factor)}, p + "ramp")},
          p + "factor");
      return node("Mul", {base(), factor}, p + "linear");
    }
    case Schedule::Polynomial: {
      need(s.total_iters > 0, where, "total_iters > 0 (--total-iters)");
      const std::string left = node("Sub", {k(p + "one", 1), clamped_fraction(t, s.total_iters, p)}, p + "left");
      return node("Mul", {base(), node("Pow", {left, k(p + "power", s.power)}, p + "factor")}, p + "polynomial");
    }
    case Schedule::OneCycle:
      return one_cycle(s, t, p, where);
    case Schedule::Sequential:
      break;
  }
  return sequential(s, t, p, where);
}

// OneCycleLR: phases ending at steps e_i (pct_start total_steps - 1, [2 pct_start total_steps - 2,]
// total_steps - 1); in phase i, from start_i = e_{i-1} (0 for the first), pct = (t - start_i) /
// (e_i - start_i) anneals each group's rate (and momentum) from the phase's start value to its
// end value: cos: end + (start - end) / 2 (cos(pi pct) + 1); linear: (end - start) pct + start.
// t is held at total_steps, the last step PyTorch allows.
std::string ScheduleWriter::one_cycle(const LrScheduler& s, const std::string& t, const std::string& p, const std::string& where) {
  need(s.total_steps > 0, where, "total_steps > 0 (--total-steps)");
  need(s.pct_start >= 0 && s.pct_start <= 1, where, "pct_start in [0, 1], got " + number(s.pct_start));
  need(s.anneal_strategy == "cos" || s.anneal_strategy == "linear", where,
       "anneal_strategy 'cos' or 'linear', got '" + s.anneal_strategy + "'");
  need(s.div_factor > 0 && s.final_div_factor > 0, where, "div_factor > 0 and final_div_factor > 0");
  for (const auto& g : groups_) {
    if (!g.max_lr) {
      throw Error(where + " needs max_lr (--max-lr" + (g.prefix.empty() ? std::string() : ", or max_lr of " + g.label) + ")");
    }
    if (!(*g.max_lr >= 0)) throw Error(g.label + ": max_lr = " + number(*g.max_lr) + " is out of range (>= 0)");
  }
  const bool cycle = s.cycle_momentum;
  if (cycle && family_of(options_.optimizer) == Family::Adagrad) {
    throw Error(where + " with cycle_momentum needs an optimizer with momentum or beta1 (sgd, momentum, nesterov, adam, "
                "adamw), as torch.optim.lr_scheduler.OneCycleLR; turn it off (--no-cycle-momentum) for adagrad");
  }
  const double total = static_cast<double>(s.total_steps);
  const auto initial = per_group([&](const Group& g) { return *g.max_lr / s.div_factor; });
  const auto peak = per_group([&](const Group& g) { return *g.max_lr; });
  const auto last = per_group([&](const Group& g) { return *g.max_lr / s.div_factor / s.final_div_factor; });
  const auto base_m = per_group([](const Group& g) { return g.base_momentum; });
  const auto max_m = per_group([](const Group& g) { return g.max_momentum; });
  struct Phase {
    double end;
    std::vector<double> lr_from, lr_to, m_from, m_to;
  };
  std::vector<Phase> phases;
  if (s.three_phase) {
    phases = {{phase_end(1, s.pct_start, total, 1), initial, peak, max_m, base_m},
              {phase_end(2, s.pct_start, total, 2), peak, initial, base_m, max_m},
              {total - 1, initial, last, max_m, max_m}};
  } else {
    phases = {{phase_end(1, s.pct_start, total, 1), initial, peak, max_m, base_m}, {total - 1, peak, last, base_m, max_m}};
  }
  const std::string tc = node("Min", {t, k(p + "total_steps", total)}, p + "t_clamped");
  const bool cos = s.anneal_strategy == "cos";
  auto anneal = [&](const std::vector<double>& from, const std::vector<double>& to, const std::string& pct, const std::string& q) {
    std::vector<double> span(from.size());
    if (cos) {
      for (size_t i = 0; i < from.size(); ++i) span[i] = (from[i] - to[i]) / 2.0;
      const std::string c = node("Add", {node("Cos", {node("Mul", {k(q + "pi", std::numbers::pi), pct}, q + "angle")}, q + "cos"),
                                         k(q + "one", 1)},
                                 q + "cos1");
      return node("Add", {vec(q + "to", to), node("Mul", {vec(q + "half_span", span), c}, q + "scaled")}, q + "value");
    }
    for (size_t i = 0; i < from.size(); ++i) span[i] = to[i] - from[i];
    return node("Add", {node("Mul", {vec(q + "span", span), pct}, q + "scaled"), vec(q + "from", from)}, q + "value");
  };
  std::string lr, momentum;
  double start = 0;
  std::vector<std::string> lr_of, m_of, ends;
  for (size_t i = 0; i < phases.size(); ++i) {
    const std::string q = p + "phase" + std::to_string(i) + ".";
    const double length = phases[i].end - start;
    need(length != 0, where, "phases of non-zero length (phase " + std::to_string(i + 1) + " ends where it starts, at step " +
                                 number(start) + ": change pct_start or total_steps)");
    const std::string pct = node("Div", {node("Sub", {tc, k(q + "start", start)}, q + "into"), k(q + "length", length)}, q + "pct");
    lr_of.push_back(anneal(phases[i].lr_from, phases[i].lr_to, pct, q + "lr."));
    if (cycle) m_of.push_back(anneal(phases[i].m_from, phases[i].m_to, pct, q + "momentum."));
    ends.push_back(k(q + "end", phases[i].end));
    start = phases[i].end;
  }
  // The first phase whose end is not passed, or the last.
  lr = lr_of.back();
  if (cycle) momentum = m_of.back();
  for (size_t i = phases.size() - 1; i-- > 0;) {
    const std::string q = p + "phase" + std::to_string(i) + ".";
    const std::string within = node("LessOrEqual", {tc, ends[i]}, q + "within");
    lr = node("Where", {within, lr_of[i], lr}, q + "lr");
    if (cycle) momentum = node("Where", {within, m_of[i], momentum}, q + "momentum");
  }
  momenta_ = momentum;
  return lr;
}

// SequentialLR: schedulers[0] until milestones[0]; from milestones[k - 1] on, schedulers[k] at
// step t - milestones[k - 1] (PyTorch restarts it there with its closed form at step 0).
std::string ScheduleWriter::sequential(const LrScheduler& s, const std::string& t, const std::string& p, const std::string& where) {
  need(!s.schedulers.empty(), where, "schedulers (--scheduler)");
  need(s.milestones.size() + 1 == s.schedulers.size(), where,
       "one milestone fewer than schedulers, got " + std::to_string(s.milestones.size()) + " milestones and " +
           std::to_string(s.schedulers.size()) + " schedulers");
  for (size_t i = 0; i < s.milestones.size(); ++i) {
    need(s.milestones[i] > (i == 0 ? 0 : s.milestones[i - 1]), where, "increasing milestones > 0");
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < s.schedulers.size(); ++i) {
    const LrScheduler& child = s.schedulers[i];
    const std::string label = "schedulers[" + std::to_string(i) + "] (" + schedule_name(child.schedule) + ")";
    if (child.schedule == Schedule::Sequential || child.schedule == Schedule::OneCycle) {
      throw Error(where + ": " + label + " cannot be part of a sequential schedule");
    }
    const std::string q = p + "s" + std::to_string(i) + ".";
    std::string local = t;
    if (i > 0) {
      const std::string from = k(q + "from", static_cast<double>(s.milestones[i - 1]));
      local = node("Max", {node("Sub", {t, from}, q + "t_shifted"), k(q + "zero", 0)}, q + "t");
    }
    values.push_back(lrs(child, local, q, label));
  }
  std::string lr = values.back();
  for (size_t i = values.size() - 1; i-- > 0;) {
    const std::string q = p + "s" + std::to_string(i) + ".";
    const std::string before = node("Less", {t, k(q + "until", static_cast<double>(s.milestones[i]))}, q + "active");
    lr = node("Where", {before, values[i], lr}, q + "selected");
  }
  return lr;
}

}  // namespace

ScheduleValues write_schedule(GraphWriter& alg, Names& names, const MakeTrainableOptions& options,
                              const std::vector<Group>& groups, const std::string& T) {
  ScheduleWriter w(alg, names, options, groups);
  const std::string t = alg.node("Cast", {T}, names("lr.t"), {autodiff::attr_int("to", kDouble)});
  const std::string where = std::string("--lr-schedule ") + schedule_name(options.schedule);
  std::string lrs = w.lrs(options, t, "lr.", where);
  if (options.warmup_steps > 0) {
    const std::string ramp = alg.node("Div", {alg.node("Add", {t, alg.scalar(names("lr.warmup_one"), 1, kDouble)}, names("lr.t1")),
                                             alg.scalar(names("lr.warmup"), static_cast<double>(options.warmup_steps), kDouble)},
                                      names("lr.ramp"));
    const std::string w_factor = alg.node("Min", {ramp, alg.scalar(names("lr.warmup_cap"), 1, kDouble)}, names("lr.warmup_factor"));
    lrs = alg.node("Mul", {lrs, w_factor}, names("lr.warmed"));
  }
  return {lrs, w.momenta()};
}

}  // namespace onnxtrain::training::detail
