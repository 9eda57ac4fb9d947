// ops/conv_gemm.h: convolutions with small output maps as one matrix product over the batch.
// The functions against Conv and ConvGrad in float64 (their reference loops) at shapes with
// strides, asymmetric pads, dilations, 1 to 3 spatial dims, bias and Relu; the rule
// prefer_conv_gemm, prefer_conv_gemm_channels_last and prefer_weight_grad_per_image (with
// conv_gemm_weight_grad_per_image); and Conv -> Relu and ConvGrad on fed float32 weights
// through a session, which take these paths on a CPU without AVX-512 and oneDNN's elsewhere,
// against float64.
#include <cmath>
#include <limits>

#include "ops/conv_gemm.h"
#include "ops/dnnl_util.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Ints = std::vector<int64_t>;

// One convolution: X, W shapes and Conv's attributes, and the same geometry for conv_gemm.h.
struct Case {
  std::string name;
  Shape x, w;
  Ints strides, pads, dilations;  // pads: begin..., end...
};

ops::ConvGeometry geometry(const Case& c) {
  ops::ConvGeometry g;
  const size_t nd = c.x.size() - 2;
  g.N = c.x[0];
  g.C = c.x[1];
  g.M = c.w[0];
  for (size_t d = 0; d < nd; ++d) {
    g.in.push_back(c.x[d + 2]);
    g.kernel.push_back(c.w[d + 2]);
    g.stride.push_back(c.strides[d]);
    g.dilation.push_back(c.dilations[d]);
    g.pad_begin.push_back(c.pads[d]);
    g.pad_end.push_back(c.pads[d + nd]);
    const int64_t extent = (g.kernel[d] - 1) * g.dilation[d] + 1;
    g.out.push_back((g.in[d] + g.pad_begin[d] + g.pad_end[d] - extent) / g.stride[d] + 1);
  }
  return g;
}

std::vector<onnx::AttributeProto> attrs(const Case& c) {
  return {attr("strides", c.strides), attr("pads", c.pads), attr("dilations", c.dilations)};
}

// A random float64 dY [N, M, O...] for geometry g.
Tensor random_output_gradient(const ops::ConvGeometry& g, uint32_t seed) {
  Shape y_shape{g.N, g.M};
  for (int64_t o : g.out) y_shape.push_back(o);
  return testing::random_f64(y_shape, seed);
}

// ConvGrad's inputs for case c, drawn with seeds `seed` (x), seed + 1 (w, scaled 0.5) and seed + 2
// (dY), and its float64 outputs dX, dW and, when `outputs` is 3, dB: what the float32 paths are
// compared with.
struct GradReference {
  ops::ConvGeometry g;
  Tensor x, w, dy;
  std::vector<Tensor> want;
};

GradReference grad_reference(const Case& c, uint32_t seed, int outputs) {
  GradReference r{geometry(c), testing::random_f64(c.x, seed), testing::random_f64(c.w, seed + 1, 0.5), {}, {}};
  r.dy = random_output_gradient(r.g, seed + 2);
  r.want = run_node(NodeSpec{"ConvGrad", "ai.onnxtrain", 1, attrs(c), outputs}, {r.dy, r.x, r.w});
  return r;
}

const Case kCases[] = {
    {"ResNet-18 layer4.0 conv1: 3x3 stride 2 pads 1, 2x2 -> 1x1", {4, 24, 2, 2}, {32, 24, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}},
    {"3x3 pads 1 on 2x2 maps (4 outputs)", {3, 40, 2, 2}, {20, 40, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}},
    {"1x1 stride 2 (the downsample)", {5, 16, 4, 4}, {12, 16, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}},
    {"asymmetric pads, kernel 2x3", {2, 7, 3, 2}, {5, 7, 2, 3}, {2, 1}, {0, 2, 1, 0}, {1, 1}},
    {"1d dilation 2", {3, 6, 5}, {4, 6, 3}, {2}, {1, 0}, {2}},
    {"3d", {2, 3, 2, 3, 2}, {4, 3, 2, 2, 2}, {1, 2, 1}, {0, 0, 1, 0, 0, 0}, {1, 1, 1}},
};

