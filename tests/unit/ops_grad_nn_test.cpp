// Unit tests for the ai.onnxtrain backward ops ConvGrad, ConvTransposeGrad, MaxPoolGrad and
// AveragePoolGrad: central differences in float64 of L = sum(Y * R) with Y the forward op run
// through onnxtrain (so dY = R), the float32 (oneDNN) and float16 paths against float64,
// omitted outputs, the max tie rule, and errors; and GatherGrad's rows split between threads.
#include <omp.h>

#include <limits>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/session.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::node_model;
using testing::NodeSpec;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;
using Ints = std::vector<int64_t>;

constexpr const char* kInternal = "ai.onnxtrain";

// Uniform values in [-1, 1), float64.
Tensor random(const Shape& shape, uint32_t seed) { return testing::random_f64(shape, seed); }

std::vector<Tensor> cast_all(const std::vector<Tensor>& ts, DataType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.defined() ? t.cast(dtype) : Tensor());
  return out;
}

// A forward op and its inputs: X, W, B for the convolutions, X for the pools.
struct GradCase {
  std::string name;
  std::string op;  // Conv, ConvTranspose, MaxPool, AveragePool
  std::vector<Shape> shapes;
  Attrs attrs;
};

// L(inputs) = sum(op(inputs) * R), R fixed, through one session of the forward node.
class Loss {
 public:
  Loss(const GradCase& c, const std::vector<Tensor>& inputs)
      : session_(node_model(NodeSpec{c.op, "", 17, c.attrs, 1}, inputs)) {}

  Tensor forward(const std::vector<Tensor>& inputs) {
    runtime::NamedTensors feeds;
    for (size_t i = 0; i < inputs.size(); ++i) feeds["in" + std::to_string(i)] = inputs[i];
    return session_.run(feeds).at("out0");
  }
  double operator()(const std::vector<Tensor>& inputs, const Tensor& r) {
    const Tensor y = forward(inputs);
    double sum = 0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += y.data<double>()[i] * r.data<double>()[i];
    return sum;
  }

 private:
  runtime::Session session_;
};

// dL/d inputs[i] by central differences (eps 1e-6).
Tensor numeric_grad(Loss& loss, std::vector<Tensor> inputs, size_t i, const Tensor& r) {
  return testing::central_differences(
      [&](const Tensor& x) {
        inputs[i] = x;
        return loss(inputs, r);
      },
      inputs[i]);
}

// The gradient op of c: dX (and dW, dB for the convolutions) for dY = r.
std::vector<Tensor> run_grad(const GradCase& c, const Tensor& r, const std::vector<Tensor>& xs) {
  std::vector<Tensor> inputs{r};
  inputs.insert(inputs.end(), xs.begin(), xs.begin() + (c.shapes.size() > 1 ? 2 : 1));
  const int outputs = c.shapes.size() > 1 ? 3 : 1;
  return run_node(NodeSpec{c.op + "Grad", kInternal, 1, c.attrs, outputs}, inputs);
}

void check_case(const GradCase& c) {
  SCOPED_TRACE(c.name);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.shapes.size(); ++i)
    xs.push_back(random(c.shapes[i], static_cast<uint32_t>(10 + i)));
  Loss loss(c, xs);
  const Tensor r = random(loss.forward(xs).shape(), 99);
  const std::vector<Tensor> got = run_grad(c, r, xs);
  ASSERT_EQ(got.size(), c.shapes.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    expect_close(got[i], numeric_grad(loss, xs, i, r), 1e-6, 1e-7);
  }
  const std::vector<Tensor> got32 =
      run_grad(c, r.cast(DataType::Float32), cast_all(xs, DataType::Float32));
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("float32 gradient of input " + std::to_string(i));
    ASSERT_EQ(got32[i].dtype(), DataType::Float32);
    expect_close(got32[i].cast(DataType::Float64), got[i], 1e-4, 1e-5);
  }
}

