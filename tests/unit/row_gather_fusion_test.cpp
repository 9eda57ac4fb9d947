// runtime/fusion.h gather_before_rowwise_ops: a Gather of a few positions along the sequence axis
// (a sequence classifier's pooler reading token 0) makes the ops before it compute only those
// positions, through the last encoder layer as exporters write it (query projection, head split
// and merge Reshapes with shapes from Shape nodes, the attention's MatMul-Softmax-MatMul or
// ai.onnx Attention, output
// projection, residual Adds, LayerNormalizations, feed-forward) up to the values needed whole
// (the keys and values read every position). Outputs and gradients equal the unrewritten graph's
// (within float32 rounding: fewer rows may take other oneDNN kernels); fuse_attention still fuses
// the query rows' attention; the cases it must leave alone stay.
#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_node;
using testing::attr;
using testing::count_op;

constexpr int64_t kS = 8, kD = 8, kH = 2, kF = 16, kClasses = 3;

struct EncoderOptions {
  std::vector<int64_t> indices = {0};  // the pooler's Gather along axis 1
  bool scalar = true;                  // indices as a scalar (the first of `indices`)
  bool mask = false;                   // an additive attention mask [N, 1, 1, S]
  bool computed_shapes = true;         // head split and merge shapes from Shape nodes, as exporters write them
  bool opaque_merge = false;           // the merge shape's leading dims through an op shape inference does not follow
  bool expose_hidden = false;          // the Gather's data is also a graph output
  bool read_all_rows = false;          // a mean over every position of the feed-forward activation joins the loss
  bool training = true;                // a Gradient node for every weight and x
  bool onnx_attention = false;         // ai.onnx Attention-23 (4-D) instead of MatMul-Softmax-MatMul
  bool allowzero = false;              // the Reshapes with allowzero = 1 (the dynamo exporter's)
  int64_t slice_step = 0;              // the pooler as Slice(hidden, [index], [index + step], [-2], [step])
};

const std::vector<std::string> kWeights = {"wq", "bq", "wk", "wv", "wo", "ln_s", "ln_b", "w1", "b1", "w2", "wc"};

void add_weight(onnx::GraphProto& g, const std::string& name, const Shape& shape, uint32_t seed) {
  io::tensor_to_proto(testing::random_f64(shape, seed, 0.5).cast(DataType::Float32), name, *g.add_initializer());
}

onnx::NodeProto* node(onnx::GraphProto& g, const std::string& op, const std::vector<std::string>& in, const std::string& out) {
  return add_node(g, op, in, {out});
}

