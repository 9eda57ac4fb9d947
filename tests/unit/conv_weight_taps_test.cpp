// A convolution and its ConvGrad sharing the taps of W they run with (runtime/fusion.h
// share_weight_taps): FusedConv's output 1 with attribute weight_taps, ConvGrad's input 3, and
// the rewrite of a training step against the unrewritten graph. Momentum reading a convolution's
// weight gradient over those taps only (runtime/fusion.h crop_momentum_gradients): ConvGrad's
// attribute dw_taps, Momentum's attribute gradient_taps, and that rewrite.
#include <string>
#include <vector>

#include "onnxtrain/io.h"
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
using Ints = std::vector<int64_t>;
const std::string kInternal = "ai.onnxtrain";

// w [M, C, k, k] restricted to taps [first, first + kept) of both spatial dims.
Tensor taps_of(const Tensor& w, int64_t first, int64_t kept) {
  const Shape& s = w.shape();
  const int64_t k = s[2];
  Tensor out(DataType::Float32, Shape{s[0], s[1], kept, kept});
  const float* from = w.data<float>();
  float* to = out.data<float>();
  for (int64_t b = 0; b < s[0] * s[1]; ++b) {
    for (int64_t i = 0; i < kept; ++i) {
      for (int64_t j = 0; j < kept; ++j) to[(b * kept + i) * kept + j] = from[(b * k + first + i) * k + first + j];
    }
  }
  return out;
}

struct TapsCase {
  std::string what;
  Shape x;
  Attrs attrs;
  int64_t first, kept;  // the taps kept in both dims; kept 0: nothing cropped
};

std::vector<TapsCase> taps_cases() {
  const Attrs pad1 = {attr("pads", Ints{1, 1, 1, 1})};
  return {
      {"3x3 on 1x1 maps: the centre tap", {2, 16, 1, 1}, pad1, 1, 1},
      {"3x3 at stride 2 on 2x2 maps: taps 1 and 2",
       {3, 16, 2, 2},
       {attr("pads", Ints{1, 1, 1, 1}), attr("strides", Ints{2, 2})},
       1,
       2},
      {"3x3 on 5x5 maps: every tap", {2, 16, 5, 5}, pad1, 0, 0},
  };
}

// FusedConv with weight_taps writes the convolution's output (Conv's) and, as output 1, the taps
// of W the crop keeps, or an empty tensor where nothing is cropped; float64 (not cropped by the
// float32 paths) gives the empty tensor too.
TEST(ConvWeightTaps, FusedConvWritesTheTapsItRunsWith) {
  for (const auto& c : taps_cases()) {
    SCOPED_TRACE(c.what);
    const Tensor x = testing::random_f64(c.x, 1).cast(DataType::Float32);
    const Tensor w = testing::random_f64({24, 16, 3, 3}, 2, 0.3).cast(DataType::Float32);
    const Tensor want = run_node(NodeSpec{"Conv", "", 17, c.attrs, 1}, {x, w})[0];
    Attrs a = c.attrs;
    a.push_back(attr("weight_taps", int64_t{1}));
    const auto got = run_node(NodeSpec{"FusedConv", kInternal, 1, a, 2}, {x, w});
    expect_close(got[0], want, 1e-5, 1e-5);
    if (c.kept == 0) {
      EXPECT_EQ(got[1].shape(), Shape{0});
    } else {
      expect_close(got[1], taps_of(w, c.first, c.kept), 0, 0);
    }
    const auto f64 = run_node(NodeSpec{"FusedConv", kInternal, 1, a, 2}, {x.cast(DataType::Float64), w.cast(DataType::Float64)});
    EXPECT_EQ(f64[1].shape(), Shape{0});
    expect_close(f64[0], want.cast(DataType::Float64), 1e-5, 1e-5);
  }
  const Attrs pooled = {attr("weight_taps", int64_t{1}), attr("pool_kernel_shape", Ints{2, 2})};
  EXPECT_TRUE(testing::throws_with(
      [&] {
        run_node(NodeSpec{"FusedConv", kInternal, 1, pooled, 2},
                 {Tensor(DataType::Float32, Shape{1, 16, 4, 4}), Tensor(DataType::Float32, Shape{16, 16, 3, 3})});
      },
      "'weight_taps' and 'pool_kernel_shape' are both set"));
}