TEST(ConvGradTest, FiniteDifferences) {
  const GradCase cases[] = {
      {"2d strides pads dilations group 2", "Conv", {{2, 4, 7, 6}, {6, 2, 3, 2}, {6}},
       {attr("strides", Ints{2, 1}), attr("pads", Ints{1, 0, 2, 1}), attr("dilations", Ints{1, 2}),
        attr("group", int64_t{2})}},
      {"1d SAME_UPPER stride 2", "Conv", {{2, 3, 9}, {4, 3, 4}, {4}},
       {attr("auto_pad", std::string("SAME_UPPER")), attr("strides", Ints{2})}},
      {"2d depthwise SAME_LOWER", "Conv", {{1, 3, 5, 4}, {3, 1, 2, 3}, {3}},
       {attr("auto_pad", std::string("SAME_LOWER")), attr("group", int64_t{3})}},
      {"2d VALID with kernel_shape", "Conv", {{2, 2, 5, 5}, {3, 2, 2, 2}, {3}},
       {attr("auto_pad", std::string("VALID")), attr("kernel_shape", Ints{2, 2})}},
      {"3d pads strides", "Conv", {{1, 2, 4, 5, 3}, {3, 2, 2, 3, 2}, {3}},
       {attr("pads", Ints{1, 0, 1, 0, 1, 1}), attr("strides", Ints{1, 2, 1})}},
      // Outer taps that read only padding: float32 runs over the others (crop_unreached_taps).
      {"3x3 pads 1 on a 1x1 map: the centre tap", "Conv", {{3, 5, 1, 1}, {6, 5, 3, 3}, {6}},
       {attr("pads", Ints{1, 1, 1, 1})}},
      {"3x3 stride 2 on a 2x2 map: 4 taps", "Conv", {{2, 3, 2, 2}, {4, 3, 3, 3}, {4}},
       {attr("pads", Ints{1, 1, 1, 1}), attr("strides", Ints{2, 2})}},
      {"stride 3 reaching taps 1 and 4 of 5, group 2", "Conv", {{1, 4, 1, 3}, {4, 2, 5, 2}, {4}},
       {attr("pads", Ints{4, 1, 4, 0}), attr("strides", Ints{3, 1}), attr("group", int64_t{2})}},
      {"1d dilation 2: the centre", "Conv", {{2, 3, 1}, {2, 3, 3}, {2}},
       {attr("pads", Ints{2, 2}), attr("dilations", Ints{2})}},
      {"3d pads 1 on a 1x2x1 map", "Conv", {{1, 2, 1, 2, 1}, {3, 2, 3, 3, 3}, {3}},
       {attr("pads", Ints{1, 1, 1, 1, 1, 1})}},
      {"4d (float32 runs the reference too)", "Conv",
       {{1, 2, 3, 3, 2, 3}, {2, 1, 2, 2, 1, 2}, {2}},
       {attr("group", int64_t{2}), attr("pads", Ints{0, 1, 0, 1, 1, 0, 0, 0})}},
  };
  for (const GradCase& c : cases) check_case(c);
}

TEST(ConvTransposeGradTest, FiniteDifferences) {
  const GradCase cases[] = {
      {"2d strides pads output_padding dilations group 2", "ConvTranspose",
       {{2, 4, 3, 4}, {4, 3, 3, 2}, {6}},
       {attr("strides", Ints{2, 3}), attr("pads", Ints{1, 0, 0, 1}),
        attr("output_padding", Ints{1, 1}), attr("dilations", Ints{1, 2}),
        attr("group", int64_t{2})}},
      {"1d SAME_UPPER stride 2", "ConvTranspose", {{2, 3, 5}, {3, 2, 3}, {2}},
       {attr("auto_pad", std::string("SAME_UPPER")), attr("strides", Ints{2})}},
      {"3d output_shape with outputs no input reaches", "ConvTranspose",
       {{1, 2, 2, 3, 2}, {2, 2, 2, 2, 3}, {2}},
       {attr("strides", Ints{2, 1, 2}), attr("output_shape", Ints{5, 4, 6})}},
  };
  for (const GradCase& c : cases) check_case(c);
}