// One encoder layer (attention and feed-forward, residuals and LayerNormalization) over x [N, S,
// D], the pooler's Gather, a classifier product and loss = sum(logits^2) (+ the mean of every
// position's activation with read_all_rows).
onnx::ModelProto encoder_model(const EncoderOptions& o) {
  onnx::ModelProto m = testing::empty_model("encoder");
  if (o.onnx_attention) m.mutable_opset_import(0)->set_version(23);
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  onnx::GraphProto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, kS, kD});
  if (o.mask) testing::typed_value(g.add_input(), "mask", onnx::TensorProto::FLOAT, {-1, 1, 1, kS});
  add_weight(g, "wq", {kD, kD}, 1);
  add_weight(g, "bq", {kD}, 2);
  add_weight(g, "wk", {kD, kD}, 3);
  add_weight(g, "wv", {kD, kD}, 4);
  add_weight(g, "wo", {kD, kD}, 5);
  add_weight(g, "ln_s", {kD}, 6);
  add_weight(g, "ln_b", {kD}, 7);
  add_weight(g, "w1", {kD, kF}, 8);
  add_weight(g, "b1", {kF}, 9);
  add_weight(g, "w2", {kF, kD}, 10);
  add_weight(g, "wc", {kD, kClasses}, 11);
  node(g, "MatMul", {"x", "wq"}, "q");
  node(g, "Add", {"q", "bq"}, "qb");
  node(g, "MatMul", {"x", "wk"}, "k");
  node(g, "MatMul", {"x", "wv"}, "v");
  if (o.computed_shapes) {  // Concat(N, S, heads, head size), N and S from Shape(x)
    node(g, "Shape", {"x"}, "sx");
    testing::add_constant_node(g, "zero", Tensor::from_vector<int64_t>(Shape{}, {0}));
    testing::add_constant_node(g, "one", Tensor::from_vector<int64_t>(Shape{}, {1}));
    testing::add_constant_node(g, "axes0", testing::i64({0}));
    node(g, "Gather", {"sx", "zero"}, "n");
    node(g, "Gather", {"sx", "one"}, "s");
    node(g, "Unsqueeze", {"n", "axes0"}, "n1");
    node(g, "Unsqueeze", {"s", "axes0"}, "s1");
    testing::add_constant_node(g, "heads", testing::i64({kH, kD / kH}));
    node(g, "Concat", {"n1", "s1", "heads"}, "split")->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
  } else {
    testing::add_constant_node(g, "split", testing::i64({0, 0, kH, kD / kH}));
  }
  for (const auto& [in, out] : {std::pair{"qb", "q4"}, {"k", "k4"}, {"v", "v4"}}) {
    node(g, "Reshape", {in, "split"}, out)->add_attribute()->CopyFrom(attr("allowzero", int64_t{o.allowzero}));
  }
  node(g, "Transpose", {"q4"}, "qt")->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{0, 2, 1, 3}));
  node(g, "Transpose", {"v4"}, "vt")->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{0, 2, 1, 3}));
  if (o.onnx_attention) {
    node(g, "Transpose", {"k4"}, "kt")->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{0, 2, 1, 3}));
    std::vector<std::string> in = {"qt", "kt", "vt"};
    if (o.mask) in.push_back("mask");
    node(g, "Attention", in, "o")->add_attribute()->CopyFrom(attr("scale", 0.5f));
  } else {
    node(g, "Transpose", {"k4"}, "kt")->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{0, 2, 3, 1}));
    node(g, "MatMul", {"qt", "kt"}, "scores");
    testing::add_constant_node(g, "scale", Tensor::from_vector<float>(Shape{}, {0.5f}));
    node(g, "Mul", {"scores", "scale"}, "scaled");
    if (o.mask) node(g, "Add", {"scaled", "mask"}, "masked");
    node(g, "Softmax", {o.mask ? "masked" : "scaled"}, "p")->add_attribute()->CopyFrom(attr("axis", int64_t{-1}));
    node(g, "MatMul", {"p", "vt"}, "o");
  }
  node(g, "Transpose", {"o"}, "ot")->add_attribute()->CopyFrom(attr("perm", std::vector<int64_t>{0, 2, 1, 3}));
  if (o.computed_shapes) {  // Concat(Shape(ot)[0:2], [D]): a Shape node reading a value the rewrite makes rows of
    node(g, "Shape", {"ot"}, "sot");
    testing::add_constant_node(g, "starts", testing::i64({0}));
    testing::add_constant_node(g, "ends", testing::i64({2}));
    testing::add_constant_node(g, "width", testing::i64({kD}));
    if (o.opaque_merge) {  // Concat(Abs(Shape(ot)[0:1]), Shape(ot)[1:2], [D])
      testing::add_constant_node(g, "mid", testing::i64({1}));
      node(g, "Slice", {"sot", "starts", "mid"}, "n_part");
      node(g, "Abs", {"n_part"}, "n_opaque");
      node(g, "Slice", {"sot", "mid", "ends"}, "s_part");
      node(g, "Concat", {"n_opaque", "s_part", "width"}, "merge")->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
    } else {
      node(g, "Slice", {"sot", "starts", "ends"}, "lead");
      node(g, "Concat", {"lead", "width"}, "merge")->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
    }
  } else {
    testing::add_constant_node(g, "merge", testing::i64({0, 0, kD}));
  }
  node(g, "Reshape", {"ot", "merge"}, "o3")->add_attribute()->CopyFrom(attr("allowzero", int64_t{o.allowzero}));
  node(g, "MatMul", {"o3", "wo"}, "a");
  node(g, "Add", {"a", "x"}, "r");
  node(g, "LayerNormalization", {"r", "ln_s", "ln_b"}, "h");
  node(g, "MatMul", {"h", "w1"}, "f");
  node(g, "Add", {"f", "b1"}, "fb");
  node(g, "Tanh", {"fb"}, "act");
  node(g, "MatMul", {"act", "w2"}, "f2");
  node(g, "Add", {"f2", "h"}, "r2");
  node(g, "LayerNormalization", {"r2", "ln_s", "ln_b"}, "hidden");
  if (o.scalar) {
    testing::add_constant_node(g, "index", Tensor::from_vector<int64_t>(Shape{}, {o.indices[0]}));
  } else {
    testing::add_constant_node(g, "index", testing::i64(o.indices));
  }
  if (o.slice_step != 0) {
    testing::add_constant_node(g, "slice_starts", testing::i64({o.indices[0]}));
    testing::add_constant_node(g, "slice_ends", testing::i64({o.indices[0] + o.slice_step}));
    testing::add_constant_node(g, "slice_axes", testing::i64({-2}));
    testing::add_constant_node(g, "slice_steps", testing::i64({o.slice_step}));
    node(g, "Slice", {"hidden", "slice_starts", "slice_ends", "slice_axes", "slice_steps"}, "cls");
  } else {
    node(g, "Gather", {"hidden", "index"}, "cls")->add_attribute()->CopyFrom(attr("axis", int64_t{1}));
  }
  node(g, "MatMul", {"cls", "wc"}, "logits");
  node(g, "Mul", {"logits", "logits"}, "squares");
  node(g, "ReduceSum", {"squares"}, o.read_all_rows ? "loss0" : "loss")->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
  if (o.read_all_rows) {
    node(g, "ReduceMean", {"act"}, "mean")->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
    node(g, "Add", {"loss0", "mean"}, "loss");
  }
  g.add_output()->set_name("logits");
  g.add_output()->set_name("loss");
  if (o.expose_hidden) g.add_output()->set_name("hidden");
  if (o.computed_shapes) g.add_output()->set_name("sot");  // Shape(ot), whole, though ot is made of rows
  if (o.training) {
    onnx::NodeProto* grad = g.add_node();
    grad->set_op_type("Gradient");
    grad->set_domain("ai.onnx.preview.training");
    grad->add_input("x");
    if (o.mask) grad->add_input("mask");
    onnx::AttributeProto xs;
    xs.set_name("xs");
    xs.set_type(onnx::AttributeProto::STRINGS);
    xs.add_strings("x");
    if (o.mask) xs.add_strings("mask");
    for (const auto& w : kWeights) {
      xs.add_strings(w);
      grad->add_input(w);
    }
    *grad->add_attribute() = xs;
    *grad->add_attribute() = attr("y", std::string("loss"));
    grad->add_output("d_x");
    if (o.mask) grad->add_output("d_mask");
    for (const auto& w : kWeights) grad->add_output("d_" + w);
    for (const auto& out : grad->output()) g.add_output()->set_name(out);
  }
  return m;
}

