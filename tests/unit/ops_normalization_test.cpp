// Unit tests for normalization.cpp (BatchNormalization, InstanceNormalization,
// LayerNormalization, Dropout), softmax.cpp (Softmax, LogSoftmax, Hardmax, and the backward ops
// SoftmaxGrad, LogSoftmaxGrad) and loss.cpp
// (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss): hand-computed values, the opset
// variants the backend tests miss, Dropout's random mask, and error cases.
#include <cmath>
#include <span>
#include <limits>
#include <random>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::f32;
using testing::i64;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;

std::vector<Tensor> run(const std::string& op, const std::vector<Tensor>& inputs, Attrs attrs = {}, int opset = 17,
                        int outputs = 1) {
  return run_node(NodeSpec{op, "", opset, std::move(attrs), outputs}, inputs);
}
Tensor f64(const Shape& shape, const std::vector<double>& v) { return Tensor::from_vector<double>(shape, v); }

Tensor random(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(gen);
  return f64(shape, v);
}

// Softmax (or LogSoftmax) of x [outer, n, inner] along the middle dim, written from the doc.
Tensor naive_softmax(const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool log) {
  const auto v = x.to_double_vector();
  std::vector<double> y(v.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += std::exp(v[static_cast<size_t>((o * n + k) * inner + j)]);
      for (int64_t k = 0; k < n; ++k) {
        const size_t i = static_cast<size_t>((o * n + k) * inner + j);
        y[i] = log ? v[i] - std::log(sum) : std::exp(v[i]) / sum;
      }
    }
  }
  return f64(x.shape(), y);
}

// --- Softmax family -----------------------------------------------------------------------

TEST(Softmax, SubtractsTheMaximumAndRunsAlongTheLastAxis) {
  const Tensor x = f32({2, 3}, {0, 1, 2, 1000, 1000, 1000});
  const double s = 1 + std::exp(-1.0) + std::exp(-2.0);
  expect_close(run("Softmax", {x}, {}, 13)[0],
               f32({2, 3}, {float(std::exp(-2.0) / s), float(std::exp(-1.0) / s), float(1 / s), 1 / 3.f, 1 / 3.f, 1 / 3.f}));
  expect_close(run("LogSoftmax", {x}, {}, 13)[0],
               f32({2, 3}, {float(-2 - std::log(s)), float(-1 - std::log(s)), float(-std::log(s)), float(-std::log(3.0)),
                            float(-std::log(3.0)), float(-std::log(3.0))}));
}

TEST(Softmax, InnerAxesAndTheOldTwoDimensionalCoercion) {
  const Tensor x = random({2, 3, 300}, 1);  // 300 lines per outer block: more than one tile
  expect_close(run("Softmax", {x}, {attr("axis", int64_t{1})}, 13)[0], naive_softmax(x, 2, 3, 300, false), 1e-12, 1e-14);
  expect_close(run("LogSoftmax", {x}, {attr("axis", int64_t{-3})}, 13)[0], naive_softmax(x, 1, 2, 900, true), 1e-12, 1e-12);
  // Before opset 13, axis 1 (the default) normalizes over all of [3, 300] at once.
  expect_close(run("Softmax", {x}, {}, 11)[0], naive_softmax(x, 2, 900, 1, false), 1e-12, 1e-14);
  expect_close(run("LogSoftmax", {x}, {attr("axis", int64_t{2})}, 1)[0], naive_softmax(x, 6, 300, 1, true), 1e-12, 1e-12);
  const Tensor half = run("Softmax", {x.cast(DataType::Float16)}, {}, 13)[0];
  ASSERT_EQ(half.dtype(), DataType::Float16);
  expect_close(half.cast(DataType::Float64), naive_softmax(x, 6, 300, 1, false), 2e-3, 1e-4);
}