TEST(MaxPoolGradTest, FiniteDifferences) {
  const GradCase cases[] = {
      {"2d pads strides dilations ceil_mode", "MaxPool", {{2, 3, 7, 6}},
       {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 2}),
        attr("pads", Ints{1, 0, 1, 1}), attr("dilations", Ints{1, 2}),
        attr("ceil_mode", int64_t{1})}},
      {"1d SAME_UPPER", "MaxPool", {{2, 2, 9}},
       {attr("kernel_shape", Ints{3}), attr("strides", Ints{2}),
        attr("auto_pad", std::string("SAME_UPPER"))}},
      {"3d overlapping windows, storage_order 1", "MaxPool", {{1, 2, 4, 5, 4}},
       {attr("kernel_shape", Ints{2, 2, 3}), attr("strides", Ints{2, 1, 2}),
        attr("pads", Ints{0, 1, 1, 1, 0, 1}), attr("storage_order", int64_t{1})}},
  };
  for (const GradCase& c : cases) check_case(c);
}

TEST(AveragePoolGradTest, FiniteDifferences) {
  const GradCase cases[] = {
      {"2d ceil_mode count_include_pad", "AveragePool", {{2, 2, 7, 6}},
       {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}),
        attr("pads", Ints{1, 1, 1, 0}), attr("ceil_mode", int64_t{1}),
        attr("count_include_pad", int64_t{1})}},
      {"2d ceil_mode without pad count", "AveragePool", {{2, 2, 7, 6}},
       {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}),
        attr("pads", Ints{1, 1, 1, 0}), attr("ceil_mode", int64_t{1})}},
      {"1d SAME_UPPER count_include_pad", "AveragePool", {{2, 2, 9}},
       {attr("kernel_shape", Ints{4}), attr("strides", Ints{2}),
        attr("auto_pad", std::string("SAME_UPPER")), attr("count_include_pad", int64_t{1})}},
      {"3d pads strides", "AveragePool", {{1, 2, 4, 5, 4}},
       {attr("kernel_shape", Ints{2, 3, 2}), attr("strides", Ints{1, 2, 2}),
        attr("pads", Ints{1, 1, 0, 0, 1, 1})}},
  };
  for (const GradCase& c : cases) check_case(c);
}

TEST(MaxPoolGradTest, TiesGoToTheFirstMaximumAndPaddingNeverWins) {
  const Tensor x = Tensor::from_vector<double>({1, 1, 4}, {1, 3, 3, 2});
  const Tensor dy = Tensor::from_vector<double>({1, 1, 3}, {1, 10, 100});
  const Attrs k2 = {attr("kernel_shape", Ints{2})};
  expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k2, 1}, {dy, x})[0],
               Tensor::from_vector<double>({1, 1, 4}, {0, 11, 100, 0}));
  // Windows (pad, -5), (-5, -6), (-6, pad): the padding is never the maximum.
  const Tensor neg = Tensor::from_vector<double>({1, 1, 2}, {-5, -6});
  const Attrs padded = {attr("kernel_shape", Ints{2}), attr("pads", Ints{1, 1})};
  expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, padded, 1}, {dy, neg})[0],
               Tensor::from_vector<double>({1, 1, 2}, {11, 100}));
  // The first NaN of a window is its maximum; a window of -inf still passes to its first element.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DataType t : {DataType::Float64, DataType::Float32}) {
    const Tensor x_nan = Tensor::from_vector<double>({1, 1, 4}, {1, nan, 3, nan}).cast(t);
    expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k2, 1}, {dy.cast(t), x_nan})[0],
                 Tensor::from_vector<double>({1, 1, 4}, {0, 11, 0, 100}).cast(t));
    const Tensor x_inf = Tensor::from_vector<double>({1, 1, 4}, {-inf, -inf, -inf, 2}).cast(t);
    expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k2, 1}, {dy.cast(t), x_inf})[0],
                 Tensor::from_vector<double>({1, 1, 4}, {1, 10, 0, 100}).cast(t));
    // The same through the two-spatial-dim kernel: a [1, 4] image, windows of [1, 2].
    const Attrs k12 = {attr("kernel_shape", Ints{1, 2})};
    expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k12, 1}, {dy.cast(t).view({1, 1, 1, 3}), x_nan.view({1, 1, 1, 4})})[0],
                 Tensor::from_vector<double>({1, 1, 1, 4}, {0, 11, 0, 100}).cast(t));
    expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k12, 1}, {dy.cast(t).view({1, 1, 1, 3}), x_inf.view({1, 1, 1, 4})})[0],
                 Tensor::from_vector<double>({1, 1, 1, 4}, {1, 10, 0, 100}).cast(t));
    expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, k12, 1}, {dy.cast(t).view({1, 1, 1, 3}), x.cast(t).view({1, 1, 1, 4})})[0],
                 Tensor::from_vector<double>({1, 1, 1, 4}, {0, 11, 100, 0}).cast(t));
  }
}

