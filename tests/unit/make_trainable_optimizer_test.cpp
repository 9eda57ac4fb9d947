// make_trainable's parameter groups, optimizer nodes and schedules on a hand-built linear
// model: every bad option is an Error naming it, groups get their own optimizer node and
// state, float64 programs use the ONNX optimizer ops only where their float attributes are
// exact, and schedules follow their formulas step by step. Parity with torch.optim and
// torch.optim.lr_scheduler is tests/parity/optimizer_parity.py.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <functional>
#include <string>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/training.h"
#include "test_util.h"

namespace onnxtrain::training {
namespace {

using testing::typed_value;

// logits [N, 3] = x [N, 4] . W [4, 3] + b [3] in float32 or float64, plus an integer
// initializer that is no parameter.
onnx::ModelProto linear(int32_t elem = onnx::TensorProto::FLOAT) {
  onnx::ModelProto m = testing::empty_model("linear");
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", elem, {-1, 4});
  std::vector<double> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1 * std::cos(static_cast<double>(i));
  const bool f64 = elem == onnx::TensorProto::DOUBLE;
  auto tensor = [&](const Shape& shape, const std::vector<double>& v) {
    return f64 ? Tensor::from_vector<double>(shape, v) : Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end()));
  };
  io::tensor_to_proto(tensor({4, 3}, w), "W", *g.add_initializer());
  io::tensor_to_proto(tensor({3}, {0.1, 0.0, -0.1}), "b", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<int64_t>({1}, {3}), "shape", *g.add_initializer());
  testing::add_node(g, "MatMul", {"x", "W"}, {"xw"});
  testing::add_node(g, "Add", {"xw", "b"}, {"logits"});
  typed_value(g.add_output(), "logits", elem, {-1, 3});
  return m;
}

runtime::NamedTensors batch(int32_t elem = onnx::TensorProto::FLOAT) {
  std::vector<double> x(24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i));
  const Tensor xs = elem == onnx::TensorProto::DOUBLE ? Tensor::from_vector<double>({6, 4}, x)
                                                      : Tensor::from_vector<float>({6, 4}, std::vector<float>(x.begin(), x.end()));
  return {{"x", xs}, {"label", Tensor::from_vector<int64_t>({6}, {0, 1, 2, 0, 1, 2})}};
}

std::string error_of(const MakeTrainableOptions& options) {
  try {
    make_trainable(linear(), options, "m.onnx");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

ParamGroup group(std::vector<std::string> params) {
  ParamGroup g;
  g.params = std::move(params);
  return g;
}

std::vector<const onnx::NodeProto*> nodes_of(const onnx::ModelProto& m, const std::string& op) {
  std::vector<const onnx::NodeProto*> out;
  for (const auto& n : m.training_info(0).algorithm().node()) {
    if (n.op_type() == op) out.push_back(&n);
  }
  return out;
}

float float_attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.f();
  }
  return std::nanf("");
}

// The learning rates of `steps` steps, read from an algorithm output.
std::vector<double> lrs(const MakeTrainableOptions& options, int steps, const std::string& output) {
  TrainingSession session(make_trainable(linear(), options));
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) out.push_back(session.step(batch()).at(output).to_double_vector()[0]);
  return out;
}

// Options made by `set` fail with an Error containing `message`.
struct ErrorCase {
  std::function<void(MakeTrainableOptions&)> set;
  std::string message;
};

void expect_errors(const std::vector<ErrorCase>& cases) {
  for (const auto& c : cases) {
    MakeTrainableOptions o;
    c.set(o);
    EXPECT_NE(error_of(o).find(c.message), std::string::npos) << error_of(o) << "\nwanted: " << c.message;
  }
}

