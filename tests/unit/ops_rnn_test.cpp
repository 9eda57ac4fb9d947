// Unit tests for rnn.cpp (RNN, GRU, LSTM) against a naive float64 reference written here from
// the operator docs: one batch entry and one gate unit at a time, no shared code with the
// kernel's batched GEMM formulation. Covers what the backend tests miss: bidirectional runs,
// sequence_lens (with reverse directions and zero lengths), initial states, peepholes,
// layout 1, linear_before_reset, input_forget, every activation function with its alpha/beta,
// clip, float32/float64/float16, omitted outputs, older opsets, and error messages.
#include <omp.h>

#include <cmath>
#include <optional>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::NodeSpec;
using testing::run_node;
using Attrs = std::vector<onnx::AttributeProto>;
using Strings = std::vector<std::string>;

Tensor f64(const Shape& shape, const std::vector<double>& v) { return Tensor::from_vector<double>(shape, v); }

Tensor random(const Shape& shape, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(gen);
  return f64(shape, v);
}

onnx::AttributeProto strings_attr(const std::string& name, const Strings& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRINGS);
  for (const auto& v : values) a.add_strings(v);
  return a;
}

// ---------------------------------------------------------------------------------------------
// The reference

// An activation with its alpha and beta already resolved (float, like the attributes).
struct Act {
  std::string name;
  float alpha = 0, beta = 0;
};

double activate(const Act& act, double x) {
  struct {
    double alpha, beta;
  } a{act.alpha, act.beta};
  const std::string& n = act.name;
  if (n == "Relu") return std::max(0.0, x);
  if (n == "Tanh") return std::tanh(x);
  if (n == "Sigmoid") return 1 / (1 + std::exp(-x));
  if (n == "Affine") return a.alpha * x + a.beta;
  if (n == "LeakyRelu") return x >= 0 ? x : a.alpha * x;
  if (n == "ThresholdedRelu") return x >= a.alpha ? x : 0;
  if (n == "ScaledTanh") return a.alpha * std::tanh(a.beta * x);
  if (n == "HardSigmoid") return std::min(std::max(a.alpha * x + a.beta, 0.0), 1.0);
  if (n == "Elu") return x >= 0 ? x : a.alpha * (std::exp(x) - 1);
  if (n == "Softsign") return x / (1 + std::abs(x));
  if (n == "Softplus") return std::log(1 + std::exp(x));
  ADD_FAILURE() << "no reference for " << n;
  return 0;
}

struct Problem {
  std::string op;  // RNN, GRU, LSTM
  std::string direction = "forward";
  int64_t S = 4, N = 3, I = 5, H = 3;
  bool batch_first = false;
  bool bias = true, initial_h = false, initial_c = false, peepholes = false;
  std::vector<int32_t> lens;  // empty: sequence_lens omitted
  std::vector<Act> acts;      // per direction, all directions; empty: the op's defaults
  std::optional<float> clip;
  bool linear_before_reset = false, input_forget = false;
  Attrs extra;  // more attributes (activations, activation_alpha, ...)
  int opset = 17;

  int64_t D() const { return direction == "bidirectional" ? 2 : 1; }
  int64_t G() const { return op == "RNN" ? 1 : op == "GRU" ? 3 : 4; }
  int outputs() const { return op == "LSTM" ? 3 : 2; }
  Shape state_shape() const { return batch_first ? Shape{N, D(), H} : Shape{D(), N, H}; }
  Shape y_shape() const { return batch_first ? Shape{N, S, D(), H} : Shape{S, D(), N, H}; }
  std::vector<Act> activations() const {
    if (!acts.empty()) return acts;
    std::vector<Act> one = op == "RNN"   ? std::vector<Act>{{"Tanh"}}
                           : op == "GRU" ? std::vector<Act>{{"Sigmoid"}, {"Tanh"}}
                                         : std::vector<Act>{{"Sigmoid"}, {"Tanh"}, {"Tanh"}};
    std::vector<Act> all = one;
    if (D() == 2) all.insert(all.end(), one.begin(), one.end());
    return all;
  }

