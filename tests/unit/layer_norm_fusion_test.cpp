// runtime/fusion.h fuse_layer_norm_grad_sum: the Sum that accumulates the gradient of
// LayerNormalization's output becomes further dY inputs of ai.onnxtrain.LayerNormalizationGrad,
// which sums them row by row as Sum does: the same bits, for every float type; the Sum stays
// where something else reads it; a term of another shape is named in the error.
// runtime/fusion.h fuse_layer_norm_bias_grad: the bias gradient of the dense layer before a
// residual Add and LayerNormalization (two SumToShapes of dX) made by LayerNormalizationGrad with
// attribute dx_sum: the same bits, the graph rewrite included.
// runtime/fusion.h fuse_add_layer_norm: the residual Add before a LayerNormalization and the
// normalization as one ai.onnxtrain.AddLayerNormalization: every output to the bit (the sum too,
// written with streaming stores from 2 MiB), for every float type, with and without broadcasting;
// the rewrite of a training graph and of an inference graph (whose sum nobody else reads, so it
// is not written), and the cases it must leave alone.
#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_node;
using testing::attr;
using testing::count_op;
using testing::NodeSpec;
using testing::run_node;

const std::unordered_map<std::string, int> kOpsets{{"", 17}, {"ai.onnx.preview.training", 1}};

void expect_same_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << "element " << i;
}

const NodeSpec kGrad{"LayerNormalizationGrad", "ai.onnxtrain", 1, {}, 3};

// A LayerNormalization's input x, scale and saved statistics (mean, inv_std_dev), and `count`
// terms of dY, all of `dtype`.
struct GradInputs {
  Tensor x, scale, mean, inv_std;
  std::vector<Tensor> terms;
};
GradInputs grad_inputs(DataType dtype, const Shape& shape, size_t count) {
  const int64_t inner = shape[shape.size() - 1];
  GradInputs in;
  in.x = testing::random_f64(shape, 1, 3.0).cast(dtype);
  in.scale = testing::random_f64(Shape{inner}, 2).cast(dtype);
  const Tensor bias = testing::random_f64(Shape{inner}, 3).cast(dtype);
  const std::vector<Tensor> norm = run_node({"LayerNormalization", "", 17, {}, 3}, {in.x, in.scale, bias});
  in.mean = norm[1];
  in.inv_std = norm[2];
  for (size_t i = 0; i < count; ++i) in.terms.push_back(testing::random_f64(shape, 10 + static_cast<uint32_t>(i)).cast(dtype));
  return in;
}

// LayerNormalizationGrad over the Sum of `terms` against the same op reading the terms itself.
void expect_terms_equal_sum(DataType dtype, const Shape& shape, size_t count) {
  const GradInputs in = grad_inputs(dtype, shape, count);
  const Tensor &x = in.x, &scale = in.scale;
  const std::vector<Tensor>& terms = in.terms;
  const Tensor sum = run_node({"Sum", "", 13, {}, 1}, terms)[0];
  const std::vector<Tensor> want = run_node(kGrad, {sum, x, scale, in.mean, in.inv_std});
  std::vector<Tensor> fused_inputs = {terms[0], x, scale, in.mean, in.inv_std};
  fused_inputs.insert(fused_inputs.end(), terms.begin() + 1, terms.end());
  const std::vector<Tensor> got = run_node(kGrad, fused_inputs);
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    expect_same_bits(got[i], want[i]);
  }
}

