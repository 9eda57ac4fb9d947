// runtime/fusion.h concat_of_slices_to_gather: a Concat of Slices that reorders the blocks of one
// tensor along an axis (PyTorch's export of nn.LSTM reorders each weight's gate blocks so) becomes
// one Gather; outputs and gradients equal the graph's without rewrites; Concats that are no such
// reordering stay.
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_node;
using testing::attr;
using testing::count_op;

constexpr int64_t kRows = 8, kCols = 3;

struct Block {
  int64_t start, end;
  int64_t axis = 0;
  int64_t step = 1;
};

struct Options {
  // The Concat's inputs: Slices of w [kRows, kCols] (axis 0, as PyTorch's LSTM export: i, o, f+g).
  std::vector<Block> blocks = {{0, 2}, {6, 8}, {2, 6}};
  int64_t concat_axis = 0;
  bool expose_slice = false;      // the first Slice's output is also a graph output
  bool other_tensor = false;      // the last Slice reads another tensor of w's shape
};

// wp = Concat(Slice(w, ...)...) (the last Slice of v under other_tensor); y = x wp where the
// blocks are rows, x wp^T where they are columns; loss = sum(y^2); its gradients with respect to
// x and w.
onnx::ModelProto model(const Options& o) {
  onnx::ModelProto m = testing::empty_model("reorder");
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  onnx::GraphProto& g = *m.mutable_graph();
  const bool rows = o.concat_axis == 0 || o.concat_axis == -2;
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, rows ? kRows : kCols});
  io::tensor_to_proto(testing::random_f64(Shape{kRows, kCols}, 1, 0.5).cast(DataType::Float32), "w", *g.add_initializer());
  io::tensor_to_proto(testing::random_f64(Shape{kRows, kCols}, 2, 0.5).cast(DataType::Float32), "v", *g.add_initializer());
  std::vector<std::string> parts;
  for (size_t k = 0; k < o.blocks.size(); ++k) {
    const Block& b = o.blocks[k];
    const std::string id = std::to_string(k);
    testing::add_constant_node(g, "s" + id, testing::i64({b.start}));
    testing::add_constant_node(g, "e" + id, testing::i64({b.end}));
    testing::add_constant_node(g, "a" + id, testing::i64({b.axis}));
    testing::add_constant_node(g, "t" + id, testing::i64({b.step}));
    const std::string data = o.other_tensor && k + 1 == o.blocks.size() ? "v" : "w";
    add_node(g, "Slice", {data, "s" + id, "e" + id, "a" + id, "t" + id}, {"part" + id});
    parts.push_back("part" + id);
  }
  add_node(g, "Concat", parts, {"wp"})->add_attribute()->CopyFrom(attr("axis", o.concat_axis));
  if (rows) {
    add_node(g, "MatMul", {"x", "wp"}, {"y"});
  } else {
    add_node(g, "Transpose", {"wp"}, {"wpt"})->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{1, 0}));
    add_node(g, "MatMul", {"x", "wpt"}, {"y"});
  }
  add_node(g, "Mul", {"y", "y"}, {"squares"});
  add_node(g, "ReduceSum", {"squares"}, {"loss"})->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
  g.add_output()->set_name("y");
  g.add_output()->set_name("loss");
  if (o.expose_slice) g.add_output()->set_name("part0");
  onnx::NodeProto* grad = g.add_node();
  grad->set_op_type("Gradient");
  grad->set_domain("ai.onnx.preview.training");
  onnx::AttributeProto xs;
  xs.set_name("xs");
  xs.set_type(onnx::AttributeProto::STRINGS);
  for (const char* name : {"x", "w"}) {
    xs.add_strings(name);
    grad->add_input(name);
    grad->add_output(std::string("d_") + name);
    g.add_output()->set_name(std::string("d_") + name);
  }
  *grad->add_attribute() = xs;
  *grad->add_attribute() = attr("y", std::string("loss"));
  return m;
}

const std::unordered_map<std::string, int> kOpsets{{"", 17}, {"ai.onnx.preview.training", 1}};

int rewritten(const Options& o) {
  onnx::GraphProto g = model(o).graph();
  return runtime::concat_of_slices_to_gather(g, kOpsets);
}

