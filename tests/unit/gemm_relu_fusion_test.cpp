// runtime/fusion.h fuse_gemm_relu: Gemm -> Relu (and ReluGrad(Y, Gemm)) becomes one
// ai.onnxtrain.FusedGemm whose values equal the two ops' on every path of the Gemm kernel (constant weights through oneDNN with the
// bias and Relu in the primitive, weights that are inputs through the primitive or sgemm, one
// row, a full C with alpha and beta, integers, float16, NaN kept); the pair stays when the
// product is read elsewhere; training through the fused layer agrees with the unfused run.
#include <cmath>
#include <limits>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "autodiff/gradient.h"
#include "runtime/fusion.h"
#include "test_util.h"
#include "training/combined_graph.h"

namespace onnxtrain {
namespace {

using testing::count_op;
using testing::expect_close;

constexpr int64_t kK = 37, kN = 19;

struct Case {
  const char* what;
  int64_t m = 6;
  bool constant_b = true;  // B an initializer, else a graph input
  bool trans_a = false, trans_b = false;
  bool full_c = false;     // C [M, N] with alpha 0.5 and beta 2, else a bias row [N]
  bool no_c = false;
  onnx::TensorProto::DataType dtype = onnx::TensorProto::FLOAT;
};

Tensor values(const Shape& shape, int seed, DataType dtype) {
  Tensor t = testing::random_f64(shape, seed);
  if (dtype == DataType::Int32) {
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(std::lround(t.data<double>()[i] * 5));
    return Tensor::from_vector<int32_t>(shape, v);
  }
  return t.cast(dtype);
}

DataType dtype_of(onnx::TensorProto::DataType t) {
  return t == onnx::TensorProto::INT32 ? DataType::Int32
                                       : t == onnx::TensorProto::FLOAT16 ? DataType::Float16 : DataType::Float32;
}

// Gemm(a, b[, c]) -> Relu, plus the feeds; with `expose`, the Gemm's output is a graph output too.
std::pair<onnx::ModelProto, runtime::NamedTensors> gemm_relu(const Case& c, bool expose = false) {
  onnx::ModelProto m = testing::empty_model("gemm_relu");
  auto* g = m.mutable_graph();
  const DataType dt = dtype_of(c.dtype);
  const Shape a_shape = c.trans_a ? Shape{kK, c.m} : Shape{c.m, kK};
  const Shape b_shape = c.trans_b ? Shape{kN, kK} : Shape{kK, kN};
  runtime::NamedTensors feeds{{"a", values(a_shape, 1, dt)}};
  testing::typed_value(g->add_input(), "a", c.dtype, {});
  const Tensor b = values(b_shape, 2, dt);
  if (c.constant_b) {
    io::tensor_to_proto(b, "b", *g->add_initializer());
  } else {
    testing::typed_value(g->add_input(), "b", c.dtype, {});
    feeds["b"] = b;
  }
  std::vector<std::string> inputs{"a", "b"};
  if (!c.no_c) {
    io::tensor_to_proto(values(c.full_c ? Shape{c.m, kN} : Shape{kN}, 3, dt), "c", *g->add_initializer());
    inputs.push_back("c");
  }
  auto* gemm = testing::add_node(*g, "Gemm", inputs, {"z"});
  if (c.trans_a) *gemm->add_attribute() = testing::attr("transA", int64_t{1});
  if (c.trans_b) *gemm->add_attribute() = testing::attr("transB", int64_t{1});
  if (c.full_c) {
    *gemm->add_attribute() = testing::attr("alpha", 0.5f);
    *gemm->add_attribute() = testing::attr("beta", 2.0f);
  }
  testing::add_node(*g, "Relu", {"z"}, {"y"});
  g->add_output()->set_name("y");
  if (expose) g->add_output()->set_name("z");
  return {m, feeds};
}

TEST(GemmReluFusion, EveryPathOfTheKernelGivesTheTwoOpsValues) {
  const Case cases[] = {
      {"constant weights, transB (a linear layer in inference)", 6, true, false, true},
      {"constant weights, plain B", 6, true, false, false},
      {"weights that are inputs, transB (the primitive, a training graph's forward)", 6, false, false, true},
      {"weights that are inputs, plain B (sgemm)", 6, false, false, false},
      {"transA (sgemm)", 6, false, true, true},
      {"one row (matrix-vector)", 1, true, false, true},
      {"one row, weights that are inputs", 1, false, false, false},
      {"a full C with alpha and beta, primitive", 6, false, false, true, true},
      {"a full C with alpha and beta, constant weights", 6, true, false, true, true},
      {"no C, primitive", 6, false, false, true, false, true},
      {"int32", 6, true, false, true, false, false, onnx::TensorProto::INT32},
      {"float16", 6, false, false, true, false, false, onnx::TensorProto::FLOAT16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto [m, feeds] = gemm_relu(c);
    onnx::GraphProto g = m.graph();
    EXPECT_EQ(runtime::fuse_gemm_relu(g), 1);
    EXPECT_EQ(count_op(g, "FusedGemm"), 1);
    EXPECT_EQ(count_op(g, "Relu") + count_op(g, "Gemm"), 0);
    const auto got = runtime::Session(m).run(feeds).at("y");
    const auto want = runtime::Session(m, {.fuse = false}).run(feeds).at("y");
    ASSERT_EQ(got.shape(), want.shape());
    if (c.dtype == onnx::TensorProto::INT32) {
      EXPECT_EQ(got.to_double_vector(), want.to_double_vector());
    } else {
      expect_close(got, want, c.dtype == onnx::TensorProto::FLOAT16 ? 1e-3 : 1e-6, 1e-6);
    }
    const auto v = got.to_double_vector();
    EXPECT_GT(std::count(v.begin(), v.end(), 0.0), 0);  // Relu cut something
    EXPECT_GT(std::count_if(v.begin(), v.end(), [](double x) { return x > 0; }), 0);
  }
}

// A NaN in A: the row it reaches stays NaN through Relu (ONNX's Relu keeps NaN), on the
// primitive's path (oneDNN's Relu post-op), sgemm's and the constant weights' paths.
TEST(GemmReluFusion, ReluKeepsNaN) {
  for (const Case& c : {Case{"primitive", 6, false, false, true}, Case{"sgemm", 6, false, false, false},
                        Case{"constant weights", 6, true, false, true}, Case{"one row", 1, true, false, true}}) {
    SCOPED_TRACE(c.what);
    auto [m, feeds] = gemm_relu(c);
    feeds.at("a").data<float>()[0] = std::numeric_limits<float>::quiet_NaN();  // row 0 (no transA here)
    const auto got = runtime::Session(m).run(feeds).at("y");
    for (int64_t j = 0; j < kN; ++j) {
      EXPECT_TRUE(std::isnan(got.data<float>()[j])) << j;
    }
    if (c.m > 1) {
      EXPECT_FALSE(std::isnan(got.data<float>()[kN]));
    }
  }
}

TEST(GemmReluFusion, AProductReadElsewhereKeepsThePair) {
  auto [m, feeds] = gemm_relu(Case{"exposed", 6, true, false, true}, true);
  onnx::GraphProto g = m.graph();
  EXPECT_EQ(runtime::fuse_gemm_relu(g), 0);
  EXPECT_EQ(count_op(g, "Gemm") + count_op(g, "Relu"), 2);
}

// ReluGrad(Y, Gemm(...)): the backward pass's input gradient of the layer above, masked where
// the layer's Relu output Y is not positive (NaN and -0 in Y mask too), in the same kernel, on
// the kernel's paths; and a Y of another shape is an error naming it.
TEST(GemmReluFusion, AReluGradOfAGemmIsMaskedInTheKernel) {
  const Case cases[] = {
      {"weights that are inputs, plain B (sgemm: a backward pass's dY W)", 6, false, false, false},
      {"transB (the primitive)", 6, false, false, true},
      {"constant weights", 6, true, false, true},
      {"one row", 1, false, false, false},
      {"no C", 6, false, false, false, false, true},
      {"float16", 6, false, false, false, false, false, onnx::TensorProto::FLOAT16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto [m, feeds] = gemm_relu(c);
    auto* g = m.mutable_graph();
    for (auto& node : *g->mutable_node()) {
      if (node.op_type() != "Relu") continue;
      node.set_op_type("ReluGrad");
      node.set_domain("ai.onnxtrain");
      node.clear_input();
      node.add_input("mask_y");
      node.add_input("z");
    }
    auto* internal = m.add_opset_import();
    internal->set_domain("ai.onnxtrain");
    internal->set_version(1);
    testing::typed_value(g->add_input(), "mask_y", c.dtype, {});
    Tensor y = testing::random_f64(Shape{c.m, kN}, 4);
    y.data<double>()[0] = std::numeric_limits<double>::quiet_NaN();
    y.data<double>()[1] = -0.0;
    feeds["mask_y"] = y.cast(dtype_of(c.dtype));
    onnx::GraphProto fused = m.graph();
    EXPECT_EQ(runtime::fuse_gemm_relu(fused), 1);
    EXPECT_EQ(count_op(fused, "FusedGemm"), 1);
    EXPECT_EQ(count_op(fused, "ReluGrad") + count_op(fused, "Gemm"), 0);
    const auto got = runtime::Session(m).run(feeds).at("y");
    const auto want = runtime::Session(m, {.fuse = false}).run(feeds).at("y");
    expect_close(got, want, c.dtype == onnx::TensorProto::FLOAT16 ? 1e-3 : 1e-6, 1e-6);
    const auto v = got.to_double_vector();
    EXPECT_EQ(v[0], 0.0);
    EXPECT_EQ(v[1], 0.0);
    EXPECT_GT(std::count(v.begin(), v.end(), 0.0), 2);
    EXPECT_GT(std::count_if(v.begin(), v.end(), [](double x) { return x < 0; }), 0);  // dX passes where Y > 0
    feeds["mask_y"] = testing::random_f64(Shape{c.m + 1, kN}, 5).cast(dtype_of(c.dtype));
    try {
      runtime::Session(m).run(feeds);
      ADD_FAILURE() << "a Y of another shape ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mask_y"), std::string::npos) << e.what();
    }
  }
}

// An MLP trained with Adam: the training graph's hidden layers fuse (their weights are inputs
// there, and the backward pass reads the Relu's output), and ten steps agree with the unfused run.
TEST(GemmReluFusion, TrainingThroughTheFusedLayersAgreesWithoutIt) {
  onnx::ModelProto m = testing::empty_model("mlp");
  auto* g = m.mutable_graph();
  testing::typed_value(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, kK});
  std::string h = "x";
  const int64_t widths[] = {kK, 24, 16, 5};
  for (int l = 0; l < 3; ++l) {
    const std::string w = "w" + std::to_string(l), b = "b" + std::to_string(l);
    io::tensor_to_proto(testing::random_f64(Shape{widths[l + 1], widths[l]}, 10 + l).cast(DataType::Float32), w,
                        *g->add_initializer());
    io::tensor_to_proto(testing::random_f64(Shape{widths[l + 1]}, 20 + l).cast(DataType::Float32), b,
                        *g->add_initializer());
    auto* gemm = testing::add_node(*g, "Gemm", {h, w, b}, {"z" + std::to_string(l)});
    *gemm->add_attribute() = testing::attr("transB", int64_t{1});
    h = "z" + std::to_string(l);
    if (l < 2) {
      testing::add_node(*g, "Relu", {h}, {"a" + std::to_string(l)});
      h = "a" + std::to_string(l);
    }
  }
  testing::typed_value(g->add_output(), h, onnx::TensorProto::FLOAT, {-1, 5});
  training::MakeTrainableOptions options;
  options.optimizer = training::Optimizer::Adam;
  const onnx::ModelProto model = training::make_trainable(m, options);
  // The step's graph as the session plans it: both hidden layers fuse (the weights are inputs
  // there, and ReluGrad reads the Relu's output, not the Gemm's).
  onnx::GraphProto step = training::combine_graphs(model.graph(), model.training_info(0).algorithm());
  autodiff::expand_gradients(step, {{"", 17}, {"ai.onnx.preview.training", 1}}, "mlp");
  runtime::fuse_matrix_products(step);
  EXPECT_EQ(runtime::fuse_gemm_relu(step), 4);  // two Relus, and the two ReluGrads of their gradients
  EXPECT_EQ(count_op(step, "Relu") + count_op(step, "ReluGrad"), 0);
  std::vector<int64_t> labels(8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 5);
  const runtime::NamedTensors batch{{"x", testing::random_f64(Shape{8, kK}, 3).cast(DataType::Float32)},
                                    {"label", Tensor::from_vector<int64_t>({8}, labels)}};
  training::TrainingOptions unfused;
  unfused.fuse = false;
  training::TrainingSession a(model), b(model, unfused);
  for (int step = 0; step < 10; ++step) {
    expect_close(a.step(batch).at("onnxtrain.loss"), b.step(batch).at("onnxtrain.loss"), 1e-6, 1e-7);
  }
  for (const auto& [name, value] : b.state()) expect_close(a.state().at(name), value, 1e-5, 1e-7);
}

}  // namespace
}  // namespace onnxtrain
