// The Gradient operator on hand-built graphs: what the per-rule finite-difference tests do not
// cover — gradients with respect to an intermediate tensor, evaluation at other values than
// the forward ones, second derivatives, zs inputs, skipped outputs, an x that y does not
// depend on, the errors, and a Gradient node inside a TrainingInfoProto algorithm.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "autodiff/gradient.h"
#include "onnxtrain/training.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::expect_close;

struct GraphBuilder {
  onnx::ModelProto model;
  onnx::GraphProto& g;

  GraphBuilder() : g(*model.mutable_graph()) {
    model.set_ir_version(8);
    auto* o = model.add_opset_import();
    o->set_version(17);
    auto* t = model.add_opset_import();
    t->set_domain("ai.onnx.preview.training");
    t->set_version(1);
    g.set_name("g");
  }
  void input(const std::string& name, std::vector<int64_t> dims, int type = onnx::TensorProto::DOUBLE) {
    auto* v = g.add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  }
  onnx::NodeProto* node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + (out.empty() ? std::string("x") : out[0]));
    for (auto& i : in) n->add_input(i);
    for (auto& o : out) n->add_output(o);
    return n;
  }
  onnx::NodeProto* gradient(std::vector<std::string> in, std::vector<std::string> out, std::vector<std::string> xs,
                            const std::string& y, std::vector<std::string> zs = {}) {
    auto* n = node("Gradient", std::move(in), std::move(out));
    n->set_domain("ai.onnx.preview.training");
    n->set_name("gradient_" + y + std::to_string(g.node_size()));
    auto strings = [&](const char* name, const std::vector<std::string>& v) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::STRINGS);
      for (const auto& s : v) a->add_strings(s);
    };
    strings("xs", xs);
    if (!zs.empty()) strings("zs", zs);
    auto* a = n->add_attribute();
    a->set_name("y");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(y);
    return n;
  }
  void output(const std::string& name) { g.add_output()->set_name(name); }
  void typed_output(const std::string& name, std::vector<int64_t> dims) {
    input(name, std::move(dims));
    *g.add_output() = g.input(g.input_size() - 1);
    g.mutable_input()->RemoveLast();
  }
  runtime::NamedTensors run(const runtime::NamedTensors& feeds) { return runtime::Session(model).run(feeds); }
};

Tensor vec(const std::vector<double>& v) { return Tensor::from_vector<double>({static_cast<int64_t>(v.size())}, v); }

// y = sum(h * h) with h = x + b.
void square_of_sum(GraphBuilder& m) {
  m.input("x", {3});
  m.input("b", {3});
  m.node("Add", {"x", "b"}, {"h"});
  m.node("Mul", {"h", "h"}, {"s"});
  m.node("ReduceSum", {"s"}, {"y"});
  m.output("y");
}

TEST(Gradient, WithRespectToAnIntermediateTensor) {
  GraphBuilder m;
  square_of_sum(m);
  m.gradient({"h"}, {"dh"}, {"h"}, "y");
  m.output("dh");
  const auto out = m.run({{"x", vec({1, 2, 3})}, {"b", vec({0.5, 0, -1})}});
  expect_close(out.at("dh"), vec({3, 4, 4}));  // 2h
}

TEST(Gradient, EvaluatesAtTheNodesInputsWhenTheyDifferFromXs) {
  GraphBuilder m;
  square_of_sum(m);
  m.input("x_other", {3});
  m.gradient({"x_other", "b"}, {"dx", "db"}, {"x", "b"}, "y");
  m.output("dx");
  m.output("db");
  const auto out = m.run({{"x", vec({1, 2, 3})}, {"b", vec({0, 0, 0})}, {"x_other", vec({-1, 5, 0.25})}});
  EXPECT_EQ(out.at("y").to_double_vector(), std::vector<double>{14.0});  // the forward value is untouched
  expect_close(out.at("dx"), vec({-2, 10, 0.5}));   // 2 (x_other + b)
  expect_close(out.at("db"), vec({-2, 10, 0.5}));
}

TEST(Gradient, SecondDerivativeOfACube) {
  // y = x^3 element-wise: dy/dx = 3x^2, and the gradient of sum(3x^2) is 6x.
  GraphBuilder m;
  m.input("x", {3});
  m.node("Mul", {"x", "x"}, {"x2"});
  m.node("Mul", {"x2", "x"}, {"y"});
  m.gradient({"x"}, {"dy"}, {"x"}, "y");
  m.gradient({"x"}, {"d2y"}, {"x"}, "dy");
  m.output("dy");
  m.output("d2y");
  const auto out = m.run({{"x", vec({-1, 0.5, 2})}});
  expect_close(out.at("dy"), vec({3, 0.75, 12}));
  expect_close(out.at("d2y"), vec({-6, 3, 12}));
}