TEST(Softmax, FloatRowsAndMaskedEntries) {
  const Tensor x = random({5, 1003}, 2);  // odd width: the vectorized loops' tails
  const Tensor x32 = x.cast(DataType::Float32);
  expect_close(run("Softmax", {x32}, {}, 13)[0].cast(DataType::Float64), naive_softmax(x, 5, 1003, 1, false), 1e-5, 1e-9);
  expect_close(run("LogSoftmax", {x32}, {}, 13)[0].cast(DataType::Float64), naive_softmax(x, 5, 1003, 1, true), 1e-5, 1e-5);
  expect_close(run("Softmax", {x32}, {attr("axis", int64_t{0})}, 13)[0].cast(DataType::Float64),
               naive_softmax(x, 1, 5, 1003, false), 1e-5, 1e-9);
  // -inf (a masked score) gets exactly 0; a NaN spreads over its line only.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  expect_close(run("Softmax", {f32({2, 3}, {0, -inf, 0, 1, nan, 1})}, {}, 13)[0], f32({2, 3}, {0.5f, 0, 0.5f, nan, nan, nan}));
  const auto log = run("LogSoftmax", {f32({1, 2}, {-inf, 0})}, {}, 13)[0].to_double_vector();
  EXPECT_EQ(log[0], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(log[1], 0.0);
}

TEST(Softmax, HardmaxMarksTheFirstMaximum) {
  const Tensor x = f32({2, 3}, {1, 3, 3, 2, 2, 1});
  expect_close(run("Hardmax", {x}, {}, 13)[0], f32({2, 3}, {0, 1, 0, 1, 0, 0}));
  expect_close(run("Hardmax", {x}, {attr("axis", int64_t{0})}, 13)[0], f32({2, 3}, {0, 1, 1, 1, 0, 0}));
  expect_close(run("Hardmax", {x}, {attr("axis", int64_t{0})}, 11)[0], f32({2, 3}, {0, 1, 0, 0, 0, 0}));
}

TEST(Softmax, RejectsABadAxis) {
  EXPECT_THROW(run("Softmax", {f32({2, 3}, {0, 0, 0, 0, 0, 0})}, {attr("axis", int64_t{2})}, 13), Error);
  EXPECT_THROW(run("Hardmax", {f32({2}, {0, 0})}, {}, 11), Error);  // default axis 1 of a 1-D input
}

// ai.onnxtrain.SoftmaxGrad / LogSoftmaxGrad (dY, Y) along the middle dim of [outer, n, inner],
// written from their formulas: dX = Y (dY - sum(dY Y)), dX = dY - exp(Y) sum(dY).
Tensor naive_softmax_grad(const Tensor& dy, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) {
  const auto g = dy.to_double_vector(), v = y.to_double_vector();
  std::vector<double> dx(v.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) {
        const size_t i = static_cast<size_t>((o * n + k) * inner + j);
        sum += log ? g[i] : g[i] * v[i];
      }
      for (int64_t k = 0; k < n; ++k) {
        const size_t i = static_cast<size_t>((o * n + k) * inner + j);
        dx[i] = log ? g[i] - std::exp(v[i]) * sum : v[i] * (g[i] - sum);
      }
    }
  }
  return f64(y.shape(), dx);
}

Tensor softmax_grad(const std::string& op, const Tensor& dy, const Tensor& y, Attrs attrs = {}) {
  return run_node(NodeSpec{op, "ai.onnxtrain", 1, std::move(attrs), 1}, {dy, y})[0];
}

