// runtime/fusion.h use_channels_last and fuse_conv_add: chains of convolutions with constant
// float32 weights and the element-wise ops between them run on channels-last tensors
// (ai.onnxtrain.ConvChannelsLast), with a Transpose only where a value enters or leaves the
// chain, and a residual Add (and its Relu) goes into the convolution before it; and
// block_pooled_conv_pairs: a pooled convolution hands its output to the next one blocked by
// channels. Every test compares the rewritten session with the unrewritten one
// (SessionOptions::fuse = false).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <dnnl.hpp>
#include <sstream>
#include <string>

#include "core/vector_math.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "ops/conv_gemm.h"
#include "ops/conv_geometry.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::count_op;
using testing::expect_close;

// A Conv node with constant weights [m, c, 3, ...] (one 3 per spatial dim) and, with `bias`, a
// constant bias; `stride` in every spatial dim, pads 1.
void add_conv(onnx::GraphProto& g, const std::string& x, const std::string& y, int64_t c, int64_t m,
              size_t spatial, uint32_t seed, bool bias = true, int64_t stride = 1) {
  Shape w_shape{m, c};
  for (size_t d = 0; d < spatial; ++d) w_shape.push_back(3);
  io::tensor_to_proto(testing::random_f64(w_shape, seed, 0.3).cast(DataType::Float32), y + ".W", *g.add_initializer());
  std::vector<std::string> inputs{x, y + ".W"};
  if (bias) {
    io::tensor_to_proto(testing::random_f64(Shape{m}, seed + 100).cast(DataType::Float32), y + ".B",
                        *g.add_initializer());
    inputs.push_back(y + ".B");
  }
  auto* conv = testing::add_node(g, "Conv", inputs, {y});
  conv->set_name(y);
  *conv->add_attribute() = attr("pads", std::vector<int64_t>(2 * spatial, 1));
  *conv->add_attribute() = attr("strides", std::vector<int64_t>(spatial, stride));
}

void add_scalar(onnx::GraphProto& g, const std::string& name, float value, size_t rank) {
  io::tensor_to_proto(Tensor::from_vector<float>(Shape::filled(rank, 1), {value}), name, *g.add_initializer());
}

constexpr int64_t kC = 16, kM = 24;

// An empty model with one float32 graph input, x.
onnx::ModelProto model_with_x(const std::string& name) {
  onnx::ModelProto m = testing::empty_model(name);
  testing::typed_value(m.mutable_graph()->add_input(), "x", onnx::TensorProto::FLOAT, {});
  return m;
}

// A residual block and a strided convolution after it, as in ResNet:
//   x -> Conv -> Relu -> Conv -> Add(., x) -> Relu = r (a graph output too)
//   r -> Conv (stride 2, no bias) -> Mul(., 0.5) -> GlobalAveragePool = y
// `c` and `m` the channels of x and of y.
onnx::ModelProto residual_model(size_t spatial, int64_t c = kC, int64_t m_out = kM) {
  onnx::ModelProto m = model_with_x("residual");
  auto& g = *m.mutable_graph();
  add_conv(g, "x", "c1", c, c, spatial, 1);
  testing::add_node(g, "Relu", {"c1"}, {"a1"});
  add_conv(g, "a1", "c2", c, c, spatial, 2);
  testing::add_node(g, "Add", {"c2", "x"}, {"s"});
  testing::add_node(g, "Relu", {"s"}, {"r"});
  add_conv(g, "r", "c3", c, m_out, spatial, 3, false, 2);
  add_scalar(g, "half", 0.5f, 1);
  testing::add_node(g, "Mul", {"c3", "half"}, {"h"});
  testing::add_node(g, "GlobalAveragePool", {"h"}, {"y"});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  testing::typed_value(g.add_output(), "r", onnx::TensorProto::FLOAT, {});
  return m;
}

Shape input_shape(int64_t n, size_t spatial, int64_t size, int64_t c = kC) {
  Shape s{n, c};
  for (size_t d = 0; d < spatial; ++d) s.push_back(size);
  return s;
}

