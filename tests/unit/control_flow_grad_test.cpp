// Gradients through If and Loop (autodiff/engine.cpp, rules_control_flow.cpp, subgraphs.cpp),
// checked against central differences in float64: both branches of an If, values read by one
// branch only, xs read inside a branch, an If output off the path, nested If, a Loop inside a
// branch, unrolled Loops (loop-carried values, scan outputs, the iteration number, enclosing
// values, nested Loops, zero iterations), unrolled Scans (states, several scan inputs and
// outputs on other axes and in reverse), second derivatives, evaluation at other inputs, the
// errors for Loops and Scans that cannot be unrolled, and a training step of a model with an If.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using runtime::NamedTensors;
using testing::expect_close;

constexpr int kDouble = onnx::TensorProto::DOUBLE, kBool = onnx::TensorProto::BOOL, kInt64 = onnx::TensorProto::INT64;

using testing::graph_attr;
using testing::typed_value;

using testing::add_node;

// A subgraph named `name` whose outputs are the doubles `outputs` (shapes left open).
onnx::GraphProto subgraph(const std::string& name, const std::vector<std::string>& outputs) {
  onnx::GraphProto g;
  g.set_name(name);
  for (const auto& o : outputs) typed_value(g.add_output(), o, kDouble, {});
  return g;
}

// A Loop body with inputs (iteration, cond, state) of one loop-carried double [2] and outputs
// (cond passed through, next_state); the caller adds the nodes computing next_state.
onnx::GraphProto loop_body(const std::string& name, const std::vector<std::string>& inputs, const std::string& next_state) {
  onnx::GraphProto body;
  body.set_name(name);
  typed_value(body.add_input(), inputs[0], kInt64, {});
  typed_value(body.add_input(), inputs[1], kBool, {});
  typed_value(body.add_input(), inputs[2], kDouble, {2});
  typed_value(body.add_output(), inputs[1], kBool, {});
  typed_value(body.add_output(), next_state, kDouble, {2});
  return body;
}

onnx::NodeProto* if_node(onnx::GraphProto& g, const std::string& cond, const std::vector<std::string>& out,
                         const onnx::GraphProto& then_g, const onnx::GraphProto& else_g) {
  auto* n = add_node(g, "If", {cond}, out);
  graph_attr(n, "then_branch", then_g);
  graph_attr(n, "else_branch", else_g);
  return n;
}

void int64_initializer(onnx::GraphProto& g, const std::string& name, int64_t value) {
  io::tensor_to_proto(Tensor::scalar<int64_t>(value), name, *g.add_initializer());
}

onnx::ModelProto model_of(const onnx::GraphProto& g) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* t = m.add_opset_import();
  t->set_domain("ai.onnx.preview.training");
  t->set_version(1);
  *m.mutable_graph() = g;
  return m;
}

onnx::NodeProto* gradient(onnx::GraphProto& g, const std::vector<std::string>& in, const std::vector<std::string>& xs,
                          const std::string& y, const std::vector<std::string>& out) {
  auto* n = add_node(g, "Gradient", in, out);
  n->set_domain("ai.onnx.preview.training");
  n->set_name("gradient_of_" + y);
  auto* a = n->add_attribute();
  a->set_name("xs");
  a->set_type(onnx::AttributeProto::STRINGS);
  for (const auto& x : xs) a->add_strings(x);
  *n->add_attribute() = testing::attr("y", y);
  return n;
}

// `forward` (computing output "y") with Gradient(xs -> y) and outputs d_<x>.
onnx::ModelProto with_gradient(onnx::ModelProto forward, const std::vector<std::string>& xs) {
  auto& g = *forward.mutable_graph();
  std::vector<std::string> out;
  for (const auto& x : xs) out.push_back("d_" + x);
  gradient(g, xs, xs, "y", out);
  for (const auto& o : out) g.add_output()->set_name(o);
  return forward;
}

Tensor vec(const std::vector<double>& v) { return Tensor::from_vector<double>({static_cast<int64_t>(v.size())}, v); }

double sum_of_y(runtime::Session& s, const NamedTensors& feeds) {
  const auto y = s.run(feeds).at("y").to_double_vector();
  return std::accumulate(y.begin(), y.end(), 0.0);
}