TEST(LayerNormGradSum, FurtherTermsOfDYGiveTheBitsOfTheSumBeforeIt) {
  for (DataType dtype : {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    expect_terms_equal_sum(dtype, Shape{5, 7, 37}, 4);  // rows split between threads, vector tails
    expect_terms_equal_sum(dtype, Shape{64, 256}, 2);
  }
}

TEST(LayerNormGradSum, ATermOfAnotherShapeIsNamedInTheError) {
  const Shape shape{4, 8};
  const Tensor x = testing::random_f64(shape, 1).cast(DataType::Float32);
  const Tensor scale = testing::random_f64(Shape{8}, 2).cast(DataType::Float32);
  const Tensor dy = testing::random_f64(shape, 3).cast(DataType::Float32);
  const Tensor broadcast_term = testing::random_f64(Shape{1, 8}, 4).cast(DataType::Float32);
  const std::string error = testing::error_of([&] { run_node(kGrad, {dy, x, scale, Tensor(), Tensor(), dy, broadcast_term}); });
  EXPECT_NE(error.find("input 'in6' is float32[1,8], expected float32[4,8] like input 'in1'"), std::string::npos) << error;
}

// An empty model importing the training domain, with a float32 graph input "x" of `dims`.
onnx::ModelProto training_model(const std::string& name, const std::vector<int64_t>& dims) {
  onnx::ModelProto m = testing::empty_model(name);
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  testing::typed_value(m.mutable_graph()->add_input(), "x", onnx::TensorProto::FLOAT, dims);
  return m;
}

// A float32 initializer of random values (testing::random_f64's seed and scale).
void add_initializer(onnx::GraphProto& g, const std::string& name, const Shape& shape, uint32_t seed, double scale = 1.0) {
  io::tensor_to_proto(testing::random_f64(shape, seed, scale).cast(DataType::Float32), name, *g.add_initializer());
}

// The Gradient of "loss" with respect to `xs`, written to the graph outputs `outs`, expanded.
void add_gradient(onnx::GraphProto& g, const std::vector<std::string>& xs, const std::vector<std::string>& outs) {
  onnx::NodeProto* grad = add_node(g, "Gradient", xs, outs);
  grad->set_domain("ai.onnx.preview.training");
  *grad->add_attribute() = attr("xs", xs);
  *grad->add_attribute() = attr("y", std::string("loss"));
  for (const auto& out : outs) g.add_output()->set_name(out);
  autodiff::expand_gradients(g, kOpsets, "test");
}

// x -> LayerNormalization -> y, read by a MatMul, a Mul and the loss itself: the gradient of y is
// a Sum of three terms. Gradient of the loss with respect to x, the scale and the bias.
onnx::ModelProto residual_model(bool expose_sum_input) {
  onnx::ModelProto m = training_model("layer_norm", {6, 3, 20});
  onnx::GraphProto& g = *m.mutable_graph();
  add_initializer(g, "scale", Shape{20}, 1);
  add_initializer(g, "bias", Shape{20}, 2);
  add_initializer(g, "w", Shape{20, 20}, 3);
  add_initializer(g, "r", Shape{6, 3, 20}, 4);
  add_node(g, "LayerNormalization", {"x", "scale", "bias"}, {"y"});
  add_node(g, "MatMul", {"y", "w"}, {"a"});
  add_node(g, "Mul", {"y", "r"}, {"b"});
  add_node(g, "Mul", {"a", "b"}, {"ab"});
  add_node(g, "Add", {"ab", "y"}, {"z"});
  *add_node(g, "ReduceSum", {"z"}, {"loss"})->add_attribute() = attr("keepdims", int64_t{0});
  add_gradient(g, {"x", "scale", "bias"}, {"dx", "dscale", "dbias"});
  if (expose_sum_input) {
    for (const auto& node : g.node()) {
      if (node.op_type() == "LayerNormalizationGrad") g.add_output()->set_name(node.input(0));
    }
  }
  return m;
}

TEST(LayerNormGradSum, TheExpansionsSumBecomesInputsOfTheGradWithTheSameResults) {
  const onnx::ModelProto unfused = residual_model(false);
  onnx::ModelProto fused = unfused;
  const int sums = count_op(fused.graph(), "Sum");
  ASSERT_GE(sums, 1);
  ASSERT_EQ(runtime::fuse_layer_norm_grad_sum(*fused.mutable_graph()), 1);
  EXPECT_EQ(count_op(fused.graph(), "Sum"), sums - 1);
  for (const auto& node : fused.graph().node()) {
    if (node.op_type() == "LayerNormalizationGrad") {
      EXPECT_EQ(node.input_size(), 7);  // dY and two more terms
    }
  }
  const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{6, 3, 20}, 9, 2.0).cast(DataType::Float32)}};
  // Neither session rewrites further: the two graphs differ by this fusion alone.
  runtime::Session a(fused, {.fuse = false}), b(unfused, {.fuse = false});
  const runtime::NamedTensors got = a.run(feeds), want = b.run(feeds);
  for (const char* name : {"dx", "dscale", "dbias"}) {
    SCOPED_TRACE(name);
    expect_same_bits(got.at(name), want.at(name));
  }
}

TEST(LayerNormGradSum, ASumReadElsewhereStays) {
  onnx::ModelProto model = residual_model(true);
  EXPECT_EQ(runtime::fuse_layer_norm_grad_sum(*model.mutable_graph()), 0);
}