  // Inputs in ONNX order, float64 (undefined where omitted; sequence_lens int32).
  std::vector<Tensor> inputs(uint32_t seed) const {
    std::vector<Tensor> in(op == "LSTM" ? 8 : 6);
    in[0] = random(batch_first ? Shape{N, S, I} : Shape{S, N, I}, seed);
    in[1] = random({D(), G() * H, I}, seed + 1);
    in[2] = random({D(), G() * H, H}, seed + 2);
    if (bias) in[3] = random({D(), 2 * G() * H}, seed + 3);
    if (!lens.empty()) in[4] = Tensor::from_vector<int32_t>(Shape{N}, lens);
    if (initial_h) in[5] = random(state_shape(), seed + 5);
    if (op == "LSTM") {
      if (initial_c) in[6] = random(state_shape(), seed + 6);
      if (peepholes) in[7] = random({D(), 3 * H}, seed + 7);
    }
    while (!in.back().defined()) in.pop_back();
    return in;
  }

  Attrs attributes() const {
    Attrs a{attr("hidden_size", H), attr("direction", direction)};
    if (batch_first) a.push_back(attr("layout", int64_t{1}));
    if (clip) a.push_back(attr("clip", *clip));
    if (linear_before_reset) a.push_back(attr("linear_before_reset", int64_t{1}));
    if (input_forget) a.push_back(attr("input_forget", int64_t{1}));
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  std::vector<Tensor> run(const std::vector<Tensor>& in) const {
    return run_node(NodeSpec{op, "", opset, attributes(), outputs()}, in);
  }
};

// {Y, Y_h, Y_c} of the problem, computed entry by entry from the operator docs' equations.
std::vector<Tensor> reference(const Problem& p, const std::vector<Tensor>& in) {
  const int64_t S = p.S, N = p.N, I = p.I, H = p.H, D = p.D(), G = p.G();
  auto values = [&](size_t i) {
    return i < in.size() && in[i].defined() ? in[i].to_double_vector() : std::vector<double>();
  };
  const auto X = values(0), W = values(1), R = values(2), B = values(3), H0 = values(5), C0 = values(6), P = values(7);
  const auto acts = p.activations();
  const int64_t per_direction = static_cast<int64_t>(acts.size()) / D, last = static_cast<int64_t>(acts.size()) - 1;
  std::vector<double> Y(S * D * N * H, 0.0), Yh(D * N * H), Yc(Yh.size());
  auto x_at = [&](int64_t t, int64_t b, int64_t i) {
    return X[p.batch_first ? (b * S + t) * I + i : (t * N + b) * I + i];
  };
  auto state_at = [&](int64_t d, int64_t b, int64_t j) {
    return p.batch_first ? (b * D + d) * H + j : (d * N + b) * H + j;
  };
  auto y_at = [&](int64_t t, int64_t d, int64_t b, int64_t j) {
    return p.batch_first ? ((b * S + t) * D + d) * H + j : ((t * D + d) * N + b) * H + j;
  };
  auto clip = [&](double v) { return p.clip ? std::min(std::max(v, -double(*p.clip)), double(*p.clip)) : v; };

  for (int64_t d = 0; d < D; ++d) {
    const bool reverse = p.direction == "reverse" || d == 1;
    const Act& f = acts[d * per_direction];  // g and h exist for GRU and LSTM only
    const Act& g = acts[std::min(d * per_direction + 1, last)];
    const Act& h_act = acts[std::min(d * per_direction + 2, last)];
    // Row k*H + j of W x, of R v, and of the biases, for this direction.
    auto wx = [&](int64_t t, int64_t b, int64_t row) {
      double s = 0;
      for (int64_t i = 0; i < I; ++i) s += W[(d * G * H + row) * I + i] * x_at(t, b, i);
      return s;
    };
    auto rv = [&](const std::vector<double>& v, int64_t row) {
      double s = 0;
      for (int64_t m = 0; m < H; ++m) s += R[(d * G * H + row) * H + m] * v[m];
      return s;
    };
    auto wb = [&](int64_t row) { return B.empty() ? 0.0 : B[d * 2 * G * H + row]; };
    auto rb = [&](int64_t row) { return B.empty() ? 0.0 : B[d * 2 * G * H + G * H + row]; };
    auto peep = [&](int64_t k, int64_t j) { return P.empty() ? 0.0 : P[d * 3 * H + k * H + j]; };

    for (int64_t b = 0; b < N; ++b) {
      std::vector<double> h(H, 0.0), c(H, 0.0);
      for (int64_t j = 0; j < H; ++j) {
        if (!H0.empty()) h[j] = H0[state_at(d, b, j)];
        if (!C0.empty()) c[j] = C0[state_at(d, b, j)];
      }
      const int64_t len = p.lens.empty() ? S : p.lens[b];
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = reverse ? len - 1 - s : s;
        std::vector<double> h_new(H), c_new(H);
        if (p.op == "RNN") {
          for (int64_t j = 0; j < H; ++j) {
            h_new[j] = activate(f, clip(wx(t, b, j) + rv(h, j) + wb(j) + rb(j)));
          }
        } else if (p.op == "GRU") {
          std::vector<double> z(H), r(H), rh(H);
          for (int64_t j = 0; j < H; ++j) {
            z[j] = activate(f, clip(wx(t, b, j) + rv(h, j) + wb(j) + rb(j)));
            r[j] = activate(f, clip(wx(t, b, H + j) + rv(h, H + j) + wb(H + j) + rb(H + j)));
            rh[j] = r[j] * h[j];
          }
          for (int64_t j = 0; j < H; ++j) {
            const int64_t row = 2 * H + j;
            const double pre = p.linear_before_reset
                                   ? wx(t, b, row) + wb(row) + r[j] * (rv(h, row) + rb(row))
                                   : wx(t, b, row) + rv(rh, row) + wb(row) + rb(row);
            const double hh = activate(g, clip(pre));
            h_new[j] = (1 - z[j]) * hh + z[j] * h[j];
          }
        } else {  // LSTM, gates i o f c
          for (int64_t j = 0; j < H; ++j) {
            auto pre = [&](int64_t k) {
              const int64_t row = k * H + j;
              return wx(t, b, row) + rv(h, row) + wb(row) + rb(row);
            };
            const double i_g = activate(f, clip(pre(0) + peep(0, j) * c[j]));
            const double f_g = p.input_forget ? 1 - i_g : activate(f, clip(pre(2) + peep(2, j) * c[j]));
            const double c_g = activate(g, clip(pre(3)));
            c_new[j] = f_g * c[j] + i_g * c_g;
            const double o_g = activate(f, clip(pre(1) + peep(1, j) * c_new[j]));
            h_new[j] = o_g * activate(h_act, c_new[j]);
          }
          c = c_new;
        }
        h = h_new;
        for (int64_t j = 0; j < H; ++j) Y[y_at(t, d, b, j)] = h[j];
      }
      for (int64_t j = 0; j < H; ++j) {
        Yh[state_at(d, b, j)] = h[j];
        Yc[state_at(d, b, j)] = c[j];
      }
    }
  }
  std::vector<Tensor> out{f64(p.y_shape(), Y), f64(p.state_shape(), Yh)};
  if (p.op == "LSTM") out.push_back(f64(p.state_shape(), Yc));
  return out;
}

