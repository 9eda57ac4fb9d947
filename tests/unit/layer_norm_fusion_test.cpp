// runtime/fusion.h fuse_layer_norm_grad_sum: the Sum that accumulates the gradient of
// LayerNormalization's output becomes further dY inputs of ai.onnxtrain.LayerNormalizationGrad,
// which sums them row by row as Sum does: the same bits, for every float type; the Sum stays
// where something else reads it; a term of another shape is named in the error.
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

// LayerNormalizationGrad over the Sum of `terms` against the same op reading the terms itself.
void expect_terms_equal_sum(DataType dtype, const Shape& shape, size_t count) {
  const int64_t inner = shape[shape.size() - 1];
  const Tensor x = testing::random_f64(shape, 1, 3.0).cast(dtype);
  const Tensor scale = testing::random_f64(Shape{inner}, 2).cast(dtype);
  const Tensor bias = testing::random_f64(Shape{inner}, 3).cast(dtype);
  const std::vector<Tensor> norm = run_node({"LayerNormalization", "", 17, {}, 3}, {x, scale, bias});
  std::vector<Tensor> terms;
  for (size_t i = 0; i < count; ++i) terms.push_back(testing::random_f64(shape, 10 + static_cast<uint32_t>(i)).cast(dtype));
  const Tensor sum = run_node({"Sum", "", 13, {}, 1}, terms)[0];
  const std::vector<Tensor> want = run_node(kGrad, {sum, x, scale, norm[1], norm[2]});
  std::vector<Tensor> fused_inputs = {terms[0], x, scale, norm[1], norm[2]};
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

// x -> LayerNormalization -> y, read by a MatMul, a Mul and the loss itself: the gradient of y is
// a Sum of three terms. Gradient of the loss with respect to x, the scale and the bias.
onnx::ModelProto residual_model(bool expose_sum_input) {
  onnx::ModelProto m = testing::empty_model("layer_norm");
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  onnx::GraphProto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {6, 3, 20});
  const auto initializer = [&](const std::string& name, const Shape& shape, uint32_t seed) {
    io::tensor_to_proto(testing::random_f64(shape, seed).cast(DataType::Float32), name, *g.add_initializer());
  };
  initializer("scale", Shape{20}, 1);
  initializer("bias", Shape{20}, 2);
  initializer("w", Shape{20, 20}, 3);
  initializer("r", Shape{6, 3, 20}, 4);
  add_node(g, "LayerNormalization", {"x", "scale", "bias"}, {"y"});
  add_node(g, "MatMul", {"y", "w"}, {"a"});
  add_node(g, "Mul", {"y", "r"}, {"b"});
  add_node(g, "Mul", {"a", "b"}, {"ab"});
  add_node(g, "Add", {"ab", "y"}, {"z"});
  *add_node(g, "ReduceSum", {"z"}, {"loss"})->add_attribute() = attr("keepdims", int64_t{0});
  onnx::NodeProto* grad = add_node(g, "Gradient", {"x", "scale", "bias"}, {"dx", "dscale", "dbias"});
  grad->set_domain("ai.onnx.preview.training");
  *grad->add_attribute() = attr("xs", std::vector<std::string>{"x", "scale", "bias"});
  *grad->add_attribute() = attr("y", std::string("loss"));
  for (const char* out : {"dx", "dscale", "dbias"}) g.add_output()->set_name(out);
  autodiff::expand_gradients(g, kOpsets, "test");
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

}  // namespace
}  // namespace onnxtrain