const NodeSpec kGradSum{"LayerNormalizationGrad", "ai.onnxtrain", 1, {attr("dx_sum", int64_t{1})}, 4};

Tensor shape_tensor(const Shape& shape) {
  std::vector<int64_t> dims(shape.begin(), shape.end());
  return Tensor::from_vector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
}

// Output 3 of LayerNormalizationGrad with dx_sum against SumToShape(SumToShape(dX, A), B) after the
// plain op, every output to the bit: A X's shape (summed while made where the rows split as
// SumToShape's do: 64 Ki elements on two threads; else after), A broadcasting (both sums after),
// B with leading 1s, further terms of dY, float32 and float64.
void expect_dx_sum(DataType dtype, const Shape& shape, const Shape& through, const Shape& target, size_t terms) {
  const GradInputs in = grad_inputs(dtype, shape, terms);
  const std::vector<Tensor>& dys = in.terms;
  std::vector<Tensor> plain_in = {dys[0], in.x, in.scale, in.mean, in.inv_std};
  plain_in.insert(plain_in.end(), dys.begin() + 1, dys.end());
  const std::vector<Tensor> want = run_node(kGrad, plain_in);
  const NodeSpec sum{"SumToShape", "ai.onnxtrain", 1, {}, 1};
  const Tensor want_sum = run_node(sum, {run_node(sum, {want[0], shape_tensor(through)})[0], shape_tensor(target)})[0];
  std::vector<Tensor> fused_in = {dys[0], in.x, in.scale, in.mean, in.inv_std, shape_tensor(through), shape_tensor(target)};
  fused_in.insert(fused_in.end(), dys.begin() + 1, dys.end());
  const std::vector<Tensor> got = run_node(kGradSum, fused_in);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    expect_same_bits(got[i], want[i]);
  }
  expect_same_bits(got[3], want_sum);
}

TEST(LayerNormBiasGrad, DxSummedToABiasGivesTheBitsOfTheTwoSumToShapes) {
  for (DataType dtype : {DataType::Float32, DataType::Float64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    expect_dx_sum(dtype, Shape{4, 64, 256}, Shape{4, 64, 256}, Shape{256}, 1);
    expect_dx_sum(dtype, Shape{4, 64, 256}, Shape{4, 64, 256}, Shape{1, 1, 256}, 3);
    expect_dx_sum(dtype, Shape{5, 7, 37}, Shape{5, 7, 37}, Shape{37}, 2);  // few rows: summed after
    expect_dx_sum(dtype, Shape{4, 64, 256}, Shape{1, 64, 256}, Shape{256}, 1);  // A broadcasts
  }
  const Shape shape{4, 8};
  const Tensor t = testing::random_f64(shape, 1).cast(DataType::Float32);
  const Tensor scale = testing::random_f64(Shape{8}, 2).cast(DataType::Float32);
  const std::string missing = testing::error_of([&] { run_node(kGradSum, {t, t, scale, Tensor(), Tensor(), shape_tensor(shape)}); });
  EXPECT_NE(missing.find("inputs 5 and 6"), std::string::npos) << missing;
  const std::string wrong = testing::error_of(
      [&] { run_node(kGradSum, {t, t, scale, Tensor(), Tensor(), shape_tensor(shape), shape_tensor(Shape{3})}); });
  EXPECT_NE(wrong.find("does not broadcast"), std::string::npos) << wrong;
}

// A dense layer with bias b before a residual Add and LayerNormalization (x [8, 32, 256]: 64 Ki
// elements, so the rows split as SumToShape's do on two threads), and its gradient with respect to
// w, b, the scale and x: the expansion's SumToShape of dX to b's shape goes into the
// LayerNormalizationGrad, and every gradient keeps its bits.
TEST(LayerNormBiasGrad, TheRewriteGivesTheSameResults) {
  onnx::ModelProto m = training_model("dense_residual_norm", {8, 32, 256});
  onnx::GraphProto& g = *m.mutable_graph();
  add_initializer(g, "w", Shape{256, 256}, 1, 0.1);
  add_initializer(g, "b", Shape{256}, 2);
  add_initializer(g, "scale", Shape{256}, 3);
  add_initializer(g, "beta", Shape{256}, 4);
  add_initializer(g, "r", Shape{8, 32, 256}, 5);
  add_node(g, "MatMul", {"x", "w"}, {"h"});
  add_node(g, "Add", {"h", "b"}, {"a"});
  add_node(g, "Add", {"a", "x"}, {"z"});
  add_node(g, "LayerNormalization", {"z", "scale", "beta"}, {"y"});
  add_node(g, "Mul", {"y", "r"}, {"yr"});
  *add_node(g, "ReduceSum", {"yr"}, {"loss"})->add_attribute() = attr("keepdims", int64_t{0});
  add_gradient(g, {"x", "w", "b", "scale"}, {"dx", "dw", "db", "dscale"});
  const onnx::ModelProto unfused = m;
  onnx::ModelProto fused = m;
  const int sums = count_op(fused.graph(), "SumToShape");
  ASSERT_EQ(runtime::fuse_layer_norm_bias_grad(*fused.mutable_graph()), 1);
  EXPECT_EQ(count_op(fused.graph(), "SumToShape"), sums - 1);
  EXPECT_EQ(runtime::fuse_layer_norm_bias_grad(*fused.mutable_graph()), 0);  // once
  const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{8, 32, 256}, 9, 2.0).cast(DataType::Float32)}};
  runtime::Session a(fused, {.fuse = false}), b(unfused, {.fuse = false});
  const runtime::NamedTensors got = a.run(feeds), want = b.run(feeds);
  for (const char* name : {"dx", "dw", "db", "dscale"}) {
    SCOPED_TRACE(name);
    expect_same_bits(got.at(name), want.at(name));
  }
}

