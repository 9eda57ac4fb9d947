// float32 Gemm, MatMul and ai.onnxtrain.MatMulAdd whose B is an initializer run oneDNN's matmul
// on a copy of B kept in the primitive's own layout, with the bias added by the primitive
// (ops/matmul.cpp ConstantWeightsProduct). Their values equal the float64 reference and the
// float32 path that reads B as a graph input (fed anew each run), for every layout of B and C,
// alpha / beta the fast path does not take, and a session that meets several row counts in turn
// (a kept copy per row count, reused when a count comes back). What counts as constant
// (KernelInit::input_is_constant): initializers no feed replaces and Constant nodes' outputs.
#include "ir/graph.h"
#include "onnxtrain/io.h"
#include "ops/kernel.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::expect_close;

constexpr int64_t kK = 67, kN = 45;

struct Layer {
  std::string op = "Gemm";  // Gemm, MatMul, or MatMul -> Add (fused into MatMulAdd)
  bool trans_b = false;     // Gemm: B stored [N, K]
  Shape c;                  // C's shape; empty: no C
  float alpha = 1.0f, beta = 1.0f;
  int x_rank = 2;           // MatMul: A [rows, K] or [2, rows / 2, K]
  const char* label = "";
};

// y = the layer of x; W (and C) initializers, or graph inputs with initializers when
// `weights_as_inputs` (then a run's feed replaces them, so they are not constant).
onnx::ModelProto layer_model(const Layer& l, int elem, bool weights_as_inputs) {
  onnx::ModelProto m = testing::empty_model("layer");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", elem, {});
  const DataType dtype = elem == onnx::TensorProto::FLOAT ? DataType::Float32 : DataType::Float64;
  const Shape w_shape = l.trans_b ? Shape{kN, kK} : Shape{kK, kN};
  io::tensor_to_proto(testing::random_f64(w_shape, 1).cast(dtype), "W", *g.add_initializer());
  if (!l.c.empty()) io::tensor_to_proto(testing::random_f64(l.c, 2).cast(dtype), "C", *g.add_initializer());
  if (weights_as_inputs) {
    testing::typed_value(g.add_input(), "W", elem, {});
    if (!l.c.empty()) testing::typed_value(g.add_input(), "C", elem, {});
  }
  if (l.op == "Gemm") {
    std::vector<std::string> in{"x", "W"};
    if (!l.c.empty()) in.push_back("C");
    auto* n = testing::add_node(g, "Gemm", in, {"y"});
    *n->add_attribute() = testing::attr("transB", int64_t{l.trans_b});
    *n->add_attribute() = testing::attr("alpha", l.alpha);
    *n->add_attribute() = testing::attr("beta", l.beta);
  } else if (l.c.empty()) {
    testing::add_node(g, "MatMul", {"x", "W"}, {"y"});
  } else {
    testing::add_node(g, "MatMul", {"x", "W"}, {"xw"});
    testing::add_node(g, "Add", {"xw", "C"}, {"y"});
  }
  g.add_output()->set_name("y");
  return m;
}

Tensor input(const Layer& l, int64_t rows, DataType dtype) {
  const Shape shape = l.x_rank == 3 ? Shape{2, rows / 2, kK} : Shape{rows, kK};
  return testing::random_f64(shape, 3 + static_cast<uint32_t>(rows)).cast(dtype);
}

TEST(ConstantWeights, LinearLayersOnInitializersGiveTheReferenceValues) {
  const std::vector<Layer> layers = {
      {.label = "Gemm"},
      {.trans_b = true, .label = "Gemm transB (torch.nn.Linear)"},
      {.trans_b = true, .c = {kN}, .label = "Gemm transB, C [N]"},
      {.c = {1, kN}, .label = "Gemm, C [1, N]"},
      {.trans_b = true, .c = {1}, .label = "Gemm transB, C of one element"},
      {.c = {kN}, .beta = 0.5f, .label = "Gemm, C [N], beta 0.5"},
      {.trans_b = true, .c = {kN}, .alpha = 2.0f, .label = "Gemm transB, C [N], alpha 2"},
      {.c = {kN}, .beta = 0.0f, .label = "Gemm, C [N], beta 0"},
      {.op = "MatMul", .label = "MatMul"},
      {.op = "MatMul", .x_rank = 3, .label = "MatMul, A of rank 3"},
      {.op = "MatMul", .c = {kN}, .x_rank = 3, .label = "MatMul -> Add (MatMulAdd)"},
  };
  for (const Layer& l : layers) {
    SCOPED_TRACE(l.label);
    runtime::Session constant(layer_model(l, onnx::TensorProto::FLOAT, false));
    runtime::Session fed(layer_model(l, onnx::TensorProto::FLOAT, true));
    runtime::Session reference(layer_model(l, onnx::TensorProto::DOUBLE, true));
    const Tensor w = testing::random_f64(l.trans_b ? Shape{kN, kK} : Shape{kK, kN}, 1);
    const Tensor c = l.c.empty() ? Tensor() : testing::random_f64(l.c, 2);
    // Row counts in turn: a new one plans (and copies B) again, 96 comes back to its entry;
    // 1 takes Gemm's matrix-vector loops.
    for (const int64_t rows : {96, 6, 96, 1, 2, 0}) {
      if (l.x_rank == 3 && rows % 2 != 0) continue;
      SCOPED_TRACE("rows " + std::to_string(rows));
      runtime::NamedTensors feeds{{"x", input(l, rows, DataType::Float64)}, {"W", w}};
      if (c.defined()) feeds.emplace("C", c);
      const Tensor want = reference.run(feeds).at("y").cast(DataType::Float32);
      for (auto& [name, t] : feeds) t = t.cast(DataType::Float32);
      const Tensor got_fed = fed.run(feeds).at("y");
      const Tensor got = constant.run({{"x", feeds.at("x")}}).at("y");
      ASSERT_EQ(got.shape(), want.shape());
      // float32 sums of 67 products of values below 1 in another order than the reference's.
      expect_close(got, want, 1e-5, 1e-5);
      expect_close(got_fed, want, 1e-5, 1e-5);
    }
  }
}

