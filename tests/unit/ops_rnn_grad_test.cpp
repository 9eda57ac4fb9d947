// Unit tests for the ai.onnxtrain backward ops RNNGrad, GRUGrad and LSTMGrad (rnn_grad.cpp):
// central differences in float64 of L = sum(Y * R_Y) + sum(Y_h * R_h) (+ sum(Y_c * R_c)) with
// the forward op run through onnxtrain (so dY = R_Y, ...), at tight tolerance; the float32 path
// against float64; every direction, sequence_lens (with zero lengths), layout 1, initial
// states, peepholes, input_forget, linear_before_reset, clip, every activation function;
// omitted output gradients, unnamed outputs, and errors.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "runtime/fusion.h"

#include "onnxtrain/error.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::attr;
using testing::expect_close;
using testing::node_model;
using testing::NodeSpec;
using Attrs = std::vector<onnx::AttributeProto>;

constexpr const char* kInternal = "ai.onnxtrain";

using testing::random_f64;
using Strings = std::vector<std::string>;

// A forward node and its inputs.
struct Config {
  std::string name;
  std::string op;  // RNN, GRU, LSTM
  std::string direction = "forward";
  bool layout1 = false, bias = true, initial_h = false, initial_c = false, peepholes = false;
  std::vector<int32_t> lens;  // empty: sequence_lens omitted
  Attrs extra;                // clip, linear_before_reset, input_forget, activations, ...
  int64_t S = 4, N = 3, I = 3, H = 2;
  int opset = 17;

  int64_t D() const { return direction == "bidirectional" ? 2 : 1; }
  int64_t G() const { return op == "RNN" ? 1 : op == "GRU" ? 3 : 4; }
  int forward_inputs() const { return op == "LSTM" ? 8 : 6; }
  int forward_outputs() const { return op == "LSTM" ? 3 : 2; }
  Attrs attributes() const {
    Attrs a{attr("hidden_size", H), attr("direction", direction)};
    if (layout1) a.push_back(attr("layout", int64_t{1}));
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Inputs in ONNX order, float64, all forward_inputs() of them (undefined where omitted).
  std::vector<Tensor> inputs(uint32_t seed) const {
    const Shape state = layout1 ? Shape{N, D(), H} : Shape{D(), N, H};
    std::vector<Tensor> in(static_cast<size_t>(forward_inputs()));
    in[0] = random_f64(layout1 ? Shape{N, S, I} : Shape{S, N, I}, seed);
    in[1] = random_f64({D(), G() * H, I}, seed + 1);
    in[2] = random_f64({D(), G() * H, H}, seed + 2);
    if (bias) in[3] = random_f64({D(), 2 * G() * H}, seed + 3);
    if (!lens.empty()) in[4] = Tensor::from_vector<int32_t>(Shape{N}, lens);
    if (initial_h) in[5] = random_f64(state, seed + 5);
    if (op == "LSTM") {
      if (initial_c) in[6] = random_f64(state, seed + 6);
      if (peepholes) in[7] = random_f64({D(), 3 * H}, seed + 7);
    }
    return in;
  }
};

// Output k of the gradient op is the gradient of forward input k, sequence_lens (4) skipped.
int input_of_output(int k) { return k < 4 ? k : k + 1; }

// L(inputs) = sum_k sum(out_k * r[k]) through one session of the forward node.
class Loss {
 public:
  Loss(const Config& c, const std::vector<Tensor>& inputs)
      : outputs_(c.forward_outputs()),
        session_(node_model(NodeSpec{c.op, "", c.opset, c.attributes(), c.forward_outputs()}, inputs)) {}

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) {
    runtime::NamedTensors feeds;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined()) feeds["in" + std::to_string(i)] = inputs[i];
    }
    auto result = session_.run(feeds);
    std::vector<Tensor> out;
    for (int k = 0; k < outputs_; ++k) out.push_back(result.at("out" + std::to_string(k)));
    return out;
  }
  double operator()(const std::vector<Tensor>& inputs, const std::vector<Tensor>& r) {
    const auto y = forward(inputs);
    double sum = 0;
    for (size_t k = 0; k < y.size(); ++k) {
      if (!r[k].defined()) continue;
      const auto yv = y[k].to_double_vector(), rv = r[k].to_double_vector();
      for (size_t j = 0; j < yv.size(); ++j) sum += yv[j] * rv[j];
    }
    return sum;
  }

 private:
  int outputs_;
  runtime::Session session_;
};

