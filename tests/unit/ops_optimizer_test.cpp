// Adagrad, Momentum and Adam (ai.onnx.preview.training v1) at T > 0, where the official
// backend tests (which all use T = 0) do not reach: Adam's bias correction, Momentum's beta,
// Adagrad's decay_factor. Expected values are the schema docs' pseudo code in float64.
#include <cmath>
#include <cstring>

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

// Large float32 tensors take the vector loop (scalar heads and tails where threads split the
// range and where the outputs are not 32-byte aligned): every element must still follow the
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

// Each Momentum / Adam kernel times its float32 pass with streaming and with ordinary stores over
// its first runs and keeps the faster (optimizers.cpp StoreChoice): runs of one session, through
// the warm-up, both trials and the choice, must give the same bits every time. The length is no
// multiple of 8, so heads and tails go through the scalar loop beside the vector body.
TEST(Optimizers, Float32ResultsDoNotDependOnTheStoreKindARunChose) {
  const int64_t n = 40003;
  std::vector<float> x(n), g(n), v(n), h(n);
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    x[static_cast<size_t>(i)] = std::sin(0.001f * f);
    g[static_cast<size_t>(i)] = std::cos(0.003f * f) * 0.1f;
    v[static_cast<size_t>(i)] = 0.01f * std::sin(0.007f * f);
    h[static_cast<size_t>(i)] = 0.5f + 0.25f * std::sin(0.005f * f);
  }
  const auto tensor = [&](const std::vector<float>& values) { return Tensor::from_vector<float>({n}, values); };
  const std::vector<std::pair<NodeSpec, std::vector<Tensor>>> cases = {
      {NodeSpec{.op_type = "Momentum", .domain = kTraining, .opset = 1,
                .attributes = {attr("alpha", 0.9f), attr("beta", 0.5f), attr("norm_coefficient", 0.0f),
                               attr("mode", std::string("nesterov"))},
                .num_outputs = 2},
       {Tensor::scalar<float>(0.05f), Tensor::scalar<int64_t>(3), tensor(x), tensor(g), tensor(v)}},
      {NodeSpec{.op_type = "Adam", .domain = kTraining, .opset = 1,
                .attributes = {attr("norm_coefficient", 0.01f)}, .num_outputs = 3},
       {Tensor::scalar<float>(0.01f), Tensor::scalar<int64_t>(7), tensor(x), tensor(g), tensor(v), tensor(h)}},
  };
  for (const auto& [spec, inputs] : cases) {
    SCOPED_TRACE(spec.op_type);
    runtime::Session session(testing::node_model(spec, inputs));
    runtime::NamedTensors feeds;
    for (size_t i = 0; i < inputs.size(); ++i) feeds["in" + std::to_string(i)] = inputs[i];
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 44; ++run) {  // 20 warm-up runs, 10 trials of each kind, then the choice
      const auto outputs = session.run(feeds);
      for (int k = 0; k < spec.num_outputs; ++k) {
        const Tensor& out = outputs.at("out" + std::to_string(k));
        const std::vector<float> values(out.data<float>(), out.data<float>() + out.numel());
        if (run == 0) {
          first.push_back(values);
        } else {
          ASSERT_EQ(std::memcmp(values.data(), first[static_cast<size_t>(k)].data(), values.size() * sizeof(float)), 0)
              << "output " << k << " of run " << run << " differs from run 0's";
        }
      }
    }
    // And run 0's values are the pseudo code's: Momentum's X_new, Adam's V_new (float64 reference).
    const double gr0 = spec.op_type == "Adam" ? double{0.01f} * x[5] + g[5] : double{g[5]};
    const double want = spec.op_type == "Adam" ? double{0.9f} * v[5] + (1 - double{0.9f}) * gr0
                                               : x[5] - double{0.05f} * (gr0 + double{0.9f} * (double{0.9f} * v[5] + double{0.5f} * gr0));
    EXPECT_NEAR(first[spec.op_type == "Adam" ? 1 : 0][5], want, 1e-6);
  }
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