const std::unordered_map<std::string, int> kOpsets{{"", 17}, {"ai.onnx.preview.training", 1}};

int rewritten(const EncoderOptions& o, const std::unordered_map<std::string, int>& opsets = kOpsets) {
  onnx::GraphProto g = encoder_model(o).graph();
  return runtime::gather_before_rowwise_ops(g, opsets);
}

// The node of `g` whose input `operand` is `name`, or null.
const onnx::NodeProto* reader_of(const onnx::GraphProto& g, const std::string& name, int operand) {
  for (const auto& n : g.node()) {
    if (n.input_size() > operand && n.input(operand) == name) return &n;
  }
  return nullptr;
}

// The op writing `value` in `g` ("" for none).
std::string producer_op(const onnx::GraphProto& g, const std::string& value) {
  for (const auto& n : g.node()) {
    for (const auto& out : n.output()) {
      if (out == value) return n.op_type();
    }
  }
  return "";
}

// Every output of the rewritten and the unrewritten model (Session without rewrites) on the same
// feeds: equal within float32 rounding.
void expect_same_outputs(const EncoderOptions& o) {
  const onnx::ModelProto model = encoder_model(o);
  runtime::Session fused(model), plain(model, {.fuse = false});
  runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{3, kS, kD}, 21).cast(DataType::Float32)}};
  if (o.mask) {
    std::vector<float> mask(3 * kS, 0.0f);
    for (int64_t j = 5; j < kS; ++j) mask[static_cast<size_t>(kS + j)] = -1e4f;  // sequence 1 pads its last 3
    feeds.emplace("mask", Tensor::from_vector<float>(Shape{3, 1, 1, kS}, mask));
  }
  const runtime::NamedTensors got = fused.run(feeds), want = plain.run(feeds);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, value] : want) {
    SCOPED_TRACE(name);
    testing::expect_close(got.at(name), value, 1e-5, 1e-6);
  }
}