TEST(SoftmaxGrad, RowsTilesAndHalfPrecisionFollowTheFormulas) {
  for (const bool log : {false, true}) {
    const std::string op = log ? "LogSoftmaxGrad" : "SoftmaxGrad";
    SCOPED_TRACE(op);
    // The rows path (last axis, an odd width for the vectorized loops' tails) and the tiles path
    // (a middle axis with 300 lines per outer block: more than one tile).
    const Tensor dy = random({5, 1003}, 3), y = naive_softmax(random({5, 1003}, 4), 5, 1003, 1, log);
    expect_close(softmax_grad(op, dy, y), naive_softmax_grad(dy, y, 5, 1003, 1, log), 1e-12, 1e-12);
    expect_close(softmax_grad(op, dy.cast(DataType::Float32), y.cast(DataType::Float32)).cast(DataType::Float64),
                 naive_softmax_grad(dy.cast(DataType::Float32).cast(DataType::Float64),
                                    y.cast(DataType::Float32).cast(DataType::Float64), 5, 1003, 1, log),
                 1e-5, 1e-5);
    const Tensor dy3 = random({2, 3, 300}, 5), y3 = naive_softmax(random({2, 3, 300}, 6), 2, 3, 300, log);
    expect_close(softmax_grad(op, dy3, y3, {attr("axis", int64_t{1})}), naive_softmax_grad(dy3, y3, 2, 3, 300, log),
                 1e-12, 1e-12);
    expect_close(softmax_grad(op, dy3, y3, {attr("axis", int64_t{-3})}), naive_softmax_grad(dy3, y3, 1, 2, 900, log),
                 1e-12, 1e-12);
    const Tensor half = softmax_grad(op, dy3.cast(DataType::Float16), y3.cast(DataType::Float16));
    ASSERT_EQ(half.dtype(), DataType::Float16);
    expect_close(half.cast(DataType::Float64),
                 naive_softmax_grad(dy3.cast(DataType::Float16).cast(DataType::Float64),
                                    y3.cast(DataType::Float16).cast(DataType::Float64), 6, 300, 1, log),
                 1e-2, 1e-2);
  }
}

TEST(SoftmaxGrad, RejectsMismatchedInputsAndABadAxis) {
  const Tensor a = f32({2, 3}, {0, 0, 0, 0, 0, 0});
  EXPECT_THROW(softmax_grad("SoftmaxGrad", a, f32({3, 2}, {0, 0, 0, 0, 0, 0})), Error);
  EXPECT_THROW(softmax_grad("SoftmaxGrad", a, a.cast(DataType::Float64)), Error);
  EXPECT_THROW(softmax_grad("LogSoftmaxGrad", a, a, {attr("axis", int64_t{2})}), Error);
}

// --- BatchNormalization -------------------------------------------------------------------

TEST(BatchNorm, InferenceUsesTheGivenStatistics) {
  const Tensor x = f32({1, 2, 1, 2}, {1, 3, -1, 1});
  const std::vector<Tensor> in{x, f32({2}, {2, 1}), f32({2}, {0, 1}), f32({2}, {2, 0}), f32({2}, {4, 1})};
  const Tensor want = f32({1, 2, 1, 2}, {-1, 1, 0, 2});
  expect_close(run("BatchNormalization", in, {attr("epsilon", 0.0f)}, 15)[0], want);
  expect_close(run("BatchNormalization", in, {attr("epsilon", 0.0f), attr("is_test", int64_t{1})}, 6)[0], want);
  expect_close(run("BatchNormalization", in, {attr("epsilon", 0.0f)}, 9)[0], want);  // one output: inference
  // [N, C] without spatial dims.
  const std::vector<Tensor> in2{f32({2, 2}, {1, -1, 3, 1}), in[1], in[2], in[3], in[4]};
  expect_close(run("BatchNormalization", in2, {attr("epsilon", 0.0f)}, 15)[0], f32({2, 2}, {-1, 0, 1, 2}));
}