// With many ties, the gradient goes where MaxPool's Indices output points: values repeating
// along the rows (ties within a column), and values of 0-2 scattered by a hash, where a
// window's maximum also appears in an earlier row at a later column (the first in row-major
// order must win over the first column's). Two windows: dilated 3x2, and ResNet's 3x3 stride 2.
TEST(MaxPoolGradTest, AgreesWithTheForwardIndices) {
  const std::vector<Attrs> windows = {
      {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 1}), attr("pads", Ints{1, 0, 1, 1}),
       attr("dilations", Ints{1, 2}), attr("ceil_mode", int64_t{1})},
      {attr("kernel_shape", Ints{3, 3}), attr("strides", Ints{2, 2}), attr("pads", Ints{1, 1, 1, 1})},
  };
  for (int pattern = 0; pattern < 2; ++pattern) {
    std::vector<double> v(2 * 2 * 7 * 6);
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<double>(pattern == 0 ? i * 7 % 3 : (i * 2654435761u >> 9) % 3);
    }
    const Tensor x = Tensor::from_vector<double>({2, 2, 7, 6}, v);
    for (const Attrs& a : windows) {
      SCOPED_TRACE("pattern " + std::to_string(pattern) + ", kernel " + std::to_string(a[0].ints(1)));
      const auto forward = run_node(NodeSpec{"MaxPool", "", 17, a, 2}, {x});
      const Tensor dy = random(forward[0].shape(), 7);
      Tensor want = Tensor::zeros(DataType::Float64, x.shape());
      Tensor want32 = Tensor::zeros(DataType::Float32, x.shape());  // summed in float32, in output order
      const auto indices = forward[1].to_int64_vector("Indices");
      for (size_t j = 0; j < indices.size(); ++j) {
        want.data<double>()[indices[j]] += dy.data<double>()[j];
        want32.data<float>()[indices[j]] += static_cast<float>(dy.data<double>()[j]);
      }
      expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, a, 1}, {dy, x})[0], want, 0, 0);
      expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, a, 1}, {dy.cast(DataType::Float32), x.cast(DataType::Float32)})[0],
                   want32, 0, 0);
    }
  }
}

// 2x2 windows at stride 2 run dedicated loops (vectors of 8 or 4 float32 outputs, the last
// chunk overlapping, scalar below 4 outputs per row): their MaxPool output and gradient must be
// those of the general loops, which MaxPool with Indices runs, including the first of tied
// maxima (signed zeros tell which), NaN, -inf and the odd row and column no window reads.
TEST(MaxPoolGradTest, TwoByTwoWindowsAgreeWithTheIndicesPath) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const double pool[] = {-0.0, 0.0, -0.0, 0.0, -1.0, 1.0, 2.0, -inf};  // many ties
  const Attrs a = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  // Output widths 14 (chunks of 8), 9 (8 + overlap), 7 and 4 (chunks of 4), 3 and 1 (scalar).
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{6, 28}, {5, 19}, {4, 14}, {7, 8}, {3, 7}, {2, 2}}) {
    std::vector<double> v(static_cast<size_t>(2 * 3 * h * w));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 29 == 5 ? nan : pool[(i * 2654435761u >> 7) % 8];
    for (DataType t : {DataType::Float32, DataType::Float64}) {
      SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w) + " " + std::string(dtype_name(t)));
      const Tensor x = Tensor::from_vector<double>({2, 3, h, w}, v).cast(t);
      const auto with_indices = run_node(NodeSpec{"MaxPool", "", 17, a, 2}, {x});
      const Tensor y = run_node(NodeSpec{"MaxPool", "", 17, a, 1}, {x})[0].cast(DataType::Float64);
      const Tensor want_y = with_indices[0].cast(DataType::Float64);
      expect_close(y, want_y, 0, 0);
      for (int64_t i = 0; i < y.numel(); ++i) {
        EXPECT_EQ(std::signbit(y.data<double>()[i]), std::signbit(want_y.data<double>()[i])) << i;
      }
      const Tensor dy = random(want_y.shape(), 11);
      Tensor want = Tensor::zeros(DataType::Float64, x.shape());
      const auto indices = with_indices[1].to_int64_vector("Indices");
      for (size_t j = 0; j < indices.size(); ++j) {
        want.data<double>()[indices[j]] += dy.cast(t).cast(DataType::Float64).data<double>()[j];
      }
      expect_close(run_node(NodeSpec{"MaxPoolGrad", kInternal, 1, a, 1}, {dy.cast(t), x})[0].cast(DataType::Float64),
                   want, 0, 0);
    }
  }
}

