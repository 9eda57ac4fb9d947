// runtime/fusion.h fuse_gelu: the erf formula of GELU that exporters write below opset 20
// (Div by sqrt 2, Erf, Add 1, Mul by x, Mul by 0.5) becomes one ai.onnxtrain.Gelu, whose values
// and gradient (through a Gradient node, ai.onnxtrain.GeluGrad) equal the unfused chain's; the
// chain stays when a constant differs or an intermediate is read elsewhere. And
// fuse_gelu_bias_grad: the SumToShape of GeluGrad's output (a bias's gradient) goes into the
// GeluGrad, with the bits of the two ops; and fuse_matmul_add_gelu: a linear layer's Gelu in
// an inference graph runs inside the product.
#include <cmath>
#include <limits>
#include <numbers>

#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::count_op;
using testing::expect_close;

const std::unordered_map<std::string, int> kOpsets{{"", 17}, {"ai.onnx.preview.training", 1}};

struct ChainOptions {
  double sqrt2 = std::numbers::sqrt2;
  bool constants_as_initializers = false;
  bool swap_operands = false;       // Add(1, e), Mul(a, x), Mul(0.5, m)
  bool expose_intermediate = false;  // the Erf output is also a graph output
  bool gradient = false;             // loss = sum(y * r) and Gradient(xs = [x])
};

void add_node(onnx::GraphProto* g, const char* op, std::vector<std::string> in, const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out + "_node");
  for (const auto& i : in) n->add_input(i);
  n->add_output(out);
}

void add_constant(onnx::GraphProto* g, const std::string& name, float value, bool initializer) {
  onnx::TensorProto t;
  io::tensor_to_proto(Tensor::from_vector<float>(Shape{}, {value}), name, t);
  if (initializer) {
    *g->add_initializer() = t;
    return;
  }
  testing::add_constant_node(*g, name, Tensor::from_vector<float>(Shape{}, {value}));
}

// loss = ReduceSum(y * r) for a constant r of `shape`, and Gradient(xs) of it as the outputs
// "d" + x.
void add_loss_gradient(onnx::GraphProto* g, const Shape& shape, const std::vector<std::string>& xs) {
  io::tensor_to_proto(testing::random_f64(shape, 5).cast(DataType::Float32), "r", *g->add_initializer());
  add_node(g, "Mul", {"y", "r"}, "yr");
  auto* sum = g->add_node();
  sum->set_op_type("ReduceSum");
  sum->add_input("yr");
  sum->add_output("loss");
  *sum->add_attribute() = attr("keepdims", int64_t{0});
  auto* grad = g->add_node();
  grad->set_op_type("Gradient");
  grad->set_domain("ai.onnx.preview.training");
  for (const auto& x : xs) {
    grad->add_input(x);
    grad->add_output("d" + x);
    g->add_output()->set_name("d" + x);
  }
  *grad->add_attribute() = attr("xs", xs);
  *grad->add_attribute() = attr("y", std::string("loss"));
}

onnx::ModelProto chain_model(const Shape& shape, const ChainOptions& o) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  auto* g = m.mutable_graph();
  g->set_name("gelu");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape) x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  add_constant(g, "sqrt2", static_cast<float>(o.sqrt2), o.constants_as_initializers);
  add_constant(g, "one", 1.0f, o.constants_as_initializers);
  add_constant(g, "half", 0.5f, o.constants_as_initializers);
  auto pair = [&](const std::string& a, const std::string& b) {
    return o.swap_operands ? std::vector<std::string>{b, a} : std::vector<std::string>{a, b};
  };
  add_node(g, "Div", {"x", "sqrt2"}, "d");
  add_node(g, "Erf", {"d"}, "e");
  add_node(g, "Add", pair("e", "one"), "a");
  add_node(g, "Mul", pair("x", "a"), "m");
  add_node(g, "Mul", pair("m", "half"), "y");
  g->add_output()->set_name("y");
  if (o.expose_intermediate) g->add_output()->set_name("e");
  if (o.gradient) add_loss_gradient(g, shape, {"x"});
  return m;
}