// The rewritten and unrewritten sessions agree on every output, run after run.
void expect_same_outputs(const onnx::ModelProto& model, const std::vector<runtime::NamedTensors>& feeds) {
  runtime::Session fused(model), unfused(model, {.fuse = false});
  for (const auto& f : feeds) {
    const runtime::NamedTensors want = unfused.run(f);
    for (int again = 0; again < 2; ++again) {  // the second run reuses the cached primitives
      const runtime::NamedTensors got = fused.run(f);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [name, tensor] : want) {
        SCOPED_TRACE("output " + name + " for x " + f.begin()->second.shape().to_string());
        ASSERT_EQ(got.at(name).shape(), tensor.shape());
        // The convolutions sum in another order (oneDNN's channels-last kernels), and the
        // rounding of a sum scales with its terms, not with the result: an element that cancels
        // to near 0 after a chain of convolutions carries the error of the chain's larger values.
        // So the absolute tolerance follows the output's largest magnitude (2e-6 of it: ~17 ulp;
        // AVX2's kernels, which order the sums differently from AVX-512's, differ by up to 5.8e-7
        // of it after four convolutions).
        double largest = 0;
        for (double v : tensor.to_double_vector()) largest = std::max(largest, std::abs(v));
        expect_close(got.at(name), tensor, 1e-5, std::max(1e-5, 2e-6 * largest));
      }
    }
  }
}

TEST(ChannelsLastFusion, AResidualBlockRunsChannelsLastWithTransposesOnlyAtItsEdges) {
  onnx::GraphProto g = residual_model(2).graph();
  ASSERT_EQ(runtime::fuse_conv_relu(g), 1);  // as a session does: Conv -> Relu first
  ASSERT_EQ(runtime::use_channels_last(g), 3);
  EXPECT_EQ(count_op(g, "ConvChannelsLast"), 3);
  EXPECT_EQ(count_op(g, "Conv") + count_op(g, "FusedConv"), 0);
  // x in; r out (a graph output); the Mul's output out (GlobalAveragePool is not element-wise).
  EXPECT_EQ(count_op(g, "Transpose"), 3);
  for (const auto& node : g.node()) {
    if (node.op_type() == "Add" || node.op_type() == "Mul" || node.op_type() == "Relu") {
      EXPECT_TRUE(node.input(0).ends_with("/channels_last")) << node.op_type() << " reads " << node.input(0);
    }
    if (node.op_type() == "GlobalAveragePool") {
      EXPECT_EQ(node.input(0), "h");
    }
  }
  ASSERT_EQ(runtime::fuse_conv_add(g), 1);  // c2 + x, then the Relu
  EXPECT_EQ(count_op(g, "Add") + count_op(g, "Relu"), 0);
  EXPECT_EQ(count_op(g, "ConvChannelsLast"), 3);
}