TEST(MakeTrainableGroups, BadGroupsAreClearErrors) {
  const std::vector<ErrorCase> cases{
      {[](auto& o) { o.param_groups = {group({"nope"})}; }, "param_groups[0] names 'nope', which is no trainable initializer"},
      {[](auto& o) { o.param_groups = {group({"shape"})}; }, "names 'shape', which is no trainable initializer"},
      {[](auto& o) { o.param_groups = {group({})}; }, "param_groups[0] names no parameter"},
      {[](auto& o) {
         ParamGroup g;
         g.patterns = {"z.*"};
         o.param_groups = {g};
       },
       "param_groups[0] pattern 'z.*' matches no trainable initializer"},
      {[](auto& o) {
         ParamGroup all;
         all.patterns = {".*"};
         o.param_groups = {group({"W"}), all};
       },
       "'W' is in param_groups[0] and param_groups[1]"},
      {[](auto& o) {
         o.param_groups = {group({"W"})};
         o.param_groups[0].beta1 = 0.5;
       },
       "param_groups[0] sets beta1, which only --optimizer adam or adamw reads"},
      {[](auto& o) {
         o.param_groups = {group({"W"})};
         o.param_groups[0].max_lr = 0.5;
       },
       "sets max_lr, which only --lr-schedule onecycle reads"},
      {[](auto& o) {
         o.param_groups = {group({"W"})};
         o.param_groups[0].lr = -1;
       },
       "param_groups[0]: lr = -1 is out of range: torch.optim.SGD needs lr >= 0"},
      {[](auto& o) {
         o.optimizer = Optimizer::Nesterov;
         o.dampening = 0.1;
       },
       "nesterov needs momentum > 0 and dampening 0"},
      {[](auto& o) {
         o.optimizer = Optimizer::Adam;
         o.beta1 = 1;
       },
       "beta1 = 1 is out of range: torch.optim.Adam needs beta1 in [0, 1)"},
      {[](auto& o) {
         o.optimizer = Optimizer::Adagrad;
         o.initial_accumulator_value = -1;
       },
       "initial_accumulator_value = -1 is out of range"},
  };
  expect_errors(cases);
}

TEST(MakeTrainableGroups, BadSchedulesAreClearErrors) {
  const std::vector<ErrorCase> cases{
      {[](auto& o) { o.schedule = Schedule::Step; }, "--lr-schedule step needs --step-size > 0"},
      {[](auto& o) { o.schedule = Schedule::Linear; }, "--lr-schedule linear needs total_iters > 0 (--total-iters)"},
      {[](auto& o) {
         o.schedule = Schedule::Linear;
         o.total_iters = 5;
         o.start_factor = 0;
       },
       "start_factor in (0, 1]"},
      {[](auto& o) { o.schedule = Schedule::CosineAnnealing; }, "T_max > 0 (--t-max)"},
      {[](auto& o) { o.schedule = Schedule::MultiStep; }, "--lr-schedule multistep needs milestones"},
      {[](auto& o) {
         o.factor = 2;
         o.total_iters = 3;
       },
       "factor in [0, 1]"},
      {[](auto& o) {
         o.schedule = Schedule::OneCycle;
         o.total_steps = 10;
       },
       "--lr-schedule onecycle needs max_lr (--max-lr)"},
      {[](auto& o) {
         o.schedule = Schedule::OneCycle;
         o.total_steps = 10;
         o.max_lr = 0.1;
         o.optimizer = Optimizer::Adagrad;
       },
       "with cycle_momentum needs an optimizer with momentum or beta1"},
      {[](auto& o) {
         o.schedule = Schedule::OneCycle;
         o.total_steps = 10;
         o.max_lr = 0.1;
         o.anneal_strategy = "exp";
       },
       "anneal_strategy 'cos' or 'linear', got 'exp'"},
      {[](auto& o) {  // phase 1 ends at pct_start total_steps - 1 = 0, where it starts
         o.schedule = Schedule::OneCycle;
         o.total_steps = 10;
         o.max_lr = 0.1;
         o.pct_start = 0.1;
       },
       "phases of non-zero length (phase 1 ends where it starts"},
      {[](auto& o) {
         o.schedule = Schedule::Sequential;
         o.schedulers = {LrScheduler{}, LrScheduler{}};
       },
       "one milestone fewer than schedulers, got 0 milestones and 2 schedulers"},
      {[](auto& o) {
         o.schedule = Schedule::Sequential;
         o.schedulers = {LrScheduler{}, LrScheduler{}, LrScheduler{}};
         o.milestones = {5, 5};
       },
       "increasing milestones > 0"},
      {[](auto& o) {
         o.schedule = Schedule::Sequential;
         o.schedulers = {LrScheduler{}, LrScheduler{}};
         o.schedulers[1].schedule = Schedule::OneCycle;
         o.milestones = {5};
       },
       "schedulers[1] (onecycle) cannot be part of a sequential schedule"},
      {[](auto& o) {
         o.schedule = Schedule::Sequential;
         o.schedulers = {LrScheduler{}, LrScheduler{}};
         o.schedulers[1].schedule = Schedule::Polynomial;
         o.milestones = {5};
       },
       "schedulers[1] (polynomial) needs total_iters > 0"},
  };
  expect_errors(cases);
}