const NodeSpec kAddNorm{"AddLayerNormalization", "ai.onnxtrain", 1, {}, 4};

// AddLayerNormalization(a, b, scale[, bias]) against Add then LayerNormalization: Y, Mean,
// InvStdDev and the sum to the bit; with `sum_output` false the node has no output 3.
void expect_add_norm(DataType dtype, const Shape& a_shape, const Shape& b_shape, bool with_bias, bool sum_output,
                     std::vector<onnx::AttributeProto> attributes = {}) {
  const Tensor a = testing::random_f64(a_shape, 1, 3.0).cast(dtype);
  const Tensor b = testing::random_f64(b_shape, 2, 3.0).cast(dtype);
  const Shape out_shape = a_shape.size() >= b_shape.size() ? a_shape : b_shape;
  const int64_t inner = out_shape[out_shape.size() - 1];
  const Tensor scale = testing::random_f64(Shape{inner}, 3).cast(dtype);
  const Tensor bias = testing::random_f64(Shape{inner}, 4).cast(dtype);
  const Tensor sum = run_node({"Add", "", 17, {}, 1}, {a, b})[0];
  std::vector<Tensor> norm_in = {sum, scale};
  if (with_bias) norm_in.push_back(bias);
  const std::vector<Tensor> want = run_node({"LayerNormalization", "", 17, attributes, 3}, norm_in);
  std::vector<Tensor> fused_in = {a, b, scale};
  if (with_bias) fused_in.push_back(bias);
  const std::vector<Tensor> got = run_node({kAddNorm.op_type, kAddNorm.domain, 1, attributes, sum_output ? 4 : 3}, fused_in);
  ASSERT_EQ(got.size(), sum_output ? 4u : 3u);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    expect_same_bits(got[i], want[i]);
  }
  if (sum_output) expect_same_bits(got[3], sum);
}

