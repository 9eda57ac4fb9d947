// runtime/fusion.h fuse_transpose_matmul: a Transpose that swaps the last two dims of a MatMul
// operand, read by that MatMul alone, becomes transA / transB of one ai.onnxtrain.MatMulTransposed
// reading the Transpose's input; its values equal Transpose -> MatMul's for every element type
// (float32 through sgemm's or oneDNN's strides, the others through copies), batch layout and
// broadcast. Transposes read elsewhere, pinned as graph outputs or permuting other dims stay.
// fuse_permuted_matmul: Transposes of any perm of rank >= 3 (attention's head split) become
// perm_a / perm_b of one ai.onnxtrain.MatMulPermuted, after a Mul by a scalar constant moves
// ahead of its Transpose and Shape nodes of the split read Gather(Shape(x), perm); values equal.
// fuse_transpose_gemm: a weight's W^T read by Gemm operands and Shape nodes (a Linear's training
// graph) is read in place with the Gemm's trans flag flipped, and a Transpose of a Gemm's product
// (the weight gradient, through a SumToShape or not) becomes the Gemm writing it; values equal.
// permute_product_outputs: a Transpose of rank >= 3 of a product's output (attention's head merge)
// becomes perm_y of the MatMulPermuted writing it, Shape readers of the product read
// Gather(Shape(y), inverse perm); values equal for every path, and other readers keep it.
// gather_before_transpose: a Gather by a constant scalar of a Transpose's output (a batch-first
// LSTM's last step) reads the Transpose's input on the moved axis when the kept dims stay in
// order; values equal; other perms, indices, readers and pinned values keep the Transpose.
#include <map>

#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::count_op;
using testing::expect_close;

// A model named `name` with float inputs a and b of `elem_type` (shapes undeclared).
onnx::ModelProto model_with_inputs(const std::string& name, int elem_type) {
  onnx::ModelProto m = testing::empty_model(name);
  for (const char* in : {"a", "b"}) testing::typed_value(m.mutable_graph()->add_input(), in, elem_type, {});
  return m;
}

onnx::NodeProto* node(onnx::GraphProto& g, const std::string& op, std::vector<std::string> in, const std::string& out) {
  auto* n = testing::add_node(g, op, in, {out});
  n->set_name(out);
  return n;
}

void transpose(onnx::GraphProto& g, const std::string& in, const std::string& out, std::vector<int64_t> perm) {
  *node(g, "Transpose", {in}, out)->add_attribute() = testing::attr("perm", perm);
}

std::vector<int64_t> swap_last2(size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t d = 0; d < rank; ++d) perm[d] = static_cast<int64_t>(d);
  std::swap(perm[rank - 2], perm[rank - 1]);
  return perm;
}

// y = MatMul(ta ? Transpose(a) : a, tb ? Transpose(b) : b), the Transposes swapping the last two dims.
onnx::ModelProto product_model(size_t rank_a, size_t rank_b, bool ta, bool tb, int elem_type) {
  onnx::ModelProto m = model_with_inputs("product", elem_type);
  auto& g = *m.mutable_graph();
  if (ta) transpose(g, "a", "a_t", swap_last2(rank_a));
  if (tb) transpose(g, "b", "b_t", swap_last2(rank_b));
  node(g, "MatMul", {ta ? "a_t" : "a", tb ? "b_t" : "b"}, "y");
  g.add_output()->set_name("y");
  return m;
}

struct Case {
  Shape a, b;  // the MatMul operands' shapes (before the Transposes' swap)
  const char* label;
};

TEST(TransposeMatMulFusion, FoldedTransposesGiveMatMulsValues) {
  const std::vector<Case> cases = {
      {{5, 7}, {7, 3}, "2-D"},
      {{4, 5, 7}, {4, 7, 3}, "equal batches"},
      {{2, 3, 5, 7}, {2, 3, 7, 6}, "rank 4"},
      {{2, 1, 5, 7}, {3, 7, 6}, "broadcast batches"},
      {{4, 5, 7}, {7, 3}, "B without a batch (A's batch in its rows)"},
      {{5, 7}, {4, 7, 3}, "A without a batch"},
      {{1, 5, 7}, {1, 7, 3}, "batch of one"},
      {{4, 0, 7}, {4, 7, 3}, "no rows"},
      {{4, 5, 0}, {4, 0, 3}, "K = 0"},
  };
  for (const auto& [ta, tb] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
    for (const Case& c : cases) {
      for (const DataType dtype : {DataType::Float32, DataType::Float64}) {
        SCOPED_TRACE(std::string(c.label) + (ta ? ", transA" : "") + (tb ? ", transB" : "") +
                     (dtype == DataType::Float32 ? ", float32" : ", float64"));
        const int elem = dtype == DataType::Float32 ? onnx::TensorProto::FLOAT : onnx::TensorProto::DOUBLE;
        const onnx::ModelProto model = product_model(c.a.size(), c.b.size(), ta, tb, elem);
        onnx::GraphProto g = model.graph();
        ASSERT_EQ(runtime::fuse_transpose_matmul(g), int{ta} + int{tb});
        EXPECT_EQ(count_op(g, "Transpose") + count_op(g, "MatMul"), 0);
        EXPECT_EQ(count_op(g, "MatMulTransposed"), 1);
        // The stored operands: the Transposes' inputs.
        auto stored = [](const Shape& s, bool t) {
          Shape r = s;
          if (t) std::swap(r[r.size() - 2], r[r.size() - 1]);
          return r;
        };
        const runtime::NamedTensors feeds{{"a", testing::random_f64(stored(c.a, ta), 1).cast(dtype)},
                                          {"b", testing::random_f64(stored(c.b, tb), 2).cast(dtype)}};
        runtime::Session fused(model), unfused(model, {.fuse = false});
        const Tensor got = fused.run(feeds).at("y"), want = unfused.run(feeds).at("y");
        ASSERT_EQ(got.shape(), want.shape());
        if (dtype == DataType::Float32) {
          expect_close(got, want, 1e-5, 1e-5);  // another summation order in the product
        } else {
          expect_close(got, want, 1e-12, 1e-12);
        }
      }
    }
  }
}