// dL/d inputs[i] by central differences (eps 1e-6).
Tensor numeric_grad(Loss& loss, std::vector<Tensor> inputs, size_t i, const std::vector<Tensor>& r) {
  return testing::central_differences(
      [&](const Tensor& x) {
        inputs[i] = x;
        return loss(inputs, r);
      },
      inputs[i]);
}

// The gradient op's model: outputs for the forward inputs in `wanted` that are present, the
// others left unnamed; the output gradients r (undefined: omitted).
onnx::ModelProto grad_model(const Config& c, const std::vector<Tensor>& inputs, const std::vector<Tensor>& r,
                            const std::vector<int>& wanted) {
  std::vector<Tensor> all = inputs;
  all.insert(all.end(), r.begin(), r.end());
  while (!all.back().defined()) all.pop_back();
  const int outputs = c.forward_inputs() - 1;
  onnx::ModelProto m = node_model(NodeSpec{c.op + "Grad", kInternal, 1, c.attributes(), outputs}, all);
  auto* g = m.mutable_graph();
  g->clear_output();
  for (int k = 0; k < outputs; ++k) {
    const int i = input_of_output(k);
    const bool named =
        inputs[static_cast<size_t>(i)].defined() && std::find(wanted.begin(), wanted.end(), i) != wanted.end();
    g->mutable_node(0)->set_output(k, named ? "grad" + std::to_string(i) : "");
    if (named) g->add_output()->set_name("grad" + std::to_string(i));
  }
  return m;
}

// Gradients by forward input position (undefined where not asked for or omitted).
std::vector<Tensor> run_grad(const Config& c, const std::vector<Tensor>& inputs, const std::vector<Tensor>& r,
                             const std::vector<int>& wanted = {0, 1, 2, 3, 5, 6, 7}) {
  runtime::Session session(grad_model(c, inputs, r, wanted));
  runtime::NamedTensors feeds;
  std::vector<Tensor> all = inputs;
  all.insert(all.end(), r.begin(), r.end());
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].defined()) feeds["in" + std::to_string(i)] = all[i];
  }
  const auto result = session.run(feeds);
  std::vector<Tensor> grads(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto it = result.find("grad" + std::to_string(i));
    if (it != result.end()) grads[i] = it->second;
  }
  return grads;
}

std::vector<Tensor> cast_all(const std::vector<Tensor>& ts, DataType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.defined() && t.dtype() == DataType::Float64 ? t.cast(dtype) : t);
  return out;
}

// Random output gradients shaped like the forward outputs.
std::vector<Tensor> output_gradients(Loss& loss, const std::vector<Tensor>& inputs, uint32_t seed) {
  std::vector<Tensor> r;
  for (const Tensor& y : loss.forward(inputs)) r.push_back(random_f64(y.shape(), seed++));
  return r;
}

// The gradients of c's inputs (seed 11) for random output gradients (seed 91), in float64 and
// in float32.
struct Gradients {
  std::vector<Tensor> inputs, r, got, got32;
};
Gradients gradients(const Config& c, Loss& loss) {
  Gradients g;
  g.inputs = c.inputs(11);
  g.r = output_gradients(loss, g.inputs, 91);
  g.got = run_grad(c, g.inputs, g.r);
  g.got32 = run_grad(c, cast_all(g.inputs, DataType::Float32), cast_all(g.r, DataType::Float32));
  return g;
}

void check(const Config& c) {
  SCOPED_TRACE(c.name);
  Loss loss(c, c.inputs(11));
  const auto [inputs, r, got, got32] = gradients(c, loss);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i == 4 || !inputs[i].defined()) continue;
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    ASSERT_TRUE(got[i].defined());
    expect_close(got[i], numeric_grad(loss, inputs, i, r), 1e-6, 1e-7);
    ASSERT_EQ(got32[i].dtype(), DataType::Float32);
    // float32 against float64: rounding accumulated over 4 steps and the GEMMs' sums.
    expect_close(got32[i].cast(DataType::Float64), got[i], 1e-4, 1e-5);
  }
}

// ---------------------------------------------------------------------------------------------
// Finite differences

