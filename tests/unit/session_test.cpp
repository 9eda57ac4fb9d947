#include <gtest/gtest.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "ops/registry.h"
#include "runtime/constant_folding.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain::runtime {
namespace {

using testing::error_of;

using testing::NodeSpec;

// Relu over float32[N,3] with a symbolic batch dim.
onnx::ModelProto relu_model() {
  onnx::ModelProto m = testing::node_model(NodeSpec{.op_type = "Relu"}, {Tensor::zeros(DataType::Float32, {1, 3})});
  auto* dim = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0);
  dim->set_dim_param("N");
  return m;
}

TEST(Session, RunsAndReportsInputsAndOutputs) {
  Session session(relu_model(), {}, {}, "relu.onnx");
  ASSERT_EQ(session.inputs().size(), 1u);
  EXPECT_EQ(session.inputs()[0].type_string(), "float32[N,3]");
  auto out = session.run({{"in0", Tensor::from_vector<float>({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  EXPECT_EQ(out.at("out0").to_double_vector(), (std::vector<double>{0, 2, 0, 4, 0, 6}));
  // Another batch size gets its own plan; the first is reused afterwards.
  EXPECT_EQ(session.run({{"in0", Tensor::zeros(DataType::Float32, {5, 3})}}).at("out0").shape(), (Shape{5, 3}));
  EXPECT_EQ(session.run({{"in0", Tensor::zeros(DataType::Float32, {2, 3})}}).at("out0").shape(), (Shape{2, 3}));
}

TEST(Session, RejectsBadFeedsWithClearErrors) {
  Session session(relu_model(), {}, {}, "relu.onnx");
  auto contains = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  std::string e = error_of([&] { session.run({}); });
  EXPECT_TRUE(contains(e, "missing feed for input 'in0'")) << e;
  EXPECT_TRUE(contains(e, "relu.onnx")) << e;
  e = error_of([&] { session.run({{"in0", Tensor::zeros(DataType::Float64, {2, 3})}}); });
  EXPECT_TRUE(contains(e, "float32[N,3]") && contains(e, "float64[2,3]")) << e;
  e = error_of([&] { session.run({{"in0", Tensor::zeros(DataType::Float32, {6})}}); });
  EXPECT_TRUE(contains(e, "rank 2")) << e;
  e = error_of([&] { session.run({{"in0", Tensor::zeros(DataType::Float32, {2, 4})}}); });
  EXPECT_TRUE(contains(e, "dim 1")) << e;
  e = error_of([&] {
    session.run({{"in0", Tensor::zeros(DataType::Float32, {2, 3})}, {"typo", Tensor::zeros(DataType::Float32, {1})}});
  });
  EXPECT_TRUE(contains(e, "'typo' is not an input")) << e;
}

TEST(Session, RejectsUnknownOpsAndOpsets) {
  auto contains = [](const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; };
  std::string e = error_of([] { Session(testing::node_model(NodeSpec{.op_type = "Frobnicate"}, {Tensor::zeros(DataType::Float32, {1})}), {}, {}, "m.onnx"); });
  EXPECT_TRUE(contains(e, "unknown operator ai.onnx.Frobnicate") && contains(e, "'node'")) << e;
  e = error_of([] { Session(testing::node_model(NodeSpec{.op_type = "Relu", .opset = 29}, {Tensor::zeros(DataType::Float32, {1})})); });
  EXPECT_TRUE(contains(e, "opset 29") && contains(e, "supports 1 to 28")) << e;
  e = error_of([] { Session(testing::node_model(NodeSpec{.op_type = "LayerNormalization", .opset = 16}, {Tensor::zeros(DataType::Float32, {1})})); });
  EXPECT_TRUE(contains(e, "opset 16 defines no operator LayerNormalization")) << e;
  e = error_of([] { Session(testing::node_model(NodeSpec{.op_type = "Thing", .domain = "com.example", .opset = 1}, {Tensor::zeros(DataType::Float32, {1})})); });
  EXPECT_TRUE(contains(e, "com.example.Thing")) << e;
  onnx::ModelProto no_domain = testing::node_model(NodeSpec{.op_type = "Relu"}, {Tensor::zeros(DataType::Float32, {1})});
  no_domain.mutable_graph()->mutable_node(0)->set_domain("com.example");
  e = error_of([&] { Session s(no_domain); });
  EXPECT_TRUE(contains(e, "no entry for domain 'com.example'")) << e;
}

TEST(Registry, OpVersionsFollowOnnxOperatorVersioning) {
  EXPECT_EQ(ops::op_version("", "Add", 15), 14);  // Add-14 is the newest version at opset 15
  EXPECT_EQ(ops::op_version("", "Add", 14), 14);
  EXPECT_EQ(ops::op_version("", "Add", 13), 13);
  EXPECT_EQ(ops::op_version("", "ReduceMean", 17), 13);
  EXPECT_EQ(ops::op_version("", "ReduceMean", 18), 18);
  EXPECT_EQ(ops::op_version("", "LayerNormalization", 16), 0);  // introduced at opset 17
  EXPECT_EQ(ops::op_version("ai.onnx.preview.training", "Adam", 1), 1);
  EXPECT_EQ(ops::op_version("ai.onnxtrain", "ConvGrad", 1), 1);
  // A row serves the op versions it names, whatever the model's opset.
  const ops::KernelDef* add = ops::find_kernel("", "Add", 15);
  ASSERT_NE(add, nullptr);
  EXPECT_TRUE(add->since <= 14 && 14 <= add->until);
  EXPECT_EQ(ops::find_kernel("", "LayerNormalization", 16), nullptr);
}

// Every version ONNX 1.23 defines of an op the kernel table implements, from the first version a
// row serves up to opset 28, is served by some row, except the versions listed here on purpose.
// A newer version left out of the table (a row stopping at an older `until`) fails this test
// with the list of what is missing; an entry below that a row now serves fails it too, so the
// list stays true. Deprecated schemas (Scatter-11, Upsample-10) are not versions to serve.
TEST(Registry, EveryOpVersionUpTo28IsServed) {
  struct NotServed {
    const char* domain;
    const char* op;
    int version;
    const char* reason;
  };
  // Nothing is left out today; an entry reads {"", "Op", version, "why"}.
  static const std::vector<NotServed> kNotServed = {};
  constexpr int kNewest = 28;
  auto listed = [&](const std::string& domain, const std::string& op, int version) {
    for (const NotServed& n : kNotServed) {
      if (domain == n.domain && op == n.op && version == n.version) return true;
    }
    return false;
  };
  auto served = [](const std::string& domain, const std::string& op, int version) {
    for (const ops::KernelDef& def : ops::kernel_table()) {
      if (def.domain == domain && def.op_type == op && def.since <= version && version <= def.until) return true;
    }
    return false;
  };
  // The first version any row serves, per (domain, op).
  std::map<std::pair<std::string, std::string>, int> first;
  for (const ops::KernelDef& def : ops::kernel_table()) {
    if (def.domain == "ai.onnxtrain") continue;  // onnxtrain's own ops have no ONNX schemas
    const auto key = std::make_pair(std::string(def.domain), std::string(def.op_type));
    const auto it = first.find(key);
    first[key] = it == first.end() ? def.since : std::min(it->second, def.since);
  }
  std::set<std::string> missing;
  for (const onnx::OpSchema& schema : onnx::OpSchemaRegistry::get_all_schemas_with_history()) {
    const auto it = first.find({schema.domain(), schema.Name()});
    const int v = schema.SinceVersion();
    if (it == first.end() || v < it->second || v > kNewest || schema.Deprecated()) continue;
    if (!served(schema.domain(), schema.Name(), v) && !listed(schema.domain(), schema.Name(), v)) {
      missing.insert((schema.domain().empty() ? "" : schema.domain() + ".") + schema.Name() + "-" + std::to_string(v));
    }
  }
  std::string list;
  for (const std::string& m : missing) list += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << "op versions no kernel row serves (read what changed, implement it, widen or add "
                                  "the row; or list the version in kNotServed with the reason):" << list;
  for (const NotServed& n : kNotServed) {
    EXPECT_FALSE(served(n.domain, n.op, n.version))
        << n.op << "-" << n.version << " is served now: remove it from kNotServed (" << n.reason << ")";
    EXPECT_NE(onnx::OpSchemaRegistry::Schema(n.op, n.version, n.domain), nullptr);
    EXPECT_EQ(ops::op_version(n.domain, n.op, n.version), n.version) << n.op << "-" << n.version << " is no version of the op";
  }
}

TEST(Session, RejectsUnsupportedElementTypesNamingTheInput) {
  Session session(testing::node_model(NodeSpec{.op_type = "Sqrt"}, {Tensor::zeros(DataType::Int32, {2})}), {}, {}, "m.onnx");
  const std::string e = error_of([&] { session.run({{"in0", Tensor::zeros(DataType::Int32, {2})}}); });
  EXPECT_NE(e.find("input 'in0' has element type int32"), std::string::npos) << e;
}

TEST(Session, InitializerInputsAreOptionalFeeds) {
  // IR 3 style: an initializer that is also a graph input is a default the caller may override.
  onnx::ModelProto m = testing::node_model(NodeSpec{.op_type = "Add", .opset = 13},
                                           {Tensor::zeros(DataType::Float32, {2}), Tensor::zeros(DataType::Float32, {2})});
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("in1");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(2);
  w->add_float_data(10);
  w->add_float_data(20);
  Session session(m);
  ASSERT_EQ(session.inputs().size(), 1u);
  ASSERT_EQ(session.optional_inputs().size(), 1u);
  const Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  EXPECT_EQ(session.run({{"in0", x}}).at("out0").to_double_vector(), (std::vector<double>{11, 22}));
  EXPECT_EQ(session.run({{"in0", x}, {"in1", x}}).at("out0").to_double_vector(), (std::vector<double>{2, 4}));
}

// ---------------------------------------------------------------------------------------------
// Constant folding (runtime/constant_folding.h)

onnx::AttributeProto tensor_attr(const std::string& name, const Tensor& t) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::TENSOR);
  io::tensor_to_proto(t, "", *a.mutable_t());
  return a;
}

// y = Reshape(x, Concat(Unsqueeze(c0), Unsqueeze(c1))) with c0, c1 Constant nodes: the exporter
// shape pattern; plus a RandomUniform and a node reading an initializer that is also an input.
onnx::ModelProto folding_model() {
  onnx::ModelProto m = testing::empty_model("folding");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2, 6});
  testing::typed_value(g.add_input(), "scale", onnx::TensorProto::FLOAT, {1});
  io::tensor_to_proto(Tensor::from_vector<float>({1}, {2.0f}), "scale", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<int64_t>({1}, {0}), "axes", *g.add_initializer());
  *testing::add_node(g, "Constant", {}, {"c0"})->add_attribute() = tensor_attr("value", Tensor::scalar<int64_t>(3));
  *testing::add_node(g, "Constant", {}, {"c1"})->add_attribute() = tensor_attr("value", Tensor::scalar<int64_t>(4));
  testing::add_node(g, "Unsqueeze", {"c0", "axes"}, {"u0"});
  testing::add_node(g, "Unsqueeze", {"c1", "axes"}, {"u1"});
  *testing::add_node(g, "Concat", {"u0", "u1"}, {"shape"})->add_attribute() = testing::attr("axis", int64_t{0});
  testing::add_node(g, "Reshape", {"x", "shape"}, {"r"});
  testing::add_node(g, "Mul", {"r", "scale"}, {"y"});
  auto* random = testing::add_node(g, "RandomUniform", {}, {"noise"});
  *random->add_attribute() = testing::attr("shape", std::vector<int64_t>{2});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {3, 4});
  testing::typed_value(g.add_output(), "shape", onnx::TensorProto::INT64, {2});
  testing::typed_value(g.add_output(), "noise", onnx::TensorProto::FLOAT, {2});
  return m;
}

