// Adam reading an embedding's gradient as the rows of its Gather's output gradient
// (runtime/fusion.h fuse_gather_grad_adam): Adam's and ScaledAdam's attribute gradient_rows in
// ops/optimizers.cpp, and the rewrite of a training step against the unrewritten graph.
#include <cmath>
#include <string>
#include <vector>

#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;
const std::string kInternal = "ai.onnxtrain";
const std::string kTraining = "ai.onnx.preview.training";

// A random float64 tensor's absolute values (Adam's H must not be negative).
Tensor random_positive(const Shape& shape, uint32_t seed, double scale) {
  Tensor t = testing::random_f64(shape, seed, scale);
  for (int64_t k = 0; k < t.numel(); ++k) t.data<double>()[k] = std::abs(t.data<double>()[k]);
  return t;
}

// X's gradient as GatherGrad makes it from dY and the indices (axis 0).
Tensor gather_grad(const Tensor& dy, const Tensor& indices, const Shape& x_shape) {
  std::vector<int64_t> dims(x_shape.begin(), x_shape.end());
  const Tensor shape = Tensor::from_vector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
  return run_node(NodeSpec{"GatherGrad", kInternal, 1, {}}, {dy, indices, shape})[0];
}

// Adam with gradient_rows on dY gives, to the bit, Adam on GatherGrad's output: float32 through
// the vector loop on a tensor whose size is not a multiple of 8 and float64, rows no index names,
// rows named several times (their dY rows summed in index order), negative indices, int32 and
// int64 indices, a second tensor given whole; ScaledAdam with its scalars after the indices.
TEST(AdamGradientRows, AdamReadsTheRowsOfAGathersGradient) {
  const Shape x_shape{37, 29};  // 1073 elements
  const std::vector<int64_t> picks = {3, 0, 36, 3, -1, 17, 3, 20, -37};
  const Attrs a = {attr("alpha", 0.9f), attr("beta", 0.99f), attr("epsilon", 1e-6f), attr("norm_coefficient", 0.01f)};
  Attrs with_rows = a;
  with_rows.push_back(attr("gradient_rows", int64_t{1}));
  for (const DataType t : {DataType::Float32, DataType::Float64}) {
    for (const DataType index_type : {DataType::Int64, DataType::Int32}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::string(dtype_name(index_type)));
      const Tensor indices = Tensor::from_vector<int64_t>({3, 3}, picks).cast(index_type);
      const Tensor x = testing::random_f64(x_shape, 31).cast(t);
      const Tensor v = testing::random_f64(x_shape, 32, 0.1).cast(t);
      const Tensor h = random_positive(x_shape, 33, 0.1).cast(t);
      const Tensor dy = testing::random_f64({3, 3, 29}, 34).cast(t);
      const Tensor whole = gather_grad(dy, indices, x_shape);
      const Tensor x2 = testing::random_f64({5}, 35).cast(t), g2 = testing::random_f64({5}, 36).cast(t);
      const Tensor v2 = testing::random_f64({5}, 37, 0.1).cast(t), h2 = random_positive({5}, 38, 0.1).cast(t);
      const Tensor r = Tensor::scalar<float>(0.05f), step = Tensor::scalar<int64_t>(3);
      const Tensor none(DataType::Int64, Shape{0});
      const auto want = run_node(NodeSpec{"Adam", kTraining, 1, a, 6}, {r, step, x, x2, whole, g2, v, v2, h, h2});
      const auto got =
          run_node(NodeSpec{"Adam", kTraining, 1, with_rows, 6}, {r, step, x, x2, dy, g2, v, v2, h, h2, indices, none});
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k) expect_close(got[k], want[k], 0, 0);

      const auto scalar = [&](double value) { return Tensor::scalar<double>(value).cast(t); };
      const std::vector<Tensor> scales = {scalar(2.0), scalar(0.5), scalar(4.0), scalar(0.25), scalar(3.0), scalar(0.999)};
      const Attrs scaled_attrs = {attr("x_scaled", int64_t{1})};
      Attrs scaled_rows = scaled_attrs;
      scaled_rows.push_back(attr("gradient_rows", int64_t{1}));
      std::vector<Tensor> plain_in = {r, step, x, whole, v, h}, rows_in = {r, step, x, dy, v, h, indices};
      plain_in.insert(plain_in.end(), scales.begin(), scales.end());
      rows_in.insert(rows_in.end(), scales.begin(), scales.end());
      const auto scaled_want = run_node(NodeSpec{"ScaledAdam", kInternal, 1, scaled_attrs, 3}, plain_in);
      const auto scaled_got = run_node(NodeSpec{"ScaledAdam", kInternal, 1, scaled_rows, 3}, rows_in);
      for (size_t k = 0; k < scaled_got.size(); ++k) expect_close(scaled_got[k], scaled_want[k], 0, 0);
    }
  }
}