TEST(RnnGradTest, Directions) {
  for (const char* direction : {"forward", "reverse", "bidirectional"}) {
    check({.name = std::string("RNN ") + direction, .op = "RNN", .direction = direction});
    check({.name = std::string("GRU ") + direction, .op = "GRU", .direction = direction});
    check({.name = std::string("LSTM ") + direction, .op = "LSTM", .direction = direction});
  }
}

TEST(RnnGradTest, SequenceLengthsAndInitialStates) {
  // Entry 1 has length 0: its Y_h is initial_h, whose gradient is dY_h unchanged.
  for (const char* direction : {"forward", "reverse", "bidirectional"}) {
    for (const char* op : {"RNN", "GRU", "LSTM"}) {
      check({.name = std::string(op) + " " + direction, .op = op, .direction = direction, .initial_h = true,
             .initial_c = true, .lens = {4, 0, 2}});
    }
  }
}

TEST(RnnGradTest, Layout1) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    check({.name = op, .op = op, .direction = "bidirectional", .layout1 = true, .initial_h = true, .initial_c = true,
           .lens = {2, 4, 1}});
  }
}

TEST(RnnGradTest, NoBias) {
  check({.name = "GRU", .op = "GRU", .bias = false, .initial_h = true});
  check({.name = "LSTM", .op = "LSTM", .direction = "reverse", .bias = false});
}

TEST(RnnGradTest, LstmPeepholesAndInputForget) {
  check({.name = "peepholes", .op = "LSTM", .initial_h = true, .initial_c = true, .peepholes = true});
  check({.name = "peepholes bidirectional", .op = "LSTM", .direction = "bidirectional", .initial_c = true,
         .peepholes = true, .lens = {3, 4, 1}});
  check({.name = "input_forget", .op = "LSTM", .direction = "reverse", .initial_c = true, .peepholes = true,
         .extra = {attr("input_forget", int64_t{1})}});
}

// ONNX's default LSTM (Sigmoid, Tanh, Tanh; no clip, peepholes or input_forget) takes a fused
// step (rnn_grad.cpp default_lstm_step); with peepholes present, even all zero, the general step
// runs. The two must give the same gradients. H = 19 spans a 16-lane vector and a remainder; the
// lengths leave some entries inactive at some steps.
void check_default_lstm_against_general(const Config& fused) {
  check(fused);
  Config general = fused;
  general.peepholes = true;
  Loss loss(fused, fused.inputs(11));
  const std::vector<Tensor> r64 = output_gradients(loss, fused.inputs(11), 91);
  for (DataType dtype : {DataType::Float64, DataType::Float32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<Tensor> inputs = cast_all(fused.inputs(11), dtype), r = cast_all(r64, dtype);
    std::vector<Tensor> with_p = inputs;
    with_p[7] = Tensor::zeros(dtype, {fused.D(), 3 * fused.H});
    const std::vector<Tensor> a = run_grad(fused, inputs, r), b = run_grad(general, with_p, r);
    for (int i : {0, 1, 2, 3, 5, 6}) {
      SCOPED_TRACE("gradient of input " + std::to_string(i));
      ASSERT_TRUE(a[static_cast<size_t>(i)].defined());
      // The same products and sums in the same order; only the fused loop's rounding of each
      // slope product may differ (float32: a few ulps carried through 4 steps).
      const double tol = dtype == DataType::Float64 ? 1e-13 : 1e-6;
      expect_close(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)], tol, tol);
    }
  }
}

TEST(RnnGradTest, DefaultLstmStepEqualsTheGeneralStep) {
  check_default_lstm_against_general({.name = "default LSTM", .op = "LSTM", .direction = "bidirectional",
                                      .initial_h = true, .initial_c = true, .lens = {4, 2, 0, 3, 4}, .N = 5,
                                      .H = 19});
}

// From 16 batch entries on two threads a float32 default LSTM's backward steps run with the batch
// split between the threads (default_lstm_batch_split), the general step over the whole batch.
TEST(RnnGradTest, DefaultLstmBatchSplitBetweenThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::vector<int32_t> lens(18);
  for (size_t b = 0; b < lens.size(); ++b) lens[b] = static_cast<int32_t>((b * 7) % 5);  // 0 to 4, ragged
  check_default_lstm_against_general({.name = "default LSTM, batch 18", .op = "LSTM", .direction = "bidirectional",
                                      .initial_h = true, .initial_c = true, .lens = lens, .N = 18, .H = 19});
  omp_set_num_threads(saved);
}