TEST(Gradient, ZsAreInputsWithoutGradients) {
  GraphBuilder m;
  m.input("x", {2});
  m.input("z", {2});
  m.node("Mul", {"x", "z"}, {"p"});
  m.node("ReduceSum", {"p"}, {"y"});
  m.gradient({"x", "z"}, {"dx"}, {"x"}, "y", {"z"});
  m.output("dx");
  expect_close(m.run({{"x", vec({1, 2})}, {"z", vec({3, -4})}}).at("dx"), vec({3, -4}));
}

TEST(Gradient, EmptyOutputNamesSkipGradientsAndUnusedXsGetZeros) {
  GraphBuilder m;
  m.input("a", {2});
  m.input("b", {2});
  m.input("unused", {2, 2});
  m.node("Mul", {"a", "b"}, {"y"});  // y is not a scalar: the seed is ones shaped like y
  m.gradient({"a", "b", "unused"}, {"", "db", "dunused"}, {"a", "b", "unused"}, "y");
  m.output("db");
  m.output("dunused");
  const auto out = m.run({{"a", vec({2, 3})}, {"b", vec({5, 7})}, {"unused", Tensor::zeros(DataType::Float64, {2, 2})}});
  expect_close(out.at("db"), vec({2, 3}));
  expect_close(out.at("dunused"), Tensor::zeros(DataType::Float64, {2, 2}));
}

std::string error_of(GraphBuilder& m, const runtime::NamedTensors& feeds) {
  try {
    m.run(feeds);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Gradient, AnOpWithoutARuleNamesTheOpTheNodeAndThePath) {
  GraphBuilder m;
  m.input("x", {2, 2});
  m.node("Exp", {"x"}, {"e"});
  m.node("Unique", {"e"}, {"s"});
  m.gradient({"x"}, {"dx"}, {"x"}, "s");
  m.output("dx");
  const std::string message = error_of(m, {{"x", Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4})}});
  EXPECT_NE(message.find("no gradient rule for Unique"), std::string::npos) << message;
  EXPECT_NE(message.find("node 'Unique_s'"), std::string::npos) << message;
  EXPECT_NE(message.find("'x' -> Exp -> [Unique]"), std::string::npos) << message;
}