// x over the range GELU bends in, its tails, and NaN / infinities.
Tensor inputs(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -6.0f + 12.0f * static_cast<float>(i) / static_cast<float>(v.size());
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = -30.0f;
  return Tensor::from_vector<float>(shape, v);
}

TEST(GeluFusion, TheErfChainBecomesOneGeluWithTheSameValues) {
  const Shape shape{3, 301};  // 903 values: parallel chunks and vector tails
  for (bool initializers : {false, true}) {
    for (bool swapped : {false, true}) {
      SCOPED_TRACE(std::string(initializers ? "initializers" : "Constant nodes") + (swapped ? ", swapped" : ""));
      const onnx::ModelProto model = chain_model(shape, {.constants_as_initializers = initializers, .swap_operands = swapped});
      onnx::GraphProto g = model.graph();
      ASSERT_EQ(runtime::fuse_gelu(g, kOpsets), 1);
      EXPECT_EQ(count_op(g, "Gelu"), 1);
      EXPECT_EQ(count_op(g, "Erf") + count_op(g, "Mul") + count_op(g, "Div") + count_op(g, "Add"), 0);
      const runtime::NamedTensors feeds{{"x", inputs(shape)}};
      runtime::Session fused(model), unfused(model, {.fuse = false});
      const Tensor got = fused.run(feeds).at("y"), want = unfused.run(feeds).at("y");
      // A few float32 roundings apart: the chain rounds after each of its five ops, the kernel
      // computes erf within 1.5 ulp (core/vector_math.h).
      expect_close(got, want, 1e-6, 1e-7);
      EXPECT_TRUE(std::isnan(got.to_double_vector()[0]));
      EXPECT_EQ(got.to_double_vector()[1], std::numeric_limits<double>::infinity());
    }
  }
}

TEST(GeluFusion, TheGradientThroughTheFusedGeluEqualsTheChainRules) {
  const Shape shape{2, 129};
  const onnx::ModelProto model = chain_model(shape, {.gradient = true});
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -5.0f + 10.0f * static_cast<float>(i) / static_cast<float>(v.size());
  const runtime::NamedTensors feeds{{"x", Tensor::from_vector<float>(shape, v)}};
  runtime::Session fused(model), unfused(model, {.fuse = false});
  expect_close(fused.run(feeds).at("dx"), unfused.run(feeds).at("dx"), 1e-5, 1e-6);
  // The fused session really ran ai.onnxtrain.Gelu: the chain is gone before the expansion.
  onnx::GraphProto g = model.graph();
  EXPECT_EQ(runtime::fuse_gelu(g, kOpsets), 1);
}

TEST(GeluFusion, AnotherConstantOrAnIntermediateReadElsewhereKeepsTheChain) {
  const Shape shape{4, 8};
  onnx::GraphProto wrong_root = chain_model(shape, {.sqrt2 = 1.4142}).graph();
  EXPECT_EQ(runtime::fuse_gelu(wrong_root, kOpsets), 0);
  onnx::GraphProto exposed = chain_model(shape, {.expose_intermediate = true}).graph();
  EXPECT_EQ(runtime::fuse_gelu(exposed, kOpsets), 0);
  EXPECT_EQ(count_op(exposed, "Erf"), 1);
}

void expect_same_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << "element " << i;
}

// GeluGrad with a shape input against GeluGrad then SumToShape.
void expect_bias_grad_equals_sum(DataType dtype, const Shape& shape, const std::vector<int64_t>& target,
                                 const std::string& approximate = "none") {
  const Tensor dy = testing::random_f64(shape, 1).cast(dtype), x = testing::random_f64(shape, 2, 4.0).cast(dtype);
  const Tensor t = testing::i64(target);
  const std::vector<onnx::AttributeProto> attrs{attr("approximate", approximate)};
  const Tensor dx = testing::run_node({"GeluGrad", "ai.onnxtrain", 1, attrs, 1}, {dy, x})[0];
  const Tensor want = testing::run_node({"SumToShape", "ai.onnxtrain", 1, {}, 1}, {dx, t})[0];
  const std::vector<Tensor> got = testing::run_node({"GeluGrad", "ai.onnxtrain", 1, attrs, 2}, {dy, x, t});
  expect_same_bits(got[0], dx);
  expect_same_bits(got[1], want);
}