// ConvGrad runs dX on its input 3 where it has the crop's shape: the forward's taps give the
// gradients of ConvGrad without it; taps scaled by 2 scale dX by 2 and leave dW (which does not
// read W); an input 3 of another shape (the forward's empty tensor, or a stale one) is not used.
TEST(ConvWeightTaps, ConvGradReadsTheForwardsTaps) {
  for (const auto& c : taps_cases()) {
    SCOPED_TRACE(c.what);
    const Tensor x = testing::random_f64(c.x, 3).cast(DataType::Float32);
    const Tensor w = testing::random_f64({24, 16, 3, 3}, 4, 0.3).cast(DataType::Float32);
    Attrs a = c.attrs;
    a.push_back(attr("weight_taps", int64_t{1}));
    const auto forward = run_node(NodeSpec{"FusedConv", kInternal, 1, a, 2}, {x, w});
    const Tensor dy = testing::random_f64(forward[0].shape(), 5).cast(DataType::Float32);
    const auto want = run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3}, {dy, x, w});
    const auto got = run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3}, {dy, x, w, forward[1]});
    for (int i = 0; i < 3; ++i) expect_close(got[i], want[i], 0, 0);
    const auto stale = run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3},
                                {dy, x, w, Tensor(DataType::Float32, Shape{24, 16, 2, 3})});
    for (int i = 0; i < 3; ++i) expect_close(stale[i], want[i], 0, 0);
    if (c.kept == 0) continue;
    Tensor doubled = forward[1].cast(DataType::Float64);
    for (int64_t i = 0; i < doubled.numel(); ++i) doubled.data<double>()[i] *= 2;
    const auto scaled = run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3}, {dy, x, w, doubled.cast(DataType::Float32)});
    Tensor dx2 = want[0].cast(DataType::Float64);
    for (int64_t i = 0; i < dx2.numel(); ++i) dx2.data<double>()[i] *= 2;
    expect_close(scaled[0], dx2.cast(DataType::Float32), 1e-6, 1e-6);
    expect_close(scaled[1], want[1], 0, 0);
  }
}

// An empty model importing the internal and the training domains, with graph inputs x and dy
// (any float32 shape) and W [24, 16, 3, 3] (a training graph's parameter: a graph input with a
// static shape).
onnx::ModelProto step_model(const std::string& name) {
  onnx::ModelProto m = testing::empty_model(name);
  for (const char* domain : {"ai.onnxtrain", "ai.onnx.preview.training"}) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(1);
  }
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  testing::typed_value(g.add_input(), "x", kFloat, {});
  testing::typed_value(g.add_input(), "dy", kFloat, {});
  testing::typed_value(g.add_input(), "W", kFloat, {24, 16, 3, 3});
  return m;
}

// step_model's feeds x [2, 16, size, size], dy [2, 24, size, size] and W, float32.
runtime::NamedTensors step_feeds(int64_t size) {
  return {{"x", testing::random_f64({2, 16, size, size}, 6).cast(DataType::Float32)},
          {"dy", testing::random_f64({2, 24, size, size}, 7).cast(DataType::Float32)},
          {"W", testing::random_f64({24, 16, 3, 3}, 8, 0.3).cast(DataType::Float32)}};
}