TEST(RowGatherFusion, TheLastLayerComputesThePooledPositionOnly) {
  onnx::GraphProto g = encoder_model({.mask = true}).graph();
  ASSERT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 1);
  // The query projection reads the pooled rows of x; the keys and values read x whole.
  const onnx::NodeProto* q = reader_of(g, "wq", 1);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(producer_op(g, q->input(0)), "Gather");
  EXPECT_EQ(reader_of(g, "wk", 1)->input(0), "x");
  EXPECT_EQ(reader_of(g, "wv", 1)->input(0), "x");
  // The feed-forward's products read rows: no node writes the original full values any more.
  for (const char* gone : {"q", "qb", "q4", "qt", "scores", "p", "o", "ot", "o3", "a", "r", "h", "f", "act", "f2", "hidden"}) {
    EXPECT_EQ(producer_op(g, gone), "") << gone;
  }
  for (const char* kept : {"k", "v"}) EXPECT_EQ(producer_op(g, kept), "MatMul") << kept;
  for (const char* kept : {"k4", "v4"}) EXPECT_EQ(producer_op(g, kept), "Reshape") << kept;
  for (const char* kept : {"kt", "vt"}) EXPECT_EQ(producer_op(g, kept), "Transpose") << kept;
  // One Gather for the rows of x (shared by the query projection and the residual).
  int gathers_of_x = 0;
  for (const auto& n : g.node()) gathers_of_x += n.op_type() == "Gather" && n.input(0) == "x";
  EXPECT_EQ(gathers_of_x, 1);
  // The attention of the query rows is still one fused Attention after fuse_before_expansion.
  onnx::GraphProto fused = encoder_model({.mask = true}).graph();
  runtime::fuse_before_expansion(fused, kOpsets);
  EXPECT_EQ(count_op(fused, "Attention"), 1);
  EXPECT_EQ(count_op(fused, "Softmax"), 0);
}