// Each group gets its own Momentum node with its hyperparameters as attributes, and its
// learning rate as a float64 output.
TEST(MakeTrainableGroups, OneOptimizerNodePerGroup) {
  MakeTrainableOptions o;
  o.optimizer = Optimizer::Momentum;
  o.lr = 0.1;
  o.param_groups = {group({"W"})};
  o.param_groups[0].lr = 0.3;
  o.param_groups[0].momentum = 0.5;
  o.param_groups[0].nesterov = true;
  const onnx::ModelProto m = make_trainable(linear(), o);
  const auto momentum = nodes_of(m, "Momentum");
  ASSERT_EQ(momentum.size(), 2u);
  EXPECT_EQ(momentum[0]->input(2), "W");  // R, T, then X
  EXPECT_EQ(float_attr(*momentum[0], "alpha"), 0.5f);
  EXPECT_EQ(momentum[0]->attribute(3).s(), "nesterov");
  EXPECT_EQ(momentum[1]->input(2), "b");
  EXPECT_EQ(float_attr(*momentum[1], "alpha"), 0.9f);
  EXPECT_EQ(momentum[1]->attribute(3).s(), "standard");
  TrainingSession session(m);
  const auto out = session.step(batch());
  EXPECT_EQ(out.at("onnxtrain.param_groups.0.lr").dtype(), DataType::Float64);
  EXPECT_EQ(out.at("onnxtrain.param_groups.0.lr").to_double_vector()[0], 0.3);
  EXPECT_EQ(out.at("onnxtrain.lr").to_double_vector()[0], static_cast<double>(0.3f));  // the first group's
}

// A float64 program uses the ONNX op only when its float attributes hold the hyperparameters
// exactly; a cycled momentum is never an attribute.
TEST(MakeTrainableGroups, OptimizerOpsOnlyWithExactAttributes) {
  struct Case {
    int32_t elem;
    Optimizer optimizer;
    double momentum_or_beta1;
    bool one_cycle;
    const char* op;
    size_t nodes;
  };
  const std::vector<Case> cases{
      {onnx::TensorProto::FLOAT, Optimizer::Momentum, 0.9, false, "Momentum", 1},
      {onnx::TensorProto::DOUBLE, Optimizer::Momentum, 0.9, false, "Momentum", 0},
      {onnx::TensorProto::DOUBLE, Optimizer::Momentum, 0.5, false, "Momentum", 1},
      {onnx::TensorProto::FLOAT, Optimizer::Momentum, 0.5, true, "Momentum", 0},
      {onnx::TensorProto::FLOAT, Optimizer::Adam, 0.9, false, "Adam", 1},
      {onnx::TensorProto::DOUBLE, Optimizer::Adam, 0.9, false, "Adam", 0},
      {onnx::TensorProto::DOUBLE, Optimizer::Adam, 0.5, false, "Adam", 1},
      {onnx::TensorProto::FLOAT, Optimizer::Adam, 0.5, true, "Adam", 0},
  };
  for (const auto& c : cases) {
    MakeTrainableOptions o;
    o.optimizer = c.optimizer;
    o.momentum = o.beta1 = c.momentum_or_beta1;
    o.beta2 = 0.75;
    o.eps = 0.125;
    if (c.one_cycle) {
      o.schedule = Schedule::OneCycle;
      o.total_steps = 10;
      o.max_lr = 0.1;
    }
    const onnx::ModelProto m = make_trainable(linear(c.elem), o);
    EXPECT_EQ(nodes_of(m, c.op).size(), c.nodes) << c.op << " " << c.momentum_or_beta1 << " elem " << c.elem;
    TrainingSession session(m);
    EXPECT_TRUE(std::isfinite(session.step(batch(c.elem)).at("onnxtrain.loss").to_double_vector()[0]));
  }
}