TEST(ConstantFolding, FoldsTheExporterShapeArithmeticOnly) {
  const onnx::ModelProto m = folding_model();
  onnx::GraphProto g = m.graph();
  // Unsqueeze x2 and Concat fold; Reshape reads x, Mul reads an overridable initializer, and
  // RandomUniform draws anew every run.
  EXPECT_EQ(fold_constants(g, {{"", 17}}, "."), 3);
  int constants = 0;
  for (const auto& n : g.node()) {
    constants += n.op_type() == "Constant";
    EXPECT_NE(n.op_type(), "Concat");
    EXPECT_NE(n.op_type(), "Unsqueeze");
  }
  // Only `shape` (a graph output) stays: c0, c1, u0, u1 and the initializer `axes` had no reader
  // left but folded nodes.
  EXPECT_EQ(constants, 1);
  EXPECT_EQ(g.node_size(), 4);
  ASSERT_EQ(g.initializer_size(), 1);
  EXPECT_EQ(g.initializer(0).name(), "scale");
}

TEST(ConstantFolding, FoldedAndUnfoldedSessionsAgree) {
  const onnx::ModelProto m = folding_model();
  const Tensor x = testing::iota({2, 6});
  Session folded(m), plain(m, {.fuse = false});
  for (const NamedTensors& feeds : {NamedTensors{{"x", x}}, NamedTensors{{"x", x}, {"scale", Tensor::from_vector<float>({1}, {-1.0f})}}}) {
    const NamedTensors a = folded.run(feeds), b = plain.run(feeds);
    testing::expect_close(a.at("y"), b.at("y"), 0, 0);
    EXPECT_EQ(a.at("y").shape(), (Shape{3, 4}));
    testing::expect_close(a.at("shape"), b.at("shape"), 0, 0);
  }
  // RandomUniform is not folded: two runs draw different numbers.
  EXPECT_NE(folded.run({{"x", x}}).at("noise").to_double_vector(), folded.run({{"x", x}}).at("noise").to_double_vector());
}