TEST(BatchNorm, TrainingUsesBatchStatisticsAndUpdatesTheRunningOnes) {
  // One channel over N = 2, D = 2: mean 3, population variance (4 + 1 + 0 + 9) / 4 = 3.5.
  const Tensor x = f64({2, 1, 2}, {1, 2, 3, 6});
  const std::vector<Tensor> in{x, f64({1}, {2}), f64({1}, {1}), f64({1}, {10}), f64({1}, {20})};
  const double inv = 1 / std::sqrt(3.5 + 1e-5);
  const Tensor want_y = f64({2, 1, 2}, {-2 * inv * 2 + 1, -1 * inv * 2 + 1, 1, 3 * inv * 2 + 1});
  const Attrs train{attr("training_mode", int64_t{1}), attr("momentum", 0.75f)};
  auto out = run("BatchNormalization", in, train, 15, 3);
  expect_close(out[0], want_y);
  expect_close(out[1], f64({1}, {10 * 0.75 + 3 * 0.25}));
  expect_close(out[2], f64({1}, {20 * 0.75 + 3.5 * 0.25}));
  // Opset 9-13: training is asking for outputs 1-4; saved_mean / saved_var are the batch's.
  out = run("BatchNormalization", in, {attr("momentum", 0.75f)}, 9, 5);
  expect_close(out[0], want_y);
  expect_close(out[1], f64({1}, {10 * 0.75 + 3 * 0.25}));
  expect_close(out[2], f64({1}, {20 * 0.75 + 3.5 * 0.25}));
  expect_close(out[3], f64({1}, {3}));
  expect_close(out[4], f64({1}, {3.5}));
  // Opset 6: is_test = 0 (the default) is training even with Y alone.
  expect_close(run("BatchNormalization", in, {}, 6)[0], want_y);
  // A 1-D input of size N has one channel.
  expect_close(run("BatchNormalization", {f64({4}, {1, 2, 3, 6}), in[1], in[2], in[3], in[4]}, train, 15, 3)[0],
               f64({4}, {-2 * inv * 2 + 1, -1 * inv * 2 + 1, 1, 3 * inv * 2 + 1}));
}

// Batch statistics of many channels against a per-channel loop in double, on both sides of the
// plane size below which they are summed column by column (batch_norm_channels.h kColumnPlanes:
// 64), with values far from 0 (1000 + noise), where a one-pass variance would lose digits.
TEST(BatchNorm, TrainingStatisticsOfSmallAndLargePlanes) {
  // {16, 520, 2, 2}: small planes in two ranges of 260 channels on two threads (batch_norm_channels.h
  // for_channel_ranges).
  for (const Shape& shape : {Shape{5, 7, 3, 2}, Shape{4, 33, 1, 1}, Shape{6, 5}, Shape{3, 4, 9, 9}, Shape{2, 3, 70},
                             Shape{16, 520, 2, 2}}) {
    SCOPED_TRACE(shape.to_string());
    Tensor x = random(shape, 11);
    for (double& v : std::span(x.data<double>(), static_cast<size_t>(x.numel()))) v += 1000;
    const int64_t n = shape[0], c = shape[1], size = x.numel() / (n * c);
    std::vector<double> mean(static_cast<size_t>(c), 0.0), var(static_cast<size_t>(c), 0.0);
    const auto at = [&](int64_t i, int64_t ch, int64_t e) { return x.data<double>()[(i * c + ch) * size + e]; };
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < size; ++e) mean[static_cast<size_t>(ch)] += at(i, ch, e) / static_cast<double>(n * size);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < size; ++e) {
          const double d = at(i, ch, e) - mean[static_cast<size_t>(ch)];
          var[static_cast<size_t>(ch)] += d * d / static_cast<double>(n * size);
        }
    }
    std::vector<double> want_y;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t e = 0; e < size; ++e) {
          const auto k = static_cast<size_t>(ch);
          want_y.push_back((at(i, ch, e) - mean[k]) / std::sqrt(var[k] + 1e-5) * 0.5 + 0.25);
        }
    const Tensor ones = f64({c}, std::vector<double>(static_cast<size_t>(c), 1.0));
    const std::vector<Tensor> in{x, f64({c}, std::vector<double>(static_cast<size_t>(c), 0.5)),
                                 f64({c}, std::vector<double>(static_cast<size_t>(c), 0.25)), ones, ones};
    const auto out = run("BatchNormalization", in, {attr("momentum", 0.0f)}, 9, 5);
    expect_close(out[3], f64({c}, mean), 1e-13, 1e-13);
    expect_close(out[4], f64({c}, var), 1e-9, 1e-12);
    expect_close(out[0], f64(shape, want_y), 1e-9, 1e-9);
    std::vector<Tensor> in32;
    for (const Tensor& t : in) in32.push_back(t.cast(DataType::Float32));
    const auto out32 = run("BatchNormalization", in32, {attr("momentum", 0.0f)}, 9, 5);
    expect_close(out32[3].cast(DataType::Float64), f64({c}, mean), 1e-6, 1e-6);
    expect_close(out32[4].cast(DataType::Float64), f64({c}, var), 1e-3, 1e-4);
  }
}