// The Gradient of sum(y) with respect to the fed xs against central differences (eps 1e-6,
// |analytic - numeric| <= 1e-6 + 1e-5 |numeric|, as the rule table's test); y itself must be
// what the model without the Gradient node computes.
NamedTensors expect_gradients_match(const onnx::ModelProto& forward, const std::vector<std::string>& xs,
                                    const NamedTensors& feeds) {
  runtime::Session plain(forward);
  runtime::Session differentiated(with_gradient(forward, xs));
  const NamedTensors out = differentiated.run(feeds);
  expect_close(out.at("y"), plain.run(feeds).at("y"), 0, 1e-12);
  constexpr double eps = 1e-6;
  for (const auto& x : xs) {
    const Tensor& g = out.at("d_" + x);
    EXPECT_EQ(g.shape(), feeds.at(x).shape()) << x;
    if (g.shape() != feeds.at(x).shape()) continue;
    const auto got = g.to_double_vector();
    for (int64_t j = 0; j < g.numel(); ++j) {
      NamedTensors shifted = feeds;
      Tensor plus = feeds.at(x).clone(), minus = feeds.at(x).clone();
      plus.data<double>()[j] += eps;
      minus.data<double>()[j] -= eps;
      shifted[x] = plus;
      const double up = sum_of_y(plain, shifted);
      shifted[x] = minus;
      const double numeric = (up - sum_of_y(plain, shifted)) / (2 * eps);
      EXPECT_NEAR(got[static_cast<size_t>(j)], numeric, 1e-6 + 1e-5 * std::abs(numeric)) << x << "[" << j << "]";
    }
  }
  return out;
}

// ---- If ----

// y = If(c) * x with h = exp(x): then_branch tanh(h * w), else_branch sin(v) * x. w is read by
// the then_branch only, v by the else_branch only, x by the graph and the else_branch.
onnx::ModelProto if_model() {
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  for (const char* name : {"x", "w", "v"}) typed_value(g.add_input(), name, kDouble, {3});
  add_node(g, "Exp", {"x"}, {"h"});
  onnx::GraphProto then_g = subgraph("then", {"t"});
  add_node(then_g, "Mul", {"h", "w"}, {"hw"});
  add_node(then_g, "Tanh", {"hw"}, {"t"});
  onnx::GraphProto else_g = subgraph("else", {"e"});
  add_node(else_g, "Sin", {"v"}, {"sv"});
  add_node(else_g, "Mul", {"sv", "x"}, {"e"});
  if_node(g, "c", {"r"}, then_g, else_g);
  add_node(g, "Mul", {"r", "x"}, {"y"});
  g.add_output()->set_name("y");
  return model_of(g);
}

NamedTensors if_feeds(bool c) {
  return {{"c", Tensor::scalar(c)}, {"x", vec({0.3, -0.7, 1.1})}, {"w", vec({0.5, 1.5, -0.4})}, {"v", vec({2.0, -1.0, 0.25})}};
}

TEST(IfGradient, ThenBranchMatchesFiniteDifferences) {
  const auto out = expect_gradients_match(if_model(), {"x", "w", "v"}, if_feeds(true));
  // v is read by the else_branch alone: exact zeros.
  EXPECT_EQ(out.at("d_v").to_double_vector(), std::vector<double>(3, 0.0));
}

TEST(IfGradient, ElseBranchMatchesFiniteDifferences) {
  const auto out = expect_gradients_match(if_model(), {"x", "w", "v"}, if_feeds(false));
  EXPECT_EQ(out.at("d_w").to_double_vector(), std::vector<double>(3, 0.0));
}

TEST(IfGradient, ConditionComputedFromTheDifferentiatedValue) {
  // c = sum(x) > 0: the branch follows x, and the gradient follows the branch.
  onnx::ModelProto m = if_model();
  auto& g = *m.mutable_graph();
  g.mutable_input()->DeleteSubrange(0, 1);
  auto* sum = add_node(g, "ReduceSum", {"x"}, {"sum_x"});
  *sum->add_attribute() = testing::attr("keepdims", int64_t{0});
  add_node(g, "Constant", {}, {"zero"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("value");
    a.set_type(onnx::AttributeProto::TENSOR);
    io::tensor_to_proto(Tensor::scalar(0.0), "", *a.mutable_t());
    return a;
  }());
  add_node(g, "Greater", {"sum_x", "zero"}, {"c"});
  for (const double sign : {1.0, -1.0}) {
    NamedTensors feeds = if_feeds(true);
    feeds.erase("c");
    feeds["x"] = vec({0.3 * sign, 0.7 * sign, 1.1 * sign});
    expect_gradients_match(m, {"x", "w", "v"}, feeds);
  }
}