std::vector<Tensor> cast_floats(const std::vector<Tensor>& in, DataType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.defined() && t.dtype() == DataType::Float64 ? t.cast(dtype) : t);
  return out;
}

// Runs the problem in float64 and float32 and compares every output with the reference.
void expect_matches_reference(const Problem& p, uint32_t seed = 1) {
  const auto in = p.inputs(seed);
  const auto want = reference(p, in);
  const auto got64 = p.run(in);
  ASSERT_EQ(got64.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("float64 output " + std::to_string(i));
    expect_close(got64[i], want[i], 1e-10, 1e-12);
  }
  const auto got32 = p.run(cast_floats(in, DataType::Float32));
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("float32 output " + std::to_string(i));
    ASSERT_EQ(got32[i].dtype(), DataType::Float32);
    expect_close(got32[i].cast(DataType::Float64), want[i], 1e-4, 1e-5);
  }
}

// ---------------------------------------------------------------------------------------------
// LSTM

TEST(Lstm, BidirectionalWithSequenceLensInitialStatesAndPeepholes) {
  for (bool batch_first : {false, true}) {
    SCOPED_TRACE(batch_first ? "layout 1" : "layout 0");
    Problem p{.op = "LSTM", .direction = "bidirectional", .S = 5, .N = 4, .I = 3, .H = 4};
    p.batch_first = batch_first;
    p.initial_h = p.initial_c = p.peepholes = true;
    p.lens = {5, 2, 4, 1};
    expect_matches_reference(p);
  }
}