// An empty indices input leaves G whole; an index out of range, a G of the wrong size and
// float indices are named in the error.
TEST(AdamGradientRows, BadRowsAreNamed) {
  const Attrs with_rows = {attr("gradient_rows", int64_t{1})};
  const Tensor x = testing::random_f64({6, 4}, 41).cast(DataType::Float32);
  const Tensor g = testing::random_f64({6, 4}, 42).cast(DataType::Float32);
  const Tensor v = testing::random_f64({6, 4}, 43, 0.1).cast(DataType::Float32);
  const Tensor h = random_positive({6, 4}, 44, 0.1).cast(DataType::Float32);
  const Tensor r = Tensor::scalar<float>(0.1f), step = Tensor::scalar<int64_t>(1);
  const auto want = run_node(NodeSpec{"Adam", kTraining, 1, {}, 3}, {r, step, x, g, v, h});
  const auto untouched = run_node(NodeSpec{"Adam", kTraining, 1, with_rows, 3}, {r, step, x, g, v, h, Tensor(DataType::Int64, Shape{0})});
  for (size_t k = 0; k < untouched.size(); ++k) expect_close(untouched[k], want[k], 0, 0);
  const Tensor dy = testing::random_f64({2, 4}, 45).cast(DataType::Float32);
  const auto run = [&](const Tensor& gradient, const Tensor& indices) {
    run_node(NodeSpec{"Adam", kTraining, 1, with_rows, 3}, {r, step, x, gradient, v, h, indices});
  };
  EXPECT_TRUE(testing::throws_with([&] { run(dy, Tensor::from_vector<int64_t>({2}, {1, 6})); },
                                   "index 6 in 'in6' is out of range for the 6 rows of X 'in2'"));
  EXPECT_TRUE(testing::throws_with([&] { run(dy, Tensor::from_vector<int64_t>({2}, {-7, 0})); }, "index -7 in 'in6'"));
  EXPECT_TRUE(testing::throws_with([&] { run(dy, Tensor::from_vector<int64_t>({3}, {0, 1, 2})); },
                                   "must be 3 rows of X 'in2'"));
  EXPECT_TRUE(testing::throws_with([&] { run(dy, Tensor::from_vector<float>({2}, {0.0f, 1.0f})); }, "expected int32 or int64"));
}

// A training step's embedding lookup, its GatherGrad (through the Identity the Gradient op's output
// is) and an Adam update of the table and of a bias B, the weights and state fed as graph inputs.
onnx::ModelProto embedding_step() {
  onnx::ModelProto m = testing::empty_model("embedding_step");
  for (const char* domain : {"ai.onnxtrain", "ai.onnx.preview.training"}) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(1);
  }
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  testing::typed_value(g.add_input(), "E", kFloat, {50, 24});
  testing::typed_value(g.add_input(), "ids", onnx::TensorProto::INT64, {4, 6});
  testing::typed_value(g.add_input(), "dy", kFloat, {4, 6, 24});
  for (const char* name : {"B", "dB", "VB", "HB"}) testing::typed_value(g.add_input(), name, kFloat, {24});
  for (const char* name : {"V", "H"}) testing::typed_value(g.add_input(), name, kFloat, {50, 24});
  testing::typed_value(g.add_input(), "R", kFloat, {});
  testing::typed_value(g.add_input(), "T", onnx::TensorProto::INT64, {});
  testing::add_node(g, "Shape", {"E"}, {"E.shape"});
  testing::add_node(g, "GatherGrad", {"dy", "ids", "E.shape"}, {"dE.raw"})->set_domain(kInternal);
  testing::add_node(g, "Identity", {"dE.raw"}, {"dE"});
  auto* opt = testing::add_node(g, "Adam", {"R", "T", "E", "B", "dE", "dB", "V", "VB", "H", "HB"},
                                {"E.new", "B.new", "V.new", "VB.new", "H.new", "HB.new"});
  opt->set_domain(kTraining);
  *opt->add_attribute() = attr("norm_coefficient", 0.001f);
  for (const char* out : {"E.new", "B.new", "V.new", "VB.new", "H.new", "HB.new"}) testing::typed_value(g.add_output(), out, kFloat, {});
  return m;
}

