// Training graphs' convolution tensors blocked by channels (runtime/fusion.h
// block_convolution_tensors): the kernels that read and write [N, C / b, H, W, b] —
// ai.onnxtrain.MaxPoolChannelBlocked, MaxPoolGrad, ConvGrad and FusedConv with the *_channel_block
// attributes — against the plain ops on the same values, and the rewrite of a CNN's training step
// (forward and backward) against the unrewritten graph.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <limits>
#include <string>
#include <vector>

#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "ops/conv_geometry.h"
#include "ops/data_movement.h"
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

// [N, C / b, H, W, b] from [N, C, H, W], and back.
Tensor blocked(const Tensor& plain, int64_t b) {
  Tensor y(plain.dtype(), ops::channel_blocked_shape(plain.shape(), b));
  ops::copy_into_channel_blocks(plain, y, b);
  return y;
}
Tensor unblocked(const Tensor& t, int64_t b) { return ops::unblocked_channels(t, b); }

// Pool inputs with NaN, signed zeros, ties and negatives (windows whose maximum is 0 or -0);
// `shift` added to all (windows of negatives only, for Relu after the pool).
Tensor pool_input(const Shape& shape, DataType t, double shift = 0) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double values[] = {-0.0, 0.0, -1.0, 0.0, 2.0, -0.0, 3.0, 1.0, -2.5, 0.5};
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 29 == 4 ? nan : values[(i * 2654435761u >> 7) % 10] + shift;
  return Tensor::from_vector<double>(shape, v).cast(t);
}

struct PoolCase {
  Shape x;
  Attrs attrs;
};

std::vector<PoolCase> pool_cases() {
  const Attrs k2 = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  return {
      {{2, 16, 7, 9}, k2},   // odd height and width: a row and a column no window reads
      {{1, 32, 6, 28}, k2},
      {{2, 16, 7, 6}, {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 1}), attr("pads", Ints{1, 0, 1, 1})}},
      {{1, 16, 9, 9}, {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}), attr("pads", Ints{1, 1, 1, 1})}},
      {{1, 16, 8, 8}, {attr("kernel_shape", Ints{2, 2}), attr("dilations", Ints{2, 2})}},
  };
}

Attrs with(Attrs attrs, const std::vector<onnx::AttributeProto>& more) {
  attrs.insert(attrs.end(), more.begin(), more.end());
  return attrs;
}

// MaxPoolGrad with x_channel_block (X and dX blocked) and with or without dy_channel_block gives
// the plain op's dX exactly, with and without its Relu, for blocks of 8 and 16, on the 2x2 loops
// and the general windows (padding, overlaps, dilations).
TEST(BlockedConvTraining, MaxPoolGradOnBlockedTensorsGivesThePlainResult) {
  for (const auto& [shape, attrs] : pool_cases()) {
    const Tensor x = pool_input(shape, DataType::Float32);
    const Tensor y = run_node(NodeSpec{"MaxPool", "", 17, attrs, 1}, {x})[0];
    const Tensor dy = testing::random_f64(y.shape(), 7).cast(DataType::Float32);
    for (const bool relu : {false, true}) {
      const Attrs plain = relu ? with(attrs, {attr("activation", std::string("Relu"))}) : attrs;
      const Tensor want = run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, plain, 1}, {dy, x})[0];
      for (const int64_t b : {int64_t{8}, int64_t{16}}) {
        for (const bool dy_blocked : {false, true}) {
          SCOPED_TRACE(shape.to_string() + " relu " + std::to_string(relu) + " b " + std::to_string(b) +
                       " dy blocked " + std::to_string(dy_blocked));
          Attrs a = with(plain, {attr("x_channel_block", b)});
          if (dy_blocked) a.push_back(attr("dy_channel_block", b));
          const Tensor got = run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, a, 1},
                                      {dy_blocked ? blocked(dy, b) : dy, blocked(x, b)})[0];
          ASSERT_EQ(got.shape(), ops::channel_blocked_shape(shape, b));
          expect_close(unblocked(got, b), want, 0, 0);
        }
      }
    }
  }
}