TEST(Lstm, ForwardAndReverseDefaults) {
  for (const char* direction : {"forward", "reverse"}) {
    SCOPED_TRACE(direction);
    Problem p{.op = "LSTM", .direction = direction, .S = 6, .N = 2, .I = 4, .H = 5};
    p.bias = false;
    expect_matches_reference(p, 7);
  }
}

// A reverse LSTM over 4 steps of 3 inputs with input_forget, peepholes, initial_c, clip 0.7 and
// f = HardSigmoid(0.3, 0.4), g = Softsign, h = ScaledTanh(1.5, 0.5): alpha and beta are
// consumed in order by the functions that take them.
Problem reverse_lstm_with_input_forget_clip_and_activations(int64_t batch, int64_t hidden) {
  Problem p{.op = "LSTM", .direction = "reverse", .S = 4, .N = batch, .I = 3, .H = hidden};
  p.input_forget = true;
  p.peepholes = p.initial_c = true;
  p.clip = 0.7f;
  p.extra = {strings_attr("activations", {"HardSigmoid", "Softsign", "ScaledTanh"}),
             attr("activation_alpha", std::vector<float>{0.3f, 1.5f}),
             attr("activation_beta", std::vector<float>{0.4f, 0.5f})};
  p.acts = {{"HardSigmoid", 0.3f, 0.4f}, {"Softsign"}, {"ScaledTanh", 1.5f, 0.5f}};
  return p;
}

TEST(Lstm, InputForgetClipAndCustomActivations) {
  Problem p = reverse_lstm_with_input_forget_clip_and_activations(3, 3);
  p.lens = {3, 4, 2};
  expect_matches_reference(p, 3);
}

// Batch 1 in float32 runs as rnn.cpp's lstm_rowwise (dot products of R's rows, one parallel
// region per direction): hidden 40 takes its eight-row vector code on two threads (20 units
// each: two groups of eight rows and a tail), 13 the scalar code on one; with
// sequence_lens shorter than the sequence and zero, both layouts, peepholes, clip, input_forget
// and other activations.
TEST(Lstm, BatchOneRunsRowByRowAndMatchesTheReference) {
  for (int64_t H : {40, 13}) {
    for (bool batch_first : {false, true}) {
      for (int len : {4, 5, 0}) {
        SCOPED_TRACE("hidden " + std::to_string(H) + (batch_first ? ", layout 1" : "") + ", length " +
                     std::to_string(len));
        Problem p{.op = "LSTM", .direction = "bidirectional", .S = 5, .N = 1, .I = 3, .H = H};
        p.batch_first = batch_first;
        p.initial_h = p.initial_c = p.peepholes = true;
        p.lens = {len};
        expect_matches_reference(p, static_cast<uint32_t>(H + len));
      }
    }
  }
  expect_matches_reference(reverse_lstm_with_input_forget_clip_and_activations(1, 16), 5);
}

// The input projection X W^T of 32 to 512 rows (sequence x batch) by a wide W runs through
// oneDNN's matmul primitive on CPUs with AVX-512 (ops/matmul_primitive.h
// transposed_b_prefers_matmul), through sgemm elsewhere: 64 rows of 64 inputs by 4 x 128 gates
// at batch 1 (the recurrence row by row) and batch 4, both directions; a GRU of 3 x 192 gates.
// W and R are scaled by 1 / sqrt(fan-in), as PyTorch initializes them: with the other tests'
// weights in [-1, 1) a recurrence this wide is chaotic over 64 steps, and float32 rounding alone
// (on the sgemm path too) moved outputs by up to 6e-4.
TEST(Lstm, InputProjectionsOfDozensOfRowsMatchTheReference) {
  const auto scaled = [](const Tensor& t, double k) {
    std::vector<double> v = t.to_double_vector();
    for (double& x : v) x *= k;
    return Tensor::from_vector<double>(t.shape(), v);
  };
  const auto check = [&](const Problem& p, uint32_t seed) {
    std::vector<Tensor> in = p.inputs(seed);
    in[1] = scaled(in[1], 1 / std::sqrt(static_cast<double>(p.I)));
    in[2] = scaled(in[2], 1 / std::sqrt(static_cast<double>(p.H)));
    const auto want = reference(p, in);
    const auto got = p.run(cast_floats(in, DataType::Float32));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("float32 output " + std::to_string(i));
      expect_close(got[i].cast(DataType::Float64), want[i], 1e-4, 1e-5);
    }
  };
  for (int64_t n : {1, 4}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    check(Problem{.op = "LSTM", .direction = "bidirectional", .S = 64 / n, .N = n, .I = 64, .H = 128},
          static_cast<uint32_t>(41 + n));
  }
  check(Problem{.op = "GRU", .S = 40, .N = 1, .I = 64, .H = 192}, 47);
}