TEST(ConvGemm, ForwardEqualsConvWithBiasAndRelu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ops::ConvGeometry g = geometry(c);
    ASSERT_LE(g.out_size(), 4);
    const Tensor x = testing::random_f64(c.x, 1), w = testing::random_f64(c.w, 2, 0.5);
    const Tensor b = testing::random_f64(Shape{g.M}, 3);
    const Tensor want = run_node(NodeSpec{"Conv", "", 17, attrs(c), 1}, {x, w, b})[0];
    ASSERT_EQ(want.shape()[1], g.M);
    const Tensor x32 = x.cast(DataType::Float32), w32 = w.cast(DataType::Float32), b32 = b.cast(DataType::Float32);
    Tensor y(DataType::Float32, want.shape());
    ops::conv_gemm_forward(g, x32.data<float>(), w32.data<float>(), b32.data<float>(), y.data<float>(), false);
    expect_close(y.cast(DataType::Float64), want, 1e-5, 1e-5);
    // Without a bias, then with Relu.
    const Tensor want_nobias = run_node(NodeSpec{"Conv", "", 17, attrs(c), 1}, {x, w})[0];
    ops::conv_gemm_forward(g, x32.data<float>(), w32.data<float>(), nullptr, y.data<float>(), false);
    expect_close(y.cast(DataType::Float64), want_nobias, 1e-5, 1e-5);
    ops::conv_gemm_forward(g, x32.data<float>(), w32.data<float>(), b32.data<float>(), y.data<float>(), true);
    const Tensor relu = run_node(NodeSpec{"Relu", "", 17, {}, 1}, {want})[0];
    expect_close(y.cast(DataType::Float64), relu, 1e-5, 1e-5);
  }
}

// x [N, C, D...] -> [N, D..., C] and w [M, C, k...] -> [M, k..., C]: the channel dim last.
Tensor channel_dim_last(const Tensor& t) {
  std::vector<int64_t> perm{0};
  for (size_t d = 2; d < t.rank(); ++d) perm.push_back(static_cast<int64_t>(d));
  perm.push_back(1);
  return run_node(NodeSpec{"Transpose", "", 17, {attr("perm", perm)}, 1}, {t})[0];
}

TEST(ConvGemm, ChannelsLastForwardEqualsConvWithBiasAndRelu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ops::ConvGeometry g = geometry(c);
    const Tensor x = testing::random_f64(c.x, 11), w = testing::random_f64(c.w, 12, 0.5);
    const Tensor b = testing::random_f64(Shape{g.M}, 13);
    const Tensor x_last = channel_dim_last(x).cast(DataType::Float32);
    const Tensor w_last = channel_dim_last(w).cast(DataType::Float32), b32 = b.cast(DataType::Float32);
    for (const bool with_bias : {true, false}) {
      const Tensor conv = run_node(NodeSpec{"Conv", "", 17, attrs(c), 1}, with_bias ? std::vector<Tensor>{x, w, b}
                                                                                      : std::vector<Tensor>{x, w})[0];
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(std::string(with_bias ? "bias" : "no bias") + (relu ? ", Relu" : ""));
        const Tensor want = channel_dim_last(relu ? run_node(NodeSpec{"Relu", "", 17, {}, 1}, {conv})[0] : conv);
        Tensor y(DataType::Float32, want.shape());
        std::fill(y.data<float>(), y.data<float>() + y.numel(), 7.0f);  // overwritten
        ops::conv_gemm_forward_channels_last(g, x_last.data<float>(), w_last.data<float>(),
                                             with_bias ? b32.data<float>() : nullptr, y.data<float>(), relu);
        expect_close(y.cast(DataType::Float64), want, 1e-5, 1e-5);
      }
    }
  }
}

TEST(ConvGemm, ReluKeepsNaN) {
  const Case& c = kCases[0];
  const ops::ConvGeometry g = geometry(c);
  Tensor x = testing::random_f64(c.x, 4).cast(DataType::Float32);
  const Tensor w = testing::random_f64(c.w, 5).cast(DataType::Float32);
  x.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();  // image 0 reads it at its one output
  Tensor y(DataType::Float32, Shape{g.N, g.M, 1, 1});
  ops::conv_gemm_forward(g, x.data<float>(), w.data<float>(), nullptr, y.data<float>(), true);
  for (int64_t m = 0; m < g.M; ++m) {
    EXPECT_TRUE(std::isnan(y.data<float>()[m])) << m;             // image 0
    EXPECT_FALSE(std::isnan(y.data<float>()[g.M + m])) << m;      // image 1
    EXPECT_GE(y.data<float>()[g.M + m], 0.0f) << m;
  }
}

