// runtime/fusion.h fuse_attention: the MatMul-Softmax-MatMul attention exporters write (PyTorch's
// scaled_dot_product_attention with Q and K each scaled, Hugging Face's eager attention with the
// scores divided, a mask added and K transposed twice) becomes one ai.onnxtrain.Attention whose
// values and gradients (through a Gradient node, ai.onnxtrain.AttentionGrad) equal the unfused
// graph's; the Shape nodes on the head split read the split's input instead; the pattern stays
// when a value of it is read elsewhere, the softmax runs over another axis or a scale is no
// constant.
#include <cmath>
#include <limits>

#include "autodiff/gradient.h"
#include "onnxtrain/io.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_constant_node;
using testing::add_node;
using testing::attr;
using testing::count_op;
using testing::expect_close;

const std::unordered_map<std::string, int> kOpsets{{"", 17}, {"ai.onnx.preview.training", 1}};
constexpr int64_t kB = 2, kS = 5, kH = 3, kD = 4, kE = kH * kD;

enum class Style {
  Sdpa,   // Mul(Q', Cast(Sqrt(c))) and Mul(K', same) with K' = Transpose(k, [0, 2, 3, 1])
  Eager,  // Div(Q' K', sqrt D) + mask, K' = Transpose(Transpose(k, [0, 2, 1, 3]), [0, 1, 3, 2]), Identity after Softmax
};

struct Options {
  Style style = Style::Sdpa;
  std::vector<int64_t> mask_dims;  // Eager: the mask input's dims
  bool expose_probabilities = false;
  bool expose_heads = false;       // the product P V ([B, H, S, D], before the merge's Transpose) is a graph output too
  int64_t softmax_axis = -1;
  bool scale_from_input = false;  // Sdpa: the factor is a graph input, not a constant
  bool gradient = false;          // loss = sum(y * r), Gradient of q, k, v (and the mask)
  int64_t kv_batch = kB;          // k's and v's batch (1: broadcast over q's by MatMul)
  bool zero_nans = false;         // Eager: Where(IsNaN(P), 0, P) after the Softmax, as PyTorch's SDPA export with a bool mask
  // Reshape(P V, [B, -1, S, D]) before the merge's Transpose, the dims from Shape nodes, as
  // PyTorch's SDPA export writes it: D from Shape(V') (provably P V's) or from Shape(Q') (equal
  // here, since q's and v's head sizes are, but not provably).
  enum class OwnShape { None, Proven, Unproven } own_shape = OwnShape::None;
};

void add_float_input(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims) {
  testing::typed_value(g->add_input(), name, onnx::TensorProto::FLOAT, dims);
}

void add_initializer(onnx::GraphProto* g, const std::string& name, const Tensor& t) {
  io::tensor_to_proto(t, name, *g->add_initializer());
}