// From 16 batch entries on two threads, a float32 LSTM runs as rnn.cpp's lstm_batch_split (each
// thread the whole sequence of its half of the batch, its own product per step, no barrier: with
// AVX-512 oneDNN's matmul on the thread's copy of R while all its rows run, sgemm after): ragged
// sequence_lens (entries ending early, one of length 0, the longest on either thread), both
// layouts, both directions, initial states, with peepholes and without (a default LSTM, whose
// input size here is at most a quarter of its hidden size: each step's product takes X[t] W^T
// too, [X[t], H] [W, R]^T, rnn.cpp inputs_in_steps_; the ragged lengths keep oneDNN's LSTM
// primitive from taking it); and the same problem on one thread (the general path) agrees to
// float32 rounding (the products cover other rows, so their sums may round differently: 2.4e-7
// at most seen here with sgemm alone).
TEST(Lstm, LargeBatchesSplitBetweenThreadsAndMatchTheReference) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  uint32_t seed = 23;
  for (bool peepholes : {true, false}) {
    for (bool batch_first : {false, true}) {
      SCOPED_TRACE(std::string(batch_first ? "layout 1" : "layout 0") + (peepholes ? ", peepholes" : ""));
      Problem p{.op = "LSTM", .direction = "bidirectional", .S = 6, .N = 19, .I = 4, .H = 24};
      p.batch_first = batch_first;
      p.initial_h = p.initial_c = true;
      p.peepholes = peepholes;
      p.lens = {6, 3, 0, 5, 6, 1, 2, 4, 6, 5, 3, 2, 1, 4, 4, 5, 6, 2, 3};
      expect_matches_reference(p, ++seed);
      const auto in = cast_floats(p.inputs(seed), DataType::Float32);
      const auto split = p.run(in);
      omp_set_num_threads(1);
      const auto general = p.run(in);
      omp_set_num_threads(2);
      for (size_t i = 0; i < split.size(); ++i) expect_close(split[i], general[i], 1e-5, 1e-6);
    }
  }
  omp_set_num_threads(saved);
}

// From 8 batch entries on, a float32 LSTM with default activations and none of clip,
// input_forget, peepholes or shorter sequences runs oneDNN's LSTM primitive (rnn_onednn.h):
// every direction, both layouts, with and without the bias, initial states and a
// sequence_lens of full lengths.
TEST(Lstm, DefaultLstmsFromEightEntriesRunOneDnnsPrimitiveAndMatchTheReference) {
  uint32_t seed = 40;
  for (const char* direction : {"forward", "reverse", "bidirectional"}) {
    for (bool batch_first : {false, true}) {
      for (bool plain : {true, false}) {
        SCOPED_TRACE(std::string(direction) + (batch_first ? ", layout 1" : "") + (plain ? "" : ", states, lens"));
        Problem p{.op = "LSTM", .direction = direction, .S = 5, .N = 9, .I = 6, .H = 16};
        p.batch_first = batch_first;
        p.bias = plain;
        p.initial_h = p.initial_c = !plain;
        if (!plain) p.lens.assign(9, 5);
        expect_matches_reference(p, ++seed);
      }
    }
  }
}

