// runtime/fusion.h fuse_matmul_add: MatMul(A, B) -> Add(., C) with constant B [K, N] and C [N]
// (a linear layer with bias on a 3-D input, as exporters write it) becomes one
// ai.onnxtrain.MatMulAdd whose values equal the two ops'; the pair stays when the product is read
// elsewhere, when B or C is a graph input (a run may replace it) or when C is not [N].
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::count_op;
using testing::expect_close;

struct PairOptions {
  bool bias_first = false;       // Add(C, y) instead of Add(y, C)
  bool constant_nodes = false;   // B and C as Constant nodes instead of initializers
  bool expose_product = false;   // the MatMul output is also a graph output
  bool bias_is_input = false;    // C is a graph input with an initializer (its default)
  int64_t bias_size = 0;         // C's elements (0: N)
};

constexpr int64_t kK = 37, kN = 19;

void add_tensor(onnx::GraphProto* g, const Tensor& t, const std::string& name, bool constant_node) {
  if (constant_node) {
    testing::add_constant_node(*g, name, t);
  } else {
    io::tensor_to_proto(t, name, *g->add_initializer());
  }
}

onnx::ModelProto pair_model(const PairOptions& o) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("linear");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {int64_t{-1}, int64_t{5}, kK}) {
    auto* dim = x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
    if (d < 0) {
      dim->set_dim_param("batch");
    } else {
      dim->set_dim_value(d);
    }
  }
  add_tensor(g, testing::random_f64(Shape{kK, kN}, 1).cast(DataType::Float32), "W", o.constant_nodes);
  const int64_t c = o.bias_size > 0 ? o.bias_size : kN;
  add_tensor(g, testing::random_f64(Shape{c}, 2).cast(DataType::Float32), "bias", o.constant_nodes);
  if (o.bias_is_input) {
    auto* in = g->add_input();
    in->set_name("bias");
    in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(c);
  }
  auto* mm = g->add_node();
  mm->set_op_type("MatMul");
  mm->add_input("x");
  mm->add_input("W");
  mm->add_output("xw");
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input(o.bias_first ? "bias" : "xw");
  add->add_input(o.bias_first ? "xw" : "bias");
  add->add_output("y");
  g->add_output()->set_name("y");
  if (o.expose_product) g->add_output()->set_name("xw");
  return m;
}

TEST(MatMulAddFusion, ALinearLayerBecomesOneMatMulAddWithTheSameValues) {
  for (bool constant_nodes : {false, true}) {
    for (bool bias_first : {false, true}) {
      SCOPED_TRACE(std::string(constant_nodes ? "Constant nodes" : "initializers") + (bias_first ? ", Add(C, y)" : ""));
      const onnx::ModelProto model = pair_model({.bias_first = bias_first, .constant_nodes = constant_nodes});
      onnx::GraphProto g = model.graph();
      ASSERT_EQ(runtime::fuse_matmul_add(g), 1);
      EXPECT_EQ(count_op(g, "MatMulAdd"), 1);
      EXPECT_EQ(count_op(g, "MatMul") + count_op(g, "Add"), 0);
      for (int64_t batch : {0, 1, 3}) {
        const runtime::NamedTensors feeds{
            {"x", testing::random_f64(Shape{batch, 5, kK}, 3).cast(DataType::Float32)}};
        runtime::Session fused(model), unfused(model, {.fuse = false});
        const Tensor got = fused.run(feeds).at("y"), want = unfused.run(feeds).at("y");
        EXPECT_EQ(got.shape(), (Shape{batch, 5, kN}));
        // The bias is added inside the product's accumulation instead of after its rounding.
        expect_close(got, want, 1e-6, 1e-6);
      }
    }
  }
}

TEST(MatMulAddFusion, AProductReadElsewhereAReplaceableBiasOrAnotherBiasShapeKeepsThePair) {
  for (const PairOptions& o : {PairOptions{.expose_product = true}, PairOptions{.bias_is_input = true},
                               PairOptions{.bias_size = 1}}) {
    onnx::GraphProto g = pair_model(o).graph();
    EXPECT_EQ(runtime::fuse_matmul_add(g), 0);
    EXPECT_EQ(count_op(g, "MatMul"), 1);
    EXPECT_EQ(count_op(g, "Add"), 1);
  }
}

}  // namespace
}  // namespace onnxtrain