// ResNet's stem before a residual block: x -> Conv (stride 2) -> Relu -> MaxPool (3x3, stride 2,
// pads 1) = p, then the block of residual_model on p.
onnx::ModelProto stem_model() {
  onnx::ModelProto m = model_with_x("stem");
  auto& g = *m.mutable_graph();
  add_conv(g, "x", "c0", 3, kC, 2, 11, true, 2);
  testing::add_node(g, "Relu", {"c0"}, {"a0"});
  auto* pool = testing::add_node(g, "MaxPool", {"a0"}, {"p"});
  *pool->add_attribute() = attr("kernel_shape", std::vector<int64_t>{3, 3});
  *pool->add_attribute() = attr("strides", std::vector<int64_t>{2, 2});
  *pool->add_attribute() = attr("pads", std::vector<int64_t>{1, 1, 1, 1});
  add_conv(g, "p", "c1", kC, kC, 2, 1);
  testing::add_node(g, "Relu", {"c1"}, {"a1"});
  add_conv(g, "a1", "c2", kC, kC, 2, 2);
  testing::add_node(g, "Add", {"c2", "p"}, {"y"});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

TEST(ChannelsLastFusion, AStemsPooledConvolutionWritesTheChainsLayout) {
  onnx::GraphProto g = stem_model().graph();
  ASSERT_EQ(runtime::fuse_conv_pool(g), 1);
  ASSERT_EQ(runtime::fuse_conv_relu(g), 1);
  ASSERT_EQ(runtime::use_channels_last(g), 3);  // the stem counts as one of the chain's convolutions
  EXPECT_EQ(count_op(g, "ConvChannelsLast"), 2);
  EXPECT_EQ(count_op(g, "Transpose"), 1);  // y out; the stem reads x as it is and writes p channels-last
  for (const auto& node : g.node()) {
    if (node.op_type() != "FusedConv") continue;
    EXPECT_EQ(node.input(0), "x");
    EXPECT_TRUE(node.output(0).ends_with("/channels_last")) << node.output(0);
    EXPECT_EQ(node.attribute(node.attribute_size() - 1).name(), "channels_last");
  }
  std::vector<runtime::NamedTensors> feeds;
  for (int64_t n : {1, 2}) {
    feeds.push_back({{"x", testing::random_f64(Shape{n, 3, 18, 18}, 12).cast(DataType::Float32)}});
  }
  expect_same_outputs(stem_model(), feeds);
}

// Two pooled convolutions as in the Fashion-MNIST CNN: x [N, 3, H, W] -> Conv (3 -> 16) -> Relu ->
// MaxPool 2x2 -> Conv (16 -> 24) -> Relu -> MaxPool 2x2 = y.
onnx::ModelProto pooled_pair_model() {
  onnx::ModelProto m = model_with_x("pooled_pair");
  auto& g = *m.mutable_graph();
  const auto add_pool = [&](const std::string& x, const std::string& y) {
    auto* pool = testing::add_node(g, "MaxPool", {x}, {y});
    *pool->add_attribute() = attr("kernel_shape", std::vector<int64_t>{2, 2});
    *pool->add_attribute() = attr("strides", std::vector<int64_t>{2, 2});
  };
  add_conv(g, "x", "c1", 3, kC, 2, 41);
  testing::add_node(g, "Relu", {"c1"}, {"a1"});
  add_pool("a1", "p1");
  add_conv(g, "p1", "c2", kC, kM, 2, 42);
  testing::add_node(g, "Relu", {"c2"}, {"a2"});
  add_pool("a2", "y");
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// The chains' float32 convolutions run oneDNN's jit kernels, never its reference loops (ref:any),
// which are hundreds of times slower: oneDNN 2.6 without AVX-512 took them for every convolution
// writing channels-last from a source left to it (the Fashion-MNIST CNN's inference, ~4 s per
// batch of 16 on an AVX2 machine). Read from oneDNN's own verbose lines of the runs.
TEST(ChannelsLastFusion, TheChainsConvolutionsRunOneDNNsJitKernels) {
  for (const onnx::ModelProto& model : {residual_model(2), stem_model(), pooled_pair_model()}) {
    SCOPED_TRACE(model.graph().name());
    runtime::Session session(model);
    const Tensor x = testing::random_f64(Shape{2, model.graph().name() == "residual" ? kC : 3, 18, 18}, 31)
                         .cast(DataType::Float32);
    ::testing::internal::CaptureStdout();
    dnnl::set_verbose(1);
    session.run({{"x", x}});
    dnnl::set_verbose(0);
    std::fflush(stdout);
    const std::string verbose = ::testing::internal::GetCapturedStdout();
    int convolutions = 0;
    std::istringstream lines(verbose);
    for (std::string line; std::getline(lines, line);) {
      if (line.find(",convolution,") == std::string::npos || line.find(",exec,") == std::string::npos) continue;
      ++convolutions;
      EXPECT_EQ(line.find(",ref:"), std::string::npos) << line;
    }
    EXPECT_EQ(convolutions, model.graph().name() == "pooled_pair" ? 2 : 3) << verbose;
    if (model.graph().name() == "pooled_pair" && ops::pooled_conv_channel_block() != 0) {
      // The second convolution reads the first one's blocked output as it is: oneDNN reorders
      // only the weights (into its ABcd8b8a / Acdb8a layouts), never an activation.
      lines = std::istringstream(verbose);
      for (std::string line; std::getline(lines, line);) {
        if (line.find(",reorder,") == std::string::npos || line.find(",exec,") == std::string::npos) continue;
        EXPECT_EQ(line.find("dst_f32::blocked:aBcd8b"), std::string::npos) << line;
      }
    }
  }
}

// The pooled FusedConv with channels_last = 1 outside oneDNN's path (float64): the channels-first
// result permuted, equal to Conv -> Relu -> MaxPool -> Transpose.
onnx::ModelProto pooled_model(bool fused) {
  onnx::ModelProto m = testing::empty_model(fused ? "fused" : "reference");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x", onnx::TensorProto::DOUBLE, {});
  io::tensor_to_proto(testing::random_f64(Shape{4, 2, 3, 3}, 1), "W", *g.add_initializer());
  const auto pool_attrs = [](onnx::NodeProto* n, const std::string& prefix) {
    *n->add_attribute() = attr(prefix + "kernel_shape", std::vector<int64_t>{2, 2});
    *n->add_attribute() = attr(prefix + "strides", std::vector<int64_t>{2, 2});
  };
  if (fused) {
    auto* internal = m.add_opset_import();
    internal->set_domain("ai.onnxtrain");
    internal->set_version(1);
    auto* n = testing::add_node(g, "FusedConv", {"x", "W"}, {"y"});
    n->set_domain("ai.onnxtrain");
    *n->add_attribute() = attr("pads", std::vector<int64_t>{1, 1, 1, 1});
    *n->add_attribute() = attr("activation", std::string("Relu"));
    pool_attrs(n, "pool_");
    *n->add_attribute() = attr("channels_last", int64_t{1});
  } else {
    *testing::add_node(g, "Conv", {"x", "W"}, {"c"})->add_attribute() = attr("pads", std::vector<int64_t>{1, 1, 1, 1});
    testing::add_node(g, "Relu", {"c"}, {"a"});
    pool_attrs(testing::add_node(g, "MaxPool", {"a"}, {"p"}), "");
    *testing::add_node(g, "Transpose", {"p"}, {"y"})->add_attribute() = attr("perm", std::vector<int64_t>{0, 2, 3, 1});
  }
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::DOUBLE, {});
  return m;
}

TEST(ChannelsLastFusion, APooledConvolutionWritesChannelsLastOnEveryPath) {
  const runtime::NamedTensors feeds{{"x", testing::random_f64(Shape{2, 2, 6, 6}, 3)}};
  const Tensor got = runtime::Session(pooled_model(true)).run(feeds).at("y");
  const Tensor want = runtime::Session(pooled_model(false), {.fuse = false}).run(feeds).at("y");
  EXPECT_EQ(got.shape(), (Shape{2, 3, 3, 4}));
  expect_close(got, want, 1e-12, 1e-12);
}

TEST(ChannelsLastFusion, ResidualBlocksGiveTheUnrewrittenResultsInOneTwoAndThreeSpatialDims) {
  for (size_t spatial : {1u, 2u, 3u}) {
    SCOPED_TRACE(std::to_string(spatial) + " spatial dims");
    const int64_t size = spatial == 3 ? 5 : 9;
    std::vector<runtime::NamedTensors> feeds;
    for (int64_t n : {1, 3}) {
      feeds.push_back({{"x", testing::random_f64(input_shape(n, spatial, size), 7).cast(DataType::Float32)}});
    }
    expect_same_outputs(residual_model(spatial), feeds);
  }
}

TEST(ChannelsLastFusion, MapsSmallerThanTheKernelTakeTheBlockedConvolutionWithTheSameResults) {
  // 2x2 maps under 3x3 kernels at a batch of more than 64 output positions: the blocked
  // direct convolution between reorders (conv.cpp blocked_for_channels_last; without AVX-512
  // the product over the batch, conv_gemm.h); 1x1 maps at batch 1: the channels-last one.
  expect_same_outputs(residual_model(2), {{{"x", testing::random_f64(input_shape(40, 2, 2), 8).cast(DataType::Float32)}},
                                          {{"x", testing::random_f64(input_shape(1, 2, 1), 9).cast(DataType::Float32)}}});
}

// `m` with its float32 initializers, inputs and outputs as float64. float64 convolutions run
// conv_ref.h's loops over every kernel tap, so such a model's outputs are a reference for the
// float32 paths, which leave out the taps that read only padding (conv_geometry.h
// crop_unreached_taps: with fed weights always, with constant ones without AVX-512).
onnx::ModelProto as_float64(onnx::ModelProto m) {
  auto& g = *m.mutable_graph();
  for (auto& init : *g.mutable_initializer()) {
    const std::string name = init.name();
    io::tensor_to_proto(io::tensor_from_proto(init, {}, "initializer " + name).cast(DataType::Float64), name, init);
  }
  for (auto* values : {g.mutable_input(), g.mutable_output()}) {
    for (auto& v : *values) v.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
  }
  return m;
}

TEST(ChannelsLastFusion, ConstantWeightsOnMapsSmallerThanTheKernelGiveEveryTapsResult) {
  // ResNet-18's last stage at 32x32 input: 3x3 convolutions on 1x1 maps read their centre tap
  // alone, and the stride-2 one from 2x2 maps its lower-right 2x2 taps. On an AVX2 machine the
  // constant weights are cropped to those taps (conv.cpp tap_crop), once, then kept: the second
  // and third runs reuse them. From 4 images, maps of up to 16 positions run as one product
  // over the batch on W's taps-first copy (conv_gemm.h prefer_conv_gemm_channels_last).
  const onnx::ModelProto model = residual_model(2);
  runtime::Session fused(model), unfused(model, {.fuse = false}), reference(as_float64(model));
  for (const Shape& shape : {input_shape(1, 2, 1), input_shape(3, 2, 2), input_shape(5, 2, 2), input_shape(4, 2, 4),
                             input_shape(1, 2, 1), input_shape(5, 2, 2)}) {
    const Tensor x64 = testing::random_f64(shape, 10 + static_cast<uint32_t>(shape[0] + shape[2]));
    const runtime::NamedTensors want = reference.run({{"x", x64}});
    for (runtime::Session* session : {&fused, &unfused}) {
      for (int again = 0; again < 2; ++again) {
        const runtime::NamedTensors got = session->run({{"x", x64.cast(DataType::Float32)}});
        for (const auto& [name, tensor] : want) {
          SCOPED_TRACE("output " + name + " for x " + shape.to_string() + (session == &fused ? ", fused" : ""));
          expect_close(got.at(name).cast(DataType::Float64), tensor, 1e-5, 1e-5);
        }
      }
    }
  }
}

TEST(ChannelsLastFusion, FewOutputRowsOnLargeConstantWeightsStreamTheWeightsWithTheSameResults) {
  // 257 or 259 channels: 64.5 Ki weights or more in the centre tap alone, above the 64 Ki from
  // which up to 4 output rows over the batch read W's reached taps once (conv_gemm.h
  // prefer_conv_stream_channels_last): 1x1 maps at batches 1 to 3 (the centre tap), 2x2 maps at
  // batch 1 (4 rows), and 2x2 maps at batch 2 (8 rows: oneDNN), against float64 with every tap.
  // At 8 lanes W's rows go three at a time: 257 rows end in a group of two, 259 in a group of
  // one; at 16 lanes (AVX-512, every lane count the CPU runs is tried) six at a time: 257 end in
  // a group of five, 259 in a group of one. Neither is a multiple of 8 or 16 (the sums' K % lanes
  // rest). 1-D and 3-D maps take the same path.
  for (const int lanes : vmath::available_lanes()) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    vmath::set_lanes(lanes);
    for (const auto& [kWide, spatial] : std::vector<std::pair<int64_t, size_t>>{{257, 2}, {257, 1}, {257, 3}, {259, 2}}) {
      const onnx::ModelProto model = residual_model(spatial, kWide, 40);
      runtime::Session fused(model), reference(as_float64(model));
      for (const auto& [n, size] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {3, 1}, {1, 2}, {2, 2}, {1, 1}}) {
        if (spatial == 3 && size == 2 && n == 2) continue;  // 16 rows: nothing new
        const Shape shape = input_shape(n, spatial, size, kWide);
        const Tensor x64 = testing::random_f64(shape, 20 + static_cast<uint32_t>(n * 3 + size));
        const runtime::NamedTensors want = reference.run({{"x", x64}});
        for (int again = 0; again < 2; ++again) {  // the second run reuses the kept weights
          const runtime::NamedTensors got = fused.run({{"x", x64.cast(DataType::Float32)}});
          for (const auto& [name, tensor] : want) {
            SCOPED_TRACE("output " + name + " for x " + shape.to_string());
            double largest = 0;
            for (double v : tensor.to_double_vector()) largest = std::max(largest, std::abs(v));
            // float32 sums of up to 6939 products (rounding scales with the terms: expect_same_outputs).
            expect_close(got.at(name).cast(DataType::Float64), tensor, 1e-5, std::max(1e-5, 2e-6 * largest));
          }
        }
      }
    }
  }
  vmath::set_lanes(vmath::available_lanes().back());  // the default
}