// MaxPoolGrad -> ReluGrad over the same X (the backward pass of Relu -> MaxPool) fuses into one
// MaxPoolGrad with activation = "Relu": the fused session gives the unfused one's dX exactly, on
// the 2x2 loops (vectors and scalars) and the general ones, with NaN, signed zeros and
// negatives in X; a second reader of MaxPoolGrad's output prevents the fusion.
TEST(MaxPoolGradTest, ReluGradFusesIntoIt) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double pool[] = {-0.0, 0.0, -1.0, 0.0, 2.0, -0.0, 3.0, 1.0};  // windows whose maximum is 0
  const Attrs k2 = {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{2, 2})};
  const Attrs general = {attr("kernel_shape", Ints{3, 2}), attr("strides", Ints{2, 1}), attr("pads", Ints{1, 0, 1, 1})};
  const std::vector<std::pair<Shape, Attrs>> cases = {
      {{1, 2, 4, 28}, k2}, {{2, 2, 6, 14}, k2}, {{2, 3, 3, 7}, k2}, {{2, 2, 7, 6}, general}};
  for (const auto& [shape, attrs] : cases) {
    std::vector<double> v(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 23 == 4 ? nan : pool[(i * 2654435761u >> 7) % 8];
    for (DataType t : {DataType::Float32, DataType::Float64}) {
      SCOPED_TRACE(shape.to_string() + " " + std::string(dtype_name(t)));
      const Tensor x = Tensor::from_vector<double>(shape, v).cast(t);
      const Tensor dp = random(run_node(NodeSpec{"MaxPool", "", 17, attrs, 1}, {x})[0].shape(), 12).cast(t);
      onnx::ModelProto model = testing::empty_model("pool_relu_grad");
      auto& g = *model.mutable_graph();
      testing::typed_value(g.add_input(), "dp", static_cast<int>(t), dp.shape().to_vector());
      testing::typed_value(g.add_input(), "x", static_cast<int>(t), shape.to_vector());
      auto* pool_grad = testing::add_node(g, "MaxPoolGrad", {"dp", "x"}, {"d"});
      pool_grad->set_domain(kInternal);
      for (const auto& a : attrs) *pool_grad->add_attribute() = a;
      testing::add_node(g, "ReluGrad", {"x", "d"}, {"dx"})->set_domain(kInternal);
      g.add_output()->set_name("dx");
      onnx::GraphProto fused_graph = g;
      ASSERT_EQ(runtime::fuse_max_pool_relu_grad(fused_graph), 1);
      ASSERT_EQ(fused_graph.node_size(), 1);
      runtime::Session fused(model), unfused(model, {.fuse = false});
      const runtime::NamedTensors feeds{{"dp", dp}, {"x", x}};
      expect_close(fused.run(feeds).at("dx"), unfused.run(feeds).at("dx"), 0, 0);
      g.add_output()->set_name("d");  // MaxPoolGrad's own output wanted too: no fusion
      EXPECT_EQ(runtime::fuse_max_pool_relu_grad(g), 0);
    }
  }
}

