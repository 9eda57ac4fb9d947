// Adagrad, Momentum and Adam (ai.onnx.preview.training v1) at T > 0, where the official
// backend tests (which all use T = 0) do not reach: Adam's bias correction, Momentum's beta,
// Adagrad's decay_factor. Expected values are the schema docs' pseudo code in float64.
#include <cmath>

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::NodeSpec;

constexpr const char* kTraining = "ai.onnx.preview.training";

const std::vector<double> kX = {1.0, -2.0, 0.5};
const std::vector<double> kG = {0.3, 0.1, -0.7};
const std::vector<double> kV = {0.05, -0.2, 0.4};
const std::vector<double> kH = {0.9, 0.01, 0.2};

Tensor vec(const std::vector<double>& v) { return Tensor::from_vector<double>({static_cast<int64_t>(v.size())}, v); }

TEST(Adagrad, DecaysTheLearningRateWithT) {
  const double r = 0.1, decay = 0.5, eps = 1e-6, norm = 0.01;
  const int64_t t = 3;
  NodeSpec spec{.op_type = "Adagrad", .domain = kTraining, .opset = 1,
                .attributes = {attr("decay_factor", static_cast<float>(decay)), attr("epsilon", static_cast<float>(eps)),
                               attr("norm_coefficient", static_cast<float>(norm))},
                .num_outputs = 2};
  const auto out = testing::run_node(spec, {Tensor::scalar<double>(r), Tensor::scalar<int64_t>(t), vec(kX), vec(kG), vec(kH)});
  // The attributes are float32; evaluate the pseudo code with their float32 values.
  const double rr = r / (1 + t * static_cast<double>(static_cast<float>(decay)));
  std::vector<double> x_new, h_new;
  for (size_t i = 0; i < kX.size(); ++i) {
    const double g = static_cast<float>(norm) * kX[i] + kG[i];
    const double h = kH[i] + g * g;
    h_new.push_back(h);
    x_new.push_back(kX[i] - rr * g / (std::sqrt(h) + static_cast<float>(eps)));
  }
  testing::expect_close(out[0], vec(x_new), 1e-12, 1e-12);
  testing::expect_close(out[1], vec(h_new), 1e-12, 1e-12);
}

TEST(Momentum, UsesBetaAfterTheFirstStep) {
  for (const char* mode : {"standard", "nesterov"}) {
    const double r = 0.05, alpha = 0.9, beta = 0.5, norm = 0.001;
    NodeSpec spec{.op_type = "Momentum", .domain = kTraining, .opset = 1,
                  .attributes = {attr("alpha", static_cast<float>(alpha)), attr("beta", static_cast<float>(beta)),
                                 attr("norm_coefficient", static_cast<float>(norm)), attr("mode", std::string(mode))},
                  .num_outputs = 2};
    const auto out = testing::run_node(spec, {Tensor::scalar<double>(r), Tensor::scalar<int64_t>(4), vec(kX), vec(kG), vec(kV)});
    std::vector<double> x_new, v_new;
    for (size_t i = 0; i < kX.size(); ++i) {
      const double g = static_cast<float>(norm) * kX[i] + kG[i];
      const double v = static_cast<float>(alpha) * kV[i] + static_cast<float>(beta) * g;
      v_new.push_back(v);
      x_new.push_back(std::string(mode) == "nesterov" ? kX[i] - r * (g + static_cast<float>(alpha) * v) : kX[i] - r * v);
    }
    testing::expect_close(out[0], vec(x_new), 1e-12, 1e-12);
    testing::expect_close(out[1], vec(v_new), 1e-12, 1e-12);
  }
}

// Large float32 tensors take the blocked, streaming-store loop (an L1 buffer per 256 elements,
// scalar heads and tails where threads split the range): every element must still follow the
// pseudo code. Reference values in float64 from the same float32 inputs.
TEST(Optimizers, LargeFloat32TensorsFollowThePseudoCode) {
  const int64_t n = 100003;
  std::vector<float> x(n), g(n), state(n);
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = std::sin(0.001f * static_cast<float>(i));
    g[static_cast<size_t>(i)] = std::cos(0.003f * static_cast<float>(i)) * 0.1f;
    state[static_cast<size_t>(i)] = 0.5f + 0.25f * std::sin(0.007f * static_cast<float>(i));
  }
  const auto tensor = [&](const std::vector<float>& v) { return Tensor::from_vector<float>({n}, v); };
  const float r = 0.05f, alpha = 0.9f, beta = 0.5f, norm = 0.001f;
  for (const char* mode : {"standard", "nesterov"}) {
    NodeSpec spec{.op_type = "Momentum", .domain = kTraining, .opset = 1,
                  .attributes = {attr("alpha", alpha), attr("beta", beta), attr("norm_coefficient", norm),
                                 attr("mode", std::string(mode))},
                  .num_outputs = 2};
    const auto out = testing::run_node(spec, {Tensor::scalar<float>(r), Tensor::scalar<int64_t>(2), tensor(x), tensor(g),
                                              tensor(state)});
    std::vector<double> x_new(n), v_new(n);
    for (size_t i = 0; i < x.size(); ++i) {
      const double gr = double{norm} * x[i] + g[i];
      const double v = double{alpha} * state[i] + double{beta} * gr;
      v_new[i] = v;
      x_new[i] = std::string(mode) == "nesterov" ? x[i] - double{r} * (gr + double{alpha} * v) : x[i] - double{r} * v;
    }
    testing::expect_close(out[0].cast(DataType::Float64), Tensor::from_vector<double>({n}, x_new), 1e-5, 1e-6);
    testing::expect_close(out[1].cast(DataType::Float64), Tensor::from_vector<double>({n}, v_new), 1e-5, 1e-6);
  }
  NodeSpec adagrad{.op_type = "Adagrad", .domain = kTraining, .opset = 1, .num_outputs = 2};
  const auto out = testing::run_node(adagrad, {Tensor::scalar<float>(r), Tensor::scalar<int64_t>(0), tensor(x), tensor(g),
                                               tensor(state)});
  std::vector<double> x_new(n), h_new(n);
  for (size_t i = 0; i < x.size(); ++i) {
    const double h = double{state[i]} + double{g[i]} * g[i];
    h_new[i] = h;
    x_new[i] = x[i] - double{r} * g[i] / (std::sqrt(h) + double{1e-6f});
  }
  testing::expect_close(out[0].cast(DataType::Float64), Tensor::from_vector<double>({n}, x_new), 1e-5, 1e-6);
  testing::expect_close(out[1].cast(DataType::Float64), Tensor::from_vector<double>({n}, h_new), 1e-5, 1e-6);
}