TEST(ConstantFolding, LeavesLargeOutputsAndFailingNodesToTheRun) {
  onnx::ModelProto m = testing::empty_model("folding");
  auto& g = *m.mutable_graph();
  *testing::add_node(g, "Constant", {}, {"big_shape"})->add_attribute() =
      tensor_attr("value", Tensor::from_vector<int64_t>({2}, {100, 100}));
  testing::add_node(g, "ConstantOfShape", {"big_shape"}, {"big"});  // 10000 elements: kept
  *testing::add_node(g, "Constant", {}, {"bad_shape"})->add_attribute() =
      tensor_attr("value", Tensor::from_vector<int64_t>({2}, {3, 7}));
  testing::add_node(g, "Reshape", {"big", "bad_shape"}, {"oops"});
  testing::typed_value(g.add_output(), "big", onnx::TensorProto::FLOAT, {});
  testing::typed_value(g.add_output(), "oops", onnx::TensorProto::FLOAT, {});
  onnx::GraphProto copy = g;
  EXPECT_EQ(fold_constants(copy, {{"", 17}}, "."), 0);
  // The Reshape cannot work: the run reports it with the node, as without folding.
  Session session(m);
  const std::string error = error_of([&] { session.run({}); });
  EXPECT_NE(error.find("Reshape"), std::string::npos) << error;
}

