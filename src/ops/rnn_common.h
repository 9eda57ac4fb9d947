// What the recurrent layers (rnn.cpp) and their gradients (rnn_grad.cpp) share: the attributes,
// the activation functions, the input checks, the tensor layouts, the matrix product, and the
// forward recurrence of one direction, which can leave a trace of every step for the
// backward pass. The equations and shapes are in rnn.cpp's header comment.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "core/vector_math.h"
#include "ops/kernel.h"

namespace onnxtrain::ops::rnn {

enum class Cell { Rnn, Gru, Lstm };
enum class Direction { Forward, Reverse, Bidirectional };

// Input and output positions of RNN, GRU and LSTM (ONNX order).
enum : int { kX = 0, kW, kR, kB, kSeqLens, kInitialH, kInitialC, kP };
enum : int { kY = 0, kYh, kYc };

// ---------------------------------------------------------------------------------------------
// Activation functions (the operator docs' list)

enum class ActKind {
  Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu,
  Softsign, Softplus
};

struct Activation {
  ActKind kind = ActKind::Tanh;
  float alpha = 0.0f, beta = 0.0f;
};

// x[0..n) = act(x[0..n)); the switch is outside the loops so each loop vectorizes. float32
// Tanh and Sigmoid (LSTM's and GRU's defaults) run core/vector_math.h's array functions (within
// 2.1 ulp of the exact values), which GCC's own code for std::tanh / std::exp does not match.
template <class V>
void activate(const Activation& a, V* __restrict x, int64_t n) {
  const V alpha = static_cast<V>(a.alpha), beta = static_cast<V>(a.beta);
  if constexpr (std::is_same_v<V, float>) {
    if (a.kind == ActKind::Tanh) return vmath::tanh(x, x, n);
    if (a.kind == ActKind::Sigmoid) return vmath::sigmoid(x, x, n);
  }
  switch (a.kind) {
    case ActKind::Relu:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] > V(0) ? x[j] : V(0);
      break;
    case ActKind::Tanh:
      for (int64_t j = 0; j < n; ++j) x[j] = std::tanh(x[j]);
      break;
    case ActKind::Sigmoid:
      for (int64_t j = 0; j < n; ++j) x[j] = V(1) / (V(1) + std::exp(-x[j]));
      break;
    case ActKind::Affine:
      for (int64_t j = 0; j < n; ++j) x[j] = alpha * x[j] + beta;
      break;
    case ActKind::LeakyRelu:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] >= V(0) ? x[j] : alpha * x[j];
      break;
    case ActKind::ThresholdedRelu:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] >= alpha ? x[j] : V(0);
      break;
    case ActKind::ScaledTanh:
      for (int64_t j = 0; j < n; ++j) x[j] = alpha * std::tanh(beta * x[j]);
      break;
    case ActKind::HardSigmoid:
      for (int64_t j = 0; j < n; ++j) x[j] = std::min(std::max(alpha * x[j] + beta, V(0)), V(1));
      break;
    case ActKind::Elu:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] >= V(0) ? x[j] : alpha * (std::exp(x[j]) - V(1));
      break;
    case ActKind::Softsign:
      for (int64_t j = 0; j < n; ++j) x[j] = x[j] / (V(1) + std::abs(x[j]));
      break;
    case ActKind::Softplus:  // log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|)
      for (int64_t j = 0; j < n; ++j) x[j] = std::max(x[j], V(0)) + std::log1p(std::exp(-std::abs(x[j])));
      break;
  }
}

template <class V>
void clip_to(V* x, int64_t n, V bound) {
  for (int64_t j = 0; j < n; ++j) x[j] = std::min(std::max(x[j], -bound), bound);
}

// ---------------------------------------------------------------------------------------------
// Attributes

struct RnnAttrs {
  std::string op;  // "RNN", "GRU" or "LSTM" (also for their gradient ops)
  Cell cell = Cell::Rnn;
  Direction direction = Direction::Forward;
  int64_t num_directions = 1;
  std::optional<int64_t> hidden_size;  // else R's last dim
  std::optional<float> clip;
  bool batch_first = false;  // layout = 1
  bool linear_before_reset = false;
  bool input_forget = false;
  int64_t acts_per_direction = 1;
  std::vector<Activation> activations;  // acts_per_direction per direction

  int64_t gates() const { return cell == Cell::Rnn ? 1 : cell == Cell::Gru ? 3 : 4; }
  const Activation& act(int64_t direction, int64_t k) const {
    return activations[static_cast<size_t>(direction * acts_per_direction + k)];
  }
  bool reverse(int64_t direction) const { return this->direction == Direction::Reverse || direction == 1; }
};

// The attributes of an RNN, GRU or LSTM node, or of its gradient op RNNGrad, GRUGrad, LSTMGrad
// (ai.onnxtrain), which carries the forward node's attributes and reads `layout` at any opset.
RnnAttrs parse_attrs(const KernelInit& init);