// Where all of a thread's rows run at the same time t at a step (equal lengths), the split steps
// write the gate gradients straight into their rows of the all-steps buffer, which lie at one
// stride (1 row apart in layout 0, seq_length rows in layout 1), and the step's product reads them
// there: equal lengths (sequence_lens omitted), and one thread's rows of equal lengths beside the
// other's ragged ones (in place at some steps, copied at the others), in both layouts.
TEST(RnnGradTest, DefaultLstmBatchSplitReadsGateGradientsInPlace) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const std::vector<int32_t> mixed = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 4, 2, 4, 4, 1, 4, 4};
  for (bool layout1 : {false, true}) {
    for (const std::vector<int32_t>& lens : {std::vector<int32_t>{}, mixed}) {
      const std::string name = std::string(layout1 ? "layout 1" : "layout 0") + (lens.empty() ? ", equal lengths" : ", mixed");
      SCOPED_TRACE(name);
      check_default_lstm_against_general({.name = name, .op = "LSTM", .direction = "bidirectional", .layout1 = layout1,
                                          .initial_h = true, .initial_c = true, .lens = lens, .N = 18, .H = 19});
    }
  }
  omp_set_num_threads(saved);
}

// Weight gradients of 512 x 128 over 1024 rows (gates x hidden by input or hidden, over
// seq x batch) run through oneDNN's matmul primitive in float32 (ops/dnnl_util.h
// transposed_a_prefers_matmul), float64 through the reference loops: the two agree, for one
// direction and for two (the second writes its own block of dW and dR).
TEST(RnnGradTest, LargeWeightGradientsAgreeWithFloat64) {
  for (const char* direction : {"forward", "bidirectional"}) {
    const Config c{.name = direction, .op = "LSTM", .direction = direction, .S = 8, .N = 128, .I = 128, .H = 128};
    SCOPED_TRACE(c.name);
    Loss loss(c, c.inputs(11));
    const Gradients g = gradients(c, loss);
    const auto& got = g.got;
    const auto& got32 = g.got32;
    for (size_t i : {1, 2, 3}) {  // W, R (the products) and B; X's gradient takes other products
      SCOPED_TRACE("gradient of input " + std::to_string(i));
      // float32 sums over 1024 rows (and 8 recurrent steps) against float64.
      expect_close(got32[i].cast(DataType::Float64), got[i], 2e-4, 1e-4);
    }
  }
}

TEST(RnnGradTest, GruLinearBeforeReset) {
  check({.name = "forward", .op = "GRU", .initial_h = true, .extra = {attr("linear_before_reset", int64_t{1})}});
  check({.name = "bidirectional, lens", .op = "GRU", .direction = "bidirectional", .lens = {1, 4, 3},
         .extra = {attr("linear_before_reset", int64_t{1})}});
  check({.name = "no bias", .op = "GRU", .bias = false, .extra = {attr("linear_before_reset", int64_t{1})}});
}

TEST(RnnGradTest, ClipZeroesTheGradientOfClippedPreActivations) {
  // With |pre-activation| up to ~4 and clip 0.7 both sides of the bound occur.
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    check({.name = op, .op = op, .direction = "bidirectional", .initial_h = true, .peepholes = true,
           .extra = {attr("clip", 0.7f)}});
  }
  check({.name = "GRU linear_before_reset", .op = "GRU",
         .extra = {attr("clip", 0.7f), attr("linear_before_reset", int64_t{1})}});
  // Clip saturates every gate: only the paths that skip the gates carry gradient.
  Config saturated{.name = "saturated", .op = "RNN", .extra = {attr("clip", 1e-3f)}};
  const auto in = saturated.inputs(11);
  Loss loss(saturated, in);
  const auto r = output_gradients(loss, in, 91);
  const auto got = run_grad(saturated, in, r);
  const std::vector<double> zeros(static_cast<size_t>(got[1].numel()), 0.0);
  expect_close(got[1], Tensor::from_vector<double>(got[1].shape(), zeros));
}