TEST(GeluBiasGrad, TheBiasGradientHasTheBitsOfSumToShapeAfterGeluGrad) {
  // Summed while dX is made: float32 to the last dim, with or without leading 1s, over rows the
  // threads split (and rows shorter than a vector); after it: other targets, types, tanh.
  expect_bias_grad_equals_sum(DataType::Float32, Shape{6, 7, 37}, {37});
  expect_bias_grad_equals_sum(DataType::Float32, Shape{64, 1100}, {1, 1100});  // two row ranges from 64 Ki elements on
  expect_bias_grad_equals_sum(DataType::Float32, Shape{2, 65, 515}, {515});
  expect_bias_grad_equals_sum(DataType::Float32, Shape{9, 5}, {5});
  expect_bias_grad_equals_sum(DataType::Float32, Shape{6, 7, 37}, {7, 1});
  expect_bias_grad_equals_sum(DataType::Float32, Shape{6, 7, 37}, {6, 7, 37});
  expect_bias_grad_equals_sum(DataType::Float32, Shape{6, 7, 37}, {37}, "tanh");
  expect_bias_grad_equals_sum(DataType::Float64, Shape{6, 7, 37}, {37});
  expect_bias_grad_equals_sum(DataType::Float16, Shape{6, 37}, {37});
}

TEST(GeluBiasGrad, AShapeThatDoesNotBroadcastIsNamed) {
  const Tensor dy = testing::random_f64(Shape{4, 6}, 1).cast(DataType::Float32);
  EXPECT_TRUE(testing::throws_with(
      [&] { testing::run_node({"GeluGrad", "ai.onnxtrain", 1, {}, 2}, {dy, dy, testing::i64({5})}); },
      "shape [5] does not broadcast to the shape of dX"));
}

// An ai.onnxtrain.Gelu node (what fuse_gelu makes of the erf formula) from x to y.
void add_fused_gelu(onnx::GraphProto* g, const std::string& x, const std::string& y) {
  auto* gelu = g->add_node();
  gelu->set_op_type("Gelu");
  gelu->set_domain("ai.onnxtrain");
  gelu->add_input(x);
  gelu->add_output(y);
}

// y = Gelu(x + b) (ai.onnxtrain.Gelu, as fuse_gelu leaves it), loss = sum(y * r); the Gradient
// of x and b, expanded.
onnx::ModelProto bias_gelu_model() {
  onnx::ModelProto m = testing::empty_model("bias_gelu");
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  auto* g = m.mutable_graph();
  testing::typed_value(g->add_input(), "x", onnx::TensorProto::FLOAT, {3, 5, 40});
  io::tensor_to_proto(testing::random_f64(Shape{40}, 3).cast(DataType::Float32), "b", *g->add_initializer());
  add_node(g, "Add", {"x", "b"}, "h");
  add_fused_gelu(g, "h", "y");
  add_loss_gradient(g, Shape{3, 5, 40}, {"x", "b"});
  autodiff::expand_gradients(*g, kOpsets, "test");
  return m;
}

TEST(GeluBiasGrad, TheBiasesSumToShapeGoesIntoTheGeluGrad) {
  const onnx::ModelProto unfused = bias_gelu_model();
  onnx::ModelProto fused = unfused;
  const int sums = count_op(fused.graph(), "SumToShape");
  ASSERT_EQ(runtime::fuse_gelu_bias_grad(*fused.mutable_graph()), 1);
  EXPECT_EQ(count_op(fused.graph(), "SumToShape"), sums - 1);
  EXPECT_EQ(runtime::fuse_gelu_bias_grad(*fused.mutable_graph()), 0);  // once per GeluGrad
  const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{3, 5, 40}, 9, 3.0).cast(DataType::Float32)}};
  runtime::Session a(fused, {.fuse = false}), b(unfused, {.fuse = false});
  const runtime::NamedTensors got = a.run(feeds), want = b.run(feeds);
  for (const char* name : {"dx", "db"}) {
    SCOPED_TRACE(name);
    expect_same_bits(got.at(name), want.at(name));
  }
}