// An If with two outputs where y reads only the first: the second runs a Loop whose trip count
// is fed, which cannot be differentiated, so a walk into it would fail.
onnx::ModelProto if_with_an_output_off_the_path() {
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  typed_value(g.add_input(), "n", kInt64, {});
  for (const char* name : {"x", "w", "u"}) typed_value(g.add_input(), name, kDouble, {2});
  onnx::GraphProto body = loop_body("body", {"i", "c_in", "s_in"}, "s_out");
  add_node(body, "Mul", {"s_in", "u"}, {"s_out"});
  onnx::GraphProto then_g = subgraph("then", {"a", "b"});
  add_node(then_g, "Mul", {"x", "w"}, {"a"});
  graph_attr(add_node(then_g, "Loop", {"n", "", "x"}, {"b"}), "body", body);
  onnx::GraphProto else_g = subgraph("else", {"a2", "b2"});
  add_node(else_g, "Sub", {"x", "w"}, {"a2"});
  add_node(else_g, "Mul", {"u", "x"}, {"b2"});
  if_node(g, "c", {"first", "second"}, then_g, else_g);
  add_node(g, "Sin", {"first"}, {"y"});
  g.add_output()->set_name("y");
  g.add_output()->set_name("second");
  return model_of(g);
}

TEST(IfGradient, AnOutputOffThePathIsNotDifferentiated) {
  for (const bool c : {true, false}) {
    SCOPED_TRACE(c);
    const NamedTensors feeds{{"c", Tensor::scalar(c)}, {"n", Tensor::scalar<int64_t>(2)}, {"x", vec({0.4, -1.2})},
                             {"w", vec({0.9, 0.3})}, {"u", vec({1.5, -0.5})}};
    const auto out = expect_gradients_match(if_with_an_output_off_the_path(), {"x", "w", "u"}, feeds);
    EXPECT_EQ(out.at("d_u").to_double_vector(), std::vector<double>(2, 0.0));
    // The second output still runs the Loop: x u^2 in the then_branch.
    expect_close(out.at("second"), c ? vec({0.4 * 2.25, -1.2 * 0.25}) : vec({0.6, 0.6}));
  }
}

// Nested If: the outer then_branch computes a = x * w and returns If(c2, then: a * a * x,
// else: a + w); the outer else_branch returns sin(x) * w. The inner If reads a value of the
// outer branch (a) and values of the main graph (x, w).
onnx::ModelProto nested_if_model() {
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c1", kBool, {});
  typed_value(g.add_input(), "c2", kBool, {});
  for (const char* name : {"x", "w"}) typed_value(g.add_input(), name, kDouble, {3});
  onnx::GraphProto inner_then = subgraph("inner_then", {"it"});
  add_node(inner_then, "Mul", {"a", "a"}, {"aa"});
  add_node(inner_then, "Mul", {"aa", "x"}, {"it"});
  onnx::GraphProto inner_else = subgraph("inner_else", {"ie"});
  add_node(inner_else, "Add", {"a", "w"}, {"ie"});
  onnx::GraphProto outer_then = subgraph("outer_then", {"ot"});
  add_node(outer_then, "Mul", {"x", "w"}, {"a"});
  if_node(outer_then, "c2", {"ot"}, inner_then, inner_else);
  onnx::GraphProto outer_else = subgraph("outer_else", {"oe"});
  add_node(outer_else, "Sin", {"x"}, {"sx"});
  add_node(outer_else, "Mul", {"sx", "w"}, {"oe"});
  if_node(g, "c1", {"y"}, outer_then, outer_else);
  g.add_output()->set_name("y");
  return model_of(g);
}

TEST(IfGradient, NestedIfInEveryCombinationOfBranches) {
  for (const bool c1 : {true, false}) {
    for (const bool c2 : {true, false}) {
      SCOPED_TRACE(std::to_string(c1) + std::to_string(c2));
      expect_gradients_match(nested_if_model(), {"x", "w"},
                             {{"c1", Tensor::scalar(c1)}, {"c2", Tensor::scalar(c2)}, {"x", vec({0.5, -1.5, 2.0})},
                              {"w", vec({1.25, 0.75, -0.5})}});
    }
  }
}

TEST(IfGradient, ALoopInsideABranchIsUnrolled) {
  // then_branch: s = x; twice s = s * w + x (M an initializer of the main graph); else_branch: x * x.
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  for (const char* name : {"x", "w"}) typed_value(g.add_input(), name, kDouble, {2});
  int64_initializer(g, "two", 2);
  onnx::GraphProto body = loop_body("body", {"i", "c_in", "s_in"}, "s_out");
  add_node(body, "Mul", {"s_in", "w"}, {"sw"});
  add_node(body, "Add", {"sw", "x"}, {"s_out"});
  onnx::GraphProto then_g = subgraph("then", {"t"});
  graph_attr(add_node(then_g, "Loop", {"two", "", "x"}, {"t"}), "body", body);
  onnx::GraphProto else_g = subgraph("else", {"e"});
  add_node(else_g, "Mul", {"x", "x"}, {"e"});
  if_node(g, "c", {"y"}, then_g, else_g);
  g.add_output()->set_name("y");
  for (const bool c : {true, false}) {
    SCOPED_TRACE(c);
    expect_gradients_match(model_of(g), {"x", "w"}, {{"c", Tensor::scalar(c)}, {"x", vec({0.5, -2.0})}, {"w", vec({1.5, 0.25})}});
  }
}