TEST(RnnGradTest, EveryActivationFunction) {
  // One function per forward-direction slot, alpha / beta consumed in list order.
  const std::vector<std::vector<std::string>> lists = {
      {"Relu"}, {"LeakyRelu"}, {"ThresholdedRelu"}, {"ScaledTanh"}, {"HardSigmoid"}, {"Elu"},
      {"Softsign"}, {"Softplus"}, {"Affine"}, {"Sigmoid"}};
  for (const auto& list : lists) {
    check({.name = "RNN " + list[0], .op = "RNN", .initial_h = true,
           .extra = {attr("activations", list), attr("activation_alpha", std::vector<float>{0.3f}),
                     attr("activation_beta", std::vector<float>{0.6f})}});
  }
  check({.name = "GRU HardSigmoid Softsign / Sigmoid Elu", .op = "GRU", .direction = "bidirectional",
         .extra = {attr("activations", Strings{"HardSigmoid", "Softsign", "Sigmoid", "Elu"}),
                   attr("activation_alpha", std::vector<float>{0.4f, 0.8f}),
                   attr("activation_beta", std::vector<float>{0.45f})}});
  // A gate function above 1 (Softplus as f) would let C grow geometrically and the loss reach
  // ~1e5, where central differences lose 5 digits to rounding: f stays in [0, 1] here.
  check({.name = "LSTM HardSigmoid ScaledTanh Softplus", .op = "LSTM", .peepholes = true,
         .extra = {attr("activations", Strings{"HardSigmoid", "ScaledTanh", "Softplus"}),
                   attr("activation_alpha", std::vector<float>{0.3f, 1.5f}),
                   attr("activation_beta", std::vector<float>{0.55f, 0.7f})}});
}

TEST(RnnGradTest, OlderOpsets) {
  // Opset 7: no layout attribute.
  check({.name = "LSTM opset 7", .op = "LSTM", .direction = "bidirectional", .initial_h = true, .opset = 7});
  check({.name = "GRU opset 13", .op = "GRU", .lens = {1, 2, 4}, .opset = 13});
}

// ---------------------------------------------------------------------------------------------
// Omitted gradients and outputs

TEST(RnnGradTest, OmittedOutputGradientsAreZero) {
  const Config c{.name = "LSTM", .op = "LSTM", .direction = "bidirectional", .initial_h = true, .initial_c = true,
                 .peepholes = true, .lens = {4, 1, 3}};
  const auto in = c.inputs(5);
  Loss loss(c, in);
  const auto r = output_gradients(loss, in, 7);
  for (size_t omitted = 0; omitted < r.size(); ++omitted) {
    SCOPED_TRACE("omitted output gradient " + std::to_string(omitted));
    std::vector<Tensor> some = r, zeros = r;
    some[omitted] = Tensor();
    const std::vector<double> z(static_cast<size_t>(r[omitted].numel()), 0.0);
    zeros[omitted] = Tensor::from_vector<double>(r[omitted].shape(), z);
    const auto got = run_grad(c, in, some);
    const auto want = run_grad(c, in, zeros);
    for (size_t i = 0; i < in.size(); ++i) {
      if (want[i].defined()) expect_close(got[i], want[i], 0, 0);
    }
  }
}