// q, k, v [B, S, E] -> split [B, S, H, D] -> attention -> merged [B, S, E] as "y", the merge's
// target shape computed from Shape(Q') as exporters do.
onnx::ModelProto attention_model(const Options& o) {
  onnx::ModelProto m = testing::empty_model("attention");
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  onnx::GraphProto* g = m.mutable_graph();
  add_float_input(g, "q", {kB, kS, kE});
  for (const char* name : {"k", "v"}) add_float_input(g, name, {o.kv_batch, kS, kE});
  add_initializer(g, "split", Tensor::from_vector<int64_t>(Shape{4}, {0, 0, kH, kD}));
  for (const char* name : {"q", "k", "v"}) add_node(*g, "Reshape", {name, "split"}, {std::string(name) + "4"});
  *add_node(*g, "Transpose", {"q4"}, {"qt"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 1, 3});
  *add_node(*g, "Transpose", {"v4"}, {"vt"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 1, 3});
  std::string scores;
  if (o.style == Style::Sdpa) {
    *add_node(*g, "Transpose", {"k4"}, {"kt"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 3, 1});
    if (o.scale_from_input) {
      add_float_input(g, "c", {});
    } else {
      add_constant_node(*g, "root", Tensor::from_vector<float>(Shape{}, {1.0f / std::sqrt(static_cast<float>(kD))}));
      add_node(*g, "Sqrt", {"root"}, {"root_sqrt"});
      *add_node(*g, "Cast", {"root_sqrt"}, {"c"})->add_attribute() = attr("to", int64_t{onnx::TensorProto::FLOAT});
    }
    add_node(*g, "Mul", {"qt", "c"}, {"qs"});
    add_node(*g, "Mul", {"c", "kt"}, {"ks"});
    add_node(*g, "MatMul", {"qs", "ks"}, {"s"});
    scores = "s";
  } else {
    *add_node(*g, "Transpose", {"k4"}, {"k_heads"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 1, 3});
    *add_node(*g, "Transpose", {"k_heads"}, {"kt"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 1, 3, 2});
    add_node(*g, "MatMul", {"qt", "kt"}, {"s"});
    add_initializer(g, "root_d", Tensor::from_vector<float>(Shape{1}, {std::sqrt(static_cast<float>(kD))}));
    add_node(*g, "Div", {"s", "root_d"}, {"s_scaled"});
    add_float_input(g, "mask", o.mask_dims);
    add_node(*g, "Add", {"mask", "s_scaled"}, {"s_masked"});
    scores = "s_masked";
  }
  auto* softmax = add_node(*g, "Softmax", {scores}, {"p"});
  *softmax->add_attribute() = attr("axis", o.softmax_axis);
  std::string p = "p";
  if (o.zero_nans) {
    add_node(*g, "IsNaN", {"p"}, {"p_nan"});
    add_constant_node(*g, "zero", Tensor::from_vector<float>(Shape{}, {0.0f}));
    add_node(*g, "Where", {"p_nan", "zero", "p"}, {"p_zeroed"});
    p = "p_zeroed";
  }
  if (o.style == Style::Eager) {
    add_node(*g, "Identity", {p}, {"p_kept"});
    p = "p_kept";
  }
  add_node(*g, "MatMul", {p, "vt"}, {"o"});
  std::string heads = "o";
  if (o.own_shape != Options::OwnShape::None) {
    for (const auto& [name, index] : std::vector<std::pair<std::string, int64_t>>{{"i0", 0}, {"i2", 2}, {"i3", 3}}) {
      add_initializer(g, name, Tensor::from_vector<int64_t>(Shape{}, {index}));
    }
    add_initializer(g, "axes0", Tensor::from_vector<int64_t>(Shape{1}, {0}));
    add_initializer(g, "minus_one", Tensor::from_vector<int64_t>(Shape{1}, {-1}));
    add_node(*g, "Shape", {"o"}, {"o_shape"});
    add_node(*g, "Shape", {"qt"}, {"qt_dims"});
    add_node(*g, "Shape", {"vt"}, {"vt_dims"});
    const bool proven = o.own_shape == Options::OwnShape::Proven;
    for (const auto& [dims, index, out] : std::vector<std::tuple<std::string, std::string, std::string>>{
             {"o_shape", "i0", "b"}, {"qt_dims", "i2", "s"}, {proven ? "vt_dims" : "qt_dims", "i3", "d"}}) {
      add_node(*g, "Gather", {dims, index}, {out + "_dim"});
      add_node(*g, "Unsqueeze", {out + "_dim", "axes0"}, {out + "1"});
    }
    *add_node(*g, "Concat", {"b1", "minus_one", "s1", "d1"}, {"own"})->add_attribute() = attr("axis", int64_t{0});
    add_node(*g, "Reshape", {"o", "own"}, {"o_same"});
    heads = "o_same";
  }
  *add_node(*g, "Transpose", {heads}, {"ot"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 1, 3});
  // merged shape [B, S, E] from Shape(Q') = [B, H, S, D]: dims 0 and 2, then E.
  add_node(*g, "Shape", {"qt"}, {"qt_shape"});
  add_initializer(g, "batch_and_sequence", Tensor::from_vector<int64_t>(Shape{2}, {0, 2}));
  add_node(*g, "Gather", {"qt_shape", "batch_and_sequence"}, {"bs"});
  add_initializer(g, "width", Tensor::from_vector<int64_t>(Shape{1}, {kE}));
  *add_node(*g, "Concat", {"bs", "width"}, {"merged"})->add_attribute() = attr("axis", int64_t{0});
  add_node(*g, "Reshape", {"ot", "merged"}, {"y"});
  testing::typed_value(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  if (o.expose_probabilities) testing::typed_value(g->add_output(), "p", onnx::TensorProto::FLOAT, {});
  if (o.expose_heads) testing::typed_value(g->add_output(), "o", onnx::TensorProto::FLOAT, {});
  if (o.gradient) {
    add_initializer(g, "r", testing::random_f64(Shape{kB, kS, kE}, 9).cast(DataType::Float32));
    add_node(*g, "Mul", {"y", "r"}, {"yr"});
    *add_node(*g, "ReduceSum", {"yr"}, {"loss"})->add_attribute() = attr("keepdims", int64_t{0});
    std::vector<std::string> xs{"q", "k", "v"};
    if (o.style == Style::Eager) xs.push_back("mask");
    std::vector<std::string> grads;
    for (const auto& x : xs) grads.push_back("d" + x);
    auto* grad = add_node(*g, "Gradient", xs, grads);
    grad->set_domain("ai.onnx.preview.training");
    *grad->add_attribute() = attr("xs", xs);
    *grad->add_attribute() = attr("y", std::string("loss"));
    for (const auto& d : grads) testing::typed_value(g->add_output(), d, onnx::TensorProto::FLOAT, {});
  }
  return m;
}

runtime::NamedTensors feeds_for(const Options& o) {
  runtime::NamedTensors feeds;
  uint32_t seed = 1;
  for (const char* name : {"q", "k", "v"}) {
    feeds[name] = testing::random_f64(Shape{name[0] == 'q' ? kB : o.kv_batch, kS, kE}, seed++).cast(DataType::Float32);
  }
  if (o.style == Style::Eager) {
    Tensor mask = testing::random_f64(Shape(o.mask_dims), 7).cast(DataType::Float32);
    float* m = mask.data<float>();
    m[0] = -10000.0f;  // a key masked out, as Hugging Face's extended masks write it
    feeds["mask"] = mask;
  }
  if (o.scale_from_input) feeds["c"] = Tensor::from_vector<float>(Shape{}, {0.5f});
  return feeds;
}

void expect_fused_equals_unfused(const Options& o, const std::vector<std::string>& outputs) {
  const onnx::ModelProto model = attention_model(o);
  onnx::GraphProto g = model.graph();
  ASSERT_EQ(runtime::fuse_attention(g, kOpsets), 1);
  EXPECT_EQ(count_op(g, "Attention"), 1);
  EXPECT_EQ(count_op(g, "Softmax") + count_op(g, "MatMul") + count_op(g, "Div"), 0);
  EXPECT_EQ(count_op(g, "Mul"), o.gradient ? 1 : 0);  // the loss's y * r
  // The merge's Transpose too: the fused node writes [B, S, H, D] (output_layout BSHD) for the
  // merge's Reshape.
  EXPECT_EQ(count_op(g, "Transpose"), 0);
  for (const auto& node : g.node()) {
    if (node.op_type() == "Attention") {
      EXPECT_EQ(node.output(0), "ot");
    }
  }
  const runtime::NamedTensors feeds = feeds_for(o);
  runtime::Session fused(model), unfused(model, {.fuse = false});
  const runtime::NamedTensors got = fused.run(feeds), want = unfused.run(feeds);
  for (const auto& name : outputs) {
    SCOPED_TRACE(name);
    // float32 sums in another order (the scale applied once to Q K^T, the softmax's exp).
    expect_close(got.at(name), want.at(name), 1e-5, 1e-6);
  }
}

TEST(AttentionFusion, ScaledDotProductAttentionAsPyTorchExportsIt) {
  expect_fused_equals_unfused({.style = Style::Sdpa}, {"y"});
}

TEST(AttentionFusion, EagerAttentionWithAMaskAsHuggingFaceWritesIt) {
  expect_fused_equals_unfused({.style = Style::Eager, .mask_dims = {kB, 1, 1, kS}}, {"y"});
  // A mask whose last dim is 1 is added to every key's score, as Add broadcasts it.
  expect_fused_equals_unfused({.style = Style::Eager, .mask_dims = {1, kH, kS, 1}}, {"y"});
}

TEST(AttentionFusion, GradientsThroughTheFusedAttentionEqualTheUnfusedRules) {
  expect_fused_equals_unfused({.style = Style::Sdpa, .gradient = true}, {"y", "dq", "dk", "dv"});
  expect_fused_equals_unfused({.style = Style::Eager, .mask_dims = {kB, 1, 1, kS}, .gradient = true},
                              {"y", "dq", "dk", "dv", "dmask"});
  expect_fused_equals_unfused({.style = Style::Eager, .mask_dims = {kB, kH, kS, 1}, .gradient = true},
                              {"y", "dq", "dk", "dv", "dmask"});
}

TEST(AttentionFusion, TheGradientReadsTheForwardsSoftmaxInsteadOfMakingItAgain) {
  onnx::GraphProto g = attention_model({.style = Style::Eager, .mask_dims = {kB, 1, 1, kS}, .gradient = true}).graph();
  ASSERT_EQ(runtime::fuse_attention(g, kOpsets), 1);
  autodiff::expand_gradients(g, kOpsets, "test");
  ASSERT_EQ(runtime::share_attention_probabilities(g), 1);
  for (const auto& node : g.node()) {
    if (node.op_type() == "Attention") {
      ASSERT_EQ(node.output_size(), 4);
      EXPECT_FALSE(node.output(3).empty());
    }
    if (node.op_type() == "AttentionGrad") {
      ASSERT_EQ(node.input_size(), 11);
    }
  }
  std::string probabilities, read;
  for (const auto& node : g.node()) {
    if (node.op_type() == "Attention") probabilities = node.output(3);
    if (node.op_type() == "AttentionGrad") read = node.input(10);
  }
  EXPECT_EQ(read, probabilities);
  EXPECT_EQ(runtime::share_attention_probabilities(g), 0);  // once only
}

TEST(AttentionFusion, AMaskThatDisallowsARowGivesNaNAsSoftmaxDoes) {
  const Options o{.style = Style::Eager, .mask_dims = {kB, 1, kS, kS}};
  const onnx::ModelProto model = attention_model(o);
  runtime::NamedTensors feeds = feeds_for(o);
  float* m = feeds.at("mask").data<float>();
  for (int64_t j = 0; j < kS; ++j) m[j] = -std::numeric_limits<float>::infinity();  // batch 0, query 0
  runtime::Session fused(model), unfused(model, {.fuse = false});
  const Tensor got = fused.run(feeds).at("y"), want = unfused.run(feeds).at("y");
  const std::vector<double> g = got.to_double_vector(), w = want.to_double_vector();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_EQ(std::isnan(g[i]), std::isnan(w[i])) << "element " << i;
    if (!std::isnan(w[i])) {
      EXPECT_NEAR(g[i], w[i], 1e-5 + 1e-5 * std::abs(w[i])) << "element " << i;
    }
  }
  EXPECT_TRUE(std::isnan(g[0]));  // y[0, 0, :] comes from the disallowed row
}