// Adagrad's sum starts at the group's initial_accumulator_value, in the state and after
// initialize().
TEST(MakeTrainableGroups, AdagradStartsFromInitialAccumulatorValue) {
  MakeTrainableOptions o;
  o.optimizer = Optimizer::Adagrad;
  o.initial_accumulator_value = 0.25;
  o.param_groups = {group({"b"})};
  o.param_groups[0].initial_accumulator_value = 2;
  TrainingSession session(make_trainable(linear(), o));
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(session.state().at("onnxtrain.adagrad_sum.W").to_double_vector(), std::vector<double>(12, 0.25));
    EXPECT_EQ(session.state().at("onnxtrain.adagrad_sum.b").to_double_vector(), std::vector<double>(3, 2.0));
    session.step(batch());
    session.initialize();
  }
}

// A frozen parameter named by a group stays a constant; the group's others train.
TEST(MakeTrainableGroups, FrozenParameterOfAGroupStaysFixed) {
  MakeTrainableOptions o;
  o.freeze = {"b"};
  o.param_groups = {group({"W", "b"})};
  o.param_groups[0].lr = 0.5;
  TrainingSession session(make_trainable(linear(), o));
  EXPECT_FALSE(session.state().contains("b"));
  const auto w0 = session.state().at("W").to_double_vector();
  session.step(batch());
  EXPECT_NE(session.state().at("W").to_double_vector(), w0);
}

// SequentialLR: a LinearLR warm-up, then ExponentialLR restarted at the milestone.
TEST(MakeTrainableSchedules, SequentialRunsEachSchedulerFromItsMilestone) {
  MakeTrainableOptions o;
  o.lr = 0.5;
  o.schedule = Schedule::Sequential;
  LrScheduler warmup, decay;
  warmup.schedule = Schedule::Linear;
  warmup.start_factor = 0.2;
  warmup.end_factor = 1;
  warmup.total_iters = 4;
  decay.schedule = Schedule::Exponential;
  decay.gamma = 0.5;
  o.schedulers = {warmup, decay};
  o.milestones = {4};
  o.param_groups = {group({"W", "b"})};
  const auto got = lrs(o, 8, "onnxtrain.param_groups.0.lr");
  for (int t = 0; t < 8; ++t) {
    const double want = t < 4 ? 0.5 * (0.2 + 0.8 * t / 4.0) : 0.5 * std::pow(0.5, t - 4);
    EXPECT_NEAR(got[static_cast<size_t>(t)], want, 1e-15) << "step " << t;
  }
}

// OneCycleLR (two phases, cos): max_lr / div_factor at step 0, max_lr at step
// pct_start total_steps - 1, max_lr / div_factor / final_div_factor at total_steps - 1; held at
// the value of step total_steps after it (PyTorch raises there).
TEST(MakeTrainableSchedules, OneCycleEndsAndHolds) {
  MakeTrainableOptions o;
  o.schedule = Schedule::OneCycle;
  o.max_lr = 1.0;
  o.total_steps = 10;
  o.pct_start = 0.5;
  o.div_factor = 4;
  o.final_div_factor = 10;
  o.param_groups = {group({"W", "b"})};
  const auto got = lrs(o, 14, "onnxtrain.param_groups.0.lr");
  EXPECT_NEAR(got[0], 0.25, 1e-15);
  EXPECT_NEAR(got[4], 1.0, 1e-15);
  EXPECT_NEAR(got[9], 0.025, 1e-15);
  for (size_t t = 11; t < 14; ++t) EXPECT_EQ(got[t], got[10]) << "step " << t;
  EXPECT_GT(got[10], 0.025);  // the cosine goes on past its end (up again), as PyTorch's
}

// MultiStepLR multiplies by gamma once per milestone passed, twice for a milestone listed twice.
TEST(MakeTrainableSchedules, MultiStepCountsRepeatedMilestones) {
  MakeTrainableOptions o;
  o.lr = 1;
  o.schedule = Schedule::MultiStep;
  o.milestones = {2, 4, 4};
  o.gamma = 0.5;
  EXPECT_EQ(lrs(o, 6, "onnxtrain.lr"), (std::vector<double>{1, 1, 0.5, 0.5, 0.125, 0.125}));
}

}  // namespace
}  // namespace onnxtrain::training