// A training step's convolution and its gradient, the weights fed as graph inputs with static
// shapes (a training graph's parameters) and, as `W2`, an initializer.
onnx::ModelProto conv_step(const Attrs& attrs, const Attrs& grad_attrs) {
  onnx::ModelProto m = step_model("conv_step");
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  const auto add = [&](const std::string& op, const std::vector<std::string>& in, const std::vector<std::string>& out,
                       const Attrs& a) {
    auto* n = testing::add_node(g, op, in, out);
    if (op != "Conv") n->set_domain(kInternal);
    for (const auto& at : a) *n->add_attribute() = at;
  };
  add("Conv", {"x", "W"}, {"y"}, attrs);
  add("ConvGrad", {"dy", "x", "W"}, {"dx", "dW", ""}, grad_attrs);
  io::tensor_to_proto(testing::random_f64({24, 24, 3, 3}, 9, 0.2).cast(DataType::Float32), "W2", *g.add_initializer());
  add("Conv", {"y", "W2"}, {"z"}, {attr("pads", Ints{1, 1, 1, 1})});
  add("ConvGrad", {"dy", "y", "W2"}, {"dy2", "", ""}, {attr("pads", Ints{1, 1, 1, 1})});
  for (const char* out : {"z", "dx", "dW", "dy2"}) testing::typed_value(g.add_output(), out, kFloat, {});
  return m;
}

// The rewrite gives the convolution on fed weights its ConvGrad's taps (not the one on an
// initializer, nor one whose gradient node has other pads), and the step's results are the
// unrewritten graph's to the bit on cropped (1x1 maps) and uncropped (5x5) convolutions.
TEST(ConvWeightTaps, TheRewrittenStepGivesTheSameResults) {
  const Attrs pad1 = {attr("pads", Ints{1, 1, 1, 1})};
  const onnx::ModelProto model = conv_step(pad1, pad1);
  onnx::ModelProto rewritten = model;
  ASSERT_EQ(runtime::share_weight_taps(*rewritten.mutable_graph()), 1);
  const auto& g = rewritten.graph();
  EXPECT_EQ(g.node(0).op_type(), "FusedConv");
  ASSERT_EQ(g.node(0).output_size(), 2);
  ASSERT_EQ(g.node(1).input_size(), 4);
  EXPECT_EQ(g.node(1).input(3), g.node(0).output(1));
  EXPECT_EQ(g.node(2).op_type(), "Conv");  // W2 is an initializer
  EXPECT_EQ(g.node(3).input_size(), 3);
  onnx::ModelProto other_pads = conv_step(pad1, {attr("pads", Ints{1, 1, 1, 0})});
  EXPECT_EQ(runtime::share_weight_taps(*other_pads.mutable_graph()), 0);

  runtime::Session original(model, {.fuse = false}), shared(rewritten, {.fuse = false});
  for (const int64_t size : {int64_t{1}, int64_t{5}}) {
    SCOPED_TRACE("maps " + std::to_string(size));
    const runtime::NamedTensors feeds = step_feeds(size);
    const runtime::NamedTensors want = original.run(feeds);
    const runtime::NamedTensors got = shared.run(feeds);
    for (const char* out : {"z", "dx", "dW", "dy2"}) {
      SCOPED_TRACE(out);
      expect_close(got.at(out), want.at(out), 0, 0);
    }
  }
}

// ConvGrad with dw_taps writes dW over the taps the crop keeps (the same values as the taps of
// the whole dW) and their description as output 3 where it crops, and dW whole with an empty
// output 3 where it does not (every tap reached, or float64, which the float32 paths' crop does
// not cover).
TEST(ConvWeightTaps, ConvGradWritesTheCroppedWeightGradient) {
  for (const auto& c : taps_cases()) {
    SCOPED_TRACE(c.what);
    for (const DataType t : {DataType::Float32, DataType::Float64}) {
      const Tensor x = testing::random_f64(c.x, 3).cast(t);
      const Tensor w = testing::random_f64({24, 16, 3, 3}, 4, 0.3).cast(t);
      const Tensor y = run_node(NodeSpec{"Conv", "", 17, c.attrs, 1}, {x, w})[0];
      const Tensor dy = testing::random_f64(y.shape(), 5).cast(t);
      const auto whole = run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3}, {dy, x, w});
      Attrs a = c.attrs;
      a.push_back(attr("dw_taps", int64_t{1}));
      const auto got = run_node(NodeSpec{"ConvGrad", kInternal, 1, a, 4}, {dy, x, w});
      expect_close(got[0], whole[0], 0, 0);
      if (c.kept == 0 || t != DataType::Float32) {
        expect_close(got[1], whole[1], 0, 0);
        EXPECT_EQ(got[3].shape(), Shape{0});
        continue;
      }
      expect_close(got[1], taps_of(whole[1], c.first, c.kept), 0, 0);
      std::vector<int64_t> offsets;
      for (int64_t i = 0; i < c.kept; ++i) {
        for (int64_t j = 0; j < c.kept; ++j) offsets.push_back((c.first + i) * 3 + c.first + j);
      }
      offsets.insert(offsets.begin(), 9);
      EXPECT_EQ(got[3].to_int64_vector("taps"), offsets);
    }
  }
}