TEST(ChannelsLastFusion, TheStreamedPathTakesFewRowsOfLargeWeightsOnly) {
  const auto geometry = [](int64_t n, int64_t c, int64_t m, int64_t size, int64_t kernel) {
    const Tensor x(DataType::Float32, Shape{n, c, size, size});
    const Tensor w(DataType::Float32, Shape{m, c, kernel, kernel});
    ops::ConvAttrs a;
    a.pads = std::vector<int64_t>(4, kernel / 2);
    return ops::resolve_conv_geometry(a, {x, "x"}, {w, "w"});
  };
  EXPECT_TRUE(ops::prefer_conv_stream_channels_last(geometry(1, 256, 256, 2, 3)));   // ResNet-18's layer 3 at batch 1
  EXPECT_TRUE(ops::prefer_conv_stream_channels_last(geometry(4, 512, 512, 1, 1)));   // 4 rows
  EXPECT_FALSE(ops::prefer_conv_stream_channels_last(geometry(2, 256, 256, 2, 3)));  // 8 rows
  EXPECT_FALSE(ops::prefer_conv_stream_channels_last(geometry(1, 16, 16, 2, 3)));    // 2304 weights
}

TEST(ChannelsLastFusion, AResidualOfAnotherBatchOrAScalarBroadcastsAsTheAddWould) {
  // Add(conv, z) where z has the larger batch (the fused node's output takes z's shape), and
  // Add(conv, 1.5) with a one-element constant: both fuse into the convolution.
  onnx::ModelProto m = testing::empty_model("broadcast");
  auto& g = *m.mutable_graph();
  testing::typed_value(g.add_input(), "x1", onnx::TensorProto::FLOAT, {});
  testing::typed_value(g.add_input(), "x2", onnx::TensorProto::FLOAT, {});
  add_conv(g, "x1", "c1", kC, kC, 2, 11);
  add_conv(g, "c1", "c2", kC, kC, 2, 12);
  add_conv(g, "x2", "c3", kC, kC, 2, 13);
  testing::add_node(g, "Add", {"c2", "c3"}, {"s"});
  add_conv(g, "s", "c4", kC, kC, 2, 14);
  add_scalar(g, "k", 1.5f, 4);
  testing::add_node(g, "Add", {"k", "c4"}, {"y"});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  onnx::GraphProto rewritten = g;
  ASSERT_EQ(runtime::use_channels_last(rewritten), 4);
  EXPECT_EQ(runtime::fuse_conv_add(rewritten), 2);
  EXPECT_EQ(count_op(rewritten, "Add"), 0);
  const runtime::NamedTensors feeds{{"x1", testing::random_f64(input_shape(1, 2, 6), 15).cast(DataType::Float32)},
                                    {"x2", testing::random_f64(input_shape(3, 2, 6), 16).cast(DataType::Float32)}};
  expect_same_outputs(m, {feeds});
}