// MaxPoolChannelBlocked gives MaxPool's output (then Relu with activation = "Relu") blocked or
// plain.
TEST(BlockedConvTraining, MaxPoolChannelBlockedGivesMaxPoolsResult) {
  for (const auto& [shape, attrs] : pool_cases()) {
    const Tensor x = pool_input(shape, DataType::Float32, -1.5);
    const Tensor pooled = run_node(NodeSpec{"MaxPool", "", 17, attrs, 1}, {x})[0];
    const Tensor rectified = run_node(NodeSpec{"Relu", "", 17, {}, 1}, {pooled})[0];
    for (const bool relu : {false, true}) {
      for (const int64_t b : {int64_t{8}, int64_t{16}}) {
        for (const bool y_blocked : {false, true}) {
          SCOPED_TRACE(shape.to_string() + " relu " + std::to_string(relu) + " b " + std::to_string(b) +
                       " y blocked " + std::to_string(y_blocked));
          Attrs a = with(attrs, {attr("x_channel_block", b)});
          if (y_blocked) a.push_back(attr("y_channel_block", b));
          if (relu) a.push_back(attr("activation", std::string("Relu")));
          const Tensor got = run_node(NodeSpec{"MaxPoolChannelBlocked", kInternal, 1, a, 1}, {blocked(x, b)})[0];
          expect_close(y_blocked ? unblocked(got, b) : got, relu ? rectified : pooled, 0, 0);
        }
      }
    }
  }
  const Attrs k2 = {attr("kernel_shape", Ints{2, 2}), attr("x_channel_block", int64_t{8})};
  EXPECT_TRUE(testing::throws_with(
      [&] {
        run_node(NodeSpec{"MaxPoolChannelBlocked", kInternal, 1, k2, 1},
                 {testing::random_f64({1, 2, 4, 4, 16}, 1).cast(DataType::Float32)});
      },
      "expected rank 5 with last dim 8"));
}

// ConvGrad with dY, X and dX blocked gives the plain op's gradients: float32 through oneDNN's
// primitives on the blocked tensors (the block conv_channel_block()), float64 and a block oneDNN
// does not write through the plain path between permutations; dW and dB alone too.
TEST(BlockedConvTraining, ConvGradOnBlockedTensorsGivesThePlainGradients) {
  const Attrs attrs = {attr("pads", Ints{1, 1, 1, 1})};
  const Tensor x64 = testing::random_f64({2, 16, 9, 9}, 1);
  const Tensor w64 = testing::random_f64({16, 16, 3, 3}, 2, 0.3);
  const Tensor dy64 = testing::random_f64({2, 16, 9, 9}, 3);
  std::vector<std::pair<DataType, int64_t>> runs = {{DataType::Float64, 8}, {DataType::Float64, 16},
                                                    {DataType::Float32, 8}};
  if (ops::conv_channel_block() == 16) runs.push_back({DataType::Float32, 16});
  for (const auto& [t, b] : runs) {
    const Tensor x = x64.cast(t), w = w64.cast(t), dy = dy64.cast(t);
    const auto want = run_node(NodeSpec{"ConvGrad", kInternal, 1, attrs, 3}, {dy, x, w});
    const double tol = t == DataType::Float32 ? 1e-5 : 0;
    for (const bool x_blocked : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " b " + std::to_string(b) + " x blocked " + std::to_string(x_blocked));
      Attrs a = with(attrs, {attr("dy_channel_block", b), attr("dx_channel_block", b)});
      if (x_blocked) a.push_back(attr("x_channel_block", b));
      const auto got = run_node(NodeSpec{"ConvGrad", kInternal, 1, a, 3}, {blocked(dy, b), x_blocked ? blocked(x, b) : x, w});
      expect_close(unblocked(got[0], b), want[0], tol, tol);
      expect_close(got[1], want[1], tol, tol);
      expect_close(got[2], want[2], tol, tol);
    }
  }
  // A dY whose shape is not the blocked output's is named in the error.
  const Attrs a = with(attrs, {attr("dy_channel_block", int64_t{8})});
  EXPECT_TRUE(testing::throws_with(
      [&] { run_node(NodeSpec{"ConvGrad", kInternal, 1, a, 3}, {dy64, x64, w64}); }, "blocked by attribute dy_channel_block"));
}