// SequenceAt at constant positions of a SplitToSequence (as the dynamo exporter writes
// torch.split) is rewritten as Slice or Gather, so gradients pass through the chunks. x [2, 6];
// loss = sum(a * a) + sum(b * w), a and b two chunks (positions negative where allowed).
TEST(Gradient, FlowsThroughSequenceAtOfSplitToSequence) {
  struct Case {
    std::string name;
    std::optional<Tensor> split;
    int64_t axis, keepdims, pa, pb;
    std::vector<int64_t> w_dims;
    std::vector<int> a_cells, b_cells;  // the cells of x (row-major index) in a and b, in order
  };
  auto cols = [](std::initializer_list<int> cs) {
    std::vector<int> cells;
    for (int r = 0; r < 2; ++r) {
      for (int c : cs) cells.push_back(r * 6 + c);
    }
    return cells;
  };
  const std::vector<Case> cases{
      {"scalar split", Tensor::scalar<int64_t>(2), 1, 1, 2, 0, {2, 2}, cols({4, 5}), cols({0, 1})},
      {"sizes, negative position", Tensor::from_vector<int64_t>({3}, {1, 2, 3}), -1, 1, -1, 1, {2, 2}, cols({3, 4, 5}),
       cols({1, 2})},
      {"no split, keepdims 0", std::nullopt, 0, 0, 1, -2, {6}, {6, 7, 8, 9, 10, 11}, {0, 1, 2, 3, 4, 5}},
      {"no split, keepdims 1", std::nullopt, 1, 1, 5, -6, {2, 1}, cols({5}), cols({0})}};
  std::vector<double> xv(12), wv(6);
  for (int i = 0; i < 12; ++i) xv[static_cast<size_t>(i)] = 0.25 * i - 1;
  for (int i = 0; i < 6; ++i) wv[static_cast<size_t>(i)] = 1.5 - 0.5 * i;
  for (const Case& c : cases) {
    auto build = [&](GraphBuilder& m, bool with_gradient) {
      m.input("x", {2, 6});
      m.input("w", c.w_dims);
      auto* split = m.node("SplitToSequence", {"x"}, {"seq"});
      if (c.split) {
        io::tensor_to_proto(*c.split, "split", *m.g.add_initializer());
        split->add_input("split");
      }
      split->add_attribute()->CopyFrom(testing::attr("axis", c.axis));
      split->add_attribute()->CopyFrom(testing::attr("keepdims", c.keepdims));
      io::tensor_to_proto(Tensor::scalar<int64_t>(c.pa), "pa", *m.g.add_initializer());
      m.node("Constant", {}, {"pb"})->add_attribute()->CopyFrom(testing::attr("value_int", c.pb));
      m.node("SequenceAt", {"seq", "pa"}, {"a"});
      m.node("SequenceAt", {"seq", "pb"}, {"b"});
      m.node("Mul", {"a", "a"}, {"aa"});
      m.node("Mul", {"b", "w"}, {"bw"});
      m.node("ReduceSum", {"aa"}, {"sa"});
      m.node("ReduceSum", {"bw"}, {"sb"});
      m.node("Add", {"sa", "sb"}, {"y"});
      m.output("y");
      if (!with_gradient) return;
      m.gradient({"x", "w"}, {"dx", "dw"}, {"x", "w"}, "y");
      m.output("dx");
      m.output("dw");
    };
    GraphBuilder m, forward_only;
    build(m, true);
    build(forward_only, false);
    const std::vector<double> w_values(wv.begin(), wv.begin() + static_cast<std::ptrdiff_t>(c.b_cells.size()));
    const Tensor w = Tensor::from_vector<double>(Shape(c.w_dims), w_values);
    const auto out = m.run({{"x", Tensor::from_vector<double>({2, 6}, xv)}, {"w", w}});
    double y = 0;
    std::vector<double> dx(12, 0.0), dw;
    for (int cell : c.a_cells) {
      y += xv[static_cast<size_t>(cell)] * xv[static_cast<size_t>(cell)];
      dx[static_cast<size_t>(cell)] += 2 * xv[static_cast<size_t>(cell)];
    }
    for (size_t k = 0; k < c.b_cells.size(); ++k) {
      const auto cell = static_cast<size_t>(c.b_cells[k]);
      y += xv[cell] * wv[k];
      dx[cell] += wv[k];
      dw.push_back(xv[cell]);
    }
    SCOPED_TRACE(c.name);
    EXPECT_DOUBLE_EQ(out.at("y").to_double_vector()[0], y);
    // The sequence kernels (no rewrite without a Gradient node) give the same value.
    EXPECT_DOUBLE_EQ(forward_only.run({{"x", Tensor::from_vector<double>({2, 6}, xv)}, {"w", w}}).at("y").to_double_vector()[0], y);
    expect_close(out.at("dx"), Tensor::from_vector<double>({2, 6}, dx), 1e-12, 1e-12);
    expect_close(out.at("dw"), Tensor::from_vector<double>(Shape(c.w_dims), dw), 1e-12, 1e-12);
  }
}

TEST(Gradient, RejectsIntegerXsUnknownNamesAndMismatchedInputs) {
  {
    GraphBuilder m;
    m.input("i", {2}, onnx::TensorProto::INT64);
    m.node("Cast", {"i"}, {"f"})->add_attribute()->CopyFrom([] {
      onnx::AttributeProto a;
      a.set_name("to");
      a.set_type(onnx::AttributeProto::INT);
      a.set_i(onnx::TensorProto::DOUBLE);
      return a;
    }());
    m.node("ReduceSum", {"f"}, {"y"});
    m.gradient({"i"}, {"di"}, {"i"}, "y");
    m.output("di");
    const std::string message = error_of(m, {{"i", Tensor::from_vector<int64_t>({2}, {1, 2})}});
    EXPECT_NE(message.find("xs names 'i' of type int64"), std::string::npos) << message;
  }
  {
    GraphBuilder m;
    square_of_sum(m);
    m.gradient({"x"}, {"dx"}, {"x"}, "nonexistent");
    m.output("dx");
    const std::string message = error_of(m, {{"x", vec({1, 2, 3})}, {"b", vec({0, 0, 0})}});
    EXPECT_NE(message.find("attribute 'y' names 'nonexistent'"), std::string::npos) << message;
  }
  {
    GraphBuilder m;
    square_of_sum(m);
    m.gradient({"x", "b"}, {"dx"}, {"x"}, "y");
    m.output("dx");
    const std::string message = error_of(m, {{"x", vec({1, 2, 3})}, {"b", vec({0, 0, 0})}});
    EXPECT_NE(message.find("has 2 inputs but xs and zs name 1"), std::string::npos) << message;
  }
}