// The primitive's weights are prepared once while they are constant (initializers no run
// replaces) and again at every run when they are graph inputs: two runs of one session, with
// other inputs (and other weights where they are inputs), each match the reference; Y_h
// alone requested (Y and Y_c omitted).
TEST(Lstm, OneDnnsPrimitiveKeepsConstantWeightsAndRereadsFedOnes) {
  Problem p{.op = "LSTM", .direction = "bidirectional", .S = 4, .N = 12, .I = 5, .H = 8};
  for (bool constant : {true, false}) {
    SCOPED_TRACE(constant ? "initializers" : "graph inputs");
    const auto first = cast_floats(p.inputs(60), DataType::Float32);
    onnx::ModelProto model = testing::node_model(NodeSpec{"LSTM", "", 17, p.attributes(), 3}, first);
    auto* graph = model.mutable_graph();
    auto* node = graph->mutable_node(0);
    node->set_output(0, "");
    node->set_output(2, "");
    auto* outputs = graph->mutable_output();
    outputs->erase(outputs->begin() + 2);
    outputs->erase(outputs->begin());
    if (constant) {  // W, R, B become initializers
      for (int i : {1, 2, 3}) io::tensor_to_proto(first[static_cast<size_t>(i)], "in" + std::to_string(i), *graph->add_initializer());
      auto* inputs = graph->mutable_input();
      inputs->erase(inputs->begin() + 1, inputs->begin() + 4);
    }
    runtime::Session session(model);
    for (uint32_t seed : {60u, 70u}) {
      auto in = p.inputs(seed);
      if (constant) {  // the weights stay the first run's
        for (size_t i : {1u, 2u, 3u}) in[i] = p.inputs(60)[i];
      }
      const auto want = reference(p, in);
      const auto in32 = cast_floats(in, DataType::Float32);
      runtime::NamedTensors feeds{{"in0", in32[0]}};
      if (!constant) {
        for (size_t i : {1u, 2u, 3u}) feeds["in" + std::to_string(i)] = in32[i];
      }
      const runtime::NamedTensors got = session.run(feeds);
      ASSERT_EQ(got.size(), 1u);
      expect_close(got.at("out1").cast(DataType::Float64), want[1], 1e-4, 1e-5);
    }
  }
}

TEST(Lstm, ZeroLengthEntriesKeepTheInitialStateAndZeroOutputs) {
  Problem p{.op = "LSTM", .direction = "bidirectional", .S = 3, .N = 3, .I = 2, .H = 2};
  p.initial_h = p.initial_c = true;
  p.lens = {0, 3, 0};
  expect_matches_reference(p, 11);
  const auto in = p.inputs(11);
  const auto got = p.run(in);
  const auto y = got[0].to_double_vector(), y_h = got[1].to_double_vector(), y_c = got[2].to_double_vector();
  const auto h0 = in[5].to_double_vector(), c0 = in[6].to_double_vector();
  for (int64_t b : {0, 2}) {
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t j = 0; j < 2; ++j) {
        const auto s = static_cast<size_t>((d * 3 + b) * 2 + j);  // [D, N, H]
        EXPECT_EQ(y_h[s], h0[s]);  // the state is the initial one ...
        EXPECT_EQ(y_c[s], c0[s]);
        for (int64_t t = 0; t < 3; ++t) EXPECT_EQ(y[((t * 2 + d) * 3 + b) * 2 + j], 0.0);  // ... Y is 0
      }
    }
  }
}

TEST(Lstm, Float16ComputesInFloat) {
  Problem p{.op = "LSTM", .direction = "bidirectional", .S = 3, .N = 2, .I = 3, .H = 2};
  p.initial_h = true;
  const auto in = p.inputs(5);
  const auto want = reference(p, cast_floats(cast_floats(in, DataType::Float16), DataType::Float64));
  const auto got = p.run(cast_floats(in, DataType::Float16));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].dtype(), DataType::Float16);
    expect_close(got[i].cast(DataType::Float64), want[i], 2e-3, 2e-3);
  }
}

TEST(Lstm, OmittedOutputsAndOlderOpsets) {
  Problem p{.op = "LSTM", .direction = "bidirectional", .S = 3, .N = 2, .I = 3, .H = 2, .opset = 7};
  p.initial_c = true;
  const auto in = p.inputs(2);
  const auto want = reference(p, in);
  // Only Y_c requested: Y and Y_h are omitted ("").
  onnx::ModelProto model = testing::node_model(NodeSpec{"LSTM", "", 7, p.attributes(), 3}, in);
  auto* node = model.mutable_graph()->mutable_node(0);
  node->set_output(0, "");
  node->set_output(1, "");
  auto* outputs = model.mutable_graph()->mutable_output();
  outputs->erase(outputs->begin(), outputs->begin() + 2);
  runtime::Session session(model);
  runtime::NamedTensors feeds;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].defined()) feeds["in" + std::to_string(i)] = in[i];
  }
  expect_close(session.run(feeds).at("out2"), want[2], 1e-10, 1e-12);
  for (int opset : {13, 14}) {
    p.opset = opset;
    expect_matches_reference(p, 2);
  }
}

// ---------------------------------------------------------------------------------------------
// GRU