TEST(ChannelsLastFusion, LoneConvolutionsAndOtherOperandsKeepTheirLayout) {
  // One convolution alone gains nothing: the graph stays.
  onnx::ModelProto one = model_with_x("one");
  auto& g1 = *one.mutable_graph();
  add_conv(g1, "x", "c1", kC, kC, 2, 21);
  testing::add_node(g1, "Relu", {"c1"}, {"y"});
  testing::typed_value(g1.add_output(), "y", onnx::TensorProto::FLOAT, {});
  onnx::GraphProto copy = g1;
  EXPECT_EQ(runtime::use_channels_last(copy), 0);
  EXPECT_EQ(copy.SerializeAsString(), g1.SerializeAsString());

  // A per-channel constant ([C, 1, 1]) is not permuted: the Add between two pairs of
  // convolutions stays channels-first, and each pair is converted on its own.
  onnx::ModelProto two = model_with_x("two");
  auto& g2 = *two.mutable_graph();
  add_conv(g2, "x", "c1", kC, kC, 2, 22);
  add_conv(g2, "c1", "c2", kC, kC, 2, 23);
  io::tensor_to_proto(testing::random_f64(Shape{kC, 1, 1}, 24).cast(DataType::Float32), "per_channel",
                      *g2.add_initializer());
  testing::add_node(g2, "Add", {"c2", "per_channel"}, {"s"});
  add_conv(g2, "s", "c3", kC, kC, 2, 25);
  add_conv(g2, "c3", "c4", kC, kC, 2, 26);
  testing::typed_value(g2.add_output(), "c4", onnx::TensorProto::FLOAT, {});
  onnx::GraphProto rewritten = g2;
  EXPECT_EQ(runtime::use_channels_last(rewritten), 4);
  EXPECT_EQ(count_op(rewritten, "Transpose"), 4);  // into and out of each pair
  for (const auto& node : rewritten.node()) {
    if (node.op_type() == "Add") {
      EXPECT_EQ(node.input(0), "c2");
    }
  }
  EXPECT_EQ(runtime::fuse_conv_add(rewritten), 0);
  expect_same_outputs(two, {{{"x", testing::random_f64(input_shape(2, 2, 7), 27).cast(DataType::Float32)}}});

  // Weights that a run may replace (a graph input) or of another type stay on the usual path.
  for (const bool as_input : {true, false}) {
    onnx::GraphProto g = two.graph();
    for (auto& init : *g.mutable_initializer()) {
      if (init.name() != "c1.W") continue;
      if (as_input) {
        testing::typed_value(g.add_input(), "c1.W", onnx::TensorProto::FLOAT, {});
      } else {
        io::tensor_to_proto(io::tensor_from_proto(init, {}, "c1.W").cast(DataType::Float64), "c1.W", init);
      }
    }
    EXPECT_EQ(runtime::use_channels_last(g), 2) << (as_input ? "graph input" : "float64");  // c3 and c4
  }
}