TEST(Gradient, DrivesATrainingInfoAlgorithm) {
  // Inference: y = x·w. Algorithm: loss = sum((y - t)^2), dw = Gradient(w), w_new = w - 0.1 dw.
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* training_opset = model.add_opset_import();
  training_opset->set_domain("ai.onnx.preview.training");
  training_opset->set_version(1);
  auto& g = *model.mutable_graph();
  g.set_name("inference");
  GraphBuilder inputs;  // only for its input() helper
  inputs.input("x", {2, 2});
  *g.add_input() = inputs.g.input(0);
  io::tensor_to_proto(Tensor::from_vector<double>({2}, {0.5, -1}), "w", *g.add_initializer());
  auto* mm = g.add_node();
  mm->set_op_type("MatMul");
  mm->add_input("x");
  mm->add_input("w");
  mm->add_output("y");
  inputs.typed_output("y", {2});
  *g.add_output() = inputs.g.output(0);

  auto* info = model.add_training_info();
  GraphBuilder alg;
  alg.g.set_name("algorithm");
  alg.input("t", {2});
  alg.node("Sub", {"y", "t"}, {"r"});
  alg.node("Mul", {"r", "r"}, {"r2"});
  alg.node("ReduceSum", {"r2"}, {"loss"});
  alg.gradient({"w"}, {"dw"}, {"w"}, "loss");
  io::tensor_to_proto(Tensor::scalar(0.1), "lr", *alg.g.add_initializer());
  alg.node("Mul", {"dw", "lr"}, {"step"});
  alg.node("Sub", {"w", "step"}, {"w_new"});
  alg.typed_output("loss", {1});
  alg.typed_output("w_new", {2});
  *info->mutable_algorithm() = alg.g;
  auto* binding = info->add_update_binding();
  binding->set_key("w");
  binding->set_value("w_new");

  training::TrainingSession session(model);
  const Tensor x = Tensor::from_vector<double>({2, 2}, {1, 2, 3, 4});
  const Tensor t = vec({1, 1});
  session.step({{"x", x}, {"t", t}});
  // y = [1*0.5 - 2, 3*0.5 - 4] = [-1.5, -2.5]; r = [-2.5, -3.5]; dw = 2 x^T r = [-26, -38].
  expect_close(session.state().at("w"), vec({0.5 + 2.6, -1 + 3.8}));
}

// A linear layer (x [..., M, K] times a matrix w [K, N]) differentiates into two Gemm nodes on
// x and dY with their batch dims flattened into rows (dw sums over the batch as it multiplies),
// not into Transpose copies, per-batch products and a sum over their batch.
TEST(Gradient, LinearLayerIsOneGemmPerInput) {
  for (const int rank : {3, 4}) {
    GraphBuilder b;
    const std::vector<int64_t> x_dims = rank == 3 ? std::vector<int64_t>{2, 3, 4} : std::vector<int64_t>{2, 2, 3, 4};
    b.input("x", x_dims);
    b.input("w", {4, 5});
    b.node("MatMul", {"x", "w"}, {"y"});
    b.node("ReduceSum", {"y"}, {"loss"});
    b.gradient({"x", "w"}, {"dx", "dw"}, {"x", "w"}, "loss");
    b.output("dx");
    b.output("dw");

    onnx::GraphProto expanded = b.g;
    autodiff::expand_gradients(expanded, {{"", 17}, {"ai.onnx.preview.training", 1}}, "test graph");
    std::map<std::string, int> ops;
    for (const auto& n : expanded.node()) ++ops[n.op_type()];
    EXPECT_EQ(ops["Transpose"], 0) << "rank " << rank;
    EXPECT_EQ(ops["MatMul"], 1) << "rank " << rank;  // the forward product
    EXPECT_EQ(ops["Gemm"], 2) << "rank " << rank;

    int64_t rows = 1;
    for (int d = 0; d + 1 < rank; ++d) rows *= x_dims[static_cast<size_t>(d)];
    std::vector<double> x(static_cast<size_t>(rows * 4)), w(20);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25 * static_cast<double>(i % 7) - 0.5;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1 * static_cast<double>(i) - 1.0;
    const auto out = b.run({{"x", Tensor::from_vector<double>(Shape(x_dims), x)}, {"w", Tensor::from_vector<double>({4, 5}, w)}});
    // dY is all ones: dx[..., k] = sum_n w[k, n]; dw[k, n] = sum over the rows of x[..., k].
    std::vector<double> dx(x.size()), dw(20);
    for (int64_t r = 0; r < rows; ++r) {
      for (size_t k = 0; k < 4; ++k) {
        for (size_t n = 0; n < 5; ++n) {
          dx[static_cast<size_t>(r) * 4 + k] += w[k * 5 + n];
          dw[k * 5 + n] += x[static_cast<size_t>(r) * 4 + k];
        }
      }
    }
    expect_close(out.at("dx"), Tensor::from_vector<double>(Shape(x_dims), dx));
    expect_close(out.at("dw"), Tensor::from_vector<double>({4, 5}, dw));
  }
}