TEST(Gru, LinearBeforeResetZeroAndOne) {
  for (bool lbr : {false, true}) {
    for (bool batch_first : {false, true}) {
      SCOPED_TRACE(std::string("linear_before_reset ") + (lbr ? "1" : "0") +
                   (batch_first ? ", layout 1" : ", layout 0"));
      Problem p{.op = "GRU", .direction = "bidirectional", .S = 5, .N = 3, .I = 4, .H = 3};
      p.linear_before_reset = lbr;
      p.batch_first = batch_first;
      p.initial_h = true;
      p.lens = {2, 5, 3};
      expect_matches_reference(p, lbr ? 21 : 22);
    }
  }
}

TEST(Gru, ReverseWithoutBiasAndWithClip) {
  Problem p{.op = "GRU", .direction = "reverse", .S = 4, .N = 2, .I = 3, .H = 4};
  p.bias = false;
  p.clip = 0.5f;
  expect_matches_reference(p, 31);
  p.bias = true;
  p.linear_before_reset = true;
  expect_matches_reference(p, 32);
}

TEST(Gru, OneActivationListServesBothDirections) {
  Problem p{.op = "GRU", .direction = "bidirectional", .S = 3, .N = 2, .I = 2, .H = 3};
  p.extra = {strings_attr("activations", {"Sigmoid", "Elu"}), attr("activation_alpha", std::vector<float>{0.5f})};
  p.acts = {{"Sigmoid"}, {"Elu", 0.5f}, {"Sigmoid"}, {"Elu", 0.5f}};
  expect_matches_reference(p, 41);
}

// ---------------------------------------------------------------------------------------------
// RNN

TEST(Rnn, CustomActivationsPerDirectionAndClip) {
  Problem p{.op = "RNN", .direction = "bidirectional", .S = 5, .N = 3, .I = 3, .H = 4};
  p.clip = 0.8f;
  p.initial_h = true;
  p.lens = {5, 1, 3};
  p.extra = {strings_attr("activations", {"LeakyRelu", "ScaledTanh"}),
             attr("activation_alpha", std::vector<float>{0.2f, 1.5f}),
             attr("activation_beta", std::vector<float>{0.7f})};
  p.acts = {{"LeakyRelu", 0.2f}, {"ScaledTanh", 1.5f, 0.7f}};
  expect_matches_reference(p, 51);
  p.batch_first = true;
  expect_matches_reference(p, 52);
}

TEST(Rnn, EveryActivationWithItsDefaults) {
  // Defaults are those of the same-named ONNX ops (Affine 1/0, ScaledTanh 1/1).
  const std::vector<Act> acts = {{"Relu"},        {"Tanh"},           {"Sigmoid"},
                                 {"Affine", 1, 0}, {"LeakyRelu", 0.01f}, {"ThresholdedRelu", 1},
                                 {"ScaledTanh", 1, 1}, {"HardSigmoid", 0.2f, 0.5f}, {"Elu", 1},
                                 {"Softsign"},     {"Softplus"}};
  for (const Act& a : acts) {
    SCOPED_TRACE(a.name);
    Problem p{.op = "RNN", .S = 3, .N = 2, .I = 3, .H = 3};
    p.extra = {strings_attr("activations", {a.name})};
    p.acts = {a};
    expect_matches_reference(p, 61);
  }
}

TEST(Rnn, ActivationNamesAreCaseInsensitive) {
  Problem p{.op = "RNN", .direction = "reverse", .S = 3, .N = 2, .I = 3, .H = 3};
  p.extra = {strings_attr("activations", {"relu"})};
  p.acts = {{"Relu"}};
  expect_matches_reference(p, 71);
}

// ---------------------------------------------------------------------------------------------
// Errors

