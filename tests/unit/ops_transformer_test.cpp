// Unit tests for the transformer ops (attention.cpp, attention_grad.cpp, transformer_norm.cpp,
// activation.cpp, LayerNormalizationGrad in normalization.cpp): the float32 fast paths against
// naive float64 references written here from the ONNX docs, shapes the backend tests miss
// (several threads' worth of heads, long rows), mixed element types, the backward ops against
// their float64 forms, and error cases. Gradients themselves are checked by finite differences
// in gradient_rules_test.cpp.
#include <cmath>
#include <limits>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::i64;
using testing::NodeSpec;
using testing::random_f64;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Tensor> run(const std::string& op, const std::vector<Tensor>& inputs, Attrs attrs, int opset, int outputs = 1,
                        const std::string& domain = "") {
  return run_node(NodeSpec{op, domain, opset, std::move(attrs), outputs}, inputs);
}

// --- a naive Attention, 4-D, written from the operator doc ---------------------------------

struct NaiveAttention {
  bool causal = false;
  double softcap = 0;
  double scale = 0;  // 0: 1 / sqrt(Dh)
  int64_t past = 0;  // keys [0, past) come first (offset of the causal frontier)
};

// Q [B, Hq, Sq, D], K [B, Hkv, T, D], V [B, Hkv, T, Dv], additive mask [Sq, T] (or undefined).
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const NaiveAttention& o) {
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), T = k.dim(2), Dv = v.dim(3);
  const auto pq = q.to_double_vector(), pk = k.to_double_vector(), pv = v.to_double_vector();
  const auto pm = mask.defined() ? mask.to_double_vector() : std::vector<double>();
  const double scale = o.scale ? o.scale : 1 / std::sqrt(static_cast<double>(D));
  std::vector<double> y(static_cast<size_t>(B * Hq * Sq * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < Sq; ++i) {
        std::vector<double> x(static_cast<size_t>(T));
        double m = -kInf;
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) {
            s += pq[static_cast<size_t>(((b * Hq + h) * Sq + i) * D + d)] * pk[static_cast<size_t>(((b * Hkv + hk) * T + j) * D + d)];
          }
          s *= scale;
          if (o.softcap > 0) s = o.softcap * std::tanh(s / o.softcap);
          if (!pm.empty()) s += pm[static_cast<size_t>(i * T + j)];
          if (o.causal && j > i + o.past) s = -kInf;
          x[static_cast<size_t>(j)] = s;
          m = std::max(m, s);
        }
        if (m == -kInf) continue;  // fully masked: a zero row
        double sum = 0;
        for (double& e : x) sum += (e = std::exp(e - m));
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < Dv; ++d) {
            y[static_cast<size_t>(((b * Hq + h) * Sq + i) * Dv + d)] +=
                x[static_cast<size_t>(j)] / sum * pv[static_cast<size_t>(((b * Hkv + hk) * T + j) * Dv + d)];
          }
        }
      }
    }
  }
  return Tensor::from_vector<double>(Shape{B, Hq, Sq, Dv}, y);
}

// [B, H, S, D] -> [B, S, H * D]
Tensor to_3d(const Tensor& t) {
  const int64_t B = t.dim(0), H = t.dim(1), S = t.dim(2), D = t.dim(3);
  const auto v = t.to_double_vector();
  std::vector<double> out(v.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) out[static_cast<size_t>(((b * S + s) * H + h) * D + d)] = v[static_cast<size_t>(((b * H + h) * S + s) * D + d)];
  return Tensor::from_vector<double>(Shape{B, S, H * D}, out).cast(t.dtype());
}

Tensor f32(const Tensor& t) { return t.cast(DataType::Float32); }

TEST(Attention, Float32HeadsInParallelMatchTheNaiveFormWithGqaCausalSoftcapAndMask) {
  // 2 x 8 query heads over 2 key/value heads (GQA): enough heads for every thread.
  const Tensor q = random_f64({2, 8, 37, 16}, 1), k = random_f64({2, 2, 45, 16}, 2), v = random_f64({2, 2, 45, 24}, 3);
  const Tensor mask = random_f64({37, 45}, 4);
  // No past: the causal offset is 0 (query i sees keys j <= i) although there are more keys.
  const NaiveAttention o{true, 1.5, 0.3, 0};
  const Tensor got = run("Attention", {f32(q), f32(k), f32(v), f32(mask)},
                         {attr("is_causal", int64_t{1}), attr("softcap", 1.5f), attr("scale", 0.3f)}, 23)[0];
  expect_close(got, f32(naive_attention(q, k, v, mask, o)), 1e-4, 1e-5);
}