// BatchNormalization in training mode and its gradient on tensors blocked by b channels
// (BatchNormalizationChannelBlocked; BatchNormalizationGrad with channel_block) give the plain
// ops' values: to the bit where the plain op also sums column by column (planes under
// batch_norm::kColumnPlanes: 1x1 and 3x5 maps), within float rounding where it sums channel by
// channel (a 9x9 map); float32 and float64, blocks of 8 and 16, the gradient with the statistics
// given and computed.
TEST(BlockedConvTraining, BatchNormalizationOnBlockedTensorsGivesThePlainValues) {
  for (const Shape& shape : {Shape{4, 32, 1, 1}, Shape{3, 16, 3, 5}, Shape{2, 32, 9, 9}}) {
    const bool same_sums = shape[2] * shape[3] < 64;
    const int64_t c = shape[1];
    const Tensor x64 = testing::random_f64(shape, 21, 2.0), dy64 = testing::random_f64(shape, 22);
    const Tensor scale64 = testing::random_f64({c}, 23), bias64 = testing::random_f64({c}, 24);
    const Tensor mean64 = testing::random_f64({c}, 25, 0.1);
    std::vector<double> var_values(static_cast<size_t>(c));
    for (int64_t i = 0; i < c; ++i) var_values[static_cast<size_t>(i)] = 0.5 + 0.01 * static_cast<double>(i);
    const Tensor var64 = Tensor::from_vector<double>({c}, var_values);
    for (const DataType t : {DataType::Float32, DataType::Float64}) {
      for (const int64_t b : {int64_t{8}, int64_t{16}}) {
        SCOPED_TRACE(shape.to_string() + " " + std::string(dtype_name(t)) + " b " + std::to_string(b));
        const double tol = same_sums ? 0 : (t == DataType::Float32 ? 1e-5 : 1e-12);
        const Tensor x = x64.cast(t), dy = dy64.cast(t), scale = scale64.cast(t), bias = bias64.cast(t);
        const Tensor mean = mean64.cast(t), var = var64.cast(t);
        const Attrs bn = {attr("epsilon", 1e-3f), attr("momentum", 0.8f)};
        const auto want = run_node(NodeSpec{"BatchNormalization", "", 15, with(bn, {attr("training_mode", int64_t{1})}), 3},
                                   {x, scale, bias, mean, var});
        const auto got = run_node(NodeSpec{"BatchNormalizationChannelBlocked", kInternal, 1,
                                           with(bn, {attr("channel_block", b)}), 3},
                                  {blocked(x, b), scale, bias, mean, var});
        expect_close(unblocked(got[0], b), want[0], tol, tol);
        expect_close(got[1], want[1], tol, tol);  // running_mean
        expect_close(got[2], want[2], tol, tol);  // running_var
        const Attrs eps = {attr("epsilon", 1e-3f)};
        for (const bool given : {false, true}) {
          SCOPED_TRACE(given ? "statistics given" : "statistics computed");
          std::vector<Tensor> plain_in = {dy, x, scale}, blocked_in = {blocked(dy, b), blocked(x, b), scale};
          if (given) {
            for (auto* in : {&plain_in, &blocked_in}) in->insert(in->end(), {mean, var});
          }
          const auto grad_want = run_node(NodeSpec{"BatchNormalizationGrad", kInternal, 1, eps, 3}, plain_in);
          const auto grad_got = run_node(NodeSpec{"BatchNormalizationGrad", kInternal, 1,
                                                  with(eps, {attr("channel_block", b)}), 3}, blocked_in);
          expect_close(unblocked(grad_got[0], b), grad_want[0], tol, tol);  // dX
          expect_close(grad_got[1], grad_want[1], tol, tol);                // dscale
          expect_close(grad_got[2], grad_want[2], tol, tol);                // dB
        }
      }
    }
  }
  // An input that is not blocked as the attribute says is named in the error.
  const Tensor plain = testing::random_f64({2, 16, 3, 3}, 26);
  const Tensor c16 = testing::random_f64({16}, 27);
  EXPECT_TRUE(testing::throws_with(
      [&] {
        run_node(NodeSpec{"BatchNormalizationChannelBlocked", kInternal, 1, {attr("channel_block", int64_t{16})}, 3},
                 {plain, c16, c16, c16, c16});
      },
      "(attribute channel_block = 16)"));
}