// Momentum with gradient_taps on a cropped G gives, to the bit, Momentum on G made whole with
// zeros (float32 through the vector loop on a tensor whose size is not a multiple of 8, float64,
// standard and nesterov); an empty taps input leaves G whole; a G that does not fit its taps and a
// tap outside the block are named in the error.
TEST(ConvWeightTaps, MomentumReadsAGradientOverItsTaps) {
  const int64_t m = 37, c = 29;  // 37 x 29 x 3 x 3: 9657 elements
  const std::vector<int64_t> kept = {4, 5, 7, 8};  // taps (1, 1), (1, 2), (2, 1), (2, 2)
  const Tensor description = Tensor::from_vector<int64_t>({5}, {9, 4, 5, 7, 8});
  for (const DataType t : {DataType::Float32, DataType::Float64}) {
    for (const char* mode : {"standard", "nesterov"}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + mode);
      const Tensor x = testing::random_f64({m, c, 3, 3}, 21).cast(t);
      const Tensor v = testing::random_f64({m, c, 3, 3}, 22, 0.1).cast(t);
      const Tensor cropped = testing::random_f64({m, c, 2, 2}, 23).cast(t).cast(DataType::Float64);
      Tensor whole(DataType::Float64, Shape{m, c, 3, 3});
      std::fill(whole.data<double>(), whole.data<double>() + whole.numel(), 0.0);
      for (int64_t b = 0; b < m * c; ++b) {
        for (size_t j = 0; j < kept.size(); ++j) {
          whole.data<double>()[b * 9 + kept[j]] = cropped.data<double>()[b * 4 + static_cast<int64_t>(j)];
        }
      }
      const Attrs a = {attr("alpha", 0.9f), attr("beta", 0.5f), attr("norm_coefficient", 0.001f), attr("mode", std::string(mode))};
      Attrs with_taps = a;
      with_taps.push_back(attr("gradient_taps", int64_t{1}));
      const Tensor r = Tensor::scalar<float>(0.05f), step = Tensor::scalar<int64_t>(3);
      const auto want = run_node(NodeSpec{"Momentum", "ai.onnx.preview.training", 1, a, 2}, {r, step, x, whole.cast(t), v});
      const auto got = run_node(NodeSpec{"Momentum", "ai.onnx.preview.training", 1, with_taps, 2},
                                {r, step, x, cropped.cast(t), v, description});
      expect_close(got[0], want[0], 0, 0);
      expect_close(got[1], want[1], 0, 0);
      const auto untouched = run_node(NodeSpec{"Momentum", "ai.onnx.preview.training", 1, with_taps, 2},
                                      {r, step, x, whole.cast(t), v, Tensor(DataType::Int64, Shape{0})});
      expect_close(untouched[0], want[0], 0, 0);
      if (t != DataType::Float32 || std::string(mode) != "standard") continue;
      EXPECT_TRUE(testing::throws_with(
          [&] {
            run_node(NodeSpec{"Momentum", "ai.onnx.preview.training", 1, with_taps, 2},
                     {r, step, x, whole.cast(t), v, description});
          },
          "of every 9 taps"));
      EXPECT_TRUE(testing::throws_with(
          [&] {
            run_node(NodeSpec{"Momentum", "ai.onnx.preview.training", 1, with_taps, 2},
                     {r, step, x, cropped.cast(t), v, Tensor::from_vector<int64_t>({5}, {9, 4, 5, 7, 9})});
          },
          "names tap 9 of blocks of 9"));
    }
  }
}