// ---------------------------------------------------------------------------------------------
// Shapes, layouts and inputs

struct RnnShape {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, directions = 1, gates = 1;
  bool batch_first = false;

  // Row of X for time t of batch entry b (X as a [seq * batch, input] matrix).
  int64_t x_row(int64_t t, int64_t b) const { return batch_first ? b * seq + t : t * batch + b; }
  // Offset of [t, d, b, :] in Y (of [b, t, d, :] for layout 1).
  int64_t y_offset(int64_t t, int64_t d, int64_t b) const {
    return (batch_first ? (b * seq + t) * directions + d : (t * directions + d) * batch + b) * hidden;
  }
  // Offset of [d, b, :] in initial_h/c and Y_h/c (of [b, d, :] for layout 1).
  int64_t state_offset(int64_t d, int64_t b) const {
    return (batch_first ? b * directions + d : d * batch + b) * hidden;
  }
  Shape y_shape() const {
    return batch_first ? Shape{batch, seq, directions, hidden} : Shape{seq, directions, batch, hidden};
  }
  Shape state_shape() const {
    return batch_first ? Shape{batch, directions, hidden} : Shape{directions, batch, hidden};
  }
};

// The time index a batch entry of sequence length `len` works on at `step`, or -1 when its
// sequence has ended.
inline int64_t time_of(int64_t step, int64_t len, bool reverse) {
  if (step >= len) return -1;
  return reverse ? len - 1 - step : step;
}

// Runs f(b, t) for each batch entry b still inside its sequence at `step` (t its time), in
// parallel when there is enough work.
template <class F>
void for_active(const std::vector<int64_t>& lens, int64_t step, bool reverse, int64_t work_per_entry, F&& f) {
  const auto batch = static_cast<int64_t>(lens.size());
  parallel_for(batch, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, work_per_entry)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t b = begin; b < end; ++b) {
                   const int64_t t = time_of(step, lens[static_cast<size_t>(b)], reverse);
                   if (t >= 0) f(b, t);
                 }
               });
}

// state [N, H] (dense) = direction d's rows of `initial` (initial_h or initial_c, in the layout
// of s), zeros when it is omitted.
template <class V>
void load_state(const RnnShape& s, const Tensor& initial, int64_t d, V* state) {
  for (int64_t b = 0; b < s.batch; ++b) {
    V* row = state + b * s.hidden;
    if (initial.defined()) {
      std::copy_n(initial.data<V>() + s.state_offset(d, b), s.hidden, row);
    } else {
      std::fill_n(row, s.hidden, V(0));
    }
  }
}

// Direction d's rows of `out` (Y_h or Y_c, in the layout of s) = state [N, H] (dense).
template <class V>
void store_state(const RnnShape& s, const V* state, int64_t d, V* out) {
  for (int64_t b = 0; b < s.batch; ++b) std::copy_n(state + b * s.hidden, s.hidden, out + s.state_offset(d, b));
}

// Fails unless input i has shape `want` ("input 'X' has shape ..., expected <meaning> = ...").
void expect_shape(const KernelContext& ctx, int i, const Shape& want, const std::string& meaning);
// Checks every forward input's dtype and shape; returns the problem's sizes.
RnnShape check_inputs(const KernelContext& ctx, const RnnAttrs& a);
// Each batch entry's sequence length, checked against [0, seq_length].
std::vector<int64_t> sequence_lengths(const KernelContext& ctx, const RnnShape& s);

// The float tensors of one run, in the compute type (optional ones undefined when omitted).
struct RnnTensors {
  Tensor x, w, r, b, initial_h, initial_c, p;

  // Direction d's block of a [num_directions, ...] weight.
  template <class V>
  static const V* of_direction(const Tensor& t, int64_t d, int64_t directions) {
    return t.data<V>() + d * (t.numel() / directions);
  }
};
// The forward inputs of ctx, cast to float32 when `to_float32` (float16 / bfloat16 inputs).
RnnTensors load_inputs(const KernelContext& ctx, const RnnAttrs& a, bool to_float32);

// ---------------------------------------------------------------------------------------------
// Matrix products

// c[M, N] (row stride ldc) = op(a)[M, K] * op(b)[K, N] (+ c when accumulate), row-major, where
// op(a) = a [M, K] (row stride lda), or the transpose of a [K, M] when trans_a; likewise b.
// float32 runs oneDNN's sgemm, float64 plain loops parallel over rows of c.
template <class V>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const V* a, int64_t lda, const V* b,
          int64_t ldb, V* c, int64_t ldc, bool accumulate);

// ---------------------------------------------------------------------------------------------
// The forward recurrence

