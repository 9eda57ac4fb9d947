// runtime/fusion.h fuse_matmul_add: MatMul(A, B) -> Add(., C) with float32 B of rank 2 and C of
// rank 1 (a linear layer with bias on a 3-D input, as exporters write it) becomes one
// ai.onnxtrain.MatMulAdd whose values equal the two ops': constants, graph inputs (a training
// graph's parameters), B as Transpose(W) (read with transB), a product whose shape a Shape node
// reads, a bias of one element; the pair stays when the product is read elsewhere or the ranks
// are not stated; the kernel names a bias that does not broadcast.
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
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

// A float32 graph input; dims < 0 are symbolic; no shape unless `shaped`.
void add_input(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims, bool shaped = true) {
  testing::typed_value(g->add_input(), name, onnx::TensorProto::FLOAT, shaped ? dims : std::vector<int64_t>{});
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& inputs,
                          const std::string& output) {
  auto* n = testing::add_node(*g, op, inputs, {output});
  n->set_name(output);
  return n;
}

onnx::ModelProto pair_model(const PairOptions& o) {
  onnx::ModelProto m = testing::empty_model("linear");
  auto* g = m.mutable_graph();
  add_input(g, "x", {-1, 5, kK});
  add_tensor(g, testing::random_f64(Shape{kK, kN}, 1).cast(DataType::Float32), "W", o.constant_nodes);
  const int64_t c = o.bias_size > 0 ? o.bias_size : kN;
  add_tensor(g, testing::random_f64(Shape{c}, 2).cast(DataType::Float32), "bias", o.constant_nodes);
  if (o.bias_is_input) add_input(g, "bias", {c});
  add_node(g, "MatMul", {"x", "W"}, "xw");
  add_node(g, "Add", {o.bias_first ? "bias" : "xw", o.bias_first ? "xw" : "bias"}, "y");
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

TEST(MatMulAddFusion, ABiasThatIsAGraphInputOrOfOneElementIsFusedToo) {
  for (const PairOptions& o : {PairOptions{.bias_is_input = true}, PairOptions{.bias_size = 1}}) {
    SCOPED_TRACE(o.bias_is_input ? "C a graph input" : "C of one element");
    const onnx::ModelProto model = pair_model(o);
    onnx::GraphProto g = model.graph();
    ASSERT_EQ(runtime::fuse_matmul_add(g), 1);
    EXPECT_EQ(count_op(g, "MatMul") + count_op(g, "Add"), 0);
    runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{2, 5, kK}, 3).cast(DataType::Float32)}};
    if (o.bias_is_input) feeds["bias"] = testing::random_f64(Shape{kN}, 4).cast(DataType::Float32);
    runtime::Session fused(model), unfused(model, {.fuse = false});
    expect_close(fused.run(feeds).at("y"), unfused.run(feeds).at("y"), 1e-6, 1e-6);
  }
}

TEST(MatMulAddFusion, AProductReadElsewhereKeepsThePair) {
  onnx::GraphProto g = pair_model({.expose_product = true}).graph();
  EXPECT_EQ(runtime::fuse_matmul_add(g), 0);
  EXPECT_EQ(count_op(g, "MatMul"), 1);
  EXPECT_EQ(count_op(g, "Add"), 1);
}

// A training graph's linear layer: W [N, K] and b [N] are graph inputs (the parameters, fed every
// step), the product reads Transpose(W), and the backward pass reads the product's shape and W^T.
struct TrainingLinearOptions {
  bool transpose_read_elsewhere = false;  // W^T is also a graph output (as the backward pass reads it)
  bool bias_rank_stated = true;           // b's declared type has a shape
  bool bias_rank_two = false;             // b declared [1, N]
};

onnx::ModelProto training_linear(const TrainingLinearOptions& o) {
  onnx::ModelProto m = testing::empty_model("training_linear");
  auto* g = m.mutable_graph();
  add_input(g, "x", {-1, 5, kK});
  add_input(g, "W", {kN, kK});
  add_input(g, "b", o.bias_rank_two ? std::vector<int64_t>{1, kN} : std::vector<int64_t>{kN}, o.bias_rank_stated);
  *add_node(g, "Transpose", {"W"}, "Wt")->add_attribute() = testing::attr("perm", std::vector<int64_t>{1, 0});
  add_node(g, "MatMul", {"x", "Wt"}, "xw");
  add_node(g, "Shape", {"xw"}, "xw_shape");
  add_node(g, "Add", {"b", "xw"}, "y");
  g->add_output()->set_name("y");
  g->add_output()->set_name("xw_shape");
  if (o.transpose_read_elsewhere) g->add_output()->set_name("Wt");
  return m;
}