TEST(AttentionFusion, NaNsZeroedAfterTheSoftmaxAsPyTorchsExportWritesThem) {
  // A row the mask disallows entirely: NaN from the Softmax, 0 after the Where, in both graphs.
  const Options o{.style = Style::Eager, .mask_dims = {kB, 1, kS, kS}, .gradient = true, .zero_nans = true};
  const onnx::ModelProto model = attention_model(o);
  onnx::GraphProto g = model.graph();
  ASSERT_EQ(runtime::fuse_attention(g, kOpsets), 1);
  EXPECT_EQ(count_op(g, "IsNaN") + count_op(g, "Where"), 0);
  runtime::NamedTensors feeds = feeds_for(o);
  float* m = feeds.at("mask").data<float>();
  for (int64_t j = 0; j < kS; ++j) m[j] = -std::numeric_limits<float>::infinity();  // batch 0, query 0
  runtime::Session fused(model), unfused(model, {.fuse = false});
  const runtime::NamedTensors got = fused.run(feeds), want = unfused.run(feeds);
  for (const char* name : {"y", "dv"}) {
    SCOPED_TRACE(name);
    expect_close(got.at(name), want.at(name), 1e-5, 1e-6);
  }
  EXPECT_EQ(got.at("y").to_double_vector()[0], 0.0);
  // The op-by-op gradient goes through SoftmaxGrad of the NaN row and is NaN wherever that row
  // reaches (batch 0's dq row and its dk); the fused one treats the row as the constant zeros the
  // Where made, as PyTorch's own attention does: finite, and equal elsewhere.
  int nan_unfused = 0;
  for (const char* name : {"dq", "dk"}) {
    SCOPED_TRACE(name);
    const std::vector<double> g = got.at(name).to_double_vector(), w = want.at(name).to_double_vector();
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(std::isfinite(g[i])) << "element " << i;
      if (std::isnan(w[i])) {
        ++nan_unfused;
      } else {
        EXPECT_NEAR(g[i], w[i], 1e-6 + 1e-5 * std::abs(w[i])) << "element " << i;
      }
    }
  }
  EXPECT_GT(nan_unfused, 0);
}