TEST(Attention, ThreeDInputsWithPastGiveTheFourDResultAndPresentOutputs) {
  const Tensor q = random_f64({2, 4, 3, 8}, 5), k = random_f64({2, 2, 3, 8}, 6), v = random_f64({2, 2, 3, 4}, 7);
  const Tensor pk = random_f64({2, 2, 5, 8}, 8), pv = random_f64({2, 2, 5, 4}, 9);
  // present = concat(past, new) along the sequence.
  auto concat = [](const Tensor& a, const Tensor& b) {
    const int64_t B = a.dim(0), H = a.dim(1), P = a.dim(2), S = b.dim(2), D = a.dim(3);
    const auto va = a.to_double_vector(), vb = b.to_double_vector();
    std::vector<double> out;
    for (int64_t bh = 0; bh < B * H; ++bh) {
      out.insert(out.end(), va.begin() + bh * P * D, va.begin() + (bh + 1) * P * D);
      out.insert(out.end(), vb.begin() + bh * S * D, vb.begin() + (bh + 1) * S * D);
    }
    return Tensor::from_vector<double>(Shape{B, H, P + S, D}, out);
  };
  const Tensor all_k = concat(pk, k), all_v = concat(pv, v);
  const Tensor want = naive_attention(q, all_k, all_v, Tensor(), {true, 0, 0, 5});
  const auto got = run("Attention", {f32(to_3d(q)), f32(to_3d(k)), f32(to_3d(v)), Tensor(), f32(pk), f32(pv)},
                       {attr("is_causal", int64_t{1}), attr("q_num_heads", int64_t{4}), attr("kv_num_heads", int64_t{2})}, 23, 3);
  expect_close(got[0], f32(to_3d(want)), 1e-4, 1e-5);
  expect_close(got[1], f32(all_k), 0, 0);
  expect_close(got[2], f32(all_v), 0, 0);
}

TEST(Attention, Float64AndBoolMaskWithAFullyMaskedRowGiveZeros) {
  const Tensor q = random_f64({1, 1, 2, 3}, 10), k = random_f64({1, 1, 3, 3}, 11), v = random_f64({1, 1, 3, 2}, 12);
  const Tensor mask = Tensor::from_vector<bool>({2, 3}, {true, false, true, false, false, false});
  const Tensor additive = Tensor::from_vector<double>({2, 3}, {0, -kInf, 0, -kInf, -kInf, -kInf});
  const Tensor got = run("Attention", {q, k, v, mask}, {}, 23)[0];
  expect_close(got, naive_attention(q, k, v, additive, {}), 1e-12, 1e-12);
  const auto y = got.to_double_vector();
  EXPECT_EQ(y[2], 0.0);
  EXPECT_EQ(y[3], 0.0);
}

TEST(Attention, QkMatmulOutputModes) {
  const Tensor q = random_f64({1, 1, 2, 2}, 13), k = random_f64({1, 1, 2, 2}, 14), v = random_f64({1, 1, 2, 2}, 15);
  const Tensor mask = Tensor::from_vector<double>({2, 2}, {0.5, -1, 0, 2});
  const auto pq = q.to_double_vector(), pk = k.to_double_vector();
  std::vector<double> raw(4), soft(4), biased(4);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const double s = (pq[i * 2] * pk[j * 2] + pq[i * 2 + 1] * pk[j * 2 + 1]) / std::sqrt(2.0);
      raw[i * 2 + j] = s;
      const double cap = 0.8f;  // the attribute's float value
      soft[i * 2 + j] = cap * std::tanh(s / cap);
      biased[i * 2 + j] = soft[i * 2 + j] + mask.to_double_vector()[i * 2 + j];
    }
  }
  const std::vector<std::vector<double>> want{raw, soft, biased};
  for (int64_t mode = 0; mode < 3; ++mode) {
    const auto got = run("Attention", {q, k, v, mask}, {attr("softcap", 0.8f), attr("qk_matmul_output_mode", mode)}, 23, 4);
    expect_close(got[3], Tensor::from_vector<double>({1, 1, 2, 2}, want[static_cast<size_t>(mode)]), 1e-6, 1e-7);
  }
  const auto probs = run("Attention", {q, k, v, mask}, {attr("softcap", 0.8f), attr("qk_matmul_output_mode", int64_t{3})}, 23, 4)[3];
  const auto p = probs.to_double_vector();
  EXPECT_NEAR(p[0] + p[1], 1.0, 1e-12);
  EXPECT_NEAR(p[0] / p[1], std::exp(biased[0] - biased[1]), 1e-9);
}