TEST(IfGradient, SecondDerivativeThroughAnIf) {
  // y = x^3 (then) or x^2 (else): d2y/dx2 = 6x or 2.
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  typed_value(g.add_input(), "x", kDouble, {3});
  onnx::GraphProto then_g = subgraph("then", {"cube"});
  add_node(then_g, "Mul", {"x", "x"}, {"sq"});
  add_node(then_g, "Mul", {"sq", "x"}, {"cube"});
  onnx::GraphProto else_g = subgraph("else", {"square"});
  add_node(else_g, "Mul", {"x", "x"}, {"square"});
  if_node(g, "c", {"y"}, then_g, else_g);
  gradient(g, {"x"}, {"x"}, "y", {"dy"});
  gradient(g, {"x"}, {"x"}, "dy", {"d2y"});
  g.add_output()->set_name("dy");
  g.add_output()->set_name("d2y");
  runtime::Session s(model_of(g));
  const Tensor x = vec({-1, 0.5, 2});
  auto out = s.run({{"c", Tensor::scalar(true)}, {"x", x}});
  expect_close(out.at("dy"), vec({3, 0.75, 12}));
  expect_close(out.at("d2y"), vec({-6, 3, 12}));
  out = s.run({{"c", Tensor::scalar(false)}, {"x", x}});
  expect_close(out.at("dy"), vec({-2, 1, 4}));
  expect_close(out.at("d2y"), vec({2, 2, 2}));
}

TEST(IfGradient, EvaluatedAtOtherInputsTheBranchesReadThem) {
  // y = If(c, then: x * w, else: x + w) evaluated at x_other: the clone's branches read x_other.
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  for (const char* name : {"x", "w", "x_other"}) typed_value(g.add_input(), name, kDouble, {2});
  onnx::GraphProto then_g = subgraph("then", {"t"});
  add_node(then_g, "Mul", {"x", "w"}, {"t"});
  onnx::GraphProto else_g = subgraph("else", {"e"});
  add_node(else_g, "Add", {"x", "w"}, {"e"});
  if_node(g, "c", {"y"}, then_g, else_g);
  gradient(g, {"x_other", "w"}, {"x", "w"}, "y", {"dx", "dw"});
  g.add_output()->set_name("y");
  g.add_output()->set_name("dx");
  g.add_output()->set_name("dw");
  runtime::Session s(model_of(g));
  const auto out = s.run({{"c", Tensor::scalar(true)}, {"x", vec({1, 2})}, {"w", vec({3, 4})}, {"x_other", vec({-5, 7})}});
  expect_close(out.at("y"), vec({3, 8}));  // the forward value is untouched
  expect_close(out.at("dx"), vec({3, 4}));
  expect_close(out.at("dw"), vec({-5, 7}));  // x_other, not x
}

// ---- Loop ----