TEST(ConvGemm, BackwardEqualsConvGrad) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const auto [g, x, w, dy, want] = grad_reference(c, 6, 2);
    const Tensor x32 = x.cast(DataType::Float32), w32 = w.cast(DataType::Float32), dy32 = dy.cast(DataType::Float32);
    Tensor dx(DataType::Float32, c.x), dw(DataType::Float32, c.w);
    // Stale values in the outputs must not survive (both are overwritten).
    std::fill(dx.data<float>(), dx.data<float>() + dx.numel(), 7.0f);
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), 7.0f);
    ops::conv_gemm_backward(g, dy32.data<float>(), x32.data<float>(), w32.data<float>(), dx.data<float>(),
                            dw.data<float>());
    expect_close(dx.cast(DataType::Float64), want[0], 1e-5, 1e-5);
    expect_close(dw.cast(DataType::Float64), want[1], 1e-5, 1e-5);
    // Each alone.
    Tensor dx_alone(DataType::Float32, c.x), dw_alone(DataType::Float32, c.w);
    ops::conv_gemm_backward(g, dy32.data<float>(), x32.data<float>(), w32.data<float>(), dx_alone.data<float>(),
                            nullptr);
    ops::conv_gemm_backward(g, dy32.data<float>(), x32.data<float>(), w32.data<float>(), nullptr,
                            dw_alone.data<float>());
    expect_close(dx_alone, dx, 0, 0);
    expect_close(dw_alone, dw, 0, 0);
  }
}

TEST(ConvGemm, WeightGradientPerImageEqualsConvGrad) {
  // kCases plus first layers of few channels and larger maps (the Fashion-MNIST CNN's conv1 at
  // a small batch, where prefer_weight_grad_per_image applies; an RGB stem with stride 2).
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({"1 channel, 5x5 pads 2 on 28x28", {3, 1, 28, 28}, {8, 1, 5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}});
  cases.push_back({"3 channels, 7x7 stride 2 pads 3", {5, 3, 16, 16}, {6, 3, 7, 7}, {2, 2}, {3, 3, 3, 3}, {1, 1}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto [g, x, w, dy, want] = grad_reference(c, 21, 3);
    const Tensor x32 = x.cast(DataType::Float32), dy32 = dy.cast(DataType::Float32);
    Tensor dw(DataType::Float32, c.w), db(DataType::Float32, Shape{c.w[0]});
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), 7.0f);  // overwritten
    ops::conv_gemm_weight_grad_per_image(g, dy32.data<float>(), x32.data<float>(), dw.data<float>());
    expect_close(dw.cast(DataType::Float64), want[1], 1e-5, 1e-5);
    // With the bias gradient from the same products (a column of ones in the patches).
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), 7.0f);
    std::fill(db.data<float>(), db.data<float>() + db.numel(), 7.0f);
    ops::conv_gemm_weight_grad_per_image(g, dy32.data<float>(), x32.data<float>(), dw.data<float>(), db.data<float>());
    expect_close(dw.cast(DataType::Float64), want[1], 1e-5, 1e-5);
    expect_close(db.cast(DataType::Float64), want[2], 1e-5, 1e-5);
  }
}