TEST(RowGatherFusion, OutputsAndGradientsEqualTheUnrewrittenGraphs) {
  {
    SCOPED_TRACE("scalar index 0, a mask, shapes from Shape nodes");
    expect_same_outputs({.mask = true});
  }
  {
    SCOPED_TRACE("the last position (index -1), constant shapes");
    expect_same_outputs({.indices = {-1}, .computed_shapes = false});
  }
  {
    SCOPED_TRACE("1-D indices, repeated and out of order");
    EXPECT_EQ(rewritten({.indices = {5, 2, 5}, .scalar = false}), 1);
    expect_same_outputs({.indices = {5, 2, 5}, .scalar = false});
  }
  {
    SCOPED_TRACE("every position's activation also read: the rewrite stops below it");
    onnx::GraphProto g = encoder_model({.read_all_rows = true}).graph();
    ASSERT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 1);
    EXPECT_EQ(producer_op(g, "act"), "Tanh");                     // whole: ReduceMean reads it
    EXPECT_EQ(producer_op(g, reader_of(g, "w2", 1)->input(0)), "Gather");  // the rows of it
    expect_same_outputs({.read_all_rows = true});
  }
  {
    SCOPED_TRACE("a merge whose leading dims shape inference cannot tell: only the rows' count changes");
    onnx::GraphProto g = encoder_model({.opaque_merge = true}).graph();
    ASSERT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 1);
    const onnx::NodeProto* merge = reader_of(g, "merge", 0);
    ASSERT_NE(merge, nullptr);
    EXPECT_EQ(merge->op_type(), "Mul");  // the shape times [1, 0, 1], plus the rows' count along the axis
    expect_same_outputs({.opaque_merge = true});
  }
  {
    SCOPED_TRACE("Reshapes with allowzero = 1: the rows' count itself in the shape");
    onnx::GraphProto g = encoder_model({.allowzero = true}).graph();
    ASSERT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 1);
    EXPECT_EQ(producer_op(g, reader_of(g, "wq", 1)->input(0)), "Gather");
    EXPECT_EQ(reader_of(g, "merge", 0)->op_type(), "Mul");
    expect_same_outputs({.allowzero = true});
  }
  {
    SCOPED_TRACE("an attention fused before: the rows move through ai.onnxtrain.Attention's queries");
    onnx::ModelProto model = encoder_model({.mask = true});
    ASSERT_EQ(runtime::fuse_attention(*model.mutable_graph(), kOpsets), 1);
    auto* internal = model.add_opset_import();
    internal->set_domain("ai.onnxtrain");
    internal->set_version(1);
    onnx::GraphProto g = model.graph();
    const std::unordered_map<std::string, int> opsets{{"", 17}, {"ai.onnx.preview.training", 1}, {"ai.onnxtrain", 1}};
    ASSERT_EQ(runtime::gather_before_rowwise_ops(g, opsets), 1);
    const onnx::NodeProto* attention = nullptr;
    for (const auto& n : g.node()) {
      if (n.op_type() == "Attention") attention = &n;
    }
    ASSERT_NE(attention, nullptr);
    EXPECT_EQ(producer_op(g, attention->input(0)), "Reshape");  // the query rows' head split
    EXPECT_EQ(attention->input(1), "k4");
    runtime::Session rows(model), whole(model, {.fuse = false});
    runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{3, kS, kD}, 21).cast(DataType::Float32)},
                                {"mask", Tensor::from_vector<float>(Shape{3, 1, 1, kS}, std::vector<float>(3 * kS, 0.0f))}};
    const runtime::NamedTensors got = rows.run(feeds), want = whole.run(feeds);
    for (const auto& [name, value] : want) {
      SCOPED_TRACE(name);
      testing::expect_close(got.at(name), value, 1e-5, 1e-6);
    }
  }
  {
    SCOPED_TRACE("ai.onnx Attention-23: its queries' rows");
    onnx::GraphProto g = encoder_model({.mask = true, .onnx_attention = true}).graph();
    ASSERT_EQ(runtime::gather_before_rowwise_ops(g, {{"", 23}, {"ai.onnx.preview.training", 1}}), 1);
    for (const auto& n : g.node()) {
      if (n.op_type() == "Attention") {
        EXPECT_EQ(n.input(1), "kt");  // the keys whole, the queries' rows
        EXPECT_NE(n.input(0), "qt");
      }
    }
    EXPECT_EQ(producer_op(g, "o"), "");
    expect_same_outputs({.mask = true, .onnx_attention = true});
  }
  {
    SCOPED_TRACE("the pooler as a Slice of one position (x[:, 3:4], axes -2)");
    EXPECT_EQ(rewritten({.indices = {3}, .slice_step = 1}), 1);
    expect_same_outputs({.indices = {3}, .mask = true, .slice_step = 1});
  }
  {
    SCOPED_TRACE("inference");
    expect_same_outputs({.mask = true, .training = false});
  }
}