// What the forward pass of one direction leaves for the backward pass: per step s of the
// recurrence (batch entry b works on time time_of(s, len_b, reverse) at step s; steps past an
// entry's length leave its rows unused, its states unchanged). A view of a flat buffer laid out
// by TraceLayout: the backward pass's own (RNNGrad / GRUGrad / LSTMGrad running the forward
// again) or the `trace` output of ai.onnxtrain.RNNTraining / GRUTraining / LSTMTraining, the
// forward op a training graph runs instead when runtime/fusion.h's share_rnn_trace pairs it
// with its gradient node.
template <class V>
struct Trace {
  int64_t steps = 0;    // the longest sequence length
  V* pre = nullptr;     // [steps, batch, gates * hidden]: each gate's pre-activation, before clip;
                        //   kept only when a slope needs it (keeps_pre_activations), else null
  V* gates = nullptr;   // [steps, batch, gates * hidden]: each gate's value (LSTM's f = 1 - i
                        //   under input_forget, whose pre-activation is not kept)
  V* h = nullptr;       // [steps + 1, batch, h_width]: the hidden state before step s (then the
                        //   last) at columns [h_column, h_column + hidden) of each row; under
                        //   trace_keeps_inputs the row of X at step s (time s) in columns [0, input)
  V* c = nullptr;       // LSTM: [steps + 1, batch, hidden]: the cell state likewise
  V* hc = nullptr;      // LSTM: [steps, batch, hidden]: h(C) of the cell state after step s
  V* hr = nullptr;      // GRU with linear_before_reset: [steps, batch, hidden]: H Rh^T + Rbh
  int64_t h_width = 0;  // h's row length: hidden, or input + hidden under trace_keeps_inputs
  int64_t h_column = 0; // where the state starts in h's row: 0, or input under trace_keeps_inputs

  // The hidden state before step s of batch entry b (of `batch`), hidden values.
  V* h_row(int64_t s, int64_t b, int64_t batch) const { return h + (s * batch + b) * h_width + h_column; }
};

// Whether the slope of an activation is computed from its input (else from its output).
bool slope_reads_input(ActKind kind);
// Whether the backward pass reads the gates' pre-activations: under `clip` (its mask) or when an
// activation's slope is a function of its input.
bool keeps_pre_activations(const RnnAttrs& a);
// Whether direction d of `a` is ONNX's default LSTM, which the float32 fast paths of rnn.cpp and
// rnn_grad.cpp take: activations Sigmoid, Tanh, Tanh; no clip, input_forget or peepholes
// (`has_peepholes`: input P is present). Its trace keeps no pre-activations.
bool is_default_lstm(const RnnAttrs& a, bool has_peepholes, int64_t d);

// Whether the trace keeps each step's row of X beside the hidden state before the step (Trace::h
// rows [X[s], H[s-1]]): RNN and LSTM (whose weight gradients are one product over [X, H_prev]
// rows, rnn_grad.cpp) of one forward direction in layout 0 whose sequences all have X's length
// (`lens`), so that the trace's rows (s, b) are X's rows in X's order and the backward pass
// reads [X, H_prev] there instead of copying both into a buffer of its own.
bool trace_keeps_inputs(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens);

// Offsets of a Trace's parts in one direction's flat buffer of `elements` values, sized for
// s.seq steps (the longest sequence a run can have); -1 for a part the cell does not keep.
struct TraceLayout {
  int64_t pre = -1, gates = 0, h = 0, c = -1, hc = -1, hr = -1;
  int64_t h_width = 0, h_column = 0;  // Trace's
  int64_t elements = 0;

  template <class V>
  Trace<V> view(V* base, int64_t steps) const {
    auto at = [&](int64_t offset) { return offset < 0 ? nullptr : base + offset; };
    return {steps, at(pre), at(gates), at(h), at(c), at(hc), at(hr), h_width, h_column};
  }
};
TraceLayout trace_layout(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens);

// Buffers of the forward recurrence that outlive a run, so that a kernel running every step
// reuses their pages instead of faulting fresh ones in.
template <class V>
struct RecurrenceBuffers {
  std::vector<V> xw, rec, h, c, bias, scratch, wr;
};

// A kernel's buffers of both compute types (B<float> and B<double>), the one a run uses by V.
template <template <class> class B>
struct BuffersByType {
  B<float> f32;
  B<double> f64;
  template <class V>
  B<V>& get() {
    if constexpr (std::is_same_v<V, float>) return f32;
    else return f64;
  }
};

// Runs direction d: writes its part of Y (whose steps past each entry's length the caller has
// zeroed), Y_h and Y_c where not null, and fills `trace` when not null (its steps set to the
// longest sequence length).
template <class V>
void run_direction(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens, const RnnTensors& in,
                   int64_t d, V* y, V* y_h, V* y_c, Trace<V>* trace, RecurrenceBuffers<V>& buffers);

}  // namespace onnxtrain::ops::rnn
