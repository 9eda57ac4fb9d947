// runtime/fusion.h drop_zero_dropout: a Dropout whose ratio is a constant 0 and whose mask nobody
// reads becomes an Identity before the Gradient expansion, so training runs no mask and no
// Where / Mul in the backward pass; its values and gradients equal the Dropout's. Any other
// Dropout stays.
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::count_op;

struct DropoutOptions {
  float ratio = 0.0f;
  bool ratio_initializer = false;  // else a Constant node
  bool ratio_input = false;        // the initializer is also a graph input (a caller may feed it)
  bool expose_mask = false;        // the mask is a graph output
  bool read_mask = false;          // a Cast reads the mask
  int opset = 17;
};

void add_node(onnx::GraphProto* g, const char* op, std::vector<std::string> in, std::vector<std::string> out,
              const char* domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_domain(domain);
  n->set_name(out[0] + "_node");
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
}

void add_float_input(onnx::GraphProto* g, const std::string& name, const Shape& shape) {
  auto* in = g->add_input();
  in->set_name(name);
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape) in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
}

// y = Dropout(x, ratio, training_mode = true), loss = sum(y * r), dx = Gradient(loss, [x]).
onnx::ModelProto dropout_model(const Shape& shape, const DropoutOptions& o) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(o.opset);
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  auto* g = m.mutable_graph();
  g->set_name("dropout");
  add_float_input(g, "x", shape);
  const Tensor ratio = Tensor::from_vector<float>(Shape{}, {o.ratio});
  if (o.ratio_initializer || o.ratio_input) {
    io::tensor_to_proto(ratio, "ratio", *g->add_initializer());
    if (o.ratio_input) add_float_input(g, "ratio", Shape{});
  } else {
    testing::add_constant_node(*g, "ratio", ratio);
  }
  testing::add_constant_node(*g, "training", Tensor::from_vector<bool>(Shape{}, {true}));
  add_node(g, "Dropout", {"x", "ratio", "training"}, {"y", "mask"});
  if (o.read_mask) {
    add_node(g, "Cast", {"mask"}, {"mask_float"});
    g->mutable_node(g->node_size() - 1)->add_attribute()->CopyFrom(attr("to", int64_t{onnx::TensorProto::FLOAT}));
    g->add_output()->set_name("mask_float");
  }
  if (o.expose_mask) g->add_output()->set_name("mask");
  io::tensor_to_proto(testing::random_f64(shape, 5).cast(DataType::Float32), "r", *g->add_initializer());
  add_node(g, "Mul", {"y", "r"}, {"yr"});
  add_node(g, "ReduceSum", {"yr"}, {"loss"});
  g->mutable_node(g->node_size() - 1)->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
  add_node(g, "Gradient", {"x"}, {"dx"}, "ai.onnx.preview.training");
  onnx::AttributeProto xs;
  xs.set_name("xs");
  xs.set_type(onnx::AttributeProto::STRINGS);
  xs.add_strings("x");
  auto* grad = g->mutable_node(g->node_size() - 1);
  *grad->add_attribute() = xs;
  *grad->add_attribute() = attr("y", std::string("loss"));
  g->add_output()->set_name("y");
  g->add_output()->set_name("dx");
  return m;
}

int replaced(const DropoutOptions& o) {
  onnx::GraphProto g = dropout_model({2, 3}, o).graph();
  const std::unordered_map<std::string, int> opsets{{"", o.opset}, {"ai.onnx.preview.training", 1}};
  return runtime::drop_zero_dropout(g, opsets);
}

TEST(DropoutFusion, ARatioOfZeroBecomesAnIdentityWithTheDropoutsValuesAndGradient) {
  const Shape shape{3, 67};
  for (bool initializer : {false, true}) {
    SCOPED_TRACE(initializer ? "ratio initializer" : "ratio Constant node");
    const onnx::ModelProto model = dropout_model(shape, {.ratio_initializer = initializer});
    onnx::GraphProto g = model.graph();
    const std::unordered_map<std::string, int> opsets{{"", 17}, {"ai.onnx.preview.training", 1}};
    ASSERT_EQ(runtime::drop_zero_dropout(g, opsets), 1);
    EXPECT_EQ(count_op(g, "Dropout"), 0);
    EXPECT_EQ(count_op(g, "Identity"), 1);
    const Tensor x = testing::random_f64(shape, 3).cast(DataType::Float32);
    runtime::Session fused(model), unfused(model, {.fuse = false});
    const auto a = fused.run({{"x", x}}), b = unfused.run({{"x", x}});
    // Both are exact: y = x, and dx = r (the mask keeps everything, 1 / (1 - 0) = 1).
    EXPECT_EQ(a.at("y").to_double_vector(), x.to_double_vector());
    EXPECT_EQ(b.at("y").to_double_vector(), x.to_double_vector());
    EXPECT_EQ(a.at("dx").to_double_vector(), b.at("dx").to_double_vector());
  }
}

TEST(DropoutFusion, EveryOtherDropoutStays) {
  EXPECT_EQ(replaced({}), 1);  // the baseline the cases below each change in one respect
  EXPECT_EQ(replaced({.ratio = 0.1f}), 0);
  EXPECT_EQ(replaced({.ratio_input = true}), 0);  // a run may feed another ratio
  EXPECT_EQ(replaced({.expose_mask = true}), 0);
  EXPECT_EQ(replaced({.read_mask = true}), 0);
  EXPECT_EQ(replaced({.opset = 11}), 0);  // Dropout-7 to 11: attribute ratio, no training mode
}

}  // namespace
}  // namespace onnxtrain