TEST(Attention, SlidingWindowAndNonpadMaskTheKeysTheSpecSays) {
  // Version 25, left window 1, right 0, nonpad 3 of 4 keys: query i at position p = i + 1
  // (offset 3 - 2) sees keys j with p - 1 <= j <= p and j < 3: {0, 1} and {1, 2}.
  const Tensor q = random_f64({1, 1, 2, 2}, 16), k = random_f64({1, 1, 4, 2}, 17), v = random_f64({1, 1, 4, 2}, 18);
  const Tensor additive = Tensor::from_vector<double>({2, 4}, {0, 0, -kInf, -kInf, -kInf, 0, 0, -kInf});
  const Tensor got = run("Attention", {q, k, v, Tensor(), Tensor(), Tensor(), i64({1}, {3})},
                         {attr("left_window_size", int64_t{1}), attr("right_window_size", int64_t{0})}, 25)[0];
  expect_close(got, naive_attention(q, k, v, additive, {}), 1e-12, 1e-12);
}

TEST(Attention, BadInputsAreErrorsNamingThem) {
  const Tensor q = random_f64({1, 3, 2, 4}, 1), k = random_f64({1, 2, 2, 4}, 2), v = random_f64({1, 2, 2, 4}, 3);
  EXPECT_THROW(run("Attention", {q, k, v}, {}, 23), Error);  // 3 query heads over 2 key/value heads
  const Tensor q3 = random_f64({1, 2, 8}, 4), k3 = random_f64({1, 2, 8}, 5);
  EXPECT_THROW(run("Attention", {q3, k3, k3}, {}, 23), Error);  // 3-D without num_heads
  const Tensor k2 = random_f64({1, 3, 2, 4}, 6);
  EXPECT_THROW(run("Attention", {q, k2, k2, random_f64({2, 3}, 7)}, {}, 23), Error);  // mask longer than the keys
  EXPECT_THROW(run("Attention", {q, k2, k2, Tensor(), random_f64({1, 3, 1, 4}, 8), random_f64({1, 3, 1, 4}, 9), i64({1}, {2})}, {}, 24),
               Error);  // nonpad_kv_seqlen with a past
  EXPECT_THROW(run("Attention", {q, k2, k2, Tensor(), Tensor(), Tensor(), i64({1}, {5})}, {}, 24), Error);  // beyond the keys
  EXPECT_THROW(run("Attention", {q, k2, k2}, {attr("q_num_heads", int64_t{3}), attr("kv_num_heads", int64_t{3})}, 25), Error);
  try {
    run("Attention", {q, k2, k2.cast(DataType::Float32)}, {}, 23);
    FAIL() << "mixed element types ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in2"), std::string::npos) << e.what();
  }
}