// A Transpose of a weight (10000 elements, over the 4096 limit) read as a product's A: folded
// when the weight has no other reader, which the graph then drops, so memory stays the same;
// kept when another node (here a graph output) still reads the weight.
TEST(ConstantFolding, FoldsALargeOutputThatReplacesTheOnlyCopyOfItsInput) {
  const Tensor w = testing::iota({100, 100});
  for (bool weight_also_read : {false, true}) {
    SCOPED_TRACE(weight_also_read ? "the weight is also an output" : "the Transpose alone reads the weight");
    onnx::ModelProto m = testing::empty_model("folding");
    auto& g = *m.mutable_graph();
    testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {100, 2});
    io::tensor_to_proto(w, "w", *g.add_initializer());
    testing::add_node(g, "Transpose", {"w"}, {"wt"});
    testing::add_node(g, "MatMul", {"wt", "x"}, {"y"});
    testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {100, 2});
    if (weight_also_read) testing::typed_value(g.add_output(), "w", onnx::TensorProto::FLOAT, {100, 100});
    onnx::GraphProto copy = g;
    EXPECT_EQ(fold_constants(copy, {{"", 17}}, "."), weight_also_read ? 0 : 1);
    EXPECT_EQ(copy.initializer_size(), weight_also_read ? 1 : 0);
    const Tensor x = testing::iota({100, 2});
    Session folded(m), plain(m, {.fuse = false});
    testing::expect_close(folded.run({{"x", x}}).at("y"), plain.run({{"x", x}}).at("y"), 0, 0);
  }
}