TEST(BatchNorm, RejectsWhatItCannotDo) {
  const Tensor x = f32({1, 2, 2}, {1, 2, 3, 4});
  const Tensor c = f32({2}, {1, 1});
  EXPECT_THROW(run("BatchNormalization", {x, c, c, c, c}, {attr("spatial", int64_t{0})}, 7), Error);
  EXPECT_THROW(run("BatchNormalization", {x, c, c, c, c}, {}, 15, 3), Error);  // running stats need training_mode
  EXPECT_THROW(run("BatchNormalization", {x, f32({3}, {1, 1, 1}), c, c, c}, {}, 15), Error);
  EXPECT_THROW(run("BatchNormalization", {Tensor::scalar(1.0f), c, c, c, c}, {}, 15), Error);
}

// --- InstanceNormalization ----------------------------------------------------------------

TEST(InstanceNorm, NormalizesEachPlane) {
  const Tensor x = f32({1, 2, 2}, {1, 3, 0, 4});  // plane means 2, 2; variances 1, 4
  const auto y = run("InstanceNormalization", {x, f32({2}, {1, 2}), f32({2}, {0, 1})}, {attr("epsilon", 0.0f)}, 6)[0];
  expect_close(y, f32({1, 2, 2}, {-1, 1, -1, 3}));
  EXPECT_THROW(run("InstanceNormalization", {x, f32({1}, {1}), f32({2}, {0, 1})}, {}, 6), Error);
}

// --- LayerNormalization -------------------------------------------------------------------

TEST(LayerNorm, NormalizesTheTrailingDimsAndKeepsThemInTheStatistics) {
  const Tensor x = f32({2, 2}, {1, 3, 0, 4});
  auto out = run("LayerNormalization", {x, f32({2}, {1, 2}), f32({2}, {0, 1})}, {attr("epsilon", 0.0f)}, 17, 3);
  expect_close(out[0], f32({2, 2}, {-1, 3, -1, 3}));
  expect_close(out[1], f32({2, 1}, {2, 2}));
  expect_close(out[2], f32({2, 1}, {1, 0.5f}));
  // axis 0: one row of all four values (mean 2, variance 2.5); no B; a Scale of [1] broadcasts.
  out = run("LayerNormalization", {x, f32({1}, {2})}, {attr("axis", int64_t{-2}), attr("epsilon", 0.0f)}, 17, 3);
  const float inv = float(1 / std::sqrt(2.5));
  expect_close(out[0], f32({2, 2}, {-2 * inv, 2 * inv, -4 * inv, 4 * inv}));
  expect_close(out[1], f32({1, 1}, {2}));
  expect_close(out[2], f32({1, 1}, {inv}));
  // float64 data still stashes float32 statistics.
  out = run("LayerNormalization", {x.cast(DataType::Float64), f64({2}, {1, 1})}, {}, 17, 3);
  EXPECT_EQ(out[0].dtype(), DataType::Float64);
  EXPECT_EQ(out[1].dtype(), DataType::Float32);
}