// The message of the Error the problem's run throws ("" when it does not throw).
std::string error_of(const Problem& p, const std::vector<Tensor>& in) {
  try {
    p.run(in);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "message: " << (message)

TEST(RnnErrors, BadShapesNameTheInputAndTheExpectedShape) {
  const Problem p{.op = "LSTM", .S = 3, .N = 2, .I = 3, .H = 2};
  auto in = p.inputs(1);
  in[1] = random({1, 8, 4}, 2);
  std::string m = error_of(p, in);
  EXPECT_ERROR_HAS(m, "'in1'");
  EXPECT_ERROR_HAS(m, "[num_directions, 4*hidden_size, input_size] = [1,8,3]");

  in = p.inputs(1);
  in[2] = random({1, 8, 3}, 2);
  m = error_of(p, in);
  EXPECT_ERROR_HAS(m, "'in2'");
  EXPECT_ERROR_HAS(m, "hidden_size");

  in = p.inputs(1);
  in[3] = random({1, 8}, 2);
  EXPECT_ERROR_HAS(error_of(p, in), "[num_directions, 8*hidden_size]");

  in = p.inputs(1);
  in[0] = random({3, 3}, 2);
  EXPECT_ERROR_HAS(error_of(p, in), "expected rank 3");

  in = p.inputs(1);
  in.resize(8);
  in[5] = random({2, 1, 2}, 2);  // layout 1's shape at layout 0
  m = error_of(p, in);
  EXPECT_ERROR_HAS(m, "'in5'");
  EXPECT_ERROR_HAS(m, "[num_directions, batch_size, hidden_size] = [1,2,2]");
  in[5] = Tensor();
  in[7] = random({1, 4}, 2);
  EXPECT_ERROR_HAS(error_of(p, in), "[num_directions, 3*hidden_size]");

  in = p.inputs(1);
  in[1] = in[1].cast(DataType::Float32);
  EXPECT_ERROR_HAS(error_of(p, in), "expected float64 like 'in0'");
}

TEST(RnnErrors, BadSequenceLens) {
  Problem p{.op = "GRU", .S = 3, .N = 2, .I = 3, .H = 2};
  p.lens = {3, 4};
  std::string m = error_of(p, p.inputs(1));
  EXPECT_ERROR_HAS(m, "'in4'");
  EXPECT_ERROR_HAS(m, "[0, seq_length = 3]");
  p.lens = {3, -1};
  EXPECT_ERROR_HAS(error_of(p, p.inputs(1)), "'in4'");
  p.lens = {};
  auto in = p.inputs(1);
  in.resize(5);
  in[4] = Tensor::from_vector<int32_t>(Shape{1}, {3});
  EXPECT_ERROR_HAS(error_of(p, in), "[batch_size] = [2]");
  in[4] = random({2}, 3);
  EXPECT_ERROR_HAS(error_of(p, in), "expected int32");
}

TEST(RnnErrors, BadAttributes) {
  Problem p{.op = "RNN", .S = 2, .N = 1, .I = 2, .H = 2};
  const auto in = p.inputs(1);
  p.extra = {strings_attr("activations", {"Swish"})};
  std::string m = error_of(p, in);
  EXPECT_ERROR_HAS(m, "unknown function 'Swish'");
  EXPECT_ERROR_HAS(m, "HardSigmoid");
  p.extra = {strings_attr("activations", {"Tanh", "Tanh", "Tanh"})};
  EXPECT_ERROR_HAS(error_of(p, in), "expected 1 (1 per direction)");
  p.extra = {};
  p.direction = "sideways";
  EXPECT_ERROR_HAS(error_of(p, in), "attribute 'direction' is 'sideways'");
  p.direction = "forward";
  p.extra = {attr("layout", int64_t{2})};
  EXPECT_ERROR_HAS(error_of(p, in), "attribute 'layout' is 2");
  p.extra = {};
  p.clip = -1.0f;
  EXPECT_ERROR_HAS(error_of(p, in), "attribute 'clip'");
  p.clip.reset();
  p.H = 3;  // hidden_size disagrees with W and R
  EXPECT_ERROR_HAS(error_of(p, in), "= [1,3,2]");

  Problem lstm{.op = "LSTM", .S = 2, .N = 1, .I = 2, .H = 2};
  lstm.extra = {attr("input_forget", int64_t{2})};
  EXPECT_ERROR_HAS(error_of(lstm, lstm.inputs(1)), "attribute 'input_forget' is 2");
  lstm.extra = {strings_attr("activations", {"Sigmoid", "Tanh"})};
  EXPECT_ERROR_HAS(error_of(lstm, lstm.inputs(1)), "expected 3 (3 per direction)");
}

TEST(Gru, HiddenSizeDefaultsToTheLastDimOfR) {
  Problem p{.op = "GRU", .S = 3, .N = 2, .I = 3, .H = 4};
  const auto in = p.inputs(1);
  const auto want = reference(p, in);
  const auto got = run_node(NodeSpec{"GRU", "", 17, {}, 2}, in);
  expect_close(got[1], want[1], 1e-10, 1e-12);
}

}  // namespace
}  // namespace onnxtrain
