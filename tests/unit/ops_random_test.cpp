#include <cmath>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::NodeSpec;

struct Moments {
  double mean = 0, stddev = 0, min = 1e300, max = -1e300;
};

Moments moments(const Tensor& t) {
  Moments m;
  const auto v = t.to_double_vector();
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.stddev += (x - m.mean) * (x - m.mean);
  m.stddev = std::sqrt(m.stddev / static_cast<double>(v.size()));
  return m;
}

TEST(Random, NormalHasTheRequestedMoments) {
  NodeSpec spec{.op_type = "RandomNormal",
                .attributes = {attr("shape", std::vector<int64_t>{400, 250}), attr("mean", 2.0f), attr("scale", 0.5f)}};
  const Tensor t = testing::run_node(spec, {})[0];
  EXPECT_EQ(t.dtype(), DataType::Float32);
  const Moments m = moments(t);
  // 100000 samples: the standard error of the mean is 0.5 / sqrt(1e5) = 0.0016.
  EXPECT_NEAR(m.mean, 2.0, 0.01);
  EXPECT_NEAR(m.stddev, 0.5, 0.01);
}

TEST(Random, UniformStaysInRangeAndIsFlat) {
  NodeSpec spec{.op_type = "RandomUniform",
                .attributes = {attr("shape", std::vector<int64_t>{100000}), attr("low", -3.0f), attr("high", 1.0f),
                               attr("dtype", int64_t{11})}};
  const Tensor t = testing::run_node(spec, {})[0];
  EXPECT_EQ(t.dtype(), DataType::Float64);
  const Moments m = moments(t);
  EXPECT_GE(m.min, -3.0);
  EXPECT_LT(m.max, 1.0);
  EXPECT_NEAR(m.mean, -1.0, 0.02);
  EXPECT_NEAR(m.stddev, 4.0 / std::sqrt(12.0), 0.01);
}

TEST(Random, SameSeedSameNumbersNewRunNewNumbers) {
  NodeSpec spec{.op_type = "RandomUniformLike", .attributes = {attr("seed", 7.0f)}};
  const Tensor like = Tensor::zeros(DataType::Float32, {3, 4});
  const auto a = testing::run_node(spec, {like})[0].to_double_vector();
  const auto b = testing::run_node(spec, {like})[0].to_double_vector();
  EXPECT_EQ(a, b);  // a fresh session replays run 0
  runtime::Session session(testing::node_model(spec, {like}));
  const auto first = session.run({{"in0", like}}).at("out0").to_double_vector();
  const auto second = session.run({{"in0", like}}).at("out0").to_double_vector();
  EXPECT_EQ(first, a);
  EXPECT_NE(first, second);
  // The session seed decides when there is no seed attribute.
  NodeSpec unseeded{.op_type = "RandomNormalLike"};
  runtime::Session s1(testing::node_model(unseeded, {like}), {.seed = 1});
  runtime::Session s2(testing::node_model(unseeded, {like}), {.seed = 2});
  EXPECT_NE(s1.run({{"in0", like}}).at("out0").to_double_vector(),
            s2.run({{"in0", like}}).at("out0").to_double_vector());
}

TEST(Random, BernoulliDrawsOnesWithProbabilityP) {
  std::vector<double> p(20000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = i < 10000 ? 0.25 : (i < 15000 ? 0.0 : 1.0);
  const Tensor probabilities = Tensor::from_vector<double>({20000}, p);
  const auto out = testing::run_node(NodeSpec{.op_type = "Bernoulli", .opset = 15}, {probabilities})[0].to_double_vector();
  double ones = 0;
  for (size_t i = 0; i < 10000; ++i) ones += out[i];
  EXPECT_NEAR(ones / 10000, 0.25, 0.015);
  for (size_t i = 10000; i < 15000; ++i) EXPECT_EQ(out[i], 0.0);
  for (size_t i = 15000; i < 20000; ++i) EXPECT_EQ(out[i], 1.0);
  EXPECT_THROW(testing::run_node(NodeSpec{.op_type = "Bernoulli", .opset = 15},
                                 {Tensor::from_vector<float>({1}, {1.5f})}),
               Error);
}

TEST(Random, RejectsBadAttributes) {
  EXPECT_THROW(testing::run_node(NodeSpec{.op_type = "RandomNormal"}, {}), Error);  // no shape
  EXPECT_THROW(testing::run_node(NodeSpec{.op_type = "RandomNormal",
                                          .attributes = {attr("shape", std::vector<int64_t>{2}), attr("dtype", int64_t{7})}},
                                 {}),
               Error);  // int64 output
  EXPECT_THROW(testing::run_node(NodeSpec{.op_type = "RandomUniformLike"}, {Tensor::zeros(DataType::Int32, {2})}),
               Error);
}

}  // namespace
}  // namespace onnxtrain