// torch.onnx.export's linear layer, MatMul(x, Transpose(W)) -> Add(b): the Transpose is left to
// the product, which reads W in place (transB), so the session holds W once, not W and a folded
// W^T that the constant-weights product would copy back into W's layout. With a known A the
// whole product folds as before.
TEST(ConstantFolding, LeavesALinearLayersTransposedWeightToItsProduct) {
  const Tensor w = testing::iota({50, 100});
  for (bool known_a : {false, true}) {
    SCOPED_TRACE(known_a ? "A is an initializer" : "A is a graph input");
    onnx::ModelProto m = testing::empty_model("linear");
    auto& g = *m.mutable_graph();
    if (known_a) {
      io::tensor_to_proto(testing::iota({2, 100}), "x", *g.add_initializer());
    } else {
      testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, 3, 100});
    }
    io::tensor_to_proto(w, "w", *g.add_initializer());
    io::tensor_to_proto(testing::iota({50}), "b", *g.add_initializer());
    testing::add_node(g, "Transpose", {"w"}, {"wt"})->add_attribute()->CopyFrom(testing::attr("perm", std::vector<int64_t>{1, 0}));
    testing::add_node(g, "MatMul", {"x", "wt"}, {"xw"});
    testing::add_node(g, "Add", {"xw", "b"}, {"y"});
    testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
    onnx::GraphProto copy = g;
    EXPECT_EQ(fold_constants(copy, {{"", 17}}, "."), known_a ? 3 : 0);
    if (known_a) continue;
    fuse_matrix_products(copy);
    ASSERT_EQ(copy.node_size(), 1);
    EXPECT_EQ(copy.node(0).op_type(), "MatMulAdd");
    EXPECT_EQ(copy.node(0).input(1), "w");
    EXPECT_EQ(copy.initializer_size(), 2);  // w and b, nothing derived from them
    const Tensor x = testing::random_f64({2, 3, 100}, 7).cast(DataType::Float32);
    Session fused(m), plain(m, {.fuse = false});
    testing::expect_close(fused.run({{"x", x}}).at("y"), plain.run({{"x", x}}).at("y"), 1e-5, 1e-4);
  }
}

// The gate reorder of an exported LSTM: three Slice nodes of one weight (4800 elements, sliced
// unevenly) and a Concat of the slices. Each Slice may take what is left of the weight, which
// only they read, and the Concat what the slices hold: all four fold, and the weight, the
// slices and their start / end / axes constants leave the graph, so memory stays the same.
TEST(ConstantFolding, FoldsTheSlicesAndConcatThatReorderAWeightSharedByThem) {
  const Tensor w = testing::iota({80, 60});
  onnx::ModelProto m = testing::empty_model("folding");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2, 60});
  io::tensor_to_proto(w, "w", *g.add_initializer());
  const std::vector<std::pair<int64_t, int64_t>> rows{{0, 20}, {60, 80}, {20, 60}};  // 1200, 1200, 2400
  std::vector<std::string> slices;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string k = std::to_string(i);
    *testing::add_node(g, "Constant", {}, {"start" + k})->add_attribute() =
        tensor_attr("value", Tensor::from_vector<int64_t>({1}, {rows[i].first}));
    *testing::add_node(g, "Constant", {}, {"end" + k})->add_attribute() =
        tensor_attr("value", Tensor::from_vector<int64_t>({1}, {rows[i].second}));
    slices.push_back("slice" + k);
    testing::add_node(g, "Slice", {"w", "start" + k, "end" + k}, {slices.back()});
  }
  *testing::add_node(g, "Concat", slices, {"reordered"})->add_attribute() = testing::attr("axis", int64_t{0});
  *testing::add_node(g, "Gemm", {"x", "reordered"}, {"y"})->add_attribute() = testing::attr("transB", int64_t{1});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {2, 80});
  onnx::GraphProto copy = g;
  EXPECT_EQ(fold_constants(copy, {{"", 17}}, "."), 4);
  EXPECT_EQ(copy.initializer_size(), 0);
  ASSERT_EQ(copy.node_size(), 2);  // the reordered weight as a Constant, and the Gemm
  EXPECT_EQ(copy.node(0).output(0), "reordered");
  EXPECT_EQ(copy.node(1).op_type(), "Gemm");
  const Tensor x = testing::iota({2, 60});
  Session folded(m), plain(m, {.fuse = false});
  testing::expect_close(folded.run({{"x", x}}).at("y"), plain.run({{"x", x}}).at("y"), 0, 0);
}

}  // namespace
}  // namespace onnxtrain::runtime