// A training step's convolution on 1x1 maps, its ConvGrad and a Momentum update of W (through the
// Identity the Gradient op's output is), the weights and state fed as graph inputs.
onnx::ModelProto momentum_step() {
  onnx::ModelProto m = step_model("momentum_step");
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  testing::typed_value(g.add_input(), "V", kFloat, {24, 16, 3, 3});
  testing::typed_value(g.add_input(), "B", kFloat, {24});
  testing::typed_value(g.add_input(), "VB", kFloat, {24});
  testing::typed_value(g.add_input(), "dB", kFloat, {24});
  testing::typed_value(g.add_input(), "R", kFloat, {});
  testing::typed_value(g.add_input(), "T", onnx::TensorProto::INT64, {});
  auto* grad = testing::add_node(g, "ConvGrad", {"dy", "x", "W"}, {"dx", "dW.raw", ""});
  grad->set_domain(kInternal);
  *grad->add_attribute() = attr("pads", Ints{1, 1, 1, 1});
  testing::add_node(g, "Identity", {"dW.raw"}, {"dW"});
  auto* opt = testing::add_node(g, "Momentum", {"R", "T", "W", "B", "dW", "dB", "V", "VB"}, {"W.new", "B.new", "V.new", "VB.new"});
  opt->set_domain("ai.onnx.preview.training");
  for (const auto& a : {attr("alpha", 0.9f), attr("beta", 0.5f), attr("norm_coefficient", 0.0f), attr("mode", std::string("standard"))}) {
    *opt->add_attribute() = a;
  }
  for (const char* out : {"dx", "W.new", "B.new", "V.new", "VB.new"}) testing::typed_value(g.add_output(), out, kFloat, {});
  return m;
}

// The rewrite hands the Momentum node W's gradient over its taps (the Identity goes, B's gradient,
// not a ConvGrad's, stays whole), and the step's results are the unrewritten graph's to the bit on
// 1x1 maps (cropped) and 5x5 maps (not); a dW with another reader is left as it is.
TEST(ConvWeightTaps, TheMomentumRewriteGivesTheSameResults) {
  const onnx::ModelProto model = momentum_step();
  onnx::ModelProto rewritten = model;
  ASSERT_EQ(runtime::crop_momentum_gradients(*rewritten.mutable_graph()), 1);
  const auto& g = rewritten.graph();
  ASSERT_EQ(g.node_size(), 2);  // ConvGrad, Momentum
  EXPECT_EQ(g.node(0).output_size(), 4);
  ASSERT_EQ(g.node(1).input_size(), 10);
  EXPECT_EQ(g.node(1).input(4), "dW.raw");
  EXPECT_EQ(g.node(1).input(8), g.node(0).output(3));
  EXPECT_EQ(g.node(1).input(9), "");
  onnx::ModelProto shared = model;
  testing::typed_value(shared.mutable_graph()->add_output(), "dW.raw", onnx::TensorProto::FLOAT, {});
  EXPECT_EQ(runtime::crop_momentum_gradients(*shared.mutable_graph()), 0);

  runtime::Session original(model, {.fuse = false}), cropped(rewritten, {.fuse = false});
  for (const int64_t size : {int64_t{1}, int64_t{5}}) {
    SCOPED_TRACE("maps " + std::to_string(size));
    runtime::NamedTensors feeds = step_feeds(size);
    feeds.insert({
        {"V", testing::random_f64({24, 16, 3, 3}, 9, 0.1).cast(DataType::Float32)},
        {"B", testing::random_f64({24}, 10).cast(DataType::Float32)},
        {"VB", testing::random_f64({24}, 11).cast(DataType::Float32)},
        {"dB", testing::random_f64({24}, 12).cast(DataType::Float32)},
        {"R", Tensor::scalar<float>(0.1f)},
        {"T", Tensor::scalar<int64_t>(2)}});
    const runtime::NamedTensors want = original.run(feeds);
    const runtime::NamedTensors got = cropped.run(feeds);
    for (const char* out : {"dx", "W.new", "B.new", "V.new", "VB.new"}) {
      SCOPED_TRACE(out);
      expect_close(got.at(out), want.at(out), 0, 0);
    }
  }
}

}  // namespace
}  // namespace onnxtrain