// The nodes a Gradient expands into are named after the Gradient node and the forward node
// whose gradient they compute, so that a profile (ONNXTRAIN_PROFILE) or an error about a backward
// kernel says which layer it belongs to; exporters' names that begin with '/' get no second one.
TEST(Gradient, BackwardNodesNameTheForwardNodeTheyDifferentiate) {
  GraphBuilder b;
  b.input("x", {3, 4});
  b.input("w", {4, 5});
  b.node("MatMul", {"x", "w"}, {"y"})->set_name("/layer1/MatMul");
  b.node("Tanh", {"y"}, {"t"})->set_name("act");
  b.node("ReduceSum", {"t"}, {"loss"});
  b.gradient({"w", "x"}, {"dw"}, {"w"}, "loss", {"x"})->set_name("grad");
  b.output("dw");

  onnx::GraphProto expanded = b.g;
  autodiff::expand_gradients(expanded, {{"", 17}, {"ai.onnx.preview.training", 1}}, "test graph");
  int gemms = 0, tanh_grads = 0;
  for (const auto& n : expanded.node()) {
    if (n.op_type() == "Gemm") {
      ++gemms;
      EXPECT_EQ(n.name().rfind("grad/layer1/MatMul/Gemm_", 0), 0u) << n.name();
    }
    if (n.name().rfind("grad/act/", 0) == 0) ++tanh_grads;
  }
  EXPECT_EQ(gemms, 1);  // dw alone: x is not among the xs
  EXPECT_GE(tanh_grads, 1);
}

// ReduceSumSquare-18 with noop_with_empty_axes = 1 and no axes reduces nothing and keeps the
// rank (keepdims = 0 notwithstanding): h is [2, 3], and the gradient of the [3]-shaped w
// broadcast over it sums over the rows. loss = sum(x^2 * w).
TEST(Gradient, ReduceWithNoopKeepsTheRankItInfers) {
  GraphBuilder b;
  b.model.mutable_opset_import(0)->set_version(18);
  b.input("x", {2, 3});
  b.input("w", {3});
  auto* sq = b.node("ReduceSumSquare", {"x"}, {"h"});
  sq->add_attribute()->CopyFrom(testing::attr("noop_with_empty_axes", int64_t{1}));
  sq->add_attribute()->CopyFrom(testing::attr("keepdims", int64_t{0}));
  b.node("Mul", {"h", "w"}, {"hw"});
  b.node("ReduceSum", {"hw"}, {"loss"})->add_attribute()->CopyFrom(testing::attr("keepdims", int64_t{0}));
  b.gradient({"x", "w"}, {"dx", "dw"}, {"x", "w"}, "loss");
  b.output("dx");
  b.output("dw");
  const Tensor x = Tensor::from_vector<double>({2, 3}, {1, 2, 3, -1, 0.5, 2});
  const runtime::NamedTensors out = b.run({{"x", x}, {"w", vec({1, -2, 0.5})}});
  expect_close(out.at("dw"), vec({2, 4.25, 13}));  // sum over rows of x^2
  expect_close(out.at("dx"), Tensor::from_vector<double>({2, 3}, {2, -8, 3, -2, -2, 2}));  // 2 x w
}

}  // namespace
}  // namespace onnxtrain