TEST(TransposeMatMulFusion, TransposesReadElsewherePinnedOrPermutingOtherDimsStay) {
  onnx::ModelProto m = model_with_inputs("kept", onnx::TensorProto::FLOAT);
  auto& g = *m.mutable_graph();
  transpose(g, "a", "a_twice", {0, 2, 1});  // read by two MatMuls
  node(g, "MatMul", {"a_twice", "b"}, "y1");
  node(g, "MatMul", {"a_twice", "b"}, "y2");
  transpose(g, "a", "a_out", {0, 2, 1});  // also a graph output
  node(g, "MatMul", {"a_out", "b"}, "y3");
  transpose(g, "a", "a_batch", {1, 0, 2});  // permutes a batch dim
  node(g, "MatMul", {"a_batch", "b"}, "y4");
  transpose(g, "b", "b_t", {0, 2, 1});  // the one that folds
  node(g, "MatMul", {"a", "b_t"}, "y5");
  for (const char* out : {"y1", "y2", "y3", "y4", "y5", "a_out"}) g.add_output()->set_name(out);

  onnx::GraphProto fused = g;
  EXPECT_EQ(runtime::fuse_transpose_matmul(fused), 1);
  EXPECT_EQ(count_op(fused, "Transpose"), 3);
  EXPECT_EQ(count_op(fused, "MatMul"), 4);
  EXPECT_EQ(count_op(fused, "MatMulTransposed"), 1);

  const runtime::NamedTensors feeds{{"a", testing::random_f64(Shape{4, 4, 4}, 3).cast(DataType::Float32)},
                                    {"b", testing::random_f64(Shape{4, 4, 4}, 4).cast(DataType::Float32)}};
  const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
  for (const char* out : {"y1", "y2", "y3", "y4", "y5", "a_out"}) {
    SCOPED_TRACE(out);
    expect_close(got.at(out), want.at(out), 1e-5, 1e-5);
  }
}

// y = the internal product `op`(a, b) with attribute `attribute`, as a model of its own.
onnx::ModelProto direct_model(const std::string& op, const onnx::AttributeProto& attribute) {
  onnx::ModelProto m = model_with_inputs("direct", onnx::TensorProto::FLOAT);
  auto* internal = m.add_opset_import();
  internal->set_domain("ai.onnxtrain");
  internal->set_version(1);
  auto& g = *m.mutable_graph();
  auto* n = node(g, op, {"a", "b"}, "y");
  n->set_domain("ai.onnxtrain");
  *n->add_attribute() = attribute;
  g.add_output()->set_name("y");
  return m;
}