// The rewrite hands the Adam node E's gradient as dY's rows (GatherGrad and the Identity go; B's
// gradient, not a GatherGrad's, stays whole), and the step's results are the unrewritten graph's
// to the bit, repeated ids included; a gradient with another reader, or a GatherGrad along
// another axis, is left as it is.
TEST(AdamGradientRows, TheRewriteGivesTheSameResults) {
  const onnx::ModelProto model = embedding_step();
  onnx::ModelProto rewritten = model;
  ASSERT_EQ(runtime::fuse_gather_grad_adam(*rewritten.mutable_graph()), 1);
  const auto& g = rewritten.graph();
  ASSERT_EQ(g.node_size(), 2);  // Shape, Adam
  const onnx::NodeProto& adam = g.node(1);
  ASSERT_EQ(adam.input_size(), 12);
  EXPECT_EQ(adam.input(4), "dy");
  EXPECT_EQ(adam.input(5), "dB");
  EXPECT_EQ(adam.input(10), "ids");
  EXPECT_EQ(adam.input(11), "");
  EXPECT_EQ(runtime::fuse_gather_grad_adam(*rewritten.mutable_graph()), 0);  // once

  onnx::ModelProto shared = model;
  testing::typed_value(shared.mutable_graph()->add_output(), "dE.raw", onnx::TensorProto::FLOAT, {});
  EXPECT_EQ(runtime::fuse_gather_grad_adam(*shared.mutable_graph()), 0);
  onnx::ModelProto other_axis = model;
  *other_axis.mutable_graph()->mutable_node(1)->add_attribute() = attr("axis", int64_t{1});
  EXPECT_EQ(runtime::fuse_gather_grad_adam(*other_axis.mutable_graph()), 0);

  runtime::Session original(model, {.fuse = false}), fused(rewritten, {.fuse = false});
  std::vector<int64_t> ids(24);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>((k * 7) % 13) + 20 - (k % 5 == 0 ? 50 : 0);  // rows 20-32, some named twice or from the end
  const runtime::NamedTensors feeds = {
      {"E", testing::random_f64({50, 24}, 51).cast(DataType::Float32)},
      {"ids", Tensor::from_vector<int64_t>({4, 6}, ids)},
      {"dy", testing::random_f64({4, 6, 24}, 52).cast(DataType::Float32)},
      {"B", testing::random_f64({24}, 53).cast(DataType::Float32)},
      {"dB", testing::random_f64({24}, 54).cast(DataType::Float32)},
      {"VB", testing::random_f64({24}, 55, 0.1).cast(DataType::Float32)},
      {"HB", random_positive({24}, 56, 0.1).cast(DataType::Float32)},
      {"V", testing::random_f64({50, 24}, 57, 0.1).cast(DataType::Float32)},
      {"H", random_positive({50, 24}, 58, 0.1).cast(DataType::Float32)},
      {"R", Tensor::scalar<float>(0.1f)},
      {"T", Tensor::scalar<int64_t>(2)}};
  const runtime::NamedTensors want = original.run(feeds);
  const runtime::NamedTensors got = fused.run(feeds);
  for (const char* out : {"E.new", "B.new", "V.new", "VB.new", "H.new", "HB.new"}) {
    SCOPED_TRACE(out);
    expect_close(got.at(out), want.at(out), 0, 0);
  }
}

}  // namespace
}  // namespace onnxtrain