TEST(RnnGradTest, ComputesOnlyTheOutputsAskedFor) {
  const Config c{.name = "GRU", .op = "GRU", .direction = "reverse", .initial_h = true, .lens = {2, 4, 3}};
  const auto in = c.inputs(5);
  Loss loss(c, in);
  const auto r = output_gradients(loss, in, 7);
  const auto all = run_grad(c, in, r);
  for (int i : {0, 1, 2, 3, 5}) {
    SCOPED_TRACE("only the gradient of input " + std::to_string(i));
    const auto one = run_grad(c, in, r, {i});
    for (size_t k = 0; k < in.size(); ++k) EXPECT_EQ(one[k].defined(), static_cast<int>(k) == i) << k;
    expect_close(one[static_cast<size_t>(i)], all[static_cast<size_t>(i)], 0, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

std::string error_of(const onnx::ModelProto& model, const runtime::NamedTensors& feeds) {
  try {
    runtime::Session session(model);
    session.run(feeds);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

runtime::NamedTensors feeds_of(const std::vector<Tensor>& all) {
  runtime::NamedTensors feeds;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].defined()) feeds["in" + std::to_string(i)] = all[i];
  }
  return feeds;
}

#define EXPECT_ERROR_HAS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "message: " << (message)

// ---------------------------------------------------------------------------------------------
// The forward node and its gradient node in one graph: runtime/fusion.h's share_rnn_trace makes
// the forward node an ai.onnxtrain *Training node whose trace the gradient node reads instead of
// running the recurrence again. The same arithmetic on the same inputs: bit-identical results.

// grad_model's graph with the forward node (outputs "y0", ...) first.
onnx::ModelProto paired_model(const Config& c, const std::vector<Tensor>& inputs, const std::vector<Tensor>& r) {
  onnx::ModelProto m = grad_model(c, inputs, r, {0, 1, 2, 3, 5, 6, 7});
  auto* g = m.mutable_graph();
  onnx::NodeProto forward;
  forward.set_op_type(c.op);
  forward.set_name("forward");
  for (int i = 0; i < c.forward_inputs(); ++i) forward.add_input(g->node(0).input(i));
  for (int k = 0; k < c.forward_outputs(); ++k) {
    forward.add_output("y" + std::to_string(k));
    g->add_output()->set_name("y" + std::to_string(k));
  }
  for (const auto& a : c.attributes()) *forward.add_attribute() = a;
  g->add_node()->CopyFrom(g->node(0));
  g->mutable_node(0)->CopyFrom(forward);
  return m;
}

std::map<std::string, Tensor> run_model(const onnx::ModelProto& m, const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& r) {
  runtime::Session session(m);
  runtime::NamedTensors feeds;
  std::vector<Tensor> all = inputs;
  all.insert(all.end(), r.begin(), r.end());
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].defined()) feeds["in" + std::to_string(i)] = all[i];
  }
  const auto out = session.run(feeds);
  return {out.begin(), out.end()};
}

void expect_identical(const Tensor& got, const Tensor& want) {
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), static_cast<size_t>(want.nbytes())), 0);
}

// With `forward_tolerance` > 0 the forward node's outputs are held to the plain forward op's
// within it instead of to the bit: from 8 entries on, a default LSTM without a trace runs oneDNN's
// LSTM primitive (rnn_onednn.h), which sums otherwise than the recurrence that keeps a trace.
void check_shared_trace(const Config& c, DataType dtype, double forward_tolerance = 0) {
  SCOPED_TRACE(c.name + (dtype == DataType::Float32 ? " float32" : " float64"));
  const std::vector<Tensor> inputs = cast_all(c.inputs(21), dtype);
  std::vector<Tensor> r;
  for (const Tensor& y : run_node(NodeSpec{c.op, "", 17, c.attributes(), c.forward_outputs()}, inputs)) {
    r.push_back(random_f64(y.shape(), 77 + static_cast<uint32_t>(r.size())).cast(dtype));
  }
  const onnx::ModelProto paired = paired_model(c, inputs, r);
  onnx::GraphProto rewritten = paired.graph();
  ASSERT_EQ(runtime::share_rnn_trace(rewritten), 1);
  EXPECT_EQ(rewritten.node(0).op_type(), c.op + "Training");
  EXPECT_EQ(rewritten.node(1).input(rewritten.node(1).input_size() - 1), rewritten.node(0).output(c.forward_outputs()));

  const std::vector<Tensor> alone = run_grad(c, inputs, r);  // the gradient op running the forward again
  const std::vector<Tensor> forward = run_node(NodeSpec{c.op, "", 17, c.attributes(), c.forward_outputs()}, inputs);
  const auto got = run_model(paired, inputs, r);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i == 4 || !inputs[i].defined()) continue;
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    expect_identical(got.at("grad" + std::to_string(i)), alone[i]);
  }
  for (int k = 0; k < c.forward_outputs(); ++k) {
    if (forward_tolerance > 0) {
      expect_close(got.at("y" + std::to_string(k)), forward[k], forward_tolerance, forward_tolerance);
    } else {
      expect_identical(got.at("y" + std::to_string(k)), forward[k]);
    }
  }
}