TEST(ChannelsLastFusion, ConvolutionsWhoseReluComesFirstKeepTheAddApart) {
  // Relu(Conv) + Conv: the Relu comes before the sum, so the first convolution cannot take the
  // Add; the second one (no activation) does, with the first one's output as z.
  onnx::ModelProto m = model_with_x("relu_first");
  auto& g = *m.mutable_graph();
  add_conv(g, "x", "c1", kC, kC, 2, 31);
  testing::add_node(g, "Relu", {"c1"}, {"a"});
  add_conv(g, "x", "c2", kC, kC, 2, 32);
  testing::add_node(g, "Add", {"a", "c2"}, {"y"});
  testing::typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {});
  onnx::GraphProto rewritten = g;
  ASSERT_EQ(runtime::fuse_conv_relu(rewritten), 1);
  ASSERT_EQ(runtime::use_channels_last(rewritten), 2);
  EXPECT_EQ(runtime::fuse_conv_add(rewritten), 1);  // c2 + Relu(c1): c2 takes the sum
  expect_same_outputs(m, {{{"x", testing::random_f64(input_shape(2, 2, 5), 33).cast(DataType::Float32)}}});
}

// The pair's value between them is blocked by channels where the CPU's convolutions take that
// layout (AVX2 without AVX-512: 8), and the results are the unrewritten ones, including over
// several chunks of images (conv.cpp kPooledChunkBytes: 16 images of 32x32 here) and a last,
// smaller chunk.
TEST(ChannelsLastFusion, PooledConvolutionsPassTheirValueBlockedByChannels) {
  const int64_t block = ops::pooled_conv_channel_block();
  onnx::GraphProto g = pooled_pair_model().graph();
  ASSERT_EQ(runtime::fuse_conv_pool(g), 2);
  ASSERT_EQ(runtime::fuse_conv_relu(g), 0);  // the Relus went into the pools' FusedConvs
  ASSERT_EQ(runtime::use_channels_last(g), 0);  // two chain starts, no chain
  ASSERT_EQ(runtime::block_pooled_conv_pairs(g), block ? 1 : 0);
  std::vector<std::string> blocks;
  for (const auto& node : g.node()) {
    for (const auto& a : node.attribute()) {
      if (a.name().ends_with("_channel_block")) blocks.push_back(node.input(0) + " " + a.name() + " " + std::to_string(a.i()));
    }
  }
  if (block) {
    EXPECT_EQ(blocks, (std::vector<std::string>{"x y_channel_block 8", "p1 x_channel_block 8"}));
  } else {
    EXPECT_TRUE(blocks.empty());
  }
  std::vector<runtime::NamedTensors> feeds;
  for (const auto& [n, size] : {std::pair{1, 12}, {2, 13}, {20, 32}}) {
    feeds.push_back({{"x", testing::random_f64(Shape{n, 3, size, size}, 43 + n).cast(DataType::Float32)}});
  }
  expect_same_outputs(pooled_pair_model(), feeds);

  // The first convolution's output also read by another node, or a graph output: not blocked.
  for (const bool output : {true, false}) {
    onnx::ModelProto m = pooled_pair_model();
    if (output) {
      testing::typed_value(m.mutable_graph()->add_output(), "p1", onnx::TensorProto::FLOAT, {});
    } else {
      testing::add_node(*m.mutable_graph(), "Relu", {"p1"}, {"r"});
      testing::typed_value(m.mutable_graph()->add_output(), "r", onnx::TensorProto::FLOAT, {});
    }
    onnx::GraphProto other = m.graph();
    runtime::fuse_conv_pool(other);
    EXPECT_EQ(runtime::block_pooled_conv_pairs(other), 0) << (output ? "a graph output" : "read by a Relu");
  }
}

