// If and Loop (runtime/control_flow.cpp) beyond the backend tests: subgraphs reading values of
// the enclosing graphs, a Loop nested in an If, scan outputs, zero iterations, and errors.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain::runtime {
namespace {

using testing::add_node;
using testing::graph_attr;
using testing::typed_value;

constexpr int kFloat = onnx::TensorProto::FLOAT, kBool = onnx::TensorProto::BOOL, kInt64 = onnx::TensorProto::INT64;

// y = if c: x * x else: x + x, each branch reading x from the enclosing graph.
onnx::ModelProto if_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto& g = *m.mutable_graph();
  g.set_name("main");
  typed_value(g.add_input(), "c", kBool, {});
  typed_value(g.add_input(), "x", kFloat, {3});
  onnx::GraphProto then_g, else_g;
  then_g.set_name("then");
  add_node(then_g, "Mul", {"x", "x"}, {"t"});
  typed_value(then_g.add_output(), "t", kFloat, {3});
  else_g.set_name("else");
  add_node(else_g, "Add", {"x", "x"}, {"e"});
  typed_value(else_g.add_output(), "e", kFloat, {3});
  auto* n = add_node(g, "If", {"c"}, {"y"});
  graph_attr(n, "then_branch", then_g);
  graph_attr(n, "else_branch", else_g);
  typed_value(g.add_output(), "y", kFloat, {3});
  return m;
}

TEST(If, RunsTheBranchTheConditionPicksWithEnclosingValues) {
  Session s(if_model());
  const Tensor x = Tensor::from_vector<float>({3}, {1, 2, 3});
  testing::expect_close(s.run({{"c", Tensor::scalar(true)}, {"x", x}}).at("y"), Tensor::from_vector<float>({3}, {1, 4, 9}));
  testing::expect_close(s.run({{"c", Tensor::scalar(false)}, {"x", x}}).at("y"), Tensor::from_vector<float>({3}, {2, 4, 6}));
}

TEST(If, ErrorsNameTheNode) {
  onnx::ModelProto m = if_model();
  Session s(m);
  try {
    s.run({{"c", Tensor::from_vector<bool>({2}, {true, false})}, {"x", Tensor::from_vector<float>({3}, {1, 2, 3})}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must hold one element"), std::string::npos) << e.what();
  }
  // A branch with another number of outputs than the node.
  auto* else_g = m.mutable_graph()->mutable_node(0)->mutable_attribute(1)->mutable_g();
  typed_value(else_g->add_output(), "x", kFloat, {3});
  try {
    Session bad(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("then_branch has 1 and else_branch 2"), std::string::npos) << e.what();
  }
}

// Loop(M, cond, s0): s = s + step per iteration (step read from the enclosing graph), scan
// output the running s; stops at M iterations or when s exceeds `limit`.
onnx::ModelProto loop_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto& g = *m.mutable_graph();
  g.set_name("main");
  typed_value(g.add_input(), "M", kInt64, {});
  typed_value(g.add_input(), "cond", kBool, {});
  typed_value(g.add_input(), "s0", kFloat, {2});
  typed_value(g.add_input(), "step", kFloat, {2});
  typed_value(g.add_input(), "limit", kFloat, {});
  onnx::GraphProto body;
  body.set_name("body");
  typed_value(body.add_input(), "i", kInt64, {});
  typed_value(body.add_input(), "c_in", kBool, {});
  typed_value(body.add_input(), "s_in", kFloat, {2});
  add_node(body, "Add", {"s_in", "step"}, {"s_out"});
  add_node(body, "ReduceMax", {"s_out"}, {"top"})->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("keepdims");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(0);
    return a;
  }());
  add_node(body, "Less", {"top", "limit"}, {"c_out"});
  add_node(body, "Identity", {"s_out"}, {"scan"});
  typed_value(body.add_output(), "c_out", kBool, {});
  typed_value(body.add_output(), "s_out", kFloat, {2});
  typed_value(body.add_output(), "scan", kFloat, {2});
  graph_attr(add_node(g, "Loop", {"M", "cond", "s0"}, {"s_final", "history"}), "body", body);
  typed_value(g.add_output(), "s_final", kFloat, {2});
  auto* h = g.add_output();
  h->set_name("history");
  h->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  return m;
}

TEST(Loop, CarriesValuesStacksScanOutputsAndStops) {
  Session s(loop_model());
  const Tensor s0 = Tensor::from_vector<float>({2}, {0, 1}), step = Tensor::from_vector<float>({2}, {1, 2});
  auto feeds = [&](int64_t trips, bool cond, float limit) {
    return NamedTensors{{"M", Tensor::scalar<int64_t>(trips)}, {"cond", Tensor::scalar(cond)}, {"s0", s0},
                        {"step", step}, {"limit", Tensor::scalar(limit)}};
  };
  // Three iterations by the trip count.
  auto out = s.run(feeds(3, true, 100));
  testing::expect_close(out.at("s_final"), Tensor::from_vector<float>({2}, {3, 7}));
  testing::expect_close(out.at("history"), Tensor::from_vector<float>({3, 2}, {1, 3, 2, 5, 3, 7}));
  // The body's condition stops it: max(s) = 3, 5, 7 -> stops after the iteration that reaches 5.
  out = s.run(feeds(10, true, 5));
  testing::expect_close(out.at("s_final"), Tensor::from_vector<float>({2}, {2, 5}));
  EXPECT_EQ(out.at("history").dim(0), 2);
  // A false condition runs no iteration: the initial values, an empty scan output.
  out = s.run(feeds(10, false, 100));
  testing::expect_close(out.at("s_final"), s0);
  EXPECT_EQ(out.at("history").numel(), 0);
}

TEST(Loop, ATripCountOfAnotherTypeIsRejected) {
  Session s(loop_model());
  try {
    s.run({{"M", Tensor::scalar<float>(3)}, {"cond", Tensor::scalar(true)}, {"s0", Tensor::from_vector<float>({2}, {0, 0})},
           {"step", Tensor::from_vector<float>({2}, {1, 1})}, {"limit", Tensor::scalar(10.0f)}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects int64"), std::string::npos) << e.what();  // the feed check
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