// float32 rows long enough for the kernel's vectorized partial sums (32 elements a block) and a
// tail, against the statistics and values computed in float64 from the float32 inputs: the
// values within float32 rounding, the stashed mean and inverse deviation too. An offset of 100
// makes the variance small next to the mean, where a lost element or block would show.
TEST(LayerNorm, LongFloat32RowsMatchFloat64Statistics) {
  for (int64_t n : {31, 32, 37, 256, 300}) {
    SCOPED_TRACE("row of " + std::to_string(n));
    const int64_t rows = 6;
    const Tensor x64 = random(Shape{rows, n}, 7);
    std::vector<double> xs = x64.to_double_vector();
    for (size_t i = 0; i < xs.size(); ++i) xs[i] += (i % 3 == 0) ? 100.0 : 0.0;
    const Tensor x = f64(Shape{rows, n}, xs).cast(DataType::Float32);
    const std::vector<double> xf = x.to_double_vector();  // the float32 inputs, exactly
    const Tensor scale = random(Shape{n}, 8).cast(DataType::Float32);
    const Tensor bias = random(Shape{n}, 9).cast(DataType::Float32);
    const std::vector<double> sv = scale.to_double_vector(), bv = bias.to_double_vector();
    const auto out = run("LayerNormalization", {x, scale, bias}, {attr("epsilon", 1e-5f)}, 17, 3);
    std::vector<double> want(xf.size()), mean(static_cast<size_t>(rows)), inv(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (int64_t i = 0; i < n; ++i) m += xf[static_cast<size_t>(r * n + i)];
      m /= static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i) v += (xf[static_cast<size_t>(r * n + i)] - m) * (xf[static_cast<size_t>(r * n + i)] - m);
      const double d = 1 / std::sqrt(v / static_cast<double>(n) + 1e-5);
      mean[static_cast<size_t>(r)] = m;
      inv[static_cast<size_t>(r)] = d;
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(r * n + i);
        want[k] = (xf[k] - m) * d * sv[static_cast<size_t>(i)] + bv[static_cast<size_t>(i)];
      }
    }
    expect_close(out[0], f64(Shape{rows, n}, want).cast(DataType::Float32), 1e-4, 1e-4);
    expect_close(out[1], f64(Shape{rows, 1}, mean).cast(DataType::Float32), 1e-6, 1e-6);
    expect_close(out[2], f64(Shape{rows, 1}, inv).cast(DataType::Float32), 1e-4, 1e-6);
  }
}

TEST(LayerNorm, RejectsBadAttributesAndShapes) {
  const Tensor x = f32({2, 2}, {1, 3, 0, 4});
  EXPECT_THROW(run("LayerNormalization", {x, f32({2}, {1, 1})}, {attr("axis", int64_t{3})}), Error);
  EXPECT_THROW(run("LayerNormalization", {x, f32({2}, {1, 1})}, {attr("stash_type", int64_t{11})}), Error);
  EXPECT_THROW(run("LayerNormalization", {x, f32({3}, {1, 1, 1})}), Error);
}

// --- Dropout ------------------------------------------------------------------------------

TEST(Dropout, OutsideTrainingIsIdentityWithAnAllTrueMask) {
  const Tensor x = f32({3}, {-1, 0, 2});
  auto out = run("Dropout", {x}, {}, 13, 2);
  expect_close(out[0], x);
  ASSERT_EQ(out[1].dtype(), DataType::Bool);
  expect_close(out[1], Tensor::from_vector<bool>({3}, {true, true, true}));
  out = run("Dropout", {x, Tensor::scalar(0.9f), Tensor::scalar(false)}, {}, 13, 2);
  expect_close(out[0], x);
  expect_close(run("Dropout", {x}, {attr("ratio", 0.5f)}, 11)[0], x);
  // Training with ratio 0 keeps everything.
  out = run("Dropout", {x, Tensor::scalar(0.0f), Tensor::scalar(true)}, {}, 13, 2);
  expect_close(out[0], x);
  expect_close(out[1], Tensor::from_vector<bool>({3}, {true, true, true}));
}