// ConvGrad without dX (a first layer's), float32 through a session: dW per image where
// prefer_weight_grad_per_image holds (after the crop of the 1x1 case to its centre tap), and
// the bias gradient, against float64.
TEST(ConvGemm, AFirstLayersWeightGradientThroughASession) {
  const Case cases[] = {
      {"1 channel, 5x5 pads 2", {4, 1, 12, 12}, {8, 1, 5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}},
      {"1 channel, 3x3 pads 1 on 1x1 maps: the centre tap", {5, 1, 1, 1}, {4, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto [g, x, w, dy, want] = grad_reference(c, 24, 3);
    onnx::ModelProto m = testing::empty_model("first_layer_grad");
    auto* internal = m.add_opset_import();
    internal->set_domain("ai.onnxtrain");
    internal->set_version(1);
    auto& graph = *m.mutable_graph();
    for (const char* name : {"dy", "x", "w"}) testing::typed_value(graph.add_input(), name, onnx::TensorProto::FLOAT, {});
    auto* grad = testing::add_node(graph, "ConvGrad", {"dy", "x", "w"}, {"", "dw", "db"});
    grad->set_domain("ai.onnxtrain");
    for (const auto& a : attrs(c)) *grad->add_attribute() = a;
    for (const char* name : {"dw", "db"}) testing::typed_value(graph.add_output(), name, onnx::TensorProto::FLOAT, {});
    runtime::Session session(m);
    for (int again = 0; again < 2; ++again) {
      const runtime::NamedTensors got = session.run({{"dy", dy.cast(DataType::Float32)},
                                                     {"x", x.cast(DataType::Float32)},
                                                     {"w", w.cast(DataType::Float32)}});
      expect_close(got.at("dw").cast(DataType::Float64), want[1], 1e-5, 1e-5);
      expect_close(got.at("db").cast(DataType::Float64), want[2], 1e-5, 1e-5);
    }
  }
}

TEST(ConvGemm, TheRule) {
  ops::ConvGeometry g = geometry(kCases[1]);  // group 1, 4 output positions
  const bool avx512 = ops::dnnl_util::has_isa(dnnl::cpu_isa::avx512_core);
  EXPECT_EQ(ops::prefer_conv_gemm(g), !avx512);
  g.G = 2;
  EXPECT_FALSE(ops::prefer_conv_gemm(g));
  g = geometry(Case{"4x4 maps", {2, 8, 4, 4}, {8, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}});
  EXPECT_FALSE(ops::prefer_conv_gemm(g));  // 16 output positions
  // Constant weights in a channels-last chain: up to 16 output positions, from 4 images.
  EXPECT_FALSE(ops::prefer_conv_gemm_channels_last(g));  // 2 images
  g.N = 4;
  EXPECT_EQ(ops::prefer_conv_gemm_channels_last(g), !avx512);
  g.G = 2;
  EXPECT_FALSE(ops::prefer_conv_gemm_channels_last(g));
  g = geometry(Case{"8x8 maps", {4, 8, 8, 8}, {8, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}});
  EXPECT_FALSE(ops::prefer_conv_gemm_channels_last(g));  // 64 output positions
  // A weight gradient alone: one input channel, group 1.
  EXPECT_FALSE(ops::prefer_weight_grad_per_image(g));  // 8 channels
  g.C = 3;
  EXPECT_FALSE(ops::prefer_weight_grad_per_image(g));
  g.C = 1;
  EXPECT_EQ(ops::prefer_weight_grad_per_image(g), !avx512);
}

// A training step's convolution: W and B fed (graph inputs), Conv -> Relu (one FusedConv in the
// session), and ConvGrad, in float32 against float64, at the shapes of ResNet-18's last stages
// (a 3x3 on 1x1 maps, whose outer taps read only padding, is cropped to its centre first).
TEST(ConvGemm, FedWeightsThroughSessionsEqualFloat64) {
  const Case cases[] = {
      kCases[0],
      kCases[1],
      {"3x3 pads 1 on 1x1 maps: the centre tap", {6, 32, 1, 1}, {16, 32, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ops::ConvGeometry g = geometry(c);
    const Tensor x = testing::random_f64(c.x, 9), w = testing::random_f64(c.w, 10, 0.5);
    const Tensor b = testing::random_f64(Shape{g.M}, 11);
    onnx::ModelProto m = testing::empty_model("conv_relu");
    auto& graph = *m.mutable_graph();
    for (const char* name : {"x", "w", "b"}) testing::typed_value(graph.add_input(), name, onnx::TensorProto::FLOAT, {});
    auto* conv = testing::add_node(graph, "Conv", {"x", "w", "b"}, {"c"});
    for (const auto& a : attrs(c)) *conv->add_attribute() = a;
    testing::add_node(graph, "Relu", {"c"}, {"y"});
    testing::typed_value(graph.add_output(), "y", onnx::TensorProto::FLOAT, {});
    const Tensor want = run_node(NodeSpec{"Relu", "", 17, {}, 1}, {run_node(NodeSpec{"Conv", "", 17, attrs(c), 1}, {x, w, b})[0]})[0];
    runtime::Session session(m);
    for (int again = 0; again < 2; ++again) {
      const Tensor got = session.run({{"x", x.cast(DataType::Float32)}, {"w", w.cast(DataType::Float32)},
                                      {"b", b.cast(DataType::Float32)}}).at("y");
      expect_close(got.cast(DataType::Float64), want, 1e-5, 1e-5);
    }
    const Tensor dy = random_output_gradient(g, 12);
    const std::vector<Tensor> grads = run_node(NodeSpec{"ConvGrad", "ai.onnxtrain", 1, attrs(c), 3}, {dy, x, w});
    const std::vector<Tensor> grads32 =
        run_node(NodeSpec{"ConvGrad", "ai.onnxtrain", 1, attrs(c), 3},
                 {dy.cast(DataType::Float32), x.cast(DataType::Float32), w.cast(DataType::Float32)});
    for (size_t i = 0; i < 3; ++i) {
      SCOPED_TRACE("ConvGrad output " + std::to_string(i));
      expect_close(grads32[i].cast(DataType::Float64), grads[i], 1e-5, 1e-5);
    }
  }
}

}  // namespace
}  // namespace onnxtrain