TEST(MatMulAddFusion, ATrainingGraphsLinearLayerReadsItsWeightsTransposedInPlace) {
  for (bool read_elsewhere : {false, true}) {
    SCOPED_TRACE(read_elsewhere ? "W^T read elsewhere" : "W^T read by the MatMul alone");
    const onnx::ModelProto model = training_linear({.transpose_read_elsewhere = read_elsewhere});
    onnx::GraphProto g = model.graph();
    ASSERT_EQ(runtime::fuse_matmul_add(g), 1);
    EXPECT_EQ(count_op(g, "MatMul") + count_op(g, "Add"), 0);
    EXPECT_EQ(count_op(g, "Transpose"), read_elsewhere ? 1 : 0);
    for (const auto& node : g.node()) {
      if (node.op_type() != "MatMulAdd") continue;
      EXPECT_EQ(node.input(1), "W");
      ASSERT_EQ(node.attribute_size(), 1);
      EXPECT_EQ(node.attribute(0).name(), "transB");
      EXPECT_EQ(node.attribute(0).i(), 1);
    }
    for (int64_t batch : {0, 1, 3, 40}) {  // 40 x 5 rows: oneDNN's matmul with the bias inside
      SCOPED_TRACE(batch);
      const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{batch, 5, kK}, 3).cast(DataType::Float32)},
                                        {"W", testing::random_f64(Shape{kN, kK}, 4).cast(DataType::Float32)},
                                        {"b", testing::random_f64(Shape{kN}, 5).cast(DataType::Float32)}};
      runtime::Session fused(model), unfused(model, {.fuse = false});
      const auto got = fused.run(feeds), want = unfused.run(feeds);
      EXPECT_EQ(got.at("y").shape(), (Shape{batch, 5, kN}));
      expect_close(got.at("y"), want.at("y"), 1e-6, 1e-6);
      expect_close(got.at("xw_shape"), want.at("xw_shape"), 0, 0);
      if (read_elsewhere) expect_close(got.at("Wt"), want.at("Wt"), 0, 0);
    }
  }
}

// make-trainable's program for a linear layer on a 3-D input written as PyTorch's training-mode
// export writes it (MatMul(x, Transpose(W)) -> Add(b, .)): the training session fuses the pair
// in the planned algorithm graph (W and b are typed graph inputs there, as in training_linear), and
// training agrees with the unfused run (a MatMulAdd that drops the bias fails here).
TEST(MatMulAddFusion, TrainingWithTheFusedLinearLayerAgreesWithoutIt) {
  onnx::ModelProto m = testing::empty_model("linear3d");
  auto* g = m.mutable_graph();
  add_input(g, "x", {-1, 3, kK});
  io::tensor_to_proto(testing::random_f64(Shape{kN, kK}, 1).cast(DataType::Float32), "W", *g->add_initializer());
  io::tensor_to_proto(testing::random_f64(Shape{kN}, 2).cast(DataType::Float32), "b", *g->add_initializer());
  *add_node(g, "Transpose", {"W"}, "Wt")->add_attribute() = testing::attr("perm", std::vector<int64_t>{1, 0});
  add_node(g, "MatMul", {"x", "Wt"}, "xw");
  add_node(g, "Add", {"b", "xw"}, "y");
  *add_node(g, "Flatten", {"y"}, "logits")->add_attribute() = testing::attr("axis", int64_t{1});
  testing::typed_value(g->add_output(), "logits", onnx::TensorProto::FLOAT, {-1, 3 * kN});
  const onnx::ModelProto model = training::make_trainable(m, {});

  std::vector<int64_t> labels(8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i * 7 % (3 * kN));
  const runtime::NamedTensors batch{{"x", testing::random_f64(Shape{8, 3, kK}, 3).cast(DataType::Float32)},
                                    {"label", Tensor::from_vector<int64_t>({8}, labels)}};
  training::TrainingOptions unfused;
  unfused.fuse = false;
  training::TrainingSession a(model), b(model, unfused);
  for (int step = 0; step < 10; ++step) {
    expect_close(a.step(batch).at("onnxtrain.loss"), b.step(batch).at("onnxtrain.loss"), 1e-6, 1e-7);
  }
  for (const auto& [name, value] : b.state()) expect_close(a.state().at(name), value, 1e-5, 1e-7);
}

TEST(MatMulAddFusion, ABiasOfUnstatedOrOtherRankKeepsThePair) {
  for (const TrainingLinearOptions& o : {TrainingLinearOptions{.bias_rank_stated = false},
                                         TrainingLinearOptions{.bias_rank_two = true}}) {
    onnx::GraphProto g = training_linear(o).graph();
    EXPECT_EQ(runtime::fuse_matmul_add(g), 0);
    EXPECT_EQ(count_op(g, "MatMul"), 1);
    EXPECT_EQ(count_op(g, "Add"), 1);
  }
}

TEST(MatMulAddFusion, ABiasThatDoesNotBroadcastIsAnErrorNamingIt) {
  onnx::ModelProto m = testing::empty_model("direct");
  auto* internal = m.add_opset_import();
  internal->set_domain("ai.onnxtrain");
  internal->set_version(1);
  auto* g = m.mutable_graph();
  for (const char* name : {"x", "W", "b"}) add_input(g, name, {}, false);
  auto* n = add_node(g, "MatMulAdd", {"x", "W", "b"}, "y");
  n->set_domain("ai.onnxtrain");
  *n->add_attribute() = testing::attr("transB", int64_t{1});
  g->add_output()->set_name("y");
  runtime::Session session(m);
  const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{4, kK}, 1).cast(DataType::Float32)},
                                    {"W", testing::random_f64(Shape{kN, kK}, 2).cast(DataType::Float32)},
                                    {"b", testing::random_f64(Shape{kN + 1}, 3).cast(DataType::Float32)}};
  const std::string message = testing::error_of([&] { session.run(feeds); });
  EXPECT_NE(message.find("input 'b' [20] does not broadcast to the product's shape [4,19]"), std::string::npos)
      << message;
  // Inner dims that differ name W as read, transposed.
  runtime::NamedTensors wide = feeds;
  wide["W"] = testing::random_f64(Shape{kN, kK + 1}, 2).cast(DataType::Float32);
  wide["b"] = testing::random_f64(Shape{kN}, 3).cast(DataType::Float32);
  const std::string mismatch = testing::error_of([&] { session.run(wide); });
  EXPECT_NE(mismatch.find("'W' transposed"), std::string::npos) << mismatch;
}

}  // namespace
}  // namespace onnxtrain