TEST(Dropout, TrainingKeepsOneMinusRatioAndScales) {
  const int64_t n = 100000;
  const Tensor x = Tensor::from_vector<float>({n}, std::vector<float>(static_cast<size_t>(n), 2.0f));
  const std::vector<Tensor> in{x, Tensor::scalar(0.3f), Tensor::scalar(true)};
  const Attrs seed{attr("seed", int64_t{42})};
  auto out = run("Dropout", in, seed, 13, 2);
  ASSERT_EQ(out[1].dtype(), DataType::Bool);
  const auto y = out[0].to_double_vector();
  const auto mask = out[1].to_double_vector();
  double kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    kept += mask[i];
    EXPECT_NEAR(y[i], mask[i] != 0 ? 2.0 / 0.7 : 0.0, 1e-6) << "element " << i;
  }
  EXPECT_NEAR(kept / static_cast<double>(n), 0.7, 0.01);  // standard error 0.0015
  // The same seed and run index give the same mask; the next run of a session a new one.
  EXPECT_EQ(run("Dropout", in, seed, 13, 2)[1].to_double_vector(), mask);
  EXPECT_NE(run("Dropout", in, {attr("seed", int64_t{43})}, 13, 2)[1].to_double_vector(), mask);
  runtime::Session session(testing::node_model(NodeSpec{"Dropout", "", 13, seed, 2}, in));
  const runtime::NamedTensors feeds{{"in0", in[0]}, {"in1", in[1]}, {"in2", in[2]}};
  EXPECT_EQ(session.run(feeds).at("out1").to_double_vector(), mask);
  EXPECT_NE(session.run(feeds).at("out1").to_double_vector(), mask);
  // Without a seed attribute the session seed decides.
  const auto unseeded = testing::node_model(NodeSpec{"Dropout", "", 13, {}, 2}, in);
  runtime::Session s1(unseeded, {.seed = 1}), s2(unseeded, {.seed = 2}), s1b(unseeded, {.seed = 1});
  const auto m1 = s1.run(feeds).at("out1").to_double_vector();
  EXPECT_EQ(s1b.run(feeds).at("out1").to_double_vector(), m1);
  EXPECT_NE(s2.run(feeds).at("out1").to_double_vector(), m1);
}

TEST(Dropout, OldOpsetsTrainWithIsTestZeroAndTypeTheMaskLikeTheData) {
  const Tensor x = Tensor::from_vector<float>({1000}, std::vector<float>(1000, 1.0f));
  auto out = run("Dropout", {x}, {attr("ratio", 0.5f)}, 6, 2);
  ASSERT_EQ(out[1].dtype(), DataType::Float32);
  const auto y = out[0].to_double_vector(), mask = out[1].to_double_vector();
  double kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    kept += mask[i];
    EXPECT_EQ(y[i], 2.0 * mask[i]);
  }
  EXPECT_GT(kept, 400);
  EXPECT_LT(kept, 600);
  expect_close(run("Dropout", {x}, {attr("is_test", int64_t{1})}, 6)[0], x);
}

TEST(Dropout, RejectsABadRatioOrTrainingMode) {
  const Tensor x = f32({2}, {1, 2});
  EXPECT_THROW(run("Dropout", {x, Tensor::scalar(1.0f), Tensor::scalar(true)}, {}, 13), Error);
  EXPECT_THROW(run("Dropout", {x, Tensor::scalar(-0.1f), Tensor::scalar(true)}, {}, 13), Error);
  EXPECT_THROW(run("Dropout", {x, Tensor::scalar(0.5f), Tensor::scalar(1.0f)}, {}, 13), Error);
  EXPECT_THROW(run("Dropout", {x, f32({2}, {0.5f, 0.5f}), Tensor::scalar(true)}, {}, 13), Error);
  EXPECT_THROW(run("Dropout", {x}, {attr("ratio", 1.0f)}, 6), Error);
}

// --- Losses -------------------------------------------------------------------------------

TEST(Loss, NllLossFollowsTheDocExamples) {
  const Tensor input = f32({2, 3, 2}, {1, 2, 2, 2, 3, 2, 0, 1, 2, 2, 1, 2});
  const Tensor target = i64({2, 2}, {2, 1, 0, 2});
  const Tensor weight = f32({3}, {0.2f, 0.3f, 0.1f});
  const Attrs none{attr("reduction", std::string("none"))};
  expect_close(run("NegativeLogLikelihoodLoss", {input, target}, none, 13)[0], f32({2, 2}, {-3, -2, -0, -2}));
  expect_close(run("NegativeLogLikelihoodLoss", {input, target, weight}, {attr("reduction", std::string("sum"))}, 13)[0],
               Tensor::scalar(-1.1f));
  expect_close(run("NegativeLogLikelihoodLoss", {input, target, weight}, {}, 13)[0], Tensor::scalar(-1.1f / 0.7f));
  // An int32 target; class 2 ignored: the mean divides by the 2 samples left.
  const Tensor target32 = Tensor::from_vector<int32_t>({2, 2}, {2, 1, 0, 2});
  expect_close(run("NegativeLogLikelihoodLoss", {input, target32}, {attr("ignore_index", int64_t{2})}, 12)[0],
               Tensor::scalar(-1.0f));
}

