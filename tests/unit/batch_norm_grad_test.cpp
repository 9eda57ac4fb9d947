// Unit tests for ai.onnxtrain.BatchNormalizationGrad and SyncBatchNormalizationGrad with one
// process (ops/sync_batch_norm.cpp): dX, dscale and dB against a float64 reference written from
// the formula of BatchNormalization's training-mode gradient, for shapes the vectorized
// per-channel loops must get right (N = 1, 1-D X, [N, C] with spatial size 1, 1x1 planes,
// channel counts that are no multiple of the vector width, planes with a remainder).
#include <cmath>
#include <random>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;

// Values exactly representable in float32, so the float32 and float64 runs see the same data.
std::vector<double> random_values(int64_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(dist(gen));
  return v;
}

struct Reference {
  std::vector<double> dx, dscale, db, mean, var;
  // Bounds of rounding errors: the largest sum of the absolute values of dX's three terms, and
  // of |dy| + |dy xhat| summed over a channel.
  double dx_terms = 0, sum_terms = 0;
};

// BatchNormalization's training-mode gradient in float64, element by element: per channel c over
// its m elements, mean and population variance, xhat = (x - mean) / sqrt(var + eps),
// dB = sum(dy), dscale = sum(dy xhat), dX = scale / sqrt(var + eps) (dy - dB / m - xhat dscale / m).
Reference reference(const Shape& shape, const std::vector<double>& x, const std::vector<double>& dy,
                    const std::vector<double>& scale, double eps) {
  const int64_t batch = shape[0], channels = shape.size() == 1 ? 1 : shape[1];
  const int64_t size = static_cast<int64_t>(x.size()) / (batch * channels);
  const double m = static_cast<double>(batch * size);
  Reference r;
  r.dx.resize(x.size());
  for (int64_t c = 0; c < channels; ++c) {
    auto each = [&](auto f) {
      for (int64_t n = 0; n < batch; ++n) {
        for (int64_t i = 0; i < size; ++i) f(static_cast<size_t>((n * channels + c) * size + i));
      }
    };
    double mean = 0, var = 0, db = 0, dscale = 0;
    each([&](size_t e) { mean += x[e]; });
    mean /= m;
    each([&](size_t e) { var += (x[e] - mean) * (x[e] - mean); });
    var /= m;
    const double invstd = 1 / std::sqrt(var + eps);
    double abs_sum = 0;
    each([&](size_t e) {
      db += dy[e];
      dscale += dy[e] * (x[e] - mean) * invstd;
      abs_sum += std::abs(dy[e]) + std::abs(dy[e] * (x[e] - mean) * invstd);
    });
    r.sum_terms = std::max(r.sum_terms, abs_sum);
    const double a = std::abs(scale[static_cast<size_t>(c)] * invstd);
    each([&](size_t e) {
      const double xhat = (x[e] - mean) * invstd;
      r.dx[e] = scale[static_cast<size_t>(c)] * invstd * (dy[e] - db / m - xhat * dscale / m);
      r.dx_terms = std::max(r.dx_terms, a * (std::abs(dy[e]) + std::abs(db / m) + std::abs(xhat * dscale / m)));
    });
    r.mean.push_back(mean);
    r.var.push_back(var);
    r.dscale.push_back(dscale);
    r.db.push_back(db);
  }
  return r;
}

template <class T>
Tensor tensor(const Shape& shape, const std::vector<double>& v) {
  return Tensor::from_vector<T>(shape, std::vector<T>(v.begin(), v.end()));
}

std::vector<Tensor> run_grad(const std::string& op, const std::vector<Tensor>& inputs, float eps) {
  return run_node(NodeSpec{op, "ai.onnxtrain", 1, {attr("epsilon", eps)}, 3}, inputs);
}

// {16, 520, 2, 2}: small planes in two ranges of channels on two threads (batch_norm_channels.h
// for_channel_ranges: 260 each).
const std::vector<Shape> kShapes{{1, 13, 5, 3}, {7}, {6, 11}, {4, 3, 1, 1}, {1, 5, 1, 1}, {2, 19, 9},
                                 {3, 5, 7, 6}, {8, 17, 33}, {5, 64, 4, 4}, {16, 520, 2, 2}};