// Every output, the gradients included, of the model with and without rewrites. The Gather that
// concat_of_slices_to_gather writes moves the same values as the Slices and the Concat, and its
// gradient (GatherGrad) adds each row once into zeros as the SliceGrads' Sum does, so with that
// rewrite alone (every other fusion off on both sides) they are equal bit for bit. With every
// fusion on, fuse_transpose_gemm makes the weight gradient of the columns case, Transpose(X^T dY),
// one Gemm writing dY^T X: the same sums, which oneDNN 2.6's sgemm rounds differently on CPUs
// without AVX-512 (AMD EPYC Zen 3: 3 elements of 24 differ, by up to 1.2e-7; in a one-off program
// there, A^T B against (B^T A)^T at [8, 3] over 4 rows differed in 162 of 200 random draws), so
// those outputs are compared to 1e-6.
void expect_same_outputs(const Options& o) {
  const onnx::ModelProto m = model(o);
  onnx::ModelProto gathered = m;
  ASSERT_EQ(runtime::concat_of_slices_to_gather(*gathered.mutable_graph(), kOpsets), 1);
  runtime::Session rewrite_only(gathered, {.fuse = false}), plain(m, {.fuse = false}), fused(m);
  const bool rows = o.concat_axis == 0 || o.concat_axis == -2;
  const runtime::NamedTensors feeds{
      {"x", testing::random_f64(Shape{4, rows ? kRows : kCols}, 7).cast(DataType::Float32)}};
  const runtime::NamedTensors want = plain.run(feeds), got = rewrite_only.run(feeds), got_fused = fused.run(feeds);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got_fused.size(), want.size());
  for (const auto& [name, value] : want) {
    SCOPED_TRACE(name);
    testing::expect_close(got.at(name), value, 0.0, 0.0);
    testing::expect_close(got_fused.at(name), value, 1e-6, 1e-6);
  }
}

TEST(ConcatOfSlicesFusion, AReorderingOfBlocksBecomesOneGather) {
  onnx::GraphProto g = model({}).graph();
  ASSERT_EQ(runtime::concat_of_slices_to_gather(g, kOpsets), 1);
  EXPECT_EQ(count_op(g, "Slice"), 0);
  EXPECT_EQ(count_op(g, "Concat"), 0);
  ASSERT_EQ(count_op(g, "Gather"), 1);
  for (const auto& n : g.node()) {
    if (n.op_type() != "Gather") continue;
    EXPECT_EQ(n.input(0), "w");
    EXPECT_EQ(n.output(0), "wp");
    ASSERT_EQ(n.attribute_size(), 1);
    EXPECT_EQ(n.attribute(0).name(), "axis");
    EXPECT_EQ(n.attribute(0).i(), 0);
  }
  // The positions in the Concat's order: rows 0-1, 6-7, 2-5.
  bool found = false;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Constant" || n.output(0).find("wp.order") != 0) continue;
    const Tensor order = io::tensor_from_proto(n.attribute(0).t(), {}, "order");
    EXPECT_EQ(order.to_int64_vector("order"), (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
    found = true;
  }
  EXPECT_TRUE(found);
}

TEST(ConcatOfSlicesFusion, OutputsAndGradientsEqualTheUnrewrittenGraphs) {
  for (const Options& o : {Options{},
                           // negative and clamped bounds: [-2, 8) is [6, 8), [5, 100) is [5, 8)
                           Options{.blocks = {{-2, 100}, {0, 5}, {5, 6}}},
                           // along the last axis (-1), whose blocks are columns
                           Options{.blocks = {{2, 3, -1}, {0, 2, 1}}, .concat_axis = -1},
                           // the identity order is a reordering too
                           Options{.blocks = {{0, 4}, {4, 8}}}}) {
    SCOPED_TRACE("Concat axis " + std::to_string(o.concat_axis) + ", " + std::to_string(o.blocks.size()) + " blocks");
    ASSERT_EQ(rewritten(o), 1);
    expect_same_outputs(o);
  }
}

TEST(ConcatOfSlicesFusion, LeavesOtherConcatsAlone) {
  const std::vector<std::pair<std::string, Options>> cases = {
      {"a position twice", {.blocks = {{0, 5}, {3, 8}}}},
      {"a position missing", {.blocks = {{0, 2}, {6, 8}}}},
      {"a Slice with a step", {.blocks = {{0, 8, 0, 2}, {1, 8, 0, 2}}}},
      {"Slices along another axis than the Concat's", {.blocks = {{0, 2, 1}, {2, 3, 1}}, .concat_axis = 0}},
      {"a Slice's output also a graph output", {.expose_slice = true}},
      {"Slices of two tensors", {.other_tensor = true}},
  };
  for (const auto& [name, o] : cases) {
    SCOPED_TRACE(name);
    EXPECT_EQ(rewritten(o), 0);
  }
  // Below opset 10 (Slice's bounds as attributes) nothing is rewritten.
  onnx::GraphProto g = model({}).graph();
  EXPECT_EQ(runtime::concat_of_slices_to_gather(g, {{"", 9}}), 0);
}

}  // namespace
}  // namespace onnxtrain