// FusedConv without a pool reads X and writes Y blocked (attributes x_channel_block /
// y_channel_block) with the results of Conv -> Relu, on oneDNN's path (float32, the block
// conv_channel_block()) and the plain one (float64).
TEST(BlockedConvTraining, FusedConvWithoutAPoolReadsAndWritesBlockedTensors) {
  const Attrs attrs = {attr("pads", Ints{2, 2, 2, 2}), attr("kernel_shape", Ints{5, 5})};
  const Tensor x64 = testing::random_f64({3, 16, 10, 11}, 4);
  const Tensor w64 = testing::random_f64({32, 16, 5, 5}, 5, 0.2);
  const Tensor b64 = testing::random_f64({32}, 6);
  std::vector<std::pair<DataType, int64_t>> runs = {{DataType::Float64, 8}};
  if (ops::conv_channel_block() != 0) runs.push_back({DataType::Float32, ops::conv_channel_block()});
  for (const auto& [t, b] : runs) {
    const Tensor x = x64.cast(t), w = w64.cast(t), bias = b64.cast(t);
    const Tensor conv = run_node(NodeSpec{"Conv", "", 17, attrs, 1}, {x, w, bias})[0];
    const Tensor want = run_node(NodeSpec{"Relu", "", 17, {}, 1}, {conv})[0];
    const double tol = t == DataType::Float32 ? 1e-5 : 1e-12;
    for (const auto& [x_blocked, y_blocked] : {std::pair{true, true}, {false, true}, {true, false}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " x blocked " + std::to_string(x_blocked) + " y blocked " +
                   std::to_string(y_blocked));
      Attrs a = with(attrs, {attr("activation", std::string("Relu"))});
      if (x_blocked) a.push_back(attr("x_channel_block", b));
      if (y_blocked) a.push_back(attr("y_channel_block", b));
      const Tensor got = run_node(NodeSpec{"FusedConv", kInternal, 1, a, 1}, {x_blocked ? blocked(x, b) : x, w, bias})[0];
      expect_close(y_blocked ? unblocked(got, b) : got, want, tol, tol);
    }
  }
}

// An empty model importing the ai.onnxtrain domain too (the training steps below use its ops).
onnx::ModelProto internal_model(const std::string& name) {
  onnx::ModelProto m = testing::empty_model(name);
  auto* internal = m.add_opset_import();
  internal->set_domain(kInternal);
  internal->set_version(1);
  return m;
}

// A CNN's training step written out: conv1 (C -> 16, 5x5) + Relu, a 2x2 pool, conv2 (16 -> 32,
// 3x3) + Relu, `pool2` attributes, then the backward pass from dp2, the output gradient fed as
// an input (MaxPoolGrad with activation Relu, as fuse_max_pool_relu_grad leaves it, and
// ConvGrad). The weights are graph inputs with static shapes, as in a training graph.
onnx::ModelProto training_step(int64_t c, const Attrs& pool2, bool r1_output) {
  onnx::ModelProto m = internal_model("training_step");
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  testing::typed_value(g.add_input(), "x", kFloat, {});
  testing::typed_value(g.add_input(), "dp2", kFloat, {});
  testing::typed_value(g.add_input(), "W1", kFloat, {16, c, 5, 5});
  testing::typed_value(g.add_input(), "B1", kFloat, {16});
  testing::typed_value(g.add_input(), "W2", kFloat, {32, 16, 3, 3});
  testing::typed_value(g.add_input(), "B2", kFloat, {32});
  const auto conv = [&](const std::string& x, const std::string& w, const std::string& b, const std::string& y, int64_t pad) {
    auto* n = testing::add_node(g, "FusedConv", {x, w, b}, {y});
    n->set_domain(kInternal);
    *n->add_attribute() = attr("pads", Ints{pad, pad, pad, pad});
    *n->add_attribute() = attr("activation", std::string("Relu"));
    return n;
  };
  const Attrs pool1 = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  const auto pool = [&](const std::string& x, const std::string& y, const Attrs& attrs) {
    auto* n = testing::add_node(g, "MaxPool", {x}, {y});
    for (const auto& a : attrs) *n->add_attribute() = a;
  };
  const auto pool_grad = [&](const std::string& dy, const std::string& x, const std::string& dx, const Attrs& attrs) {
    auto* n = testing::add_node(g, "MaxPoolGrad", {dy, x}, {dx});
    n->set_domain(kInternal);
    for (const auto& a : attrs) *n->add_attribute() = a;
    *n->add_attribute() = attr("activation", std::string("Relu"));
  };
  conv("x", "W1", "B1", "r1", 2);
  pool("r1", "p1", pool1);
  conv("p1", "W2", "B2", "r2", 1);
  pool("r2", "p2", pool2);
  pool_grad("dp2", "r2", "d2", pool2);
  auto* grad2 = testing::add_node(g, "ConvGrad", {"d2", "p1", "W2"}, {"dp1", "dW2", "dB2"});
  grad2->set_domain(kInternal);
  *grad2->add_attribute() = attr("pads", Ints{1, 1, 1, 1});
  pool_grad("dp1", "r1", "d1", pool1);
  auto* grad1 = testing::add_node(g, "ConvGrad", {"d1", "x", "W1"}, {"", "dW1", "dB1"});
  grad1->set_domain(kInternal);
  *grad1->add_attribute() = attr("pads", Ints{2, 2, 2, 2});
  for (const char* out : {"p2", "dW1", "dB1", "dW2", "dB2"}) testing::typed_value(g.add_output(), out, kFloat, {});
  if (r1_output) testing::typed_value(g.add_output(), "r1", kFloat, {});
  return m;
}