// y = Gelu(x W + b) (ai.onnxtrain.Gelu, as fuse_gelu leaves the erf formula), x [2, 9, 24], W
// [24, 40] and b [40] initializers, or W a graph input (`fed_weights`); `expose_product`: x W + b is
// a graph output too.
onnx::ModelProto linear_gelu_model(bool fed_weights, bool expose_product) {
  onnx::ModelProto m = testing::empty_model("linear_gelu");
  auto* g = m.mutable_graph();
  testing::typed_value(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 9, 24});
  if (fed_weights) testing::typed_value(g->add_input(), "w", onnx::TensorProto::FLOAT, {24, 40});
  io::tensor_to_proto(testing::random_f64(Shape{24, 40}, 3, 0.5).cast(DataType::Float32), "w", *g->add_initializer());
  io::tensor_to_proto(testing::random_f64(Shape{40}, 4).cast(DataType::Float32), "b", *g->add_initializer());
  add_node(g, "MatMul", {"x", "w"}, "xw");
  add_node(g, "Add", {"xw", "b"}, "h");
  add_fused_gelu(g, "h", "y");
  g->add_output()->set_name("y");
  if (expose_product) g->add_output()->set_name("h");
  return m;
}

TEST(MatMulAddGelu, ALinearLayersGeluRunsInsideTheProduct) {
  for (bool fed : {false, true}) {
    SCOPED_TRACE(fed ? "weights fed" : "constant weights");
    const onnx::ModelProto model = linear_gelu_model(fed, false);
    onnx::GraphProto g = model.graph();
    runtime::fuse_matrix_products(g);
    ASSERT_EQ(runtime::fuse_matmul_add_gelu(g), 1);
    EXPECT_EQ(count_op(g, "Gelu"), 0);
    EXPECT_EQ(count_op(g, "MatMulAdd"), 1);
    runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{2, 9, 24}, 5, 2.0).cast(DataType::Float32)}};
    if (fed) feeds["w"] = testing::random_f64(Shape{24, 40}, 6, 0.5).cast(DataType::Float32);
    runtime::Session fused(model), unfused(model, {.fuse = false});
    for (int again = 0; again < 2; ++again) {  // the second run reuses the primitive and its weights
      // oneDNN's erf (constant weights) against vmath's: a few float32 roundings apart.
      expect_close(fused.run(feeds).at("y"), unfused.run(feeds).at("y"), 1e-5, 1e-6);
    }
  }
}

TEST(MatMulAddGelu, AProductReadElsewhereKeepsItsGelu) {
  onnx::GraphProto g = linear_gelu_model(false, true).graph();
  runtime::fuse_matrix_products(g);
  EXPECT_EQ(runtime::fuse_matmul_add_gelu(g), 0);
  EXPECT_EQ(count_op(g, "Gelu"), 1);
}

TEST(MatMulAddGelu, AnotherActivationIsNamed) {
  const Tensor x = testing::random_f64(Shape{3, 4}, 1).cast(DataType::Float32);
  const Tensor w = testing::random_f64(Shape{4, 5}, 2).cast(DataType::Float32);
  const Tensor b = testing::random_f64(Shape{5}, 3).cast(DataType::Float32);
  EXPECT_TRUE(testing::throws_with(
      [&] { testing::run_node({"MatMulAdd", "ai.onnxtrain", 1, {attr("activation", std::string("Tanh"))}, 1}, {x, w, b}); },
      "attribute activation is 'Tanh', expected 'Gelu' or none"));
}

}  // namespace
}  // namespace onnxtrain