TEST(ConvGradTest, HalfTypesComputeThroughFloat) {
  const GradCase c{"", "Conv", {}, {attr("pads", Ints{1, 1, 0, 1}), attr("strides", Ints{1, 2})}};
  const std::vector<Tensor> xs{random({2, 3, 5, 6}, 1), random({4, 3, 2, 3}, 2)};
  const Tensor r = random({2, 4, 5, 3}, 3);
  auto grad = [&](DataType t) {
    return run_node(NodeSpec{"ConvGrad", kInternal, 1, c.attrs, 3},
                    {r.cast(t), xs[0].cast(t), xs[1].cast(t)});
  };
  const auto want = grad(DataType::Float64);
  for (DataType t : {DataType::Float16, DataType::BFloat16}) {
    const auto got = grad(t);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(got[i].dtype(), t);
      expect_close(got[i].cast(DataType::Float64), want[i], 3e-2, 6e-2);
    }
  }
  const Attrs k = {attr("kernel_shape", Ints{2, 2}), attr("pads", Ints{0, 1, 1, 0})};
  std::vector<double> distinct(32);  // exact in float16: no ties appear by rounding
  for (size_t i = 0; i < distinct.size(); ++i) distinct[i] = static_cast<double>(i * 13 % 32) / 16;
  const Tensor x = Tensor::from_vector<double>({1, 2, 4, 4}, distinct);
  const Tensor dy = random({1, 2, 4, 4}, 5);
  for (const char* op : {"MaxPoolGrad", "AveragePoolGrad"}) {
    const Tensor want_pool = run_node(NodeSpec{op, kInternal, 1, k, 1}, {dy, x})[0];
    const Tensor got_pool = run_node(NodeSpec{op, kInternal, 1, k, 1},
                                     {dy.cast(DataType::Float16), x.cast(DataType::Float16)})[0];
    expect_close(got_pool.cast(DataType::Float64), want_pool, 1e-2, 1e-2);
  }
}

// Each output alone, for float64 (reference) and float32 (oneDNN), equals the full result; the
// model here has no opset_import for ai.onnxtrain, which every model gets implicitly.
TEST(ConvGradTest, OmittedOutputsAndImplicitDomain) {
  for (const char* op : {"ConvGrad", "ConvTransposeGrad"}) {
    for (DataType t : {DataType::Float64, DataType::Float32}) {
      const bool transpose = std::string(op) == "ConvTransposeGrad";
      const Tensor x = random({2, 4, 5, 5}, 1).cast(t);
      const Tensor w = random(transpose ? Shape{4, 3, 3, 3} : Shape{6, 2, 3, 3}, 2).cast(t);
      const Tensor dy = random(transpose ? Shape{2, 6, 10, 6} : Shape{2, 6, 3, 4}, 3).cast(t);
      const Attrs a = {attr("group", int64_t{2}), attr("strides", Ints{2, 1}),
                       attr("pads", Ints{1, 1, 1, 0}), attr("output_padding", Ints{1, 0})};
      const Attrs attrs(a.begin(), a.end() - (transpose ? 0 : 1));
      const NodeSpec spec{op, kInternal, 1, attrs, 3};
      const auto full = run_node(spec, {dy, x, w});
      for (int keep = 0; keep < 3; ++keep) {
        onnx::ModelProto model = node_model(spec, {dy, x, w});
        model.mutable_opset_import()->RemoveLast();  // ai.onnxtrain
        auto* graph = model.mutable_graph();
        for (int i = 0; i < 3; ++i) {
          if (i != keep) graph->mutable_node(0)->set_output(i, "");
        }
        graph->mutable_output()->DeleteSubrange(0, 3);
        graph->add_output()->set_name("out" + std::to_string(keep));
        runtime::Session session(model);
        const auto out = session.run({{"in0", dy}, {"in1", x}, {"in2", w}});
        ASSERT_EQ(out.size(), 1u);
        expect_close(out.at("out" + std::to_string(keep)), full[static_cast<size_t>(keep)], 1e-6,
                     1e-6);
      }
    }
  }
}