// The attributes the rewrite set, as "node input/output attribute value" lines, and the
// activations.
std::vector<std::string> rewrite_summary(const onnx::GraphProto& g) {
  std::vector<std::string> lines;
  for (const auto& node : g.node()) {
    for (const auto& a : node.attribute()) {
      if (a.name().ends_with("_channel_block")) lines.push_back(node.op_type() + " " + node.output(0) + " " + a.name());
      if (a.name() == "activation") lines.push_back(node.op_type() + " " + node.output(0) + " Relu");
      if (a.name() == "routing_mask") lines.push_back(node.op_type() + " " + node.output(0) + " routing_mask " + node.input(1));
    }
  }
  return lines;
}

// The rewritten step against the original (both run without the other rewrites), on pools of
// 2x2 windows (taken into the convolutions, which then write the pools' routing masks) over even
// and odd maps, and on overlapping 3x3 windows with padding (conv2's pool stays a node), at two
// batch sizes.
TEST(BlockedConvTraining, ACnnsTrainingStepPassesBlockedTensorsWithTheSameResults) {
  const int64_t b = ops::conv_channel_block();
  if (b != 16) GTEST_SKIP() << "the rewrite applies on CPUs with AVX-512 only";
  const Attrs k2 = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  const Attrs k3 = {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}), attr("pads", Ints{1, 1, 1, 1})};
  const std::vector<std::string> conv1 = {
      "FusedConv p1 y_channel_block", "FusedConv p1 Relu",  // conv1 with pool1: Relu after the pool
  };
  const std::vector<std::string> backward = {
      "ConvGrad dp1 dy_channel_block", "ConvGrad dp1 x_channel_block", "ConvGrad dp1 dx_channel_block",
      "MaxPoolGrad d1 x_channel_block", "MaxPoolGrad d1 dy_channel_block", "MaxPoolGrad d1 routing_mask r1/routing_mask",
      "ConvGrad  dy_channel_block"};  // conv1's ConvGrad: x has 1 channel, no dX
  const auto join = [](std::vector<std::vector<std::string>> parts) {
    std::vector<std::string> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  // Map sizes: 12 -> pools to 6 -> 3; 13 -> 6 (a row and column unread) -> 3; 14 -> 7 -> 4 (3x3,
  // stride 2, pads 1); 2 -> 1 -> 1.
  const std::vector<std::tuple<Attrs, int64_t, int64_t, std::vector<std::string>>> cases = {
      {k2, 12, 3,
       join({conv1,
             {"FusedConv p2 x_channel_block", "FusedConv p2 Relu",  // p2 is a graph output: plain
              "MaxPoolGrad d2 x_channel_block", "MaxPoolGrad d2 routing_mask r2/routing_mask"},  // dp2: plain
             backward})},
      {k2, 13, 3, {}},
      {k3, 2, 1, {}},  // 2x2 maps: conv1's outer taps read only padding (cropped to 3x3)
      {k3, 14, 4,
       join({conv1,
             {"FusedConv r2 x_channel_block", "FusedConv r2 y_channel_block", "MaxPoolChannelBlocked p2 x_channel_block",
              "MaxPoolChannelBlocked p2 Relu", "MaxPoolGrad d2 Relu", "MaxPoolGrad d2 x_channel_block"},
             backward})},
  };
  for (const auto& [pool2, size, pooled, summary] : cases) {
    const onnx::ModelProto model = training_step(1, pool2, false);
    onnx::ModelProto rewritten = model;
    ASSERT_EQ(runtime::block_convolution_tensors(*rewritten.mutable_graph()), 6);  // r1 p1 r2 d2 dp1 d1
    if (!summary.empty()) {
      EXPECT_EQ(rewrite_summary(rewritten.graph()), summary);
    }
    EXPECT_EQ(testing::count_op(rewritten.graph(), "MaxPool"), 0);
    EXPECT_EQ(testing::count_op(rewritten.graph(), "MaxPoolChannelBlocked"), pool2.size() == 3 ? 1 : 0);  // the 3x3 pool
    runtime::Session original(model, {.fuse = false}), blocked_step(rewritten, {.fuse = false});
    for (const int64_t n : {int64_t{2}, int64_t{5}}) {
      SCOPED_TRACE("batch " + std::to_string(n) + " map " + std::to_string(size));
      const runtime::NamedTensors feeds{
          {"x", testing::random_f64({n, 1, size, size}, 10).cast(DataType::Float32)},
          {"W1", testing::random_f64({16, 1, 5, 5}, 11, 0.3).cast(DataType::Float32)},
          {"B1", testing::random_f64({16}, 12, 0.1).cast(DataType::Float32)},
          {"W2", testing::random_f64({32, 16, 3, 3}, 13, 0.2).cast(DataType::Float32)},
          {"B2", testing::random_f64({32}, 14, 0.1).cast(DataType::Float32)},
          {"dp2", testing::random_f64({n, 32, pooled, pooled}, 15).cast(DataType::Float32)}};
      const runtime::NamedTensors want = original.run(feeds);
      const runtime::NamedTensors got = blocked_step.run(feeds);
      for (const char* out : {"p2", "dW1", "dB1", "dW2", "dB2"}) {
        SCOPED_TRACE(out);
        expect_close(got.at(out), want.at(out), 1e-4, 1e-5);
      }
    }
  }
}