TEST(TransposeMatMulFusion, ATransposedOperandOfRankOneIsAnErrorNamingIt) {
  runtime::Session session(direct_model("MatMulTransposed", testing::attr("transA", int64_t{1})));
  const std::string message = testing::error_of([&] {
    session.run({{"a", testing::random_f64(Shape{4}, 1).cast(DataType::Float32)},
                 {"b", testing::random_f64(Shape{4, 2}, 2).cast(DataType::Float32)}});
  });
  EXPECT_NE(message.find("input 'a'"), std::string::npos) << message;
  EXPECT_NE(message.find("transA = 1 needs rank >= 2"), std::string::npos) << message;
  // Inner dims that differ: the message shows the shape the product reads and says it is transposed.
  const std::string mismatch = testing::error_of([&] {
    session.run({{"a", testing::random_f64(Shape{2, 4, 3}, 1).cast(DataType::Float32)},
                 {"b", testing::random_f64(Shape{2, 5, 2}, 2).cast(DataType::Float32)}});
  });
  EXPECT_NE(mismatch.find("node 'y'"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("'a' transposed [2,3,4]"), std::string::npos) << mismatch;
}

// A training graph's W^T = Transpose(w) as the gradient of a Linear reads it: as B of the input
// gradient's Gemm (transB = 1: (W^T)^T), with `as_a` also as A of a second Gemm (with a bias
// and alpha), and by Shape nodes (the weight gradient's shape). `pinned`: W^T is a graph output.
onnx::ModelProto weight_transpose_model(bool as_a, bool pinned) {
  onnx::ModelProto m = testing::empty_model("linear_gradient");
  auto& g = *m.mutable_graph();
  for (const char* in : {"w", "dy", "c", "bias"}) testing::typed_value(g.add_input(), in, onnx::TensorProto::FLOAT, {});
  transpose(g, "w", "wt", {1, 0});
  *node(g, "Gemm", {"dy", "wt"}, "dx")->add_attribute() = testing::attr("transB", int64_t{1});
  node(g, "Shape", {"wt"}, "wt_shape");
  *node(g, "Shape", {"wt"}, "wt_rows")->add_attribute() = testing::attr("end", int64_t{1});
  std::vector<std::string> outputs{"dx", "wt_shape", "wt_rows"};
  if (as_a) {
    auto* gemm = node(g, "Gemm", {"wt", "c", "bias"}, "z");
    *gemm->add_attribute() = testing::attr("alpha", 0.5f);
    outputs.push_back("z");
  }
  if (pinned) outputs.push_back("wt");
  for (const auto& out : outputs) g.add_output()->set_name(out);
  return m;
}

TEST(TransposeGemmFusion, AWeightsTransposeReadByGemmsAndShapesIsReadInPlace) {
  for (bool as_a : {false, true}) {
    SCOPED_TRACE(as_a ? "as B and as A" : "as B");
    const onnx::ModelProto m = weight_transpose_model(as_a, false);
    onnx::GraphProto g = m.graph();
    EXPECT_EQ(runtime::fuse_transpose_gemm(g), 1);
    EXPECT_EQ(count_op(g, "Transpose"), 0);
    EXPECT_EQ(count_op(g, "Gather"), 2);
    for (const auto& n : g.node()) {  // transB = 1 on W^T is transB = 0 on W; no transA on W^T is transA = 1 on W
      if (n.op_type() != "Gemm") continue;
      EXPECT_EQ(n.input(n.output(0) == "dx" ? 1 : 0), "w");
      for (const auto& a : n.attribute()) {
        if (a.name() == "transB") {
          EXPECT_EQ(a.i(), 0);
        }
        if (a.name() == "transA") {
          EXPECT_EQ(a.i(), 1);
        }
      }
    }
    const runtime::NamedTensors feeds{{"w", testing::random_f64(Shape{3, 4}, 1).cast(DataType::Float32)},
                                      {"dy", testing::random_f64(Shape{5, 3}, 2).cast(DataType::Float32)},
                                      {"c", testing::random_f64(Shape{3, 6}, 3).cast(DataType::Float32)},
                                      {"bias", testing::random_f64(Shape{6}, 4).cast(DataType::Float32)}};
    const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
    EXPECT_EQ(got.at("dx").shape(), (Shape{5, 4}));
    for (const auto& [name, value] : want) {
      SCOPED_TRACE(name);
      expect_close(got.at(name), value, 1e-6, 1e-6);
    }
  }
}

TEST(TransposeGemmFusion, ATransposeReadOtherwiseOrPinnedStays) {
  onnx::GraphProto pinned = weight_transpose_model(true, true).graph();
  EXPECT_EQ(runtime::fuse_transpose_gemm(pinned), 0);
  onnx::GraphProto as_c = weight_transpose_model(false, false).graph();  // W^T also as a Gemm's C
  *node(as_c, "Gemm", {"dy", "w", "wt"}, "with_c")->add_attribute() = testing::attr("transB", int64_t{1});
  EXPECT_EQ(runtime::fuse_transpose_gemm(as_c), 0);
  onnx::GraphProto both = weight_transpose_model(false, false).graph();  // as A and B of one Gemm
  node(both, "Gemm", {"wt", "wt"}, "square");
  EXPECT_EQ(runtime::fuse_transpose_gemm(both), 0);
  onnx::GraphProto by_matmul = weight_transpose_model(false, false).graph();
  node(by_matmul, "MatMul", {"dy", "wt"}, "product");
  EXPECT_EQ(runtime::fuse_transpose_gemm(by_matmul), 0);
  for (const onnx::GraphProto* g : {&pinned, &as_c, &both, &by_matmul}) EXPECT_EQ(count_op(*g, "Transpose"), 1);
}

// A training graph's weight gradient dW = Transpose(SumToShape(Gemm(x, dy, transA = 1), target))
// (the gradient of W^T = Transpose(W) after the Gemm that sums x^T dy over the rows), with
// `through_sum` false the Transpose reading the Gemm (alpha 2, transB) directly; an Identity
// reads the Transpose. `target` is an
// int64 input: [K, N] keeps the sum as it is, [1, N] sums over K. `extra_reader`: the product is
// also a graph output.
onnx::ModelProto weight_gradient_model(bool through_sum, bool extra_reader) {
  onnx::ModelProto m = testing::empty_model("weight_gradient");
  auto* internal = m.add_opset_import();
  internal->set_domain("ai.onnxtrain");
  internal->set_version(1);
  auto& g = *m.mutable_graph();
  for (const char* in : {"x", "dy"}) testing::typed_value(g.add_input(), in, onnx::TensorProto::FLOAT, {});
  testing::typed_value(g.add_input(), "target", onnx::TensorProto::INT64, {2});
  auto* gemm = node(g, "Gemm", {"x", "dy"}, "product");
  *gemm->add_attribute() = testing::attr(through_sum ? "transA" : "transB", int64_t{1});
  if (!through_sum) *gemm->add_attribute() = testing::attr("alpha", 2.0f);
  if (through_sum) node(g, "SumToShape", {"product", "target"}, "summed")->set_domain("ai.onnxtrain");
  transpose(g, through_sum ? "summed" : "product", "dw_t", {1, 0});
  node(g, "Identity", {"dw_t"}, "dw");  // as the Gradient node's output reads it
  g.add_output()->set_name("dw");
  if (extra_reader) g.add_output()->set_name("product");
  return m;
}

TEST(TransposeGemmFusion, ATransposedProductIsWrittenTransposed) {
  for (bool through_sum : {true, false}) {
    for (const std::vector<int64_t>& target : {std::vector<int64_t>{4, 3}, std::vector<int64_t>{1, 3}}) {
      if (!through_sum && target[0] == 1) continue;
      SCOPED_TRACE(std::string(through_sum ? "through SumToShape to " : "the Gemm's own output, ") +
                   Shape(target).to_string());
      const onnx::ModelProto m = weight_gradient_model(through_sum, false);
      onnx::GraphProto g = m.graph();
      EXPECT_EQ(runtime::fuse_transpose_gemm(g), 1);
      EXPECT_EQ(count_op(g, "Transpose"), 0);
      EXPECT_EQ(count_op(g, "Gather"), through_sum ? 1 : 0);
      // x [5, 4], dy [5, 3]: x^T dy [4, 3]; without the sum, x [4, 5] and dy [3, 5]: 2 x dy^T [4, 3].
      const runtime::NamedTensors feeds{
          {"x", testing::random_f64(through_sum ? Shape{5, 4} : Shape{4, 5}, 1).cast(DataType::Float32)},
          {"dy", testing::random_f64(through_sum ? Shape{5, 3} : Shape{3, 5}, 2).cast(DataType::Float32)},
          {"target", Tensor::from_vector<int64_t>({2}, target)}};
      const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
      EXPECT_EQ(got.at("dw").shape(), (Shape{3, target[0]}));
      expect_close(got.at("dw"), want.at("dw"), 1e-6, 1e-6);
    }
  }
}

TEST(TransposeGemmFusion, AProductReadElsewhereOrWithCStays) {
  onnx::GraphProto read_elsewhere = weight_gradient_model(true, true).graph();
  EXPECT_EQ(runtime::fuse_transpose_gemm(read_elsewhere), 0);
  onnx::GraphProto with_c = weight_gradient_model(false, false).graph();
  with_c.mutable_node(0)->add_input("x");
  EXPECT_EQ(runtime::fuse_transpose_gemm(with_c), 0);
  EXPECT_EQ(count_op(read_elsewhere, "Transpose") + count_op(with_c, "Transpose"), 2);
}

// An attention block as the BERT export writes it: q, k and v [B, S, H * D] split into heads by
// Reshape and Transpose, Q and K scaled after the split, the split's shape read by Shape nodes.
constexpr int64_t kB = 2, kS = 5, kH = 3, kD = 4;

// With `shape_of_scaled`, a Shape node reads the scaled Q too (as a training graph's gradient
// of that Mul does).
onnx::ModelProto attention_model(bool pin_split, bool shape_of_scaled = false) {
  onnx::ModelProto m = testing::empty_model("attention");
  auto& g = *m.mutable_graph();
  for (const char* in : {"q", "k", "v"}) testing::typed_value(g.add_input(), in, onnx::TensorProto::FLOAT, {});
  io::tensor_to_proto(Tensor::from_vector<int64_t>({4}, {0, 0, kH, kD}), "split", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<float>({}, {0.5f}), "scale", *g.add_initializer());
  for (const char* x : {"q", "k", "v"}) node(g, "Reshape", {x, "split"}, std::string(x) + "4");
  transpose(g, "q4", "qt", {0, 2, 1, 3});
  node(g, "Shape", {"qt"}, "qt_shape");
  *node(g, "Shape", {"qt"}, "qt_tail")->add_attribute() = testing::attr("start", int64_t{-2});
  node(g, "Mul", {"qt", "scale"}, "qs");
  if (shape_of_scaled) {
    node(g, "Shape", {"qs"}, "qs_shape");
    g.add_output()->set_name("qs_shape");
  }
  transpose(g, "k4", "kt", {0, 2, 3, 1});
  node(g, "Mul", {"scale", "kt"}, "ks");
  node(g, "MatMul", {"qs", "ks"}, "scores");
  node(g, "Softmax", {"scores"}, "p");
  transpose(g, "v4", "vt", {0, 2, 1, 3});
  node(g, "MatMul", {"p", "vt"}, "context");
  for (const char* out : {"context", "qt_shape", "qt_tail"}) g.add_output()->set_name(out);
  if (pin_split) g.add_output()->set_name("vt");
  return m;
}

runtime::NamedTensors attention_feeds() {
  runtime::NamedTensors feeds;
  int seed = 1;
  for (const char* in : {"q", "k", "v"}) {
    feeds[in] = testing::random_f64(Shape{kB, kS, kH * kD}, seed++).cast(DataType::Float32);
  }
  return feeds;
}

TEST(PermutedMatMulFusion, AttentionsHeadSplitIsReadInPlace) {
  const onnx::ModelProto m = attention_model(false);
  onnx::GraphProto g = m.graph();
  EXPECT_EQ(runtime::fuse_permuted_matmul(g), 3);
  EXPECT_EQ(count_op(g, "MatMulPermuted"), 2);
  EXPECT_EQ(count_op(g, "Transpose") + count_op(g, "MatMul"), 0);
  EXPECT_EQ(count_op(g, "Mul"), 2);     // now of the unsplit q4 and k4
  EXPECT_EQ(count_op(g, "Gather"), 2);  // the split's shape from q4's
  const auto feeds = attention_feeds();
  const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
  EXPECT_EQ(got.at("context").shape(), (Shape{kB, kH, kS, kD}));
  expect_close(got.at("context"), want.at("context"), 1e-6, 1e-6);
  expect_close(got.at("qt_shape"), want.at("qt_shape"), 0, 0);
  expect_close(got.at("qt_tail"), want.at("qt_tail"), 0, 0);
}

// The Mul moved ahead of Q's split leaves the split with the Mul's Shape reader; a second round
// of the preparation takes it, so the split still folds.
TEST(PermutedMatMulFusion, ASplitWhoseScaledValueAShapeReadsFoldsToo) {
  const onnx::ModelProto m = attention_model(false, true);
  onnx::GraphProto g = m.graph();
  EXPECT_EQ(runtime::fuse_permuted_matmul(g), 3);
  EXPECT_EQ(count_op(g, "Transpose") + count_op(g, "MatMul"), 0);
  EXPECT_EQ(count_op(g, "Gather"), 3);
  const auto feeds = attention_feeds();
  const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
  expect_close(got.at("context"), want.at("context"), 1e-6, 1e-6);
  expect_close(got.at("qs_shape"), want.at("qs_shape"), 0, 0);
  const Tensor& qs_shape = got.at("qs_shape");
  EXPECT_EQ(std::vector<int64_t>(qs_shape.data<int64_t>(), qs_shape.data<int64_t>() + qs_shape.numel()),
            (std::vector<int64_t>{kB, kH, kS, kD}));
}

TEST(PermutedMatMulFusion, ATransposeReadElsewhereStays) {
  onnx::GraphProto g = attention_model(true).graph();
  EXPECT_EQ(runtime::fuse_permuted_matmul(g), 2);  // Q's and K's; V's split is a graph output
  EXPECT_EQ(count_op(g, "Transpose"), 1);
  EXPECT_EQ(count_op(g, "MatMul"), 1);
}

// A split read by several products, as in a training graph, where the backward pass reads it
// too: y1 = t d, y2 = t^T e (a MatMulTransposed after fuse_transpose_matmul, whose transA composes
// with the perm), and with `flagged_input` also y3 = t f^T with f a graph input (a flag on an
// operand no Transpose makes: the split stays).
onnx::ModelProto shared_split_model(bool flagged_input) {
  onnx::ModelProto m = testing::empty_model("shared");
  auto& g = *m.mutable_graph();
  for (const char* in : {"a", "d", "e", "f"}) testing::typed_value(g.add_input(), in, onnx::TensorProto::FLOAT, {});
  transpose(g, "a", "t", {1, 0, 2});
  node(g, "MatMul", {"t", "d"}, "y1");
  transpose(g, "t", "t_swapped", {0, 2, 1});
  node(g, "MatMul", {"t_swapped", "e"}, "y2");
  g.add_output()->set_name("y1");
  g.add_output()->set_name("y2");
  if (flagged_input) {
    transpose(g, "f", "f_swapped", {0, 2, 1});
    node(g, "MatMul", {"t", "f_swapped"}, "y3");
    g.add_output()->set_name("y3");
  }
  return m;
}

TEST(PermutedMatMulFusion, ASplitReadBySeveralProductsIsReadInPlaceByEach) {
  for (bool flagged_input : {false, true}) {
    SCOPED_TRACE(flagged_input ? "with a flag on a graph input" : "products only");
    const onnx::ModelProto m = shared_split_model(flagged_input);
    onnx::GraphProto g = m.graph();
    runtime::fuse_transpose_matmul(g);
    EXPECT_EQ(count_op(g, "MatMulTransposed"), flagged_input ? 2 : 1);
    EXPECT_EQ(runtime::fuse_permuted_matmul(g), flagged_input ? 0 : 1);
    EXPECT_EQ(count_op(g, "Transpose"), flagged_input ? 1 : 0);
    EXPECT_EQ(count_op(g, "MatMulPermuted"), flagged_input ? 0 : 2);
    for (const auto& n : g.node()) {  // y2 reads a with the perm and then its last two dims swapped
      if (n.op_type() == "MatMulPermuted" && n.output(0) == "y2") {
        ASSERT_EQ(n.attribute_size(), 1);
        EXPECT_EQ(std::vector<int64_t>(n.attribute(0).ints().begin(), n.attribute(0).ints().end()),
                  (std::vector<int64_t>{1, 2, 0}));
      }
    }
    const runtime::NamedTensors feeds{{"a", testing::random_f64(Shape{2, 3, 4}, 1).cast(DataType::Float32)},
                                      {"d", testing::random_f64(Shape{3, 4, 5}, 2).cast(DataType::Float32)},
                                      {"e", testing::random_f64(Shape{3, 2, 6}, 3).cast(DataType::Float32)},
                                      {"f", testing::random_f64(Shape{3, 7, 4}, 4).cast(DataType::Float32)}};
    const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
    for (const auto& [name, value] : want) {
      SCOPED_TRACE(name);
      expect_close(got.at(name), value, 1e-6, 1e-6);
    }
  }
}

TEST(PermutedMatMulFusion, OtherElementTypesRanksAndBroadcastBatchesGiveMatMulsValues) {
  struct PermCase {
    Shape a, b;
    std::vector<int64_t> perm_a;
    int elem_type;
    const char* label;
  };
  const std::vector<PermCase> cases = {
      {{3, 2, 4}, {2, 4, 5}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, batches equal: in place"},
      {{3, 2, 4}, {2, 4, 5}, {1, 0, 2}, onnx::TensorProto::DOUBLE, "float64: copies"},
      {{3, 2, 4}, {4, 5}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, B of rank 2: copies"},
      {{3, 1, 4}, {2, 4, 5}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, broadcast batch: copies"},
      {{3, 2, 4}, {2, 4, 5}, {1, 0, 2}, onnx::TensorProto::INT32, "int32: copies"},
  };
  for (const PermCase& c : cases) {
    SCOPED_TRACE(c.label);
    onnx::ModelProto m = model_with_inputs("permuted", c.elem_type);
    auto& g = *m.mutable_graph();
    transpose(g, "a", "a_t", c.perm_a);
    node(g, "MatMul", {"a_t", "b"}, "y");
    g.add_output()->set_name("y");
    onnx::GraphProto fused = g;
    ASSERT_EQ(runtime::fuse_permuted_matmul(fused), 1);
    const DataType type = c.elem_type == onnx::TensorProto::FLOAT    ? DataType::Float32
                          : c.elem_type == onnx::TensorProto::DOUBLE ? DataType::Float64
                                                                     : DataType::Int32;
    const runtime::NamedTensors feeds{{"a", testing::random_f64(c.a, 1).cast(type)},
                                      {"b", testing::random_f64(c.b, 2).cast(type)}};
    const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
    expect_close(got.at("y"), want.at("y"), 1e-6, 1e-6);
  }
}

TEST(PermutedMatMulFusion, APermThatIsNotAPermutationIsAnErrorNamingTheInput) {
  runtime::Session session(direct_model("MatMulPermuted", testing::attr("perm_a", std::vector<int64_t>{0, 0, 1})));
  const std::string message = testing::error_of([&] {
    session.run({{"a", testing::random_f64(Shape{2, 3, 4}, 1).cast(DataType::Float32)},
                 {"b", testing::random_f64(Shape{2, 4, 2}, 2).cast(DataType::Float32)}});
  });
  EXPECT_NE(message.find("attribute perm_a [0,0,1] is not a permutation of the dims of input 'a' [2,3,4]"),
            std::string::npos)
      << message;
}

// The attention of attention_model with its head merge: merged = Transpose(context, [0, 2, 1, 3])
// reshaped to [B, S, H * D], and Shape(context) as a graph output.
onnx::ModelProto merged_attention_model() {
  onnx::ModelProto m = attention_model(false);
  auto& g = *m.mutable_graph();
  transpose(g, "context", "merged4", {0, 2, 1, 3});
  io::tensor_to_proto(Tensor::from_vector<int64_t>({3}, {0, 0, kH * kD}), "merge", *g.add_initializer());
  node(g, "Reshape", {"merged4", "merge"}, "merged");
  node(g, "Shape", {"context"}, "context_shape");
  g.mutable_output()->Clear();
  for (const char* out : {"merged", "context_shape", "qt_shape"}) g.add_output()->set_name(out);
  return m;
}

TEST(PermutedProductOutput, AttentionsHeadMergeIsWrittenInPlace) {
  const onnx::ModelProto m = merged_attention_model();
  onnx::GraphProto g = m.graph();
  ASSERT_EQ(runtime::fuse_permuted_matmul(g), 3);
  EXPECT_EQ(runtime::permute_product_outputs(g), 1);
  EXPECT_EQ(count_op(g, "Transpose") + count_op(g, "MatMul"), 0);
  ASSERT_EQ(count_op(g, "MatMulPermuted"), 2);
  int with_perm_y = 0;
  for (const auto& n : g.node()) {
    for (const auto& a : n.attribute()) with_perm_y += a.name() == "perm_y";
  }
  EXPECT_EQ(with_perm_y, 1);
  const auto feeds = attention_feeds();
  const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
  EXPECT_EQ(got.at("merged").shape(), (Shape{kB, kS, kH * kD}));
  expect_close(got.at("merged"), want.at("merged"), 1e-6, 1e-6);
  const Tensor& shape = got.at("context_shape");  // the unpermuted product's shape, as before
  EXPECT_EQ(std::vector<int64_t>(shape.data<int64_t>(), shape.data<int64_t>() + shape.numel()),
            (std::vector<int64_t>{kB, kH, kS, kD}));
}

TEST(PermutedProductOutput, EveryPathGivesTheTransposedProduct) {
  struct OutCase {
    Shape a, b;
    std::vector<int64_t> perm_a, perm_y;
    int elem_type;
    const char* label;
  };
  const std::vector<OutCase> cases = {
      {{3, 2, 4}, {3, 4, 5}, {}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, batches equal: in place"},
      {{3, 2, 4}, {3, 4, 5}, {}, {2, 0, 1}, onnx::TensorProto::FLOAT, "float32, a cyclic perm: in place"},
      {{2, 3, 2, 4}, {2, 3, 4, 5}, {}, {3, 1, 0, 2}, onnx::TensorProto::FLOAT, "float32, rank 4: in place"},
      {{2, 3, 4}, {3, 4, 5}, {1, 0, 2}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, A permuted too: in place"},
      {{3, 2, 4}, {3, 4, 5}, {}, {1, 0, 2}, onnx::TensorProto::DOUBLE, "float64: copies"},
      {{3, 2, 4}, {4, 5}, {}, {1, 0, 2}, onnx::TensorProto::FLOAT, "float32, B of rank 2: copies"},
      {{3, 1, 2, 4}, {2, 4, 5}, {}, {1, 3, 0, 2}, onnx::TensorProto::FLOAT, "float32, broadcast: copies"},
      {{3, 2, 4}, {3, 4, 5}, {}, {1, 0, 2}, onnx::TensorProto::INT32, "int32: copies"},
      {{3, 0, 4}, {3, 4, 5}, {}, {1, 0, 2}, onnx::TensorProto::FLOAT, "no rows"},
      {{3, 2, 0}, {3, 0, 5}, {}, {2, 1, 0}, onnx::TensorProto::FLOAT, "K = 0: zeros"},
  };
  for (const OutCase& c : cases) {
    SCOPED_TRACE(c.label);
    onnx::ModelProto m = model_with_inputs("permuted_output", c.elem_type);
    auto& g = *m.mutable_graph();
    if (!c.perm_a.empty()) transpose(g, "a", "a_t", c.perm_a);
    node(g, "MatMul", {c.perm_a.empty() ? "a" : "a_t", "b"}, "product");
    transpose(g, "product", "y_t", c.perm_y);
    node(g, "Identity", {"y_t"}, "y");  // a Transpose writing a graph output is left alone
    g.add_output()->set_name("y");
    onnx::GraphProto fused = g;
    runtime::fuse_permuted_matmul(fused);
    ASSERT_EQ(runtime::permute_product_outputs(fused), 1);
    EXPECT_EQ(count_op(fused, "Transpose"), 0);
    const DataType type = c.elem_type == onnx::TensorProto::FLOAT    ? DataType::Float32
                          : c.elem_type == onnx::TensorProto::DOUBLE ? DataType::Float64
                                                                     : DataType::Int32;
    const runtime::NamedTensors feeds{{"a", testing::random_f64(c.a, 1).cast(type)},
                                      {"b", testing::random_f64(c.b, 2).cast(type)}};
    const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
    ASSERT_EQ(got.at("y").shape(), want.at("y").shape());
    expect_close(got.at("y"), want.at("y"), 1e-6, 1e-6);
  }
}

TEST(PermutedProductOutput, ProductsReadElsewherePinnedOrOfRankTwoKeepTheirTranspose) {
  onnx::ModelProto m = model_with_inputs("kept_outputs", onnx::TensorProto::FLOAT);
  auto& g = *m.mutable_graph();
  node(g, "MatMul", {"a", "b"}, "read_twice");  // also read by a Relu
  transpose(g, "read_twice", "y1", {1, 0, 2});
  node(g, "Relu", {"read_twice"}, "y2");
  node(g, "MatMul", {"a", "b"}, "pinned");  // a graph output
  transpose(g, "pinned", "y3", {1, 0, 2});
  node(g, "Relu", {"a"}, "not_a_product");
  transpose(g, "not_a_product", "y4", {1, 0, 2});
  node(g, "MatMul", {"a", "b"}, "folds");
  transpose(g, "folds", "y5_t", {2, 1, 0});
  node(g, "Identity", {"y5_t"}, "y5");
  for (const char* out : {"y1", "y2", "pinned", "y3", "y4", "y5"}) g.add_output()->set_name(out);
  onnx::GraphProto fused = g;
  EXPECT_EQ(runtime::permute_product_outputs(fused), 1);
  EXPECT_EQ(count_op(fused, "Transpose"), 3);
  const runtime::NamedTensors feeds{{"a", testing::random_f64(Shape{3, 2, 4}, 1).cast(DataType::Float32)},
                                    {"b", testing::random_f64(Shape{3, 4, 5}, 2).cast(DataType::Float32)}};
  const auto got = runtime::Session(m).run(feeds), want = runtime::Session(m, {.fuse = false}).run(feeds);
  for (const char* out : {"y1", "y2", "y3", "y4", "y5"}) expect_close(got.at(out), want.at(out), 1e-6, 1e-6);

  onnx::ModelProto two = model_with_inputs("rank_two", onnx::TensorProto::FLOAT);
  node(*two.mutable_graph(), "MatMul", {"a", "b"}, "p");
  transpose(*two.mutable_graph(), "p", "y", {1, 0});
  two.mutable_graph()->add_output()->set_name("y");
  onnx::GraphProto g2 = two.graph();
  EXPECT_EQ(runtime::permute_product_outputs(g2), 0);  // rank 2: fuse_transpose_gemm's and Gemm's business
}

TEST(PermutedProductOutput, APermYThatIsNotAPermutationIsAnErrorNamingIt) {
  runtime::Session session(direct_model("MatMulPermuted", testing::attr("perm_y", std::vector<int64_t>{0, 2})));
  const std::string message = testing::error_of([&] {
    session.run({{"a", testing::random_f64(Shape{2, 3, 4}, 1).cast(DataType::Float32)},
                 {"b", testing::random_f64(Shape{2, 4, 2}, 2).cast(DataType::Float32)}});
  });
  EXPECT_NE(message.find("attribute perm_y [0,2] is not a permutation of the dims of the product [2,3,2]"),
            std::string::npos)
      << message;
}

// y_k = Gather(Transpose(a, perm_k), index_k, axis_k) for the cases below, index_k an initializer.
struct GatherCase {
  std::vector<int64_t> perm;
  int64_t axis;
  std::vector<int64_t> index_dims;  // {} for a scalar
  bool folds;
  const char* label;
};

TEST(GatherBeforeTranspose, AScalarGatherReadsTheTransposesInput) {
  const std::vector<GatherCase> cases = {
      {{1, 0, 2}, 1, {}, true, "a batch-first LSTM's last step: perm [1, 0, 2], axis 1"},
      {{1, 0, 2}, -2, {}, true, "the same by a negative axis"},
      {{1, 0, 2}, 0, {}, true, "axis 0 (kept dims 0 and 2)"},
      {{2, 0, 1}, 0, {}, true, "perm [2, 0, 1], axis 0"},
      {{2, 1, 0}, 1, {}, false, "perm [2, 1, 0], axis 1: the kept dims swap"},
      {{1, 0, 2}, 1, {1}, false, "a one-element index of rank 1"},
  };
  for (const GatherCase& c : cases) {
    SCOPED_TRACE(c.label);
    onnx::ModelProto m = model_with_inputs("gather", onnx::TensorProto::FLOAT);
    auto& g = *m.mutable_graph();
    node(g, "Relu", {"a"}, "r");
    transpose(g, "r", "a_t", c.perm);
    for (const char* v : {"r", "a_t"}) testing::typed_value(g.add_value_info(), v, onnx::TensorProto::FLOAT, {});
    Tensor index = testing::i64(Shape(c.index_dims), {-1});
    onnx::TensorProto* init = g.add_initializer();
    init->set_name("index");
    init->set_data_type(onnx::TensorProto::INT64);
    for (int64_t d : c.index_dims) init->add_dims(d);
    init->add_int64_data(index.data<int64_t>()[0]);
    *node(g, "Gather", {"a_t", "index"}, "y")->add_attribute() = testing::attr("axis", c.axis);
    g.add_output()->set_name("y");

    onnx::GraphProto fused = g;
    EXPECT_EQ(runtime::gather_before_transpose(fused), c.folds ? 1 : 0);
    EXPECT_EQ(count_op(fused, "Transpose"), c.folds ? 0 : 1);
    // The removed Transpose's output loses its value_info; its input keeps its own.
    std::vector<std::string> infos;
    for (const auto& v : fused.value_info()) infos.push_back(v.name());
    EXPECT_EQ(infos, (c.folds ? std::vector<std::string>{"r"} : std::vector<std::string>{"r", "a_t"}));
    const runtime::NamedTensors feeds{{"a", testing::iota(Shape{4, 3, 5})}, {"b", testing::iota(Shape{1})}};
    const Tensor got = runtime::Session(m).run(feeds).at("y");
    const Tensor want = runtime::Session(m, {.fuse = false}).run(feeds).at("y");
    ASSERT_EQ(got.shape(), want.shape());
    expect_close(got, want, 0, 0);
  }
}

TEST(GatherBeforeTranspose, ATransposeReadElsewhereOrPinnedStays) {
  onnx::ModelProto m = model_with_inputs("kept", onnx::TensorProto::FLOAT);
  auto& g = *m.mutable_graph();
  auto* one = g.add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto::INT64);
  one->add_int64_data(1);
  transpose(g, "a", "read_twice", {1, 0, 2});
  *node(g, "Gather", {"read_twice", "one"}, "y1")->add_attribute() = testing::attr("axis", int64_t{1});
  node(g, "Relu", {"read_twice"}, "y2");
  transpose(g, "a", "pinned", {1, 0, 2});
  *node(g, "Gather", {"pinned", "one"}, "y3")->add_attribute() = testing::attr("axis", int64_t{1});
  for (const char* out : {"y1", "y2", "y3", "pinned"}) g.add_output()->set_name(out);
  onnx::GraphProto fused = g;
  EXPECT_EQ(runtime::gather_before_transpose(fused), 0);
  EXPECT_EQ(count_op(fused, "Transpose"), 2);
}

}  // namespace
}  // namespace onnxtrain