TEST(BatchNormalizationGrad, MatchesFloat64ReferenceOnOddShapes) {
  uint32_t seed = 1;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE(Tensor(DataType::Float32, shape).description());
    const int64_t channels = shape.size() == 1 ? 1 : shape[1];
    // An offset mean makes x - mean matter; dy with a nonzero mean makes mean(dy) matter.
    const auto x = random_values(shape.numel(), seed++, 1.0, 4.0);
    const auto dy = random_values(shape.numel(), seed++, -0.5, 1.5);
    const auto scale = random_values(channels, seed++, -2.0, 2.0);
    const Reference want = reference(shape, x, dy, scale, 1e-3f);
    const Shape c{channels};
    for (const char* op : {"BatchNormalizationGrad", "SyncBatchNormalizationGrad"}) {
      SCOPED_TRACE(op);
      const auto d = run_grad(op, {tensor<double>(shape, dy), tensor<double>(shape, x), tensor<double>(c, scale)}, 1e-3f);
      // float64: other summation orders and dX's terms grouped otherwise, a few ulps of the terms.
      expect_close(d[0], tensor<double>(shape, want.dx), 0, 1e-14 * want.dx_terms);
      expect_close(d[1], tensor<double>(c, want.dscale), 0, 1e-14 * want.sum_terms);
      expect_close(d[2], tensor<double>(c, want.db), 0, 1e-14 * want.sum_terms);
      const auto f = run_grad(op, {tensor<float>(shape, dy), tensor<float>(shape, x), tensor<float>(c, scale)}, 1e-3f);
      // float32: dX is a dy + b (x - mean) + k in float, a few float ulps (6e-8) of its terms;
      // the sums accumulate in double and are rounded once to float.
      expect_close(f[0], tensor<float>(shape, want.dx), 0, 5e-7 * want.dx_terms);
      expect_close(f[1], tensor<float>(c, want.dscale), 1e-7, 1e-14 * want.sum_terms);
      expect_close(f[2], tensor<float>(c, want.db), 1e-7, 1e-14 * want.sum_terms);
    }
  }
}

// With the statistics as inputs 3 and 4 the kernel uses them instead of computing them again.
TEST(BatchNormalizationGrad, UsesGivenStatistics) {
  const Shape shape{3, 5, 2, 3};
  const auto x = random_values(shape.numel(), 11, -1.0, 3.0);
  const auto dy = random_values(shape.numel(), 12, -1.0, 1.0);
  const auto scale = random_values(5, 13, 0.5, 1.5);
  const Reference want = reference(shape, x, dy, scale, 1e-5f);
  const Shape c{5};
  const auto d = run_grad("BatchNormalizationGrad",
                          {tensor<double>(shape, dy), tensor<double>(shape, x), tensor<double>(c, scale),
                           tensor<double>(c, want.mean), tensor<double>(c, want.var)},
                          1e-5f);
  expect_close(d[0], tensor<double>(shape, want.dx), 0, 1e-14 * want.dx_terms);
  expect_close(d[1], tensor<double>(c, want.dscale), 0, 1e-14 * want.sum_terms);
  // Statistics that are not the batch's change the result: they are read, not recomputed.
  std::vector<double> shifted = want.mean;
  for (double& m : shifted) m += 0.5;
  const auto other = run_grad("BatchNormalizationGrad",
                              {tensor<double>(shape, dy), tensor<double>(shape, x), tensor<double>(c, scale),
                               tensor<double>(c, shifted), tensor<double>(c, want.var)},
                              1e-5f);
  EXPECT_GT(std::abs(other[1].to_double_vector()[0] - want.dscale[0]), 1e-3);
}

TEST(BatchNormalizationGrad, RejectsBadInputs) {
  const Tensor x = tensor<float>({2, 3, 2}, random_values(12, 1, 0, 1));
  const Tensor scale = tensor<float>({3}, {1, 1, 1});
  EXPECT_THROW(run_grad("BatchNormalizationGrad", {tensor<float>({2, 3, 3}, random_values(18, 2, 0, 1)), x, scale}, 1e-5f),
               Error);
  EXPECT_THROW(run_grad("BatchNormalizationGrad", {x, x, tensor<float>({2}, {1, 1})}, 1e-5f), Error);
  EXPECT_THROW(run_grad("BatchNormalizationGrad", {Tensor::scalar(1.0f), Tensor::scalar(1.0f), scale}, 1e-5f), Error);
  EXPECT_THROW(run_grad("BatchNormalizationGrad", {tensor<float>({0, 3}, {}), tensor<float>({0, 3}, {}), scale}, 1e-5f),
               Error);  // no batch statistics
}

}  // namespace
}  // namespace onnxtrain
