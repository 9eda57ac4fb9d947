// runtime/fusion.h fold_batch_norm_into_conv: an inference-mode BatchNormalization after a Conv
// with constant weights folds into the Conv's weights and bias, and the values equal the two
// ops'; the pair stays when the Conv output is read elsewhere, when a BatchNormalization input
// is a graph input (a run may replace it) or when it runs in training mode.
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::count_op;
using testing::expect_close;

const std::unordered_map<std::string, int> kOpsets{{"", 17}};

struct PairOptions {
  bool conv_bias = true;
  int64_t group = 1;
  bool relu = true;            // Conv -> BatchNormalization -> Relu
  bool expose_conv = false;    // the Conv output is also a graph output
  bool mean_is_input = false;  // the running mean is a graph input with an initializer
  bool training = false;       // training_mode = 1 (opset 14+), with its two extra outputs
  bool constant_nodes = false;  // the BatchNormalization inputs as Constant nodes
};

constexpr int64_t kC = 4, kM = 6;

onnx::ModelProto pair_model(const PairOptions& o) {
  onnx::ModelProto m = testing::empty_model("conv_bn");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, kC, 7, 7});
  io::tensor_to_proto(testing::random_f64(Shape{kM, kC / o.group, 3, 3}, 1).cast(DataType::Float32), "W",
                      *g.add_initializer());
  std::vector<std::string> conv_inputs{"x", "W"};
  if (o.conv_bias) {
    io::tensor_to_proto(testing::random_f64(Shape{kM}, 2).cast(DataType::Float32), "B", *g.add_initializer());
    conv_inputs.push_back("B");
  }
  auto* conv = testing::add_node(g, "Conv", conv_inputs, {"c"});
  *conv->add_attribute() = attr("pads", std::vector<int64_t>{1, 1, 1, 1});
  *conv->add_attribute() = attr("group", o.group);
  const char* params[4] = {"scale", "shift", "mean", "var"};
  for (int k = 0; k < 4; ++k) {
    Tensor t = testing::random_f64(Shape{kM}, 3 + static_cast<uint32_t>(k));
    if (k == 3) t = Tensor::from_vector<double>(Shape{kM}, [&] {  // variances: positive
      std::vector<double> v = t.to_double_vector();
      for (double& e : v) e = 0.1 + e * e;
      return v;
    }());
    const Tensor f = t.cast(DataType::Float32);
    if (o.constant_nodes) {
      testing::add_constant_node(g, params[k], f);
    } else {
      io::tensor_to_proto(f, params[k], *g.add_initializer());
    }
  }
  if (o.mean_is_input) testing::typed_value(g.add_input(), "mean", onnx::TensorProto::FLOAT, {kM});
  std::vector<std::string> bn_outputs{o.relu ? "n" : "y"};
  if (o.training) bn_outputs.insert(bn_outputs.end(), {"running_mean", "running_var"});
  auto* bn = testing::add_node(g, "BatchNormalization", {"c", "scale", "shift", "mean", "var"}, bn_outputs);
  *bn->add_attribute() = attr("epsilon", 1e-3f);
  if (o.training) *bn->add_attribute() = attr("training_mode", int64_t{1});
  if (o.relu) testing::add_node(g, "Relu", {"n"}, {"y"});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  if (o.expose_conv) testing::typed_value(g.add_output(), "c", onnx::TensorProto::FLOAT, {});
  return m;
}

TEST(ConvBatchNormFusion, TheBatchNormalizationFoldsIntoTheConvWithTheSameValues) {
  for (const PairOptions& o : {PairOptions{}, PairOptions{.conv_bias = false}, PairOptions{.group = 2},
                               PairOptions{.relu = false}, PairOptions{.constant_nodes = true}}) {
    SCOPED_TRACE("bias " + std::to_string(o.conv_bias) + ", group " + std::to_string(o.group) + ", relu " +
                 std::to_string(o.relu) + ", Constant nodes " + std::to_string(o.constant_nodes));
    const onnx::ModelProto model = pair_model(o);
    onnx::GraphProto g = model.graph();
    ASSERT_EQ(runtime::fold_batch_norm_into_conv(g, kOpsets), 1);
    EXPECT_EQ(count_op(g, "BatchNormalization"), 0);
    EXPECT_EQ(count_op(g, "Conv"), 1);
    for (const auto& init : g.initializer()) EXPECT_NE(init.name(), "W") << "the old weight is dropped";
    EXPECT_EQ(count_op(g, "Constant"), 0) << "Constant nodes nothing reads any more are dropped";
    const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{2, kC, 7, 7}, 9).cast(DataType::Float32)}};
    runtime::Session fused(model), unfused(model, {.fuse = false});
    // The folded weights round once where the two ops round twice.
    expect_close(fused.run(feeds).at("y"), unfused.run(feeds).at("y"), 1e-5, 1e-5);
  }
}

TEST(ConvBatchNormFusion, AConvOutputReadElsewhereAReplaceableInputOrTrainingModeKeepsThePair) {
  for (const PairOptions& o : {PairOptions{.expose_conv = true}, PairOptions{.mean_is_input = true},
                               PairOptions{.relu = false, .training = true}}) {
    onnx::GraphProto g = pair_model(o).graph();
    EXPECT_EQ(runtime::fold_batch_norm_into_conv(g, kOpsets), 0);
    EXPECT_EQ(count_op(g, "BatchNormalization"), 1);
  }
  onnx::GraphProto old = pair_model({}).graph();  // before opset 7 is_test decides the mode
  EXPECT_EQ(runtime::fold_batch_norm_into_conv(old, {{"", 6}}), 0);
}

}  // namespace
}  // namespace onnxtrain