TEST(AttentionFusion, TheFusedOpNamesWhatItCannotRead) {
  const Tensor q = testing::random_f64(Shape{1, 3, 2, 4}, 1).cast(DataType::Float32);
  const testing::NodeSpec bshd{"Attention", "ai.onnxtrain", 1,
                               {attr("input_layout", std::string("BSHD")), attr("version", int64_t{23})}};
  // Another layout, a Q that is not [batch, sequence, heads, head size], a P of the wrong shape.
  testing::NodeSpec other = bshd;
  other.attributes[0] = attr("input_layout", std::string("BHSD"));
  EXPECT_TRUE(testing::throws_with([&] { testing::run_node(other, {q, q, q}); }, "input_layout"));
  testing::NodeSpec other_output = bshd;
  other_output.attributes.push_back(attr("output_layout", std::string("BHSD")));
  EXPECT_TRUE(testing::throws_with([&] { testing::run_node(other_output, {q, q, q}); }, "attribute 'output_layout' is 'BHSD'"));
  const Tensor q3 = testing::random_f64(Shape{1, 3, 8}, 2).cast(DataType::Float32);
  EXPECT_TRUE(testing::throws_with([&] { testing::run_node(bshd, {q3, q3, q3}); }, "in0"));
  const testing::NodeSpec grad{"AttentionGrad", "ai.onnxtrain", 1, bshd.attributes, 3};
  const Tensor dy = testing::random_f64(Shape{1, 2, 3, 4}, 3).cast(DataType::Float32);
  const Tensor wrong_p = testing::random_f64(Shape{1, 2, 3, 2}, 4).cast(DataType::Float32);
  std::vector<Tensor> in{dy, q, q, q, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), wrong_p};
  EXPECT_TRUE(testing::throws_with([&] { testing::run_node(grad, in); }, "the forward's softmax"));
}