// The node's int attribute `name`, 0 when absent.
int64_t int_attr(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) return a.i();
  }
  return 0;
}

// A residual block's training step written out, as the Gradient expansion and the session's
// earlier rewrites leave ResNet-18's: conv1 -> BatchNormalization -> Relu (r1) -> conv2 ->
// BatchNormalization -> Add(., r1) -> Relu (r2) -> conv3 (its output c3 the graph output); then
// the backward pass from dc3 (ConvGrad, ReluGrad, the Add's gradient as SumToShape of Shape,
// BatchNormalizationGrad, a Sum of r1's two gradients). 16 channels, weights graph inputs with
// static shapes.
onnx::ModelProto residual_step() {
  onnx::ModelProto m = internal_model("residual_step");
  auto& g = *m.mutable_graph();
  const int kFloat = onnx::TensorProto::FLOAT;
  for (const char* in : {"x", "dc3"}) testing::typed_value(g.add_input(), in, kFloat, {});
  for (const char* w : {"W1", "W2", "W3"}) testing::typed_value(g.add_input(), w, kFloat, {16, 16, 3, 3});
  for (const char* p : {"s1", "b1", "m1", "v1", "s2", "b2", "m2", "v2"}) testing::typed_value(g.add_input(), p, kFloat, {16});
  const Attrs pads = {attr("pads", Ints{1, 1, 1, 1})};
  const auto node = [&](const std::string& op, const std::vector<std::string>& in, const std::vector<std::string>& out,
                        const Attrs& attrs = {}, bool internal_op = false) {
    auto* n = testing::add_node(g, op, in, out);
    if (internal_op) n->set_domain(kInternal);
    for (const auto& a : attrs) *n->add_attribute() = a;
  };
  const Attrs training = {attr("training_mode", int64_t{1}), attr("epsilon", 1e-3f)};
  node("Conv", {"x", "W1"}, {"c1"}, pads);
  node("BatchNormalization", {"c1", "s1", "b1", "m1", "v1"}, {"y1", "rm1", "rv1"}, training);
  node("Relu", {"y1"}, {"r1"});
  node("Conv", {"r1", "W2"}, {"c2"}, pads);
  node("BatchNormalization", {"c2", "s2", "b2", "m2", "v2"}, {"y2", "rm2", "rv2"}, training);
  node("Add", {"y2", "r1"}, {"a"});
  node("Relu", {"a"}, {"r2"});
  node("Conv", {"r2", "W3"}, {"c3"}, pads);
  node("ConvGrad", {"dc3", "r2", "W3"}, {"dr2", "dW3", ""}, pads, true);
  node("ReluGrad", {"r2", "dr2"}, {"da"}, {}, true);
  node("Shape", {"y2"}, {"sy2"});
  node("Shape", {"r1"}, {"sr1"});
  node("SumToShape", {"da", "sy2"}, {"dy2"}, {}, true);
  node("SumToShape", {"da", "sr1"}, {"dskip"}, {}, true);
  const Attrs eps = {attr("epsilon", 1e-3f)};
  node("BatchNormalizationGrad", {"dy2", "c2", "s2"}, {"dc2", "ds2", "db2"}, eps, true);
  node("ConvGrad", {"dc2", "r1", "W2"}, {"dr1c", "dW2", ""}, pads, true);
  node("Sum", {"dr1c", "dskip"}, {"dr1"});
  node("ReluGrad", {"r1", "dr1"}, {"dy1"}, {}, true);
  node("BatchNormalizationGrad", {"dy1", "c1", "s1"}, {"dc1", "ds1", "db1"}, eps, true);
  node("ConvGrad", {"dc1", "x", "W1"}, {"dx", "dW1", ""}, pads, true);
  for (const char* out : {"c3", "dx", "dW1", "dW2", "dW3", "ds1", "db1", "ds2", "db2", "rm1", "rv1", "rm2", "rv2"}) {
    testing::typed_value(g.add_output(), out, kFloat, {});
  }
  return m;
}