TEST(ConvGradTest, Errors) {
  const Tensor x = random({1, 2, 5, 5}, 1), w = random({3, 2, 3, 3}, 2);
  const auto conv_grad = [&](const Tensor& dy, const Tensor& x_, const Tensor& w_,
                             Attrs attrs = {}) {
    return run_node(NodeSpec{"ConvGrad", kInternal, 1, std::move(attrs), 3}, {dy, x_, w_});
  };
  EXPECT_NO_THROW(conv_grad(random({1, 3, 3, 3}, 3), x, w));
  EXPECT_THROW(conv_grad(random({1, 3, 4, 3}, 3), x, w), Error);  // spatial dims
  EXPECT_THROW(conv_grad(random({1, 2, 3, 3}, 3), x, w), Error);  // channels
  EXPECT_THROW(conv_grad(random({1, 3, 3}, 3), x, w), Error);  // rank
  EXPECT_THROW(conv_grad(random({1, 3, 3, 3}, 3).cast(DataType::Float32), x, w), Error);
  EXPECT_THROW(conv_grad(random({1, 3, 3, 3}, 3), x, random({3, 3, 3, 3}, 2)), Error);
  EXPECT_THROW(conv_grad(random({1, 3, 3, 3}, 3), x, w, {attr("pads", Ints{1, 1})}), Error);
  EXPECT_THROW(conv_grad(random({1, 3, 3, 3}, 3), x, w, {attr("group", int64_t{0})}), Error);
  EXPECT_THROW(run_node(NodeSpec{"ConvTransposeGrad", kInternal, 1, {}, 3},
                        {random({1, 3, 5, 5}, 3), x, random({2, 3, 3, 3}, 2)}),
               Error);  // ConvTranspose Y is [1, 3, 7, 7]
}

