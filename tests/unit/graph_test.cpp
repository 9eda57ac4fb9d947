#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "ir/graph.h"
#include "onnxtrain/error.h"
#include "runtime/plan.h"

namespace onnxtrain::ir {
namespace {

void add_node(onnx::GraphProto& g, const std::string& op, std::vector<std::string> inputs,
              std::vector<std::string> outputs, const std::string& name = "") {
  auto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
}

void add_input(onnx::GraphProto& g, const std::string& name) {
  auto* v = g.add_input();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("N");
}

std::string error_of(const onnx::GraphProto& g) {
  try {
    Graph::from_proto(g, "m.onnx", {});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The node names in the order the graph runs them.
std::vector<std::string> node_order(const Graph& graph) {
  std::vector<std::string> order;
  for (NodeId id : graph.topological_order()) order.push_back(graph.node(id).name);
  return order;
}

TEST(Graph, SortsUnsortedNodesTopologically) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Relu", {"b"}, {"c"}, "second");
  add_node(g, "Neg", {"x"}, {"a"}, "first");
  add_node(g, "Abs", {"a"}, {"b"}, "middle");
  g.add_output()->set_name("c");
  Graph graph = Graph::from_proto(g, "m.onnx", {});
  EXPECT_EQ(node_order(graph), (std::vector<std::string>{"first", "middle", "second"}));
  EXPECT_EQ(graph.value(graph.find("x")).type.to_string(), "float32[N]");
}

// A Shape or Size node runs as soon as its input exists, so that a backward pass reading the
// shape of a forward value does not keep the value alive until then; the other nodes keep
// their proto order.
TEST(Graph, RunsShapeAndSizeNodesRightAfterTheirInput) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Neg", {"x"}, {"a"}, "forward1");
  add_node(g, "Abs", {"a"}, {"b"}, "forward2");
  add_node(g, "Relu", {"b"}, {"c"}, "backward1");
  add_node(g, "Shape", {"a"}, {"shape_a"}, "shape_of_a");
  add_node(g, "Size", {"x"}, {"size_x"}, "size_of_x");
  add_node(g, "Reshape", {"c", "shape_a"}, {"d"}, "backward2");
  g.add_output()->set_name("d");
  g.add_output()->set_name("size_x");
  Graph graph = Graph::from_proto(g, "m.onnx", {});
  EXPECT_EQ(node_order(graph), (std::vector<std::string>{"size_of_x", "forward1", "shape_of_a", "forward2", "backward1",
                                             "backward2"}));
}

TEST(Graph, RejectsCyclesNamingANode) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Add", {"x", "b"}, {"a"}, "n1");
  add_node(g, "Relu", {"a"}, {"b"}, "n2");
  g.add_output()->set_name("b");
  const std::string message = error_of(g);
  EXPECT_NE(message.find("cycle"), std::string::npos) << message;
  EXPECT_NE(message.find("m.onnx"), std::string::npos) << message;
}

TEST(Graph, RejectsUndefinedInputsNamingNodeAndTensor) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Add", {"x", "ghost"}, {"y"}, "adder");
  g.add_output()->set_name("y");
  const std::string message = error_of(g);
  EXPECT_NE(message.find("'ghost'"), std::string::npos) << message;
  EXPECT_NE(message.find("'adder' (Add)"), std::string::npos) << message;
}

TEST(Graph, RejectsNamesAssignedTwice) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Relu", {"x"}, {"y"}, "a");
  add_node(g, "Neg", {"x"}, {"y"}, "b");
  g.add_output()->set_name("y");
  EXPECT_NE(error_of(g).find("already produced"), std::string::npos);

  onnx::GraphProto h;
  add_input(h, "x");
  add_node(h, "Relu", {"x"}, {"x"}, "a");
  EXPECT_NE(error_of(h).find("graph input"), std::string::npos);

  onnx::GraphProto k;
  add_input(k, "x");
  add_input(k, "x");
  EXPECT_NE(error_of(k).find("twice"), std::string::npos);
}

TEST(Graph, RecordsSubgraphReadsAsImplicitInputs) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "cond");
  add_input(g, "x");
  add_node(g, "If", {"cond"}, {"y"}, "branch");
  auto* then_branch = g.mutable_node(0)->add_attribute();
  then_branch->set_name("then_branch");
  then_branch->set_type(onnx::AttributeProto::GRAPH);
  add_node(*then_branch->mutable_g(), "Relu", {"x"}, {"t"});
  then_branch->mutable_g()->add_output()->set_name("t");
  g.add_output()->set_name("y");
  Graph graph = Graph::from_proto(g, "m.onnx", {});
  const Node& node = graph.node(0);
  ASSERT_EQ(node.implicit_inputs.size(), 1u);
  EXPECT_EQ(graph.value(node.implicit_inputs[0]).name, "x");
  // Outer-scope names resolve inside a subgraph built on its own.
  Graph sub = Graph::from_proto(then_branch->g(), "m.onnx", {}, {"x"});
  EXPECT_TRUE(sub.value(sub.find("x")).is_outer_scope);
}

TEST(Graph, KeepsSequenceAndOptionalTypesAndRejectsMaps) {
  onnx::GraphProto g;
  g.set_name("main");
  auto* seq = g.add_input();
  seq->set_name("s");
  seq->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::FLOAT);
  add_node(g, "Identity", {"s"}, {"y"});
  g.add_output()->set_name("y");
  g.mutable_output(0)->mutable_type()->mutable_optional_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::INT64);
  const Graph graph = Graph::from_proto(g, "m.onnx", {});
  EXPECT_EQ(graph.value(graph.find("s")).value_type.to_string(), "sequence(float32)");
  EXPECT_EQ(graph.value(graph.find("y")).value_type.to_string(), "optional(int64)");
  g.mutable_input(0)->mutable_type()->mutable_map_type()->set_key_type(onnx::TensorProto::STRING);
  try {
    Graph::from_proto(g, "m.onnx", {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph input 's' has a map type"), std::string::npos) << e.what();
  }
}

TEST(Plan, ReleasesValuesAfterTheirLastUse) {
  onnx::GraphProto g;
  g.set_name("main");
  add_input(g, "x");
  add_node(g, "Neg", {"x"}, {"a"});
  add_node(g, "Abs", {"a"}, {"b"});
  add_node(g, "Relu", {"b"}, {"c"});
  g.add_output()->set_name("c");
  Graph graph = Graph::from_proto(g, "m.onnx", {});
  runtime::Plan plan(graph, {{"", 17}});
  std::vector<onnxtrain::Value> values(graph.values().size());
  values[static_cast<size_t>(graph.find("x"))] = Tensor::from_vector<float>({2}, {1, -2});
  plan.run(values, ops::RunContext{});
  EXPECT_FALSE(values[static_cast<size_t>(graph.find("a"))].defined());
  EXPECT_FALSE(values[static_cast<size_t>(graph.find("b"))].defined());
  EXPECT_FALSE(values[static_cast<size_t>(graph.find("x"))].defined());
  ASSERT_TRUE(values[static_cast<size_t>(graph.find("c"))].defined());
  EXPECT_EQ(values[static_cast<size_t>(graph.find("c"))].tensor().to_double_vector(), (std::vector<double>{1, 2}));  // Relu(Abs(Neg(x)))
}

}  // namespace
}  // namespace onnxtrain::ir