// Loop(M, cond, s0) with body s = s * w + sin(s) / 2 (w read from the main graph, 1/2 a body
// initializer) and scan output
// s * i (the iteration number); y = history * r + s_final. `m_constant` gives M by a Constant
// node instead of an initializer, with a constant true cond passed as the Loop's input and the
// body's cond output an Identity of it, as torch.onnx.export writes loops.
onnx::ModelProto loop_model(int64_t trips, bool m_constant = false) {
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "s0", kDouble, {2});
  typed_value(g.add_input(), "w", kDouble, {2});
  typed_value(g.add_input(), "r", kDouble, {trips, 2});
  std::string cond;
  if (m_constant) {
    onnx::AttributeProto value;
    value.set_name("value");
    value.set_type(onnx::AttributeProto::TENSOR);
    io::tensor_to_proto(Tensor::scalar<int64_t>(trips), "", *value.mutable_t());
    *add_node(g, "Constant", {}, {"M"})->add_attribute() = value;
    io::tensor_to_proto(Tensor::scalar(true), "", *value.mutable_t());
    *add_node(g, "Constant", {}, {"always"})->add_attribute() = value;
    cond = "always";
  } else {
    int64_initializer(g, "M", trips);
  }
  onnx::GraphProto body;
  body.set_name("body");
  typed_value(body.add_input(), "i", kInt64, {});
  typed_value(body.add_input(), "c_in", kBool, {});
  typed_value(body.add_input(), "s_in", kDouble, {2});
  io::tensor_to_proto(Tensor::scalar(0.5), "half", *body.add_initializer());
  add_node(body, "Mul", {"s_in", "w"}, {"sw"});
  add_node(body, "Sin", {"s_in"}, {"ss"});
  add_node(body, "Mul", {"ss", "half"}, {"ssh"});
  add_node(body, "Add", {"sw", "ssh"}, {"s_out"});
  *add_node(body, "Cast", {"i"}, {"i_d"})->add_attribute() = testing::attr("to", int64_t{kDouble});
  add_node(body, "Mul", {"s_out", "i_d"}, {"scan"});
  add_node(body, "Identity", {m_constant ? "always" : "c_in"}, {"c_out"});
  typed_value(body.add_output(), "c_out", kBool, {});
  typed_value(body.add_output(), "s_out", kDouble, {2});
  typed_value(body.add_output(), "scan", kDouble, {2});
  auto* loop = add_node(g, "Loop", {"M", cond, "s0"}, {"s_final", "history"});
  loop->set_name("loop");
  graph_attr(loop, "body", body);
  add_node(g, "Mul", {"history", "r"}, {"weighted"});
  add_node(g, "Add", {"weighted", "s_final"}, {"y"});
  g.add_output()->set_name("y");
  return model_of(g);
}

NamedTensors loop_feeds(int64_t trips) {
  std::vector<double> r;
  for (int64_t k = 0; k < 2 * trips; ++k) r.push_back(0.5 - 0.3 * static_cast<double>(k));
  return {{"s0", vec({0.2, -0.6})}, {"w", vec({0.9, 1.1})}, {"r", Tensor::from_vector<double>({trips, 2}, r)}};
}

TEST(LoopGradient, UnrolledLoopMatchesFiniteDifferences) {
  expect_gradients_match(loop_model(3), {"s0", "w", "r"}, loop_feeds(3));
  // Opset 11: the scan outputs are stacked by Unsqueeze with an axes attribute.
  onnx::ModelProto m = loop_model(3);
  m.mutable_opset_import(0)->set_version(11);
  expect_gradients_match(m, {"s0", "w", "r"}, loop_feeds(3));
}

TEST(LoopGradient, TripCountFromAConstantNodeAndAConstantCondition) {
  expect_gradients_match(loop_model(4, true), {"s0", "w", "r"}, loop_feeds(4));
}

TEST(LoopGradient, ZeroIterations) {
  // y = s_final + sum(history) with an empty history: dy/ds0 = 1, dy/dw = 0.
  onnx::ModelProto m = loop_model(0);
  auto& g = *m.mutable_graph();
  g.mutable_node()->DeleteSubrange(g.node_size() - 2, 2);
  *add_node(g, "ReduceSum", {"history"}, {"history_sum"})->add_attribute() = testing::attr("keepdims", int64_t{0});
  add_node(g, "Add", {"s_final", "history_sum"}, {"y"});
  g.mutable_input()->DeleteSubrange(2, 1);  // r
  const auto out = expect_gradients_match(m, {"s0", "w"}, {{"s0", vec({0.2, -0.6})}, {"w", vec({0.9, 1.1})}});
  EXPECT_EQ(out.at("d_s0").to_double_vector(), std::vector<double>(2, 1.0));
  EXPECT_EQ(out.at("d_w").to_double_vector(), std::vector<double>(2, 0.0));
}

// ---- Scan ----