TEST(AttentionFusion, ThePatternStaysWhenItCannotGoWhole) {
  onnx::GraphProto exposed = attention_model({.expose_probabilities = true}).graph();
  EXPECT_EQ(runtime::fuse_attention(exposed, kOpsets), 0);
  EXPECT_EQ(count_op(exposed, "Softmax"), 1);
  onnx::GraphProto other_axis = attention_model({.softmax_axis = 2}).graph();
  EXPECT_EQ(runtime::fuse_attention(other_axis, kOpsets), 0);
  onnx::GraphProto fed_scale = attention_model({.scale_from_input = true}).graph();
  EXPECT_EQ(runtime::fuse_attention(fed_scale, kOpsets), 0);
  onnx::GraphProto shared_keys = attention_model({.kv_batch = 1}).graph();  // K and V broadcast over the batch
  EXPECT_EQ(runtime::fuse_attention(shared_keys, kOpsets), 0);
  const Options shared{.kv_batch = 1};
  runtime::Session broadcast(attention_model(shared));
  EXPECT_EQ(broadcast.run(feeds_for(shared)).at("y").shape(), (Shape{kB, kS, kE}));
  // Unfused, these still run: the fed scale's model as a whole.
  const Options o{.scale_from_input = true};
  runtime::Session session(attention_model(o));
  EXPECT_EQ(session.run(feeds_for(o)).at("y").shape(), (Shape{kB, kS, kE}));
}