TEST(Adam, AppliesBiasCorrectionAndPostRegularization) {
  const double r = 0.01, alpha = 0.9, beta = 0.999, eps = 1e-8, norm = 0.02, post = 0.1;
  const int64_t t = 5;
  NodeSpec spec{.op_type = "Adam", .domain = kTraining, .opset = 1,
                .attributes = {attr("alpha", static_cast<float>(alpha)), attr("beta", static_cast<float>(beta)),
                               attr("epsilon", static_cast<float>(eps)), attr("norm_coefficient", static_cast<float>(norm)),
                               attr("norm_coefficient_post", static_cast<float>(post))},
                .num_outputs = 3};
  const auto out = testing::run_node(spec, {Tensor::scalar<double>(r), Tensor::scalar<int64_t>(t), vec(kX), vec(kG), vec(kV), vec(kH)});
  // The attributes are float32; evaluate the pseudo code with their float32 values.
  const double a = static_cast<float>(alpha), b = static_cast<float>(beta), e = static_cast<float>(eps);
  const double n = static_cast<float>(norm), p = static_cast<float>(post);
  const double r_adjusted = r * std::sqrt(1 - std::pow(b, t)) / (1 - std::pow(a, t));
  std::vector<double> x_new, v_new, h_new;
  for (size_t i = 0; i < kX.size(); ++i) {
    const double g = n * kX[i] + kG[i];
    const double v = a * kV[i] + (1 - a) * g;
    const double h = b * kH[i] + (1 - b) * g * g;
    v_new.push_back(v);
    h_new.push_back(h);
    x_new.push_back((1 - p) * (kX[i] - r_adjusted * v / (std::sqrt(h) + e)));
  }
  testing::expect_close(out[0], vec(x_new), 1e-12, 1e-12);
  testing::expect_close(out[1], vec(v_new), 1e-12, 1e-12);
  testing::expect_close(out[2], vec(h_new), 1e-12, 1e-12);
}

TEST(Adam, UpdatesSeveralTensorsOfDifferentShapes) {
  NodeSpec spec{.op_type = "Adam", .domain = kTraining, .opset = 1, .num_outputs = 6};
  const Tensor x1 = Tensor::from_vector<float>({2}, {1, 2});
  const Tensor x2 = Tensor::from_vector<float>({1, 3}, {3, 4, 5});
  const Tensor z1 = Tensor::zeros(DataType::Float32, {2});
  const Tensor z2 = Tensor::zeros(DataType::Float32, {1, 3});
  const Tensor g1 = Tensor::from_vector<float>({2}, {1, -1});
  const Tensor g2 = Tensor::from_vector<float>({1, 3}, {1, 1, 1});
  const auto out = testing::run_node(spec, {Tensor::scalar<float>(0.1f), Tensor::scalar<int64_t>(1), x1, x2, g1, g2, z1, z2, z1, z2});
  // T = 1 with zero moments: V = 0.1 G, H = 0.001 G², R_adj = 0.1 * sqrt(0.001) / 0.1, so each
  // step is sqrt(0.001) * 0.1 G / (sqrt(0.001) |G| + 1e-6) ≈ 0.1 sign(G).
  EXPECT_NEAR(out[0].to_double_vector()[0], 0.9, 1e-4);
  EXPECT_NEAR(out[0].to_double_vector()[1], 2.1, 1e-4);
  EXPECT_EQ(out[1].shape(), (Shape{1, 3}));
  EXPECT_NEAR(out[1].to_double_vector()[2], 4.9, 1e-4);
}

TEST(Optimizers, RejectMalformedInputs) {
  NodeSpec adagrad{.op_type = "Adagrad", .domain = kTraining, .opset = 1, .num_outputs = 2};
  const Tensor r = Tensor::scalar<double>(0.1), t = Tensor::scalar<int64_t>(0);
  EXPECT_THROW(testing::run_node(adagrad, {r, t, vec(kX), vec({1, 2}), vec(kH)}), Error);  // G shape
  EXPECT_THROW(testing::run_node(adagrad, {r, Tensor::scalar<int32_t>(0), vec(kX), vec(kG), vec(kH)}), Error);  // T type
  EXPECT_THROW(testing::run_node(adagrad, {r, t, vec(kX), vec(kG)}), Error);  // missing H
  NodeSpec momentum{.op_type = "Momentum", .domain = kTraining, .opset = 1,
                    .attributes = {attr("alpha", 0.9f), attr("beta", 1.0f), attr("norm_coefficient", 0.0f),
                                   attr("mode", std::string("heavy"))},
                    .num_outputs = 2};
  EXPECT_THROW(testing::run_node(momentum, {r, t, vec(kX), vec(kG), vec(kV)}), Error);  // bad mode
}

}  // namespace
}  // namespace onnxtrain