// The rewrite passes the residual block's activations and their gradients blocked through the
// normalizations, the element-wise ops and the Add's gradient (ResNet-18's step then reorders no
// activation between its convolutions), and the step's results are the plain graph's.
TEST(BlockedConvTraining, AResidualBlocksStepPassesBlockedTensorsThroughItsNormalizations) {
  const int64_t b = ops::conv_channel_block();
  if (b != 16) GTEST_SKIP() << "the rewrite applies on CPUs with AVX-512 only";
  const onnx::ModelProto model = residual_step();
  onnx::ModelProto rewritten = model;
  // c1 y1 r1 c2 y2 a r2 dr2 da dy2 dskip dc2 dr1c dr1 dy1 dc1; x and dc3 (inputs), c3 and dx
  // (outputs) stay plain.
  ASSERT_EQ(runtime::block_convolution_tensors(*rewritten.mutable_graph()), 16);
  EXPECT_EQ(testing::count_op(rewritten.graph(), "BatchNormalization"), 0);
  EXPECT_EQ(testing::count_op(rewritten.graph(), "BatchNormalizationChannelBlocked"), 2);
  int grads = 0;
  for (const auto& n : rewritten.graph().node()) {
    if (n.op_type() == "BatchNormalizationGrad") {
      EXPECT_EQ(int_attr(n, "channel_block"), 16) << n.output(0);
      ++grads;
    }
    if (n.op_type() == "FusedConv" && n.output(0) == "c3") {
      EXPECT_EQ(int_attr(n, "y_channel_block"), 0);
    }
    if (n.op_type() == "ConvGrad" && n.output(0) == "dx") {
      EXPECT_EQ(int_attr(n, "dx_channel_block"), 0);
    }
  }
  EXPECT_EQ(grads, 2);
  runtime::Session original(model, {.fuse = false}), blocked_step(rewritten, {.fuse = false});
  for (const int64_t n : {int64_t{2}, int64_t{3}}) {
    for (const int64_t size : {int64_t{3}, int64_t{9}}) {  // planes of 9 (column by column) and 81 (block by block)
      SCOPED_TRACE("batch " + std::to_string(n) + " map " + std::to_string(size));
      runtime::NamedTensors feeds{{"x", testing::random_f64({n, 16, size, size}, 30).cast(DataType::Float32)},
                                  {"dc3", testing::random_f64({n, 16, size, size}, 31).cast(DataType::Float32)}};
      uint32_t seed = 32;
      for (const char* w : {"W1", "W2", "W3"}) feeds[w] = testing::random_f64({16, 16, 3, 3}, seed++, 0.2).cast(DataType::Float32);
      for (const char* p : {"s1", "b1", "m1", "s2", "b2", "m2"}) feeds[p] = testing::random_f64({16}, seed++).cast(DataType::Float32);
      for (const char* v : {"v1", "v2"}) feeds[v] = Tensor::from_vector<float>({16}, std::vector<float>(16, 0.7f));
      const runtime::NamedTensors want = original.run(feeds);
      const runtime::NamedTensors got = blocked_step.run(feeds);
      for (const auto& [name, value] : want) {
        SCOPED_TRACE(name);
        expect_close(got.at(name), value, 1e-4, 1e-4);
      }
    }
  }
  // With r2 a graph output the Relu writing it stays plain, and with it the Add and everything the
  // element-wise ops join to it: the BatchNormalizations, r1 and their gradients.
  onnx::ModelProto pinned = model;
  testing::typed_value(pinned.mutable_graph()->add_output(), "r2", onnx::TensorProto::FLOAT, {});
  runtime::block_convolution_tensors(*pinned.mutable_graph());
  EXPECT_EQ(testing::count_op(pinned.graph(), "BatchNormalizationChannelBlocked"), 0);
  for (const auto& n : pinned.graph().node()) EXPECT_EQ(int_attr(n, "channel_block"), 0) << n.op_type();
}