TEST(AddLayerNorm, GivesTheBitsOfTheAddAndTheNormalization) {
  for (DataType dtype : {DataType::Float32, DataType::Float64, DataType::Float16, DataType::BFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    expect_add_norm(dtype, Shape{5, 7, 37}, Shape{5, 7, 37}, true, true);  // vector tails
    expect_add_norm(dtype, Shape{64, 256}, Shape{64, 256}, false, true);
    expect_add_norm(dtype, Shape{64, 256}, Shape{64, 256}, true, false);  // the sum not asked for
    expect_add_norm(dtype, Shape{5, 7, 37}, Shape{37}, true, true);       // B broadcast: the sum made first
    expect_add_norm(dtype, Shape{7, 37}, Shape{5, 7, 37}, true, true);    // A broadcast
    expect_add_norm(dtype, Shape{6, 4, 10}, Shape{6, 4, 10}, true, true, {attr("axis", int64_t{1}), attr("epsilon", 0.25f)});
  }
  // 4 MiB of float32: the sum goes by streaming stores.
  expect_add_norm(DataType::Float32, Shape{8, 512, 256}, Shape{8, 512, 256}, true, true);
}

TEST(AddLayerNorm, InputsOfTwoTypesAreAnError) {
  const Tensor a = testing::random_f64(Shape{4, 8}, 1).cast(DataType::Float32);
  const Tensor b = testing::random_f64(Shape{4, 8}, 2).cast(DataType::Float64);
  const Tensor scale = testing::random_f64(Shape{8}, 3).cast(DataType::Float32);
  const std::string error = testing::error_of([&] { run_node(kAddNorm, {a, b, scale}); });
  EXPECT_NE(error.find("different element types"), std::string::npos) << error;
}

// x -> Add(x, r) -> LayerNormalization -> y -> loss, with the gradient with respect to x, r and
// the scale when `training`.
onnx::ModelProto residual_norm_model(bool training) {
  onnx::ModelProto m = training_model("residual_norm", {8, 32, 256});
  onnx::GraphProto& g = *m.mutable_graph();
  add_initializer(g, "r", Shape{8, 32, 256}, 1);
  add_initializer(g, "scale", Shape{256}, 2);
  add_initializer(g, "beta", Shape{256}, 3);
  add_initializer(g, "w", Shape{8, 32, 256}, 4);
  add_node(g, "Add", {"x", "r"}, {"z"});
  add_node(g, "LayerNormalization", {"z", "scale", "beta"}, {"y"});
  add_node(g, "Mul", {"y", "w"}, {"yw"});
  *add_node(g, "ReduceSum", {"yw"}, {"loss"})->add_attribute() = attr("keepdims", int64_t{0});
  g.add_output()->set_name("y");
  if (training) add_gradient(g, {"x", "r", "scale"}, {"dx", "dr", "dscale"});
  return m;
}

const onnx::NodeProto* find_op(const onnx::GraphProto& g, const std::string& op_type) {
  for (const auto& node : g.node()) {
    if (node.op_type() == op_type) return &node;
  }
  return nullptr;
}

TEST(AddLayerNorm, TheRewriteGivesTheSameResults) {
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training graph" : "inference graph");
    const onnx::ModelProto unfused = residual_norm_model(training);
    onnx::ModelProto fused = unfused;
    ASSERT_EQ(runtime::fuse_add_layer_norm(*fused.mutable_graph()), 1);
    EXPECT_EQ(count_op(fused.graph(), "Add"), count_op(unfused.graph(), "Add") - 1);
    EXPECT_EQ(count_op(fused.graph(), "LayerNormalization"), 0);
    const onnx::NodeProto* node = find_op(fused.graph(), "AddLayerNormalization");
    ASSERT_NE(node, nullptr);
    ASSERT_EQ(node->output_size(), 4);
    // The backward pass reads the sum; the inference graph does not, so it is not written.
    EXPECT_EQ(node->output(3), training ? "z" : "");
    const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{8, 32, 256}, 9, 2.0).cast(DataType::Float32)}};
    runtime::Session a(fused, {.fuse = false}), b(unfused, {.fuse = false});
    const runtime::NamedTensors got = a.run(feeds), want = b.run(feeds);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, tensor] : want) {
      SCOPED_TRACE(name);
      expect_same_bits(got.at(name), tensor);
    }
  }
}

TEST(AddLayerNorm, LeavesAloneASumReadBeforeTheNormalizationOrAGraphOutput) {
  {  // a reader of the sum before the normalization in the node order
    onnx::ModelProto m = residual_norm_model(false);
    onnx::GraphProto& g = *m.mutable_graph();
    onnx::NodeProto early;
    early.set_op_type("Relu");
    early.add_input("z");
    early.add_output("early");
    g.mutable_node()->Add(std::move(early));
    g.mutable_node()->SwapElements(1, g.node_size() - 1);  // Add, Relu, ..., LayerNormalization last
    EXPECT_EQ(runtime::fuse_add_layer_norm(g), 0);
  }
  {  // the sum as a graph output
    onnx::ModelProto m = residual_norm_model(false);
    m.mutable_graph()->add_output()->set_name("z");
    EXPECT_EQ(runtime::fuse_add_layer_norm(*m.mutable_graph()), 0);
  }
}

}  // namespace
}  // namespace onnxtrain