TEST(PoolGradTest, Errors) {
  const Tensor x = random({1, 2, 5, 5}, 1);
  const Attrs k = {attr("kernel_shape", Ints{2, 2})};
  for (const char* op : {"MaxPoolGrad", "AveragePoolGrad"}) {
    SCOPED_TRACE(op);
    const auto pool_grad = [&](const Tensor& dy, const Tensor& x_, const Attrs& attrs) {
      return run_node(NodeSpec{op, kInternal, 1, attrs, 1}, {dy, x_});
    };
    EXPECT_NO_THROW(pool_grad(random({1, 2, 4, 4}, 2), x, k));
    EXPECT_THROW(pool_grad(random({1, 2, 5, 5}, 2), x, k), Error);
    EXPECT_THROW(pool_grad(random({1, 2, 16}, 2), x, k), Error);
    EXPECT_THROW(pool_grad(random({1, 2, 4, 4}, 2).cast(DataType::Float32), x, k), Error);
    EXPECT_THROW(pool_grad(random({1, 2, 4}, 2), random({1, 2, 5}, 1), k), Error);  // X rank
    EXPECT_THROW(pool_grad(random({1, 2, 4, 4}, 2), x, {}), Error);  // no kernel_shape
    EXPECT_THROW(pool_grad(random({1, 2, 4, 4}, 2), x,
                           {attr("kernel_shape", Ints{2, 2}), attr("strides", Ints{1})}),
                 Error);
  }
  // The fused ReLU gradient: only MaxPoolGrad takes an activation, and only Relu.
  const auto activation_error = [&](const char* op, const std::string& activation) {
    try {
      run_node(NodeSpec{op, kInternal, 1, {attr("kernel_shape", Ints{2, 2}), attr("activation", activation)}, 1},
               {random({1, 2, 4, 4}, 2), x});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(activation_error("MaxPoolGrad", "Tanh").find("'activation' is 'Tanh'"), std::string::npos);
  EXPECT_NE(activation_error("AveragePoolGrad", "Relu").find("only MaxPoolGrad"), std::string::npos);
  EXPECT_EQ(activation_error("MaxPoolGrad", "Relu"), "no error");
}

// SumToShape over more than 2 x 32768 elements splits the rows between the threads, each part
// summed on its own, then added: the sums equal float64's, for kept trailing dims, summed
// trailing dims (size 1 in the target) and a target of lower rank.
TEST(SumToShapeTest, LargeInputsSplitAcrossThreadsSumLikeFloat64) {
  const Shape shape{301, 7, 40};  // 84280 elements, 2107 rows
  const Tensor g64 = testing::random_f64(shape, 3);
  for (const Shape& target : std::vector<Shape>{{7, 40}, {40}, {7, 1}, {301, 1, 40}, {1, 1, 1}}) {
    SCOPED_TRACE(target.to_string());
    const Tensor shape_tensor = Tensor::from_vector<int64_t>(Shape{static_cast<int64_t>(target.size())}, target.to_vector());
    const Tensor got = run_node(NodeSpec{"SumToShape", "ai.onnxtrain", 1}, {g64.cast(DataType::Float32), shape_tensor})[0];
    const Tensor want = run_node(NodeSpec{"SumToShape", "ai.onnxtrain", 1}, {g64, shape_tensor})[0];
    ASSERT_EQ(got.shape(), target);
    // float32 sums of up to 12040 terms of |x| < 1: a few 1e-6 relative, 1e-4 absolute at most.
    expect_close(got.cast(DataType::Float64), want, 1e-4, 1e-4);
    // float64 against a plain loop over every element.
    const auto v = g64.to_double_vector();
    std::vector<double> ref(static_cast<size_t>(target.numel()), 0.0);
    const size_t pad = shape.size() - target.size();
    for (int64_t i = 0; i < shape.numel(); ++i) {
      int64_t rest = i, offset = 0, scale = 1;
      for (size_t d = shape.size(); d-- > 0;) {
        const int64_t index = rest % shape[d];
        rest /= shape[d];
        if (d >= pad && target[d - pad] != 1) {
          offset += index * scale;
          scale *= target[d - pad];
        }
      }
      ref[static_cast<size_t>(offset)] += v[static_cast<size_t>(i)];
    }
    expect_close(want, Tensor::from_vector<double>(target, ref), 1e-12, 1e-12);
  }
}

// GatherGrad of Gather on axis 0 (an embedding) and 1, with outputs large enough for the rows to
// split between threads, indices repeated and negative: every output row sums the dY rows that
// index it in index order, so one and two threads give the same bits, and the sums match float64.
TEST(GatherGradTest, RowsSplitBetweenThreadsSumInIndexOrder) {
  struct Case {
    Shape data;
    int64_t axis;
    int64_t n;  // indices
  };
  for (const Case& c : {Case{{3000, 40}, 0, 500}, Case{{3, 2000, 12}, 1, 300}}) {
    SCOPED_TRACE(c.data.to_string());
    const int64_t dim = c.data[static_cast<size_t>(c.axis)];
    std::mt19937 rng(7);
    std::vector<int64_t> idx(static_cast<size_t>(c.n));
    // 60 rows spread over the whole dim (so over every thread's part), each indexed ~n / 60 times,
    // a quarter of them as negative indices.
    for (auto& i : idx) i = static_cast<int64_t>(rng() % 60) * (dim / 60) + 7 - (rng() % 4 == 0 ? dim : 0);
    Shape dy_shape = c.data;
    dy_shape[static_cast<size_t>(c.axis)] = c.n;
    const Tensor dy64 = random(dy_shape, 21);
    const std::vector<Tensor> in{dy64.cast(DataType::Float32), testing::i64(idx),
                                 testing::i64(std::vector<int64_t>(c.data.begin(), c.data.end()))};
    const Attrs attrs{attr("axis", c.axis)};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Tensor one = run_node(NodeSpec{"GatherGrad", kInternal, 1, attrs, 1}, in).at(0);
    omp_set_num_threads(2);
    const Tensor two = run_node(NodeSpec{"GatherGrad", kInternal, 1, attrs, 1}, in).at(0);
    omp_set_num_threads(threads);
    ASSERT_EQ(one.shape(), c.data);
    for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(one.data<float>()[i], two.data<float>()[i]) << "element " << i;
    // float64: out[b, idx[j], r] += dy[b, j, r].
    const int64_t outer = c.data.numel(0, static_cast<size_t>(c.axis));
    const int64_t inner = c.data.numel(static_cast<size_t>(c.axis) + 1, c.data.size());
    std::vector<double> want(static_cast<size_t>(c.data.numel()), 0.0);
    for (int64_t b = 0; b < outer; ++b) {
      for (int64_t j = 0; j < c.n; ++j) {
        const int64_t row = (idx[static_cast<size_t>(j)] + dim) % dim;
        for (int64_t r = 0; r < inner; ++r) {
          want[static_cast<size_t>((b * dim + row) * inner + r)] += dy64.data<double>()[(b * c.n + j) * inner + r];
        }
      }
    }
    expect_close(two, Tensor::from_vector<double>(c.data, want).cast(DataType::Float32), 1e-5, 1e-5);
  }
}

}  // namespace
}  // namespace onnxtrain