// What the rewrite leaves plain: a value that is a graph output, and with it the pool and the
// MaxPoolGrad reading it (X and dX go blocked together); channels that do not divide by the block.
TEST(BlockedConvTraining, OutputsAndUndividedChannelsStayPlain) {
  const int64_t b = ops::conv_channel_block();
  if (b != 16) GTEST_SKIP() << "the rewrite applies on CPUs with AVX-512 only";
  const Attrs k2 = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  onnx::ModelProto m = training_step(1, k2, true);
  // r1 plain: its pool reads it plain and writes p1 plain, its MaxPoolGrad writes d1 plain and
  // reads dp1 plain; conv2's side stays blocked (conv2 takes its pool in, reading p1 plain).
  ASSERT_EQ(runtime::block_convolution_tensors(*m.mutable_graph()), 2);  // r2 d2
  EXPECT_EQ(rewrite_summary(m.graph()),
            (std::vector<std::string>{"FusedConv r1 Relu", "FusedConv p2 Relu", "MaxPoolGrad d2 x_channel_block",
                                      "MaxPoolGrad d2 routing_mask r2/routing_mask", "ConvGrad dp1 dy_channel_block",
                                      "MaxPoolGrad d1 Relu"}));
  EXPECT_EQ(testing::count_op(m.graph(), "MaxPool"), 1);
  // conv2's weights read 12 input channels of p1's 16 (not divisible by the block): conv2 reads
  // p1 plain and its ConvGrad writes dp1 plain, while conv1's side stays blocked.
  onnx::ModelProto twelve = training_step(1, k2, false);
  for (auto& in : *twelve.mutable_graph()->mutable_input()) {
    if (in.name() == "W2") in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(12);
  }
  runtime::block_convolution_tensors(*twelve.mutable_graph());
  const std::vector<std::string> lines = rewrite_summary(twelve.graph());
  for (const char* plain : {"p1 y_channel_block", "r2 x_channel_block", "dp1 x_channel_block", "dp1 dx_channel_block"}) {
    EXPECT_EQ(std::count(lines.begin(), lines.end(), std::string("FusedConv ") + plain) +
                  std::count(lines.begin(), lines.end(), std::string("MaxPoolChannelBlocked ") + plain) +
                  std::count(lines.begin(), lines.end(), std::string("ConvGrad ") + plain),
              0)
        << plain;
  }
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "MaxPoolGrad d1 routing_mask r1/routing_mask"), 1);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "MaxPoolGrad d1 x_channel_block"), 1);
}

}  // namespace
}  // namespace onnxtrain