// AttentionGrad in float32 (sgemm, heads in parallel) against float64 (plain loops).
TEST(AttentionGrad, Float32MatchesFloat64) {
  const Tensor dy = random_f64({2, 6, 9, 5}, 20), q = random_f64({2, 6, 9, 4}, 21), k = random_f64({2, 3, 7, 4}, 22),
               v = random_f64({2, 3, 7, 5}, 23), mask = random_f64({9, 11}, 24), pk = random_f64({2, 3, 4, 4}, 25),
               pv = random_f64({2, 3, 4, 5}, 26);
  const Attrs attrs{attr("is_causal", int64_t{1}), attr("softcap", 2.0f)};
  const std::vector<Tensor> in{dy, q, k, v, mask, pk, pv};
  const auto want = run("AttentionGrad", in, attrs, 1, 6, "ai.onnxtrain");
  std::vector<Tensor> in32;
  for (const auto& t : in) in32.push_back(f32(t));
  const auto got = run("AttentionGrad", in32, attrs, 1, 6, "ai.onnxtrain");
  for (size_t i = 0; i < 6; ++i) expect_close(got[i], f32(want[i]), 1e-3, 1e-5);
}

// --- normalizations ---------------------------------------------------------------------------

TEST(RMSNormalization, MixedTypesAndBroadcastScale) {
  const Tensor x = random_f64({3, 2, 4}, 30);
  const Tensor scale = random_f64({2, 1}, 31);  // broadcast over the last dim
  const auto vx = x.to_double_vector(), vs = scale.to_double_vector();
  std::vector<double> want(vx.size());
  for (int64_t r = 0; r < 3; ++r) {
    double ms = 0;
    for (int64_t k = 0; k < 8; ++k) ms += vx[static_cast<size_t>(r * 8 + k)] * vx[static_cast<size_t>(r * 8 + k)];
    const double inv = 1 / std::sqrt(ms / 8 + 1e-5);
    for (int64_t k = 0; k < 8; ++k) want[static_cast<size_t>(r * 8 + k)] = vx[static_cast<size_t>(r * 8 + k)] * inv * vs[static_cast<size_t>(k / 4)];
  }
  const Tensor got = run("RMSNormalization", {x.cast(DataType::Float16), f32(scale)}, {attr("axis", int64_t{1})}, 23)[0];
  ASSERT_EQ(got.dtype(), DataType::Float32);  // Y has scale's type (V)
  expect_close(got, f32(Tensor::from_vector<double>({3, 2, 4}, want)), 2e-3, 2e-3);  // x rounded to float16
}

TEST(GroupNormalization, Version18PerGroupEqualsVersion21WithRepeatedParameters) {
  const Tensor x = random_f64({2, 6, 5}, 40), scale_g = random_f64({3}, 41), bias_g = random_f64({3}, 42);
  std::vector<double> sc, bc;
  for (int c = 0; c < 6; ++c) {
    sc.push_back(scale_g.to_double_vector()[static_cast<size_t>(c / 2)]);
    bc.push_back(bias_g.to_double_vector()[static_cast<size_t>(c / 2)]);
  }
  const Attrs attrs{attr("num_groups", int64_t{3})};
  const Tensor y18 = run("GroupNormalization", {x, scale_g, bias_g}, attrs, 18)[0];
  const Tensor y21 = run("GroupNormalization", {x, Tensor::from_vector<double>({6}, sc), Tensor::from_vector<double>({6}, bc)}, attrs, 21)[0];
  expect_close(y18, y21, 1e-12, 1e-12);
  EXPECT_THROW(run("GroupNormalization", {x, scale_g, bias_g}, attrs, 21), Error);  // 21 wants one value per channel
  EXPECT_THROW(run("GroupNormalization", {x, scale_g, bias_g}, {attr("num_groups", int64_t{4})}, 18), Error);
}

// LayerNormalizationGrad in float32 with the saved statistics against float64.
TEST(LayerNormalizationGrad, Float32WithSavedStatisticsMatchesFloat64) {
  const Tensor x = random_f64({64, 48}, 50), scale = random_f64({48}, 51), dy = random_f64({64, 48}, 52);
  const auto fwd = run("LayerNormalization", {f32(x), f32(scale)}, {}, 17, 3);
  const auto got = run("LayerNormalizationGrad", {f32(dy), f32(x), f32(scale), fwd[1], fwd[2]}, {}, 1, 3, "ai.onnxtrain");
  const auto want = run("LayerNormalizationGrad", {dy, x, scale}, {}, 1, 3, "ai.onnxtrain");  // statistics recomputed
  for (size_t i = 0; i < 3; ++i) expect_close(got[i], f32(want[i]), 1e-4, 1e-5);
}