// Scan (opset 16) over xs [3, 4] along axis 1 (4 steps) backwards and ws [4, 3] along axis 0
// forwards, with state h [3]: h = tanh(h * w_t + x_t); scan outputs h * x_t stacked along axis 1
// (then [3, 4]) in reverse, and h + w_t along axis 0 ([4, 3]). y = outputs weighted + h_final.
onnx::ModelProto scan_model(int64_t steps) {
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "h0", kDouble, {3});
  typed_value(g.add_input(), "xs", kDouble, {3, steps});
  typed_value(g.add_input(), "ws", kDouble, {steps, 3});
  onnx::GraphProto body;
  body.set_name("body");
  typed_value(body.add_input(), "h_in", kDouble, {3});
  typed_value(body.add_input(), "x_t", kDouble, {3});
  typed_value(body.add_input(), "w_t", kDouble, {3});
  add_node(body, "Mul", {"h_in", "w_t"}, {"hw"});
  add_node(body, "Add", {"hw", "x_t"}, {"pre"});
  add_node(body, "Tanh", {"pre"}, {"h_out"});
  add_node(body, "Mul", {"h_out", "x_t"}, {"out_a"});
  add_node(body, "Add", {"h_out", "w_t"}, {"out_b"});
  typed_value(body.add_output(), "h_out", kDouble, {3});
  typed_value(body.add_output(), "out_a", kDouble, {3});
  typed_value(body.add_output(), "out_b", kDouble, {3});
  auto* scan = add_node(g, "Scan", {"h0", "xs", "ws"}, {"h_final", "a", "b"});
  scan->set_name("scan");
  graph_attr(scan, "body", body);
  *scan->add_attribute() = testing::attr("num_scan_inputs", int64_t{2});
  *scan->add_attribute() = testing::attr("scan_input_axes", std::vector<int64_t>{1, 0});
  *scan->add_attribute() = testing::attr("scan_input_directions", std::vector<int64_t>{1, 0});
  *scan->add_attribute() = testing::attr("scan_output_axes", std::vector<int64_t>{-1, 0});
  *scan->add_attribute() = testing::attr("scan_output_directions", std::vector<int64_t>{1, 0});
  add_node(g, "Transpose", {"b"}, {"bt"});  // [3, steps] like a
  add_node(g, "Mul", {"a", "bt"}, {"ab"});
  *add_node(g, "ReduceSum", {"ab"}, {"abs"})->add_attribute() = testing::attr("keepdims", int64_t{0});
  add_node(g, "Add", {"h_final", "abs"}, {"y"});
  g.add_output()->set_name("y");
  onnx::ModelProto m = model_of(g);
  m.mutable_opset_import(0)->set_version(16);
  return m;
}

NamedTensors scan_feeds(int64_t steps) {
  std::vector<double> x, w;
  for (int64_t k = 0; k < 3 * steps; ++k) {
    x.push_back(0.4 - 0.15 * static_cast<double>(k % 7));
    w.push_back(0.3 + 0.1 * static_cast<double>(k % 5));
  }
  return {{"h0", vec({0.1, -0.5, 0.3})},
          {"xs", Tensor::from_vector<double>({3, steps}, x)},
          {"ws", Tensor::from_vector<double>({steps, 3}, w)}};
}

TEST(ScanGradient, UnrolledScanMatchesFiniteDifferences) {
  expect_gradients_match(scan_model(4), {"h0", "xs", "ws"}, scan_feeds(4));
  // Opset 11: the stacking Unsqueeze takes an axes attribute.
  onnx::ModelProto m = scan_model(2);
  m.mutable_opset_import(0)->set_version(11);
  expect_gradients_match(m, {"h0", "xs", "ws"}, scan_feeds(2));
}

TEST(ScanGradient, AScanOfUnknownLengthIsAnErrorNamingTheNodeAndWhy) {
  onnx::ModelProto m = scan_model(4);
  auto* xs = m.mutable_graph()->mutable_input(1)->mutable_type()->mutable_tensor_type()->mutable_shape();
  xs->mutable_dim(1)->set_dim_param("T");  // the scan length is a symbolic dim
  auto* ws = m.mutable_graph()->mutable_input(2)->mutable_type()->mutable_tensor_type()->mutable_shape();
  ws->mutable_dim(0)->set_dim_param("T");
  const std::string e = testing::error_of([&] { runtime::Session s(with_gradient(m, {"h0"})); });
  EXPECT_NE(e.find("cannot differentiate through node 'scan' (Scan)"), std::string::npos) << e;
  EXPECT_NE(e.find("symbolic dim"), std::string::npos) << e;
}

TEST(LoopGradient, NestedLoopsAndAnIfInTheBody) {
  // Outer body (3 iterations): t = inner Loop (2 iterations of t = t * w + s) from s; then
  // s = If(i == 1, then: t * t, else: t + s). The inner body and the If read the outer body's
  // values and w from the main graph.
  onnx::GraphProto g;
  g.set_name("main");
  typed_value(g.add_input(), "s0", kDouble, {2});
  typed_value(g.add_input(), "w", kDouble, {2});
  int64_initializer(g, "three", 3);
  int64_initializer(g, "two", 2);
  int64_initializer(g, "one", 1);
  onnx::GraphProto inner = loop_body("inner", {"j", "ci", "t_in"}, "t_out");
  add_node(inner, "Mul", {"t_in", "w"}, {"tw"});
  add_node(inner, "Add", {"tw", "s_in"}, {"t_out"});
  onnx::GraphProto then_g = subgraph("then", {"tt"});
  add_node(then_g, "Mul", {"t", "t"}, {"tt"});
  onnx::GraphProto else_g = subgraph("else", {"ts"});
  add_node(else_g, "Add", {"t", "s_in"}, {"ts"});
  onnx::GraphProto outer = loop_body("outer", {"i", "co", "s_in"}, "s_out");
  graph_attr(add_node(outer, "Loop", {"two", "", "s_in"}, {"t"}), "body", inner);
  add_node(outer, "Equal", {"i", "one"}, {"is_one"});
  if_node(outer, "is_one", {"s_out"}, then_g, else_g);
  graph_attr(add_node(g, "Loop", {"three", "", "s0"}, {"y"}), "body", outer);
  g.add_output()->set_name("y");
  expect_gradients_match(model_of(g), {"s0", "w"}, {{"s0", vec({0.3, -0.2})}, {"w", vec({0.7, 0.4})}});
}