TEST(RnnSharedTrace, GradientsEqualTheGradientOpRunningTheForwardAgain) {
  const std::vector<Config> configs{
      {.name = "LSTM bidirectional, lengths, states, peepholes", .op = "LSTM", .direction = "bidirectional",
       .initial_h = true, .initial_c = true, .peepholes = true, .lens = {4, 0, 2}},
      {.name = "LSTM input_forget, Relu gates (the trace keeps pre-activations)", .op = "LSTM",
       .extra = {attr("input_forget", int64_t{1}), attr("activations", Strings{"Relu", "Tanh", "Tanh"})}},
      {.name = "GRU linear_before_reset, layout 1, reverse", .op = "GRU", .direction = "reverse", .layout1 = true,
       .extra = {attr("linear_before_reset", int64_t{1})}},
      {.name = "GRU with clip", .op = "GRU", .extra = {attr("clip", 0.5f)}},
      {.name = "RNN bidirectional, no bias", .op = "RNN", .direction = "bidirectional", .bias = false}};
  for (const Config& c : configs) {
    check_shared_trace(c, DataType::Float32);
    check_shared_trace(c, DataType::Float64);
  }
}

// From 16 batch entries on two threads a float32 LSTM's forward recurrence runs as rnn.cpp's
// lstm_batch_split, each thread writing its rows of the trace: the float32 gradients still agree
// with float64 ones (finite-difference checked), and the trace the forward node hands over equals
// the one the gradient op records when it runs the forward again.
TEST(RnnSharedTrace, LstmBatchSplitBetweenThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  std::vector<int32_t> lens(18);
  for (size_t b = 0; b < lens.size(); ++b) lens[b] = static_cast<int32_t>((b * 7) % 5);  // 0 to 4, ragged
  const Config c{.name = "LSTM bidirectional, batch 18", .op = "LSTM", .direction = "bidirectional",
                 .initial_h = true, .initial_c = true, .peepholes = true, .lens = lens, .N = 18};
  check(c);
  check_shared_trace(c, DataType::Float32);
  omp_set_num_threads(saved);
}

// One forward direction in layout 0 whose sequences all have X's length: the trace's h rows are
// [X[t], H[t-1]] (rnn_common.h trace_keeps_inputs) and the weight gradients read them there. From
// 16 entries on two threads the forward steps run with the batch split, and, where the input
// size is at most a quarter of the hidden size, their products read those rows too
// (rnn.cpp inputs_in_steps_): sequence_lens omitted and given at full length, with and without
// peepholes (the general step and the default LSTM's), against finite differences and float64,
// and the forward node's trace against the gradient op's own.
TEST(RnnSharedTrace, LstmTraceKeepsXRowsBesideTheStates) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (bool peepholes : {false, true}) {
    for (bool lens : {false, true}) {
      const Config c{.name = std::string("LSTM batch 18") + (peepholes ? ", peepholes" : "") + (lens ? ", full lens" : ""),
                     .op = "LSTM", .initial_h = true, .initial_c = true, .peepholes = peepholes,
                     .lens = lens ? std::vector<int32_t>(18, 4) : std::vector<int32_t>{}, .N = 18, .I = 4, .H = 19};
      check(c);
      check_shared_trace(c, DataType::Float32, peepholes ? 0 : 1e-6);
    }
  }
  omp_set_num_threads(saved);
}

TEST(RnnSharedTrace, RepeatedRunsWithOtherInputsReuseNothingStale) {
  // A session keeps the kernels' buffers between runs: the second run, with other values and
  // other sequence lengths, must equal a fresh session's.
  Config c{.op = "LSTM", .direction = "bidirectional", .lens = {4, 1, 3}};
  const std::vector<Tensor> first = c.inputs(31);
  std::vector<Tensor> r;
  for (const Tensor& y : run_node(NodeSpec{c.op, "", 17, c.attributes(), c.forward_outputs()}, first)) {
    r.push_back(random_f64(y.shape(), 5 + static_cast<uint32_t>(r.size())));
  }
  runtime::Session session(paired_model(c, first, r));
  auto run = [&](const std::vector<Tensor>& inputs) {
    runtime::NamedTensors feeds;
    std::vector<Tensor> all = inputs;
    all.insert(all.end(), r.begin(), r.end());
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].defined()) feeds["in" + std::to_string(i)] = all[i];
    }
    return session.run(feeds);
  };
  run(first);
  Config other = c;
  other.lens = {2, 4, 0};
  const std::vector<Tensor> second = other.inputs(41);
  const auto got = run(second);
  const std::vector<Tensor> want = run_grad(other, second, r);
  for (int i : {0, 1, 2, 3}) expect_identical(got.at("grad" + std::to_string(i)), want[static_cast<size_t>(i)]);
}

