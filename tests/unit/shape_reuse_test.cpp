// Shape arithmetic computed once per plan (runtime/plan.h): a node whose inputs are shape roots'
// outputs (Shape, Size), initializers and other such nodes' outputs takes the outputs it kept
// when its inputs are what they were, and runs again whenever they are not: a shape read off a
// value whose shape depends on data, a replaced initializer, a changed input shape.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "ir/graph.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/plan.h"
#include "test_util.h"

namespace onnxtrain::runtime {
namespace {

using namespace onnxtrain::testing;

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

// One Plan over a hand-built graph, run with named feeds the way GraphRunner runs it (the
// graph's initializers bound first, then the feeds).
struct PlanRun {
  ir::Graph graph;
  OpsetMap opsets{{"", 17}};
  Plan plan;
  uint64_t runs = 0;
  explicit PlanRun(const onnx::GraphProto& g)
      : graph(ir::Graph::from_proto(g, "test", ".")), plan(graph, opsets) {}
  NamedTensors run(const NamedTensors& feeds) {
    std::vector<Value> values(graph.values().size());
    for (const auto& [id, tensor] : graph.initializers()) values[static_cast<size_t>(id)] = tensor;
    for (const auto& [name, tensor] : feeds) values[static_cast<size_t>(graph.find(name))] = tensor;
    ops::RunContext context;
    context.run_index = runs++;  // random ops draw anew each run
    plan.run(values, context);
    NamedTensors out;
    for (ir::ValueId id : graph.outputs()) out[graph.value(id).name] = values[static_cast<size_t>(id)].tensor();
    return out;
  }
};

// Y = Reshape(X, [X.shape[0], -1, 2]) the way torch.onnx.export writes it: Shape, Gather by a
// Constant index, Unsqueeze by a Constant axis, Concat with a Constant [-1, 2].
onnx::GraphProto exporter_reshape() {
  onnx::GraphProto g;
  g.set_name("reshape");
  typed_value(g.add_input(), "X", kFloat, {-1, 6});
  add_node(g, "Shape", {"X"}, {"shape"});
  add_constant_node(g, "zero", Tensor::scalar<int64_t>(0));
  add_node(g, "Gather", {"shape", "zero"}, {"batch"});
  add_constant_node(g, "axes", i64({0}));
  add_node(g, "Unsqueeze", {"batch", "axes"}, {"batch_1d"});
  add_constant_node(g, "rest", i64({-1, 2}));
  add_node(g, "Concat", {"batch_1d", "rest"}, {"target"})->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
  add_node(g, "Reshape", {"X", "target"}, {"Y"});
  typed_value(g.add_output(), "Y", kFloat, {});
  return g;
}

TEST(ShapeReuse, ExporterShapeArithmeticRunsOnceAndFollowsTheInputShape) {
  PlanRun p(exporter_reshape());
  const NamedTensors first = p.run({{"X", iota(Shape{2, 6})}});
  EXPECT_EQ(p.plan.steps_reused(), 0u);
  EXPECT_EQ(first.at("Y").shape(), (Shape{2, 3, 2}));
  const NamedTensors second = p.run({{"X", iota(Shape{2, 6})}});
  EXPECT_EQ(p.plan.steps_reused(), 6u);  // three Constants, Gather, Unsqueeze, Concat; Shape and Reshape ran
  expect_close(second.at("Y"), iota(Shape{2, 3, 2}), 0, 0);

  const NamedTensors other = p.run({{"X", iota(Shape{4, 6})}});  // another batch: the chain runs again
  EXPECT_EQ(p.plan.steps_reused(), 3u);  // the Constants only
  EXPECT_EQ(other.at("Y").shape(), (Shape{4, 3, 2}));
  p.run({{"X", iota(Shape{4, 6})}});
  EXPECT_EQ(p.plan.steps_reused(), 6u);
  const NamedTensors back = p.run({{"X", iota(Shape{2, 6})}});
  EXPECT_EQ(back.at("Y").shape(), (Shape{2, 3, 2}));
}

TEST(ShapeReuse, AShapeThatDependsOnDataIsReadAgainEveryRun) {
  // n = Size(NonZero(X)) / 1, then ConstantOfShape([n]): the same input shape, different counts.
  onnx::GraphProto g;
  g.set_name("nonzero");
  typed_value(g.add_input(), "X", kFloat, {4});
  add_node(g, "NonZero", {"X"}, {"where"});
  add_node(g, "Size", {"where"}, {"count"});
  add_constant_node(g, "axes", i64({0}));
  add_node(g, "Unsqueeze", {"count", "axes"}, {"count_1d"});
  add_node(g, "ConstantOfShape", {"count_1d"}, {"Y"});
  typed_value(g.add_output(), "Y", kFloat, {});
  PlanRun p(g);
  EXPECT_EQ(p.run({{"X", f32(Shape{4}, {1, 0, 2, 0})}}).at("Y").shape(), (Shape{2}));
  EXPECT_EQ(p.run({{"X", f32(Shape{4}, {1, 0, 2, 0})}}).at("Y").shape(), (Shape{2}));
  EXPECT_EQ(p.plan.steps_reused(), 2u);  // the Constant and the Unsqueeze; Y is a graph output
  EXPECT_EQ(p.run({{"X", f32(Shape{4}, {1, 3, 2, 5})}}).at("Y").shape(), (Shape{4}));
  EXPECT_EQ(p.plan.steps_reused(), 1u);  // the count changed: only the Constant
  EXPECT_EQ(p.run({{"X", f32(Shape{4}, {0, 0, 0, 0})}}).at("Y").shape(), (Shape{0}));
}

TEST(ShapeReuse, AReplacedInitializerIsReadAgain) {
  // Y = Expand(X, Concat(Shape(X)[0:1], k)) with k an initializer a run may replace (an
  // initializer that is also a graph input: the feed is its value for that run).
  onnx::GraphProto g;
  g.set_name("initializer");
  typed_value(g.add_input(), "X", kFloat, {-1, 1});
  typed_value(g.add_input(), "k", kInt64, {1});
  io::tensor_to_proto(i64({3}), "k", *g.add_initializer());
  add_node(g, "Shape", {"X"}, {"shape"})->add_attribute()->CopyFrom(attr("end", int64_t{1}));
  add_node(g, "Concat", {"shape", "k"}, {"target"})->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
  add_node(g, "Expand", {"X", "target"}, {"Y"});
  typed_value(g.add_output(), "Y", kFloat, {});
  PlanRun p(g);
  EXPECT_EQ(p.run({{"X", iota(Shape{2, 1})}}).at("Y").shape(), (Shape{2, 3}));
  EXPECT_EQ(p.run({{"X", iota(Shape{2, 1})}}).at("Y").shape(), (Shape{2, 3}));
  EXPECT_EQ(p.plan.steps_reused(), 1u);  // the Concat
  EXPECT_EQ(p.run({{"X", iota(Shape{2, 1})}, {"k", i64({5})}}).at("Y").shape(), (Shape{2, 5}));
  EXPECT_EQ(p.plan.steps_reused(), 0u);
  EXPECT_EQ(p.run({{"X", iota(Shape{2, 1})}}).at("Y").shape(), (Shape{2, 3}));
}

TEST(ShapeReuse, ARunThatFailsLeavesNothingKept) {
  // Y = Reshape(X, Shape(Z)), then W = ConstantOfShape(Shape(X) * 2): the Mul comes after the
  // Reshape, which fails unless X and Z hold as many elements.
  onnx::GraphProto g;
  g.set_name("failing");
  typed_value(g.add_input(), "X", kFloat, {-1});
  typed_value(g.add_input(), "Z", kFloat, {-1, -1});
  add_node(g, "Shape", {"X"}, {"x_shape"});
  add_node(g, "Shape", {"Z"}, {"z_shape"});
  add_node(g, "Reshape", {"X", "z_shape"}, {"Y"});
  add_constant_node(g, "two", i64({2}));
  add_node(g, "Mul", {"x_shape", "two"}, {"doubled"});
  add_node(g, "ConstantOfShape", {"doubled"}, {"W"});
  typed_value(g.add_output(), "Y", kFloat, {});
  typed_value(g.add_output(), "W", kFloat, {});
  PlanRun p(g);
  EXPECT_EQ(p.run({{"X", iota(Shape{3})}, {"Z", iota(Shape{3, 1})}}).at("W").shape(), (Shape{6}));
  // Shape(X) becomes [4] in a run that fails before the Mul ...
  EXPECT_TRUE(throws_with([&] { p.run({{"X", iota(Shape{4})}, {"Z", iota(Shape{3, 1})}}); }, "Reshape"));
  // ... so in the next run Shape(X) is what the run before saw, yet the Mul's kept [6] is older.
  EXPECT_EQ(p.run({{"X", iota(Shape{4})}, {"Z", iota(Shape{4, 1})}}).at("W").shape(), (Shape{8}));
  EXPECT_EQ(p.plan.steps_reused(), 0u);
  EXPECT_EQ(p.run({{"X", iota(Shape{4})}, {"Z", iota(Shape{4, 1})}}).at("W").shape(), (Shape{8}));
  EXPECT_EQ(p.plan.steps_reused(), 2u);  // the Constant and the Mul
}

TEST(ShapeReuse, RandomNodesLargeValuesAndGraphOutputsAreNotKept) {
  onnx::GraphProto g;
  g.set_name("not kept");
  typed_value(g.add_input(), "X", kFloat, {-1, -1});
  add_node(g, "Shape", {"X"}, {"shape"});
  // 300 x 300 elements: over kMaxReusedElements, so computed every run.
  add_node(g, "ConstantOfShape", {"shape"}, {"big"});
  add_node(g, "RandomUniformLike", {"big"}, {"noise"});
  add_node(g, "ReduceSum", {"noise"}, {"total"})->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
  add_node(g, "Identity", {"shape"}, {"shape_out"});  // a graph output
  typed_value(g.add_output(), "total", kFloat, {});
  typed_value(g.add_output(), "shape_out", kInt64, {});
  static_assert(300 * 300 > Plan::kMaxReusedElements);
  PlanRun p(g);
  const Tensor x = Tensor::zeros(DataType::Float32, Shape{300, 300});
  const float first = p.run({{"X", x}}).at("total").data<float>()[0];
  NamedTensors second = p.run({{"X", x}});
  EXPECT_EQ(p.plan.steps_reused(), 0u);
  EXPECT_NE(second.at("total").data<float>()[0], first);  // a new draw, not the kept sum
  second.at("shape_out").data<int64_t>()[0] = 7;  // the caller owns what it was given
  EXPECT_EQ(p.run({{"X", x}}).at("shape_out").data<int64_t>()[0], 300);
}

TEST(ShapeReuse, APlanKeepsAtMostItsLimitInAll) {
  // 20 masks of X's shape, ConstantOfShape(Shape(X)), each summed into a graph output: with X of
  // 65536 elements the Shape's kept output takes 1 element of the plan's limit, the first 15
  // masks what is left but 65535, and the other 5 are made every run.
  static_assert(Plan::kMaxReusedElementsPerPlan == 16 * 65536);
  onnx::GraphProto g;
  g.set_name("limit");
  typed_value(g.add_input(), "X", kFloat, {-1});
  add_node(g, "Shape", {"X"}, {"shape"});
  for (int i = 0; i < 20; ++i) {
    const std::string mask = "mask" + std::to_string(i), sum = "sum" + std::to_string(i);
    auto* fill = add_node(g, "ConstantOfShape", {"shape"}, {mask})->add_attribute();
    fill->set_name("value");
    fill->set_type(onnx::AttributeProto::TENSOR);
    io::tensor_to_proto(f32(Shape{1}, {static_cast<float>(i)}), "", *fill->mutable_t());
    add_node(g, "ReduceSum", {mask}, {sum})->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
    typed_value(g.add_output(), sum, kFloat, {});
  }
  PlanRun p(g);
  const Tensor x = Tensor::zeros(DataType::Float32, Shape{65536});
  p.run({{"X", x}});
  const NamedTensors out = p.run({{"X", x}});
  EXPECT_EQ(p.plan.steps_reused(), 15u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(out.at("sum" + std::to_string(i)).data<float>()[0], 65536.0f * static_cast<float>(i));
}

TEST(ShapeReuse, SessionRunsAgreeAcrossShapes) {
  onnx::ModelProto model = empty_model("reshape");
  *model.mutable_graph() = exporter_reshape();
  Session session(model);
  for (int64_t batch : {2, 2, 5, 2, 5, 5}) {
    const NamedTensors out = session.run({{"X", iota(Shape{batch, 6})}});
    expect_close(out.at("Y"), iota(Shape{batch, 3, 2}), 0, 0);
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