// In float64 the saved statistics (float32 by the op's stash_type 1) are too coarse: the
// gradient with them must equal the gradient with the statistics recomputed in double (it was
// 1e-7 off, which a float64 BERT showed against PyTorch).
TEST(LayerNormalizationGrad, Float64IgnoresTheFloat32SavedStatistics) {
  const Tensor x = random_f64({16, 24}, 58), scale = random_f64({24}, 59), dy = random_f64({16, 24}, 60);
  const auto fwd = run("LayerNormalization", {x, scale}, {}, 17, 3);
  ASSERT_EQ(fwd[1].dtype(), DataType::Float32);
  const auto got = run("LayerNormalizationGrad", {dy, x, scale, fwd[1], fwd[2]}, {}, 1, 3, "ai.onnxtrain");
  const auto want = run("LayerNormalizationGrad", {dy, x, scale}, {}, 1, 3, "ai.onnxtrain");
  for (size_t i = 0; i < 3; ++i) expect_close(got[i], want[i], 1e-13, 1e-14);
}

// The LayerNormalization rule when a loss also reads the saved Mean and InvStdDev (float32
// outputs, so the finite differences use eps 1e-3 and a tolerance to match):
// loss = sum(Y R0) + sum(Cast(Mean) R1) + sum(Cast(InvStdDev) R2), gradient with respect to X.
TEST(LayerNormalizationGrad, FlowsThroughTheSavedStatistics) {
  const Tensor x = random_f64({3, 4}, 53), scale = random_f64({4}, 54), r0 = random_f64({3, 4}, 55), r1 = random_f64({3, 1}, 56),
               r2 = random_f64({3, 1}, 57);
  auto model = [&](bool gradient) {
    onnx::ModelProto m = testing::empty_model("ln_stats");
    auto* opset = m.add_opset_import();
    opset->set_domain("ai.onnx.preview.training");
    opset->set_version(1);
    onnx::GraphProto& g = *m.mutable_graph();
    testing::typed_value(g.add_input(), "X", onnx::TensorProto::DOUBLE, {3, 4});
    const std::vector<std::pair<std::string, Tensor>> inits{{"S", scale}, {"R0", r0}, {"R1", r1}, {"R2", r2}};
    for (const auto& [name, t] : inits) io::tensor_to_proto(t, name, *g.add_initializer());
    testing::add_node(g, "LayerNormalization", {"X", "S"}, {"Y", "Mean", "Inv"});
    testing::add_node(g, "Cast", {"Mean"}, {"Mean64"})->add_attribute()->CopyFrom(attr("to", int64_t{11}));
    testing::add_node(g, "Cast", {"Inv"}, {"Inv64"})->add_attribute()->CopyFrom(attr("to", int64_t{11}));
    testing::add_node(g, "Mul", {"Y", "R0"}, {"t0"});
    testing::add_node(g, "Mul", {"Mean64", "R1"}, {"t1"});
    testing::add_node(g, "Mul", {"Inv64", "R2"}, {"t2"});
    for (const char* t : {"t0", "t1", "t2"}) {
      testing::add_node(g, "ReduceSum", {t}, {std::string(t) + "s"})->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
    }
    testing::add_node(g, "Sum", {"t0s", "t1s", "t2s"}, {"loss"});
    g.add_output()->set_name(gradient ? "dX" : "loss");
    if (gradient) {
      auto* n = testing::add_node(g, "Gradient", {"X"}, {"dX"});
      n->set_domain("ai.onnx.preview.training");
      n->add_attribute()->CopyFrom(attr("xs", std::vector<std::string>{"X"}));
      n->add_attribute()->CopyFrom(attr("y", std::string("loss")));
    }
    return m;
  };
  runtime::Session with_gradient(model(true)), loss_only(model(false));
  const Tensor got = with_gradient.run({{"X", x}}).at("dX");
  const Tensor want = testing::central_differences(
      [&](const Tensor& at) { return loss_only.run({{"X", at}}).at("loss").to_double_vector()[0]; }, x, 1e-3);
  expect_close(got, want, 1e-3, 1e-3);
}