TEST(Loss, SoftmaxCrossEntropyWeightsAndIgnoredLabels) {
  const Tensor scores = f64({2, 3}, {0, 1, 2, 3, 3, 3});
  const double l0 = std::log(1 + std::exp(1.0) + std::exp(2.0)), l1 = std::log(3.0);
  const Attrs none{attr("reduction", std::string("none"))};
  auto out = run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, 2})}, none, 13, 2);
  expect_close(out[0], f64({2}, {l0, l1}));
  expect_close(out[1], f64({2, 3}, {-l0, 1 - l0, 2 - l0, -l1, -l1, -l1}));
  expect_close(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, 2})}, {}, 13)[0], Tensor::scalar((l0 + l1) / 2));
  const Tensor w = f64({3}, {0.5, 1, 2});
  expect_close(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, 2}), w}, {}, 13)[0],
               Tensor::scalar((0.5 * l0 + 2 * l1) / 2.5));
  // Label -1 == ignore_index: loss 0, and left out of the mean's denominator.
  const Attrs ignore{attr("ignore_index", int64_t{-1})};
  expect_close(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {-1, 2}), w}, ignore, 13)[0], Tensor::scalar(l1));
  Attrs ignore_none = ignore;
  ignore_none.push_back(none[0]);
  expect_close(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {-1, 2})}, ignore_none, 13)[0], f64({2}, {0, l1}));
}

TEST(Loss, SoftmaxCrossEntropyOverExtraDims) {
  const Tensor scores = random({2, 4, 3, 5}, 7);
  std::vector<int64_t> labels(30);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i * 7 % 4);
  const Tensor logp = naive_softmax(scores, 2, 4, 15, true);
  const auto lp = logp.to_double_vector();
  std::vector<double> want(30);
  double sum = 0;
  for (size_t i = 0; i < 30; ++i) {
    const size_t n = i / 15, j = i % 15;
    want[i] = -lp[(n * 4 + static_cast<size_t>(labels[i])) * 15 + j];
    sum += want[i];
  }
  auto out = run("SoftmaxCrossEntropyLoss", {scores, i64({2, 3, 5}, labels)}, {attr("reduction", std::string("none"))}, 13, 2);
  expect_close(out[0], f64({2, 3, 5}, want), 1e-12, 1e-12);
  expect_close(out[1], logp, 1e-12, 1e-12);
  expect_close(run("SoftmaxCrossEntropyLoss", {scores, i64({2, 3, 5}, labels)}, {attr("reduction", std::string("sum"))}, 13)[0],
               Tensor::scalar(sum), 1e-12, 1e-12);
}

TEST(Loss, RejectsBadLabelsAndAttributes) {
  const Tensor scores = f32({2, 3}, {0, 1, 2, 3, 3, 3});
  EXPECT_THROW(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, 3})}, {}, 13), Error);
  EXPECT_THROW(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, -1})}, {}, 13), Error);  // no ignore_index
  EXPECT_THROW(run("SoftmaxCrossEntropyLoss", {scores, i64({3}, {0, 1, 2})}, {}, 13), Error);
  EXPECT_THROW(run("SoftmaxCrossEntropyLoss", {scores, f32({2}, {0, 1})}, {}, 13), Error);
  EXPECT_THROW(run("SoftmaxCrossEntropyLoss", {scores, i64({2}, {0, 1}), f32({2}, {1, 1})}, {}, 13), Error);
  EXPECT_THROW(run("NegativeLogLikelihoodLoss", {scores, i64({2}, {0, 1})}, {attr("reduction", std::string("avg"))}, 13),
               Error);
  EXPECT_THROW(run("NegativeLogLikelihoodLoss", {f32({3}, {0, 1, 2}), i64({1}, {0})}, {}, 13), Error);
}

}  // namespace
}  // namespace onnxtrain