// ai.onnxtrain.FusedConv with x_channel_block / y_channel_block outside oneDNN's path (float64:
// conv_ref.h, then the layout copies) against the ONNX ops, with the blocked value made by
// Reshape and Transpose; and a blocked X of the wrong shape is named in the error.
TEST(ChannelsLastFusion, APooledConvolutionReadsAndWritesTheBlockedLayoutOnEveryPath) {
  const auto model = [](bool fused, bool read_blocked) {
    onnx::ModelProto m = testing::empty_model(fused ? "fused" : "reference");
    auto& g = *m.mutable_graph();
    testing::typed_value(g.add_input(), "x", onnx::TensorProto::DOUBLE, {});
    io::tensor_to_proto(testing::random_f64(Shape{16, 8, 3, 3}, 51), "W", *g.add_initializer());
    io::tensor_to_proto(testing::random_f64(Shape{16}, 52), "B", *g.add_initializer());
    const auto pool_attrs = [](onnx::NodeProto* n, const std::string& prefix) {
      *n->add_attribute() = attr(prefix + "kernel_shape", std::vector<int64_t>{2, 2});
      *n->add_attribute() = attr(prefix + "strides", std::vector<int64_t>{2, 2});
    };
    // read_blocked: x is [N, 1, H, W, 8], the blocked form of [N, 8, H, W]; y is plain.
    // Otherwise x is plain and y blocked, [N, 2, O, O, 8].
    if (fused) {
      auto* internal = m.add_opset_import();
      internal->set_domain("ai.onnxtrain");
      internal->set_version(1);
      auto* n = testing::add_node(g, "FusedConv", {"x", "W", "B"}, {"y"});
      n->set_domain("ai.onnxtrain");
      *n->add_attribute() = attr("pads", std::vector<int64_t>{1, 1, 1, 1});
      *n->add_attribute() = attr("activation", std::string("Relu"));
      pool_attrs(n, "pool_");
      *n->add_attribute() = attr(read_blocked ? "x_channel_block" : "y_channel_block", int64_t{8});
    } else {
      std::string in = "x";
      if (read_blocked) {  // [N, 1, H, W, 8] -> [N, 1, 8, H, W] -> [N, 8, H, W]
        *testing::add_node(g, "Transpose", {"x"}, {"xt"})->add_attribute() =
            attr("perm", std::vector<int64_t>{0, 1, 4, 2, 3});
        io::tensor_to_proto(Tensor::from_vector<int64_t>(Shape{4}, {0, 8, 6, 6}), "plain", *g.add_initializer());
        testing::add_node(g, "Reshape", {"xt", "plain"}, {"xp"});
        in = "xp";
      }
      *testing::add_node(g, "Conv", {in, "W", "B"}, {"c"})->add_attribute() =
          attr("pads", std::vector<int64_t>{1, 1, 1, 1});
      testing::add_node(g, "Relu", {"c"}, {"a"});
      pool_attrs(testing::add_node(g, "MaxPool", {"a"}, {read_blocked ? "y" : "p"}), "");
      if (!read_blocked) {  // [N, 16, O, O] -> [N, 2, 8, O, O] -> [N, 2, O, O, 8]
        io::tensor_to_proto(Tensor::from_vector<int64_t>(Shape{5}, {0, 2, 8, 3, 3}), "split", *g.add_initializer());
        testing::add_node(g, "Reshape", {"p", "split"}, {"ps"});
        *testing::add_node(g, "Transpose", {"ps"}, {"y"})->add_attribute() =
            attr("perm", std::vector<int64_t>{0, 1, 3, 4, 2});
      }
    }
    testing::typed_value(g.add_output(), "y", onnx::TensorProto::DOUBLE, {});
    return m;
  };
  for (const bool read_blocked : {false, true}) {
    SCOPED_TRACE(read_blocked ? "x blocked" : "y blocked");
    const Tensor x = testing::random_f64(read_blocked ? Shape{2, 1, 6, 6, 8} : Shape{2, 8, 6, 6}, 53);
    const Tensor got = runtime::Session(model(true, read_blocked)).run({{"x", x}}).at("y");
    const Tensor want = runtime::Session(model(false, read_blocked), {.fuse = false}).run({{"x", x}}).at("y");
    EXPECT_EQ(got.shape(), read_blocked ? (Shape{2, 16, 3, 3}) : (Shape{2, 2, 3, 3, 8}));
    expect_close(got, want, 1e-12, 1e-12);
  }
  try {
    runtime::Session(model(true, true)).run({{"x", testing::random_f64(Shape{2, 8, 6, 6}, 54)}});
    ADD_FAILURE() << "a plain x was taken for a blocked one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x_channel_block = 8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2,8,6,6]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