TEST(RnnSharedTrace, OnlyAGradientOfTheSameInputsAndAttributesIsPaired) {
  Config c{.op = "GRU"};
  const std::vector<Tensor> inputs = c.inputs(1);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2), random_f64({1, 3, 2}, 3)};
  onnx::GraphProto other_input = paired_model(c, inputs, r).graph();
  other_input.mutable_node(1)->set_input(2, "in1");  // R differs
  EXPECT_EQ(runtime::share_rnn_trace(other_input), 0);
  onnx::GraphProto other_attribute = paired_model(c, inputs, r).graph();
  *other_attribute.mutable_node(1)->add_attribute() = attr("linear_before_reset", int64_t{1});
  EXPECT_EQ(runtime::share_rnn_trace(other_attribute), 0);
  EXPECT_EQ(other_attribute.node(0).op_type(), "GRU");
}

TEST(RnnSharedTrace, ATraceOfTheWrongShapeNamesTheInput) {
  Config c{.op = "RNN"};
  const auto in = c.inputs(1);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2), random_f64({1, 3, 2}, 3)};
  std::vector<Tensor> all = in;
  all.insert(all.end(), r.begin(), r.end());
  all.push_back(random_f64({1, 5}, 4));  // a trace of 5 values
  onnx::ModelProto m = grad_model(c, in, r, {0});
  m.mutable_graph()->mutable_node(0)->add_input("in8");
  auto* input = m.mutable_graph()->add_input();
  input->set_name("in8");
  input->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
  const std::string message = error_of(m, feeds_of(all));
  EXPECT_ERROR_HAS(message, "'in8'");
  EXPECT_ERROR_HAS(message, "expected the trace of RNNTraining");
}


TEST(RnnGradErrors, UnknownActivationNamesTheNodeAndTheFunction) {
  Config c{.op = "GRU", .extra = {attr("activations", Strings{"Sigmoid", "Gelu"})}};
  const auto in = c.inputs(1);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2), random_f64({1, 3, 2}, 3)};
  std::vector<Tensor> all = in;
  all.insert(all.end(), r.begin(), r.end());
  const std::string m = error_of(grad_model(c, in, r, {0, 1}), feeds_of(all));
  EXPECT_ERROR_HAS(m, "GRUGrad");
  EXPECT_ERROR_HAS(m, "'node'");
  EXPECT_ERROR_HAS(m, "unknown function 'Gelu'");
}

TEST(RnnGradErrors, BadOutputGradientShapeNamesTheTensor) {
  Config c{.op = "LSTM"};
  const auto in = c.inputs(1);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2), random_f64({1, 3, 2}, 3), random_f64({1, 2, 3}, 4)};
  std::vector<Tensor> all = in;
  all.insert(all.end(), r.begin(), r.end());
  const std::string m = error_of(grad_model(c, in, r, {0}), feeds_of(all));
  EXPECT_ERROR_HAS(m, "'in10'");
  EXPECT_ERROR_HAS(m, "the shape of Y_c = [1,3,2]");
}

TEST(RnnGradErrors, OutputOfAnOmittedInput) {
  Config c{.op = "RNN", .bias = false};
  const auto in = c.inputs(1);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2)};
  std::vector<Tensor> all = in;
  all.insert(all.end(), r.begin(), r.end());
  onnx::ModelProto m = grad_model(c, in, r, {0});
  m.mutable_graph()->mutable_node(0)->set_output(3, "dB");  // B is omitted
  m.mutable_graph()->add_output()->set_name("dB");
  const std::string message = error_of(m, feeds_of(all));
  EXPECT_ERROR_HAS(message, "'dB'");
  EXPECT_ERROR_HAS(message, "which is omitted");
}

TEST(RnnGradErrors, Float16IsNotSupported) {
  Config c{.op = "RNN"};
  const auto in = cast_all(c.inputs(1), DataType::Float16);
  const std::vector<Tensor> r{random_f64({4, 1, 3, 2}, 2).cast(DataType::Float16)};
  std::vector<Tensor> all = in;
  all.insert(all.end(), r.begin(), r.end());
  const std::string m = error_of(grad_model(c, in, r, {0}), feeds_of(all));
  EXPECT_ERROR_HAS(m, "RNNGrad");
  EXPECT_ERROR_HAS(m, "float16");
}

}  // namespace
}  // namespace onnxtrain