// Which inputs of a node a kernel may treat as the same at every run.
TEST(ConstantWeights, InitializersAndConstantNodesAreConstantInputs) {
  onnx::ModelProto m = testing::empty_model("inputs");
  auto& g = *m.mutable_graph();
  for (const char* name : {"x", "fed_weight"}) testing::typed_value(g.add_input(), name, onnx::TensorProto::FLOAT, {});
  io::tensor_to_proto(testing::random_f64({2, 2}, 1).cast(DataType::Float32), "weight", *g.add_initializer());
  io::tensor_to_proto(testing::random_f64({2, 2}, 2).cast(DataType::Float32), "fed_weight", *g.add_initializer());
  auto* c = testing::add_node(g, "Constant", {}, {"constant"});
  onnx::AttributeProto value;
  value.set_name("value");
  value.set_type(onnx::AttributeProto::TENSOR);
  io::tensor_to_proto(testing::random_f64({2, 2}, 3).cast(DataType::Float32), "constant", *value.mutable_t());
  *c->add_attribute() = value;
  testing::add_node(g, "Relu", {"x"}, {"computed"});
  testing::add_node(g, "Sum", {"x", "weight", "fed_weight", "constant", "computed"}, {"y"});
  g.add_output()->set_name("y");
  const ir::Graph graph = ir::Graph::from_proto(g, "inputs", ".");
  const ir::Node& sum = graph.nodes().back();
  ASSERT_EQ(sum.op_type, "Sum");
  const ops::KernelInit init(graph, sum, 17);
  EXPECT_FALSE(init.input_is_constant(0)) << "a graph input";
  EXPECT_TRUE(init.input_is_constant(1)) << "an initializer";
  EXPECT_FALSE(init.input_is_constant(2)) << "an initializer that is also a graph input (a feed may replace it)";
  EXPECT_TRUE(init.input_is_constant(3)) << "a Constant node's output";
  EXPECT_FALSE(init.input_is_constant(4)) << "another node's output";
  EXPECT_FALSE(init.input_is_constant(5)) << "no such input";
}

// torch.onnx.export writes a linear layer as MatMul(x, Transpose(W)) -> Add(b) with W [N, K]; the
// session's MatMulAdd reads the initializer W in place (transB), so it runs on constant weights.
TEST(ConstantWeights, ExportersTransposedWeightGivesTheReferenceValues) {
  const auto model = [](int elem) {
    onnx::ModelProto m = testing::empty_model("exported");
    auto& g = *m.mutable_graph();
    const DataType dtype = elem == onnx::TensorProto::FLOAT ? DataType::Float32 : DataType::Float64;
    testing::typed_value(g.add_input(), "x", elem, {});
    io::tensor_to_proto(testing::random_f64({kN, kK}, 1).cast(dtype), "W", *g.add_initializer());
    io::tensor_to_proto(testing::random_f64({kN}, 2).cast(dtype), "b", *g.add_initializer());
    testing::add_node(g, "Transpose", {"W"}, {"Wt"});
    testing::add_node(g, "MatMul", {"x", "Wt"}, {"xw"});
    testing::add_node(g, "Add", {"b", "xw"}, {"y"});
    g.add_output()->set_name("y");
    return m;
  };
  runtime::Session session(model(onnx::TensorProto::FLOAT));
  runtime::Session reference(model(onnx::TensorProto::DOUBLE));
  for (const int64_t rows : {96, 5, 96}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const Tensor x = testing::random_f64({2, rows, kK}, 4 + static_cast<uint32_t>(rows));
    const Tensor want = reference.run({{"x", x}}).at("y").cast(DataType::Float32);
    const Tensor got = session.run({{"x", x.cast(DataType::Float32)}}).at("y");
    ASSERT_EQ(got.shape(), want.shape());
    expect_close(got, want, 1e-5, 1e-5);  // as above
  }
}

}  // namespace
}  // namespace onnxtrain