std::string error_of(const onnx::ModelProto& m) {
  try {
    runtime::Session s(m);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(LoopGradient, LoopsThatCannotBeUnrolledAreErrorsNamingTheNodeAndWhy) {
  {
    // M fed at run time.
    onnx::ModelProto m = loop_model(3);
    auto& g = *m.mutable_graph();
    g.clear_initializer();
    typed_value(g.add_input(), "M", kInt64, {});
    const std::string e = error_of(with_gradient(m, {"w"}));
    EXPECT_NE(e.find("node 'loop' (Loop)"), std::string::npos) << e;
    EXPECT_NE(e.find("the trip count is not known when the graph is planned (M 'M'"), std::string::npos) << e;
  }
  {
    // M omitted.
    onnx::ModelProto m = loop_model(3);
    m.mutable_graph()->mutable_node(0)->set_input(0, "");
    const std::string e = error_of(with_gradient(m, {"w"}));
    EXPECT_NE(e.find("the trip count is not known when the graph is planned (input M is omitted)"), std::string::npos) << e;
  }
  {
    // The body's condition computed from data.
    onnx::ModelProto m = loop_model(3);
    auto* body = m.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
    auto* sum = add_node(*body, "ReduceSum", {"s_out"}, {"total"});
    *sum->add_attribute() = testing::attr("keepdims", int64_t{0});
    add_node(*body, "Less", {"total", "total"}, {"data_cond"});
    body->mutable_output(0)->set_name("data_cond");
    const std::string e = error_of(with_gradient(m, {"w"}));
    EXPECT_NE(e.find("node 'loop' (Loop)"), std::string::npos) << e;
    EXPECT_NE(e.find("the loop ends on a condition computed from data (the body's condition output 'data_cond'"),
              std::string::npos)
        << e;
  }
  {
    // The outer condition fed.
    onnx::ModelProto m = loop_model(3);
    auto& g = *m.mutable_graph();
    typed_value(g.add_input(), "go", kBool, {});
    g.mutable_node(0)->set_input(1, "go");
    const std::string e = error_of(with_gradient(m, {"w"}));
    EXPECT_NE(e.find("the loop ends on a condition computed from data (input cond 'go'"), std::string::npos) << e;
  }
}

TEST(LoopGradient, ALoopOffTheGradientPathStaysALoop) {
  // z = Loop with a fed trip count; y = s0 * w does not read z.
  onnx::ModelProto m = loop_model(3);
  auto& g = *m.mutable_graph();
  g.clear_initializer();
  typed_value(g.add_input(), "M", kInt64, {});
  g.mutable_node()->DeleteSubrange(g.node_size() - 2, 2);
  g.mutable_input()->DeleteSubrange(2, 1);  // r
  add_node(g, "Mul", {"s0", "w"}, {"y"});
  g.add_output()->set_name("s_final");
  runtime::Session s(with_gradient(m, {"s0", "w"}));
  for (const int64_t trips : {1, 2}) {
    NamedTensors feeds = loop_feeds(trips);
    feeds.erase("r");
    feeds["M"] = Tensor::scalar<int64_t>(trips);
    const auto out = s.run(feeds);
    expect_close(out.at("d_s0"), vec({0.9, 1.1}));
    // The trip count still comes from the feed.
    std::vector<double> state{0.2, -0.6};
    for (int64_t k = 0; k < trips; ++k) {
      state[0] = state[0] * 0.9 + std::sin(state[0]) / 2;
      state[1] = state[1] * 1.1 + std::sin(state[1]) / 2;
    }
    expect_close(out.at("s_final"), vec(state), 1e-12, 1e-12);
  }
}

// ---- training ----

// y [N, 2] = If(sum(x) > 0, then: tanh(x W1 + b), else: x W2 + b): W1, W2 and b are read inside
// the branches only.
onnx::ModelProto if_regression() {
  onnx::GraphProto g;
  g.set_name("if_regression");
  typed_value(g.add_input(), "x", kDouble, {-1, 3});
  io::tensor_to_proto(Tensor::from_vector<double>({3, 2}, {0.1, -0.2, 0.3, 0.4, -0.5, 0.6}), "W1", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<double>({3, 2}, {-0.3, 0.2, 0.1, -0.4, 0.5, 0.2}), "W2", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<double>({2}, {0.05, -0.1}), "b", *g.add_initializer());
  io::tensor_to_proto(Tensor::scalar(0.0), "zero", *g.add_initializer());
  *add_node(g, "ReduceSum", {"x"}, {"total"})->add_attribute() = testing::attr("keepdims", int64_t{0});
  add_node(g, "Greater", {"total", "zero"}, {"positive"});
  onnx::GraphProto then_g = subgraph("then", {"t"});
  add_node(then_g, "MatMul", {"x", "W1"}, {"xw1"});
  add_node(then_g, "Add", {"xw1", "b"}, {"z1"});
  add_node(then_g, "Tanh", {"z1"}, {"t"});
  onnx::GraphProto else_g = subgraph("else", {"e"});
  add_node(else_g, "MatMul", {"x", "W2"}, {"xw2"});
  add_node(else_g, "Add", {"xw2", "b"}, {"e"});
  if_node(g, "positive", {"y"}, then_g, else_g);
  typed_value(g.add_output(), "y", kDouble, {-1, 2});
  onnx::ModelProto m = model_of(g);
  m.mutable_opset_import()->RemoveLast();
  return m;
}

// The mean squared error of the inference model on (x, label) with `params` replaced.
double mse(const onnx::ModelProto& model, const NamedTensors& params, const Tensor& x, const Tensor& label) {
  onnx::ModelProto m = model;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    const auto it = params.find(t.name());
    if (it != params.end()) io::tensor_to_proto(it->second, t.name(), t);
  }
  const auto y = runtime::Session(m).run({{"x", x}}).at("y").to_double_vector();
  const auto l = label.to_double_vector();
  double total = 0;
  for (size_t i = 0; i < y.size(); ++i) total += (y[i] - l[i]) * (y[i] - l[i]);
  return total / static_cast<double>(y.size());
}

TEST(IfTraining, MakeTrainableStepsMatchFiniteDifferenceGradientDescent) {
  const onnx::ModelProto model = if_regression();
  training::MakeTrainableOptions options;
  options.loss = training::Loss::Mse;
  options.optimizer = training::Optimizer::Sgd;
  options.lr = 0.1;
  training::TrainingSession session(training::make_trainable(model, options));
  for (const char* p : {"W1", "W2", "b"}) ASSERT_TRUE(session.state().contains(p)) << p << " is not trainable";
  const Tensor label = Tensor::from_vector<double>({2, 2}, {0.5, -0.25, 1.0, 0.0});
  // The first batch takes the then_branch, the second the else_branch.
  for (const double sign : {1.0, -1.0}) {
    SCOPED_TRACE(sign);
    const Tensor x = Tensor::from_vector<double>({2, 3}, {0.2 * sign, 0.5 * sign, -0.1 * sign, 0.3 * sign, 0.1 * sign, 0.4 * sign});
    NamedTensors before;
    for (const char* p : {"W1", "W2", "b"}) before[p] = session.state().at(p).clone();
    session.step({{"x", x}, {"label", label}});
    constexpr double eps = 1e-6, lr = 0.1;
    for (const char* p : {"W1", "W2", "b"}) {
      const auto old_values = before.at(p).to_double_vector();
      const auto new_values = session.state().at(p).to_double_vector();
      for (size_t j = 0; j < old_values.size(); ++j) {
        NamedTensors plus = before, minus = before;
        plus[p] = before.at(p).clone();
        minus[p] = before.at(p).clone();
        plus[p].data<double>()[j] += eps;
        minus[p].data<double>()[j] -= eps;
        const double grad = (mse(model, plus, x, label) - mse(model, minus, x, label)) / (2 * eps);
        EXPECT_NEAR(new_values[j], old_values[j] - lr * grad, 1e-8) << p << "[" << j << "]";
      }
    }
    // The branch not taken leaves its weights alone.
    const char* untouched = sign > 0 ? "W2" : "W1";
    EXPECT_EQ(session.state().at(untouched).to_double_vector(), before.at(untouched).to_double_vector());
  }
}

}  // namespace
}  // namespace onnxtrain