TEST(RotaryEmbedding, PositionsOutsideTheCacheAreErrors) {
  const Tensor x = random_f64({1, 1, 2, 4}, 60), cache = random_f64({3, 2}, 61);
  EXPECT_THROW(run("RotaryEmbedding", {f32(x), f32(cache), f32(cache), i64({1, 2}, {0, 3})}, {}, 23), Error);
  EXPECT_THROW(run("RotaryEmbedding", {f32(x), f32(cache), f32(cache), i64({1, 2}, {0, 1})}, {attr("rotary_embedding_dim", int64_t{3})}, 23),
               Error);
}

TEST(LinearAttention, TheUpdateRuleDecidesWhichInputsMustBeGiven) {
  const Tensor q = f32(random_f64({1, 2, 4}, 80)), decay = f32(random_f64({1, 2, 2}, 81));
  const Attrs heads{attr("q_num_heads", int64_t{2}), attr("kv_num_heads", int64_t{2})};
  EXPECT_THROW(run("LinearAttention", {q, q, q}, heads, 27, 2), Error);  // gated_delta needs decay and beta
  Attrs gated = heads;
  gated.push_back(attr("update_rule", std::string("gated")));
  const auto out = run("LinearAttention", {q, q, q, Tensor(), decay}, gated, 27, 2);
  EXPECT_EQ(out[0].shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(out[1].shape(), (Shape{1, 2, 2, 2}));
  EXPECT_THROW(run("LinearAttention", {q, q, q, Tensor(), decay, decay}, gated, 27, 2), Error);  // gated forbids beta
}

TEST(CausalConvWithState, ChecksTheDepthwiseWeight) {
  const Tensor x = f32(random_f64({1, 3, 5}, 82));
  EXPECT_THROW(run("CausalConvWithState", {x, f32(random_f64({3, 2, 2}, 83))}, {}, 27, 2), Error);
  const auto out = run("CausalConvWithState", {x, f32(random_f64({3, 1, 3}, 84))}, {}, 27, 2);
  // present_state is the last k - 1 = 2 inputs of each channel.
  const auto xv = x.to_double_vector(), sv = out[1].to_double_vector();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(sv[static_cast<size_t>(c * 2)], xv[static_cast<size_t>(c * 5 + 3)]);
    EXPECT_EQ(sv[static_cast<size_t>(c * 2 + 1)], xv[static_cast<size_t>(c * 5 + 4)]);
  }
}

// --- activations ------------------------------------------------------------------------------

TEST(Activations, MatchTheirFormulasInFloat32) {
  const Tensor x = random_f64({1000}, 70, 6.0);
  const auto v = x.to_double_vector();
  std::vector<double> gelu(v.size()), gelu_tanh(v.size()), swish(v.size()), mish(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double t = v[i];
    gelu[i] = 0.5 * t * (1 + std::erf(t / std::sqrt(2.0)));
    gelu_tanh[i] = 0.5 * t * (1 + std::tanh(std::sqrt(2 / M_PI) * (t + 0.044715 * t * t * t)));
    swish[i] = t / (1 + std::exp(-0.5 * t));
    mish[i] = t * std::tanh(std::log1p(std::exp(t)));
  }
  auto want = [&](const std::vector<double>& w) { return f32(Tensor::from_vector<double>({1000}, w)); };
  expect_close(run("Gelu", {f32(x)}, {}, 20)[0], want(gelu), 1e-5, 1e-6);
  expect_close(run("Gelu", {f32(x)}, {attr("approximate", std::string("tanh"))}, 20)[0], want(gelu_tanh), 1e-5, 1e-6);
  expect_close(run("Swish", {f32(x)}, {attr("alpha", 0.5f)}, 24)[0], want(swish), 1e-5, 1e-6);
  expect_close(run("Mish", {f32(x)}, {}, 22)[0], want(mish), 1e-5, 1e-6);
  EXPECT_THROW(run("Gelu", {f32(x)}, {attr("approximate", std::string("fast"))}, 20), Error);
  EXPECT_THROW(run("SwiGLU", {f32(x), f32(random_f64({10, 100}, 71))}, {}, 28), Error);  // no broadcasting
}

}  // namespace
}  // namespace onnxtrain