TEST(RowGatherFusion, LeavesAloneWhatItCannotShorten) {
  EXPECT_EQ(rewritten({}), 1);  // the baseline the cases below each change in one respect
  EXPECT_EQ(rewritten({.expose_hidden = true}), 0);                          // the whole value is a graph output
  EXPECT_EQ(rewritten({.indices = {0, 1, 2, 3, 4}, .scalar = false}), 0);  // more than half the positions
  EXPECT_EQ(rewritten({.indices = {kS}}), 0);  // out of range: the Gather's own error, at run time
  EXPECT_EQ(rewritten({.indices = {-kS - 1}}), 0);
  EXPECT_EQ(rewritten({.indices = {-kS}}), 1);
  EXPECT_EQ(rewritten({.indices = {0}, .slice_step = 2}), 0);  // a Slice with a step
  EXPECT_EQ(rewritten({}, {{"", 12}, {"ai.onnx.preview.training", 1}}), 0);  // before opset 13

  // Self-attention on one value (queries, keys and values the same): its producer stays whole
  // for the keys and values, and only a Gather of it feeds the queries.
  {
    onnx::ModelProto sm = testing::empty_model("self");
    sm.mutable_opset_import(0)->set_version(23);
    onnx::GraphProto& sg = *sm.mutable_graph();
    testing::typed_value(sg.add_input(), "x", onnx::TensorProto::FLOAT, {2, kH, kS, kD});
    node(sg, "Tanh", {"x"}, "t");
    node(sg, "Attention", {"t", "t", "t"}, "y");
    node(sg, "Relu", {"y"}, "r");
    testing::add_constant_node(sg, "index", Tensor::from_vector<int64_t>(Shape{}, {3}));
    node(sg, "Gather", {"r", "index"}, "row")->add_attribute()->CopyFrom(attr("axis", int64_t{2}));
    sg.add_output()->set_name("row");
    const onnx::ModelProto before = sm;
    const std::unordered_map<std::string, int> opsets{{"", 23}};
    ASSERT_EQ(runtime::gather_before_rowwise_ops(sg, opsets), 1);
    EXPECT_EQ(producer_op(sg, "t"), "Tanh");  // whole: the keys and values read it
    for (const auto& n : sg.node()) {
      if (n.op_type() == "Attention") {
        EXPECT_EQ(producer_op(sg, n.input(0)), "Gather");
        EXPECT_EQ(n.input(1), "t");
      }
    }
    runtime::Session rows(sm), whole(before, {.fuse = false});
    const Tensor x = testing::random_f64(Shape{2, kH, kS, kD}, 5).cast(DataType::Float32);
    testing::expect_close(rows.run({{"x", x}}).at("row"), whole.run({{"x", x}}).at("row"), 1e-5, 1e-6);
  }

  // A Softmax along the gathered axis mixes its positions: nothing before it moves.
  onnx::ModelProto m = testing::empty_model("softmax");
  onnx::GraphProto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2, kS, kD});
  add_weight(g, "w", {kD, kD}, 1);
  node(g, "MatMul", {"x", "w"}, "y");
  node(g, "Softmax", {"y"}, "p")->add_attribute()->CopyFrom(attr("axis", int64_t{1}));
  testing::add_constant_node(g, "index", Tensor::from_vector<int64_t>(Shape{}, {0}));
  node(g, "Gather", {"p", "index"}, "first")->add_attribute()->CopyFrom(attr("axis", int64_t{1}));
  g.add_output()->set_name("first");
  EXPECT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 0);
  // The same along the last axis: the product and the Softmax compute the first row only.
  g.mutable_node(1)->mutable_attribute(0)->set_i(-1);
  EXPECT_EQ(runtime::gather_before_rowwise_ops(g, kOpsets), 1);
  EXPECT_EQ(producer_op(g, reader_of(g, "w", 1)->input(0)), "Gather");
}

}  // namespace
}  // namespace onnxtrain