TEST(AttentionFusion, AProductReadBeyondTheMergeKeepsItsTranspose) {
  // P V is a graph output as well as the merge's input: the fused node writes it in the
  // [B, H, S, D] form and the Transpose stays. Values and gradients as unfused, both ways.
  for (bool exposed : {false, true}) {
    SCOPED_TRACE(exposed ? "the product exposed" : "the product read by the merge alone");
    const Options o{.style = Style::Eager, .mask_dims = {kB, 1, 1, kS}, .expose_heads = exposed, .gradient = true};
    const onnx::ModelProto model = attention_model(o);
    onnx::GraphProto g = model.graph();
    ASSERT_EQ(runtime::fuse_attention(g, kOpsets), 1);
    EXPECT_EQ(count_op(g, "Transpose"), exposed ? 1 : 0);
    const runtime::NamedTensors feeds = feeds_for(o);
    runtime::Session fused(model), unfused(model, {.fuse = false});
    const runtime::NamedTensors got = fused.run(feeds), want = unfused.run(feeds);
    for (const char* name : {"y", "dq", "dk", "dv", "dmask"}) {
      SCOPED_TRACE(name);
      expect_close(got.at(name), want.at(name), 1e-5, 1e-6);
    }
    if (exposed) expect_close(got.at("o"), want.at("o"), 1e-5, 1e-6);
  }
}

TEST(AttentionFusion, AReshapeToTheProductsOwnShapeBeforeTheMergeGoesWithTheTranspose) {
  // PyTorch's export of scaled_dot_product_attention: Reshape(P V, [B, -1, S, D]) from Shape(P V),
  // Shape(Q') and Shape(V'), then the merge's Transpose. Proven the product's own shape, both go
  // (the fused node writes [B, S, H, D]) and Shape(P V) reads the new output permuted; with D
  // taken from Shape(Q') (q's head size: equal at this run, but not provably) both stay. Values
  // and gradients as unfused either way.
  for (const auto own : {Options::OwnShape::Proven, Options::OwnShape::Unproven}) {
    const bool proven = own == Options::OwnShape::Proven;
    SCOPED_TRACE(proven ? "D from Shape(V')" : "D from Shape(Q')");
    const Options o{.gradient = true, .own_shape = own};
    const onnx::ModelProto model = attention_model(o);
    onnx::GraphProto g = model.graph();
    ASSERT_EQ(runtime::fuse_attention(g, kOpsets), 1);
    EXPECT_EQ(count_op(g, "Transpose"), proven ? 0 : 1);
    EXPECT_EQ(count_op(g, "Reshape"), proven ? 4 : 5);  // the three head splits and the merge stay
    for (const auto& node : g.node()) {
      if (node.op_type() == "Attention") {
        EXPECT_EQ(node.output(0), proven ? "ot" : "o");
      }
    }
    const runtime::NamedTensors feeds = feeds_for(o);
    runtime::Session fused(model), unfused(model, {.fuse = false});
    const runtime::NamedTensors got = fused.run(feeds), want = unfused.run(feeds);
    for (const char* name : {"y", "dq", "dk", "dv"}) {
      SCOPED_TRACE(name);
      expect_close(got.at(name), want.at(name), 1e-5, 1e-6);
    }
  }
}

}  // namespace
}  // namespace onnxtrain
