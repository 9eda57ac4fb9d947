// RNNGrad, GRUGrad, LSTMGrad (domain ai.onnxtrain, version 1): the gradients of RNN, GRU and
// LSTM (rnn.cpp) by backpropagation through time, emitted by autodiff/rules_rnn.cpp.
//
// Attributes: the forward node's, verbatim (`layout` is read at any opset).
// Inputs:  the forward node's inputs in their positions (RNN, GRU: X, W, R, B, sequence_lens,
//          initial_h; LSTM also initial_c, P; omitted ones ""), then dY, dY_h (and dY_c for
//          LSTM), the gradients flowing into the outputs; an omitted one is zero; then,
//          optionally, trace: the output of the RNNTraining / GRUTraining / LSTMTraining node
//          that ran the forward pass on the same inputs (rnn.cpp; runtime/fusion.h's
//          share_rnn_trace pairs them).
// Outputs: dX, dW, dR, dB, d_initial_h (and d_initial_c, dP for LSTM): the gradient of each
//          forward input but sequence_lens, shaped like it. Outputs the graph leaves unnamed
//          are not computed; an output whose forward input is omitted must be unnamed.
// float32 and float64.
//
// Each direction reads every step's gate values and states (rnn::Trace) from `trace`, or, without
// it, runs the forward recurrence again to make them, then walks the steps backwards. With dH and dC the gradients flowing
// into a step's output state, s = act'(pre-activation) (0 where `clip` cut it off), and P_
// the peepholes:
//   RNN:  da = dH s;                       dH_prev = da R
//   GRU:  dh = dH (1 - z), dz = dH (H_prev - h), dah = dh s_h;
//         linear_before_reset: dr = dah (H_prev Rh^T + Rbh), dah' = dah r (into Rh, Rbh)
//         otherwise:           d(rH) = dah Rh,  dr = d(rH) H_prev  (dah into Rh, Rbh)
//         daz = dz s_z, dar = dr s_r;      dH_prev = dH z + [daz, dar, dah'] R  (+ d(rH) r)
//   LSTM: do = dH h(C), dC += dH o h'(C), dao = do s_o, dC += dao P_o;
//         di = dC c, df = dC C_prev, dc = dC i (input_forget: di -= df, no f gate);
//         dai = di s_i, daf = df s_f, dac = dc s_c;
//         dC_prev = dC f + dai P_i + daf P_f,  dH_prev = [dai, dao, daf, dac] R
// Each step's products with R are one GEMM over the batch (a float32 default LSTM on several
// threads: one per thread's share of the batch, default_lstm_batch_split); an entry past its sequence length
// keeps dH and dC unchanged (its rows of the step's gradients are zero). The gate gradients of
// all steps, kept in X's row order, give the weight gradients in one GEMM each:
//   dX = dG W,  dW = dG^T X,  dR = dG_rec^T H_in,  dWb = colsum(dG),  dRb = colsum(dG_rec)
// where dG_rec equals dG except for GRU's h gate (dah' above) and H_in is H_prev except for
// GRU's h gate without linear_before_reset (r . H_prev). Where dG_rec = dG (RNN, LSTM) and both
// are asked for, dW and dR are one product, [dW, dR] = dG^T [X, H_prev], which reads dG once
// (bench/workloads.py's LSTM, [4H, I + H] over 4096 rows alone: 13.4-13.8 ms against 15.2-15.9 for
// the two at I = H = 256). It runs transposed, [dW, dR]^T = [X, H_prev]^T dG through sgemm, and
// each part is transposed into its output in tiles: with AVX-512 the product as written went to
// oneDNN's matmul primitive (transposed_a_prefers_matmul), which took 6.81 and 10.87 ms alone at
// the LSTM's I + H = 288 and 512 (G*H = 1024, 4096 rows) against sgemm's 6.54 and 10.50 for the
// transpose (onnxtrain-bench-gemm, two threads, fastest of 10); in the step LSTMGrad 38.7-38.9 ms
// against 40.2-40.3 (ONNXTRAIN_PROFILE, 33 minus 3 steps, three alternating pairs; not measured
// on a CPU without AVX-512, where both forms ran through sgemm). The threads of
// default_lstm_batch_split sum dG's columns for dWb while each row is in cache, instead of a
// pass over all of dG after the steps. With the joint product and those sums, the LSTM's
// LSTMGrad took 54.6-55.8 ms a training step against 57.2-60.5 (ONNXTRAIN_PROFILE, 30 steps, three
// alternating pairs).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/factories.h"
#include "ops/rnn_common.h"

namespace onnxtrain::ops {

namespace {

using namespace rnn;

// slope = d act(clip(x)) / dx for n pre-activations x whose values y = act(clip(x)) the forward
// pass computed; the slope is 0 where clip cut x off.
// x is read only under clip or when slope_reads_input(a.kind) (and may be null otherwise).
template <class V>
void slopes(const Activation& a, const std::optional<float>& clip, const V* x, const V* y, V* slope, int64_t n) {
  if (clip || slope_reads_input(a.kind)) {
    std::copy(x, x + n, slope);
    if (clip) clip_to(slope, n, static_cast<V>(*clip));
  }
  const V alpha = static_cast<V>(a.alpha), beta = static_cast<V>(a.beta);
  const V* v = slope;  // slope[j] holds the (clipped) pre-activation until replaced by its slope
  switch (a.kind) {
    case ActKind::Relu:
      for (int64_t j = 0; j < n; ++j) slope[j] = v[j] > V(0) ? V(1) : V(0);
      break;
    case ActKind::Tanh:
      for (int64_t j = 0; j < n; ++j) slope[j] = V(1) - y[j] * y[j];
      break;
    case ActKind::Sigmoid:
      for (int64_t j = 0; j < n; ++j) slope[j] = y[j] * (V(1) - y[j]);
      break;
    case ActKind::Affine:
      for (int64_t j = 0; j < n; ++j) slope[j] = alpha;
      break;
    case ActKind::LeakyRelu:
      for (int64_t j = 0; j < n; ++j) slope[j] = v[j] >= V(0) ? V(1) : alpha;
      break;
    case ActKind::ThresholdedRelu:
      for (int64_t j = 0; j < n; ++j) slope[j] = v[j] >= alpha ? V(1) : V(0);
      break;
    case ActKind::ScaledTanh:  // alpha beta (1 - tanh^2(beta v)), tanh(beta v) = y / alpha
      for (int64_t j = 0; j < n; ++j) {
        const V t = alpha == V(0) ? V(0) : y[j] / alpha;
        slope[j] = alpha * beta * (V(1) - t * t);
      }
      break;
    case ActKind::HardSigmoid:
      for (int64_t j = 0; j < n; ++j) {
        const V u = alpha * v[j] + beta;
        slope[j] = u > V(0) && u < V(1) ? alpha : V(0);
      }
      break;
    case ActKind::Elu:  // alpha e^v = y + alpha below 0
      for (int64_t j = 0; j < n; ++j) slope[j] = v[j] >= V(0) ? V(1) : y[j] + alpha;
      break;
    case ActKind::Softsign:
      for (int64_t j = 0; j < n; ++j) {
        const V d = V(1) + std::abs(v[j]);
        slope[j] = V(1) / (d * d);
      }
      break;
    case ActKind::Softplus:  // sigmoid(v) = 1 - e^-y
      for (int64_t j = 0; j < n; ++j) slope[j] = -std::expm1(-y[j]);
      break;
  }
  if (clip) {
    const V bound = static_cast<V>(*clip);
    for (int64_t j = 0; j < n; ++j) slope[j] = std::abs(x[j]) > bound ? V(0) : slope[j];
  }
}

// out[0..cols) = the sums of the columns of the [rows, cols] matrix m (row stride ld).
template <class V>
void column_sums(const V* m, int64_t rows, int64_t cols, int64_t ld, V* out) {
  std::fill(out, out + cols, V(0));
  for (int64_t r = 0; r < rows; ++r) {
    const V* __restrict row = m + r * ld;
    for (int64_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

// The gradient inputs (after the forward inputs) and outputs (one per forward input but
// sequence_lens).
struct GradLayout {
  int dy, dy_h, dy_c;  // input positions
  static GradLayout of(const RnnAttrs& a) {
    const int first = a.cell == Cell::Lstm ? 8 : 6;
    return {first, first + 1, first + 2};
  }
};
enum : int { kDX = 0, kDW, kDR, kDB, kDInitialH, kDInitialC, kDP };
// The forward input whose gradient output k is.
constexpr int input_of_output(int k) { return k < kSeqLens ? k : k + 1; }

template <class V>
struct GradIn {
  const V *dy = nullptr, *dy_h = nullptr, *dy_c = nullptr;  // null when omitted
};
template <class V>
struct GradOut {
  V* of[7] = {};  // by output position; null when not asked for
};

// The buffers of a backward pass, kept by the kernel from run to run (their pages stay mapped).
template <class V>
struct BackwardBuffers {
  RecurrenceBuffers<V> forward;
  std::vector<V> trace;  // the recomputed trace of one direction, without a trace input
  std::vector<V> dg_all, h_in, dg_rec_h, rh, dg, slope, dh, dc, drh, dp;
  std::vector<V> bias_sums;  // default_lstm_batch_split: [threads, G*H], each thread's sums of dG's columns
  std::vector<V> dw_dr;      // [I + H, G*H]: dW^T above dR^T, from the one product over [X, H_prev]
};

template <class V>
class Backward {
 public:
  // `trace`: the trace input's data ([D, layout.elements]), or null to run the forward again.
  Backward(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens, const RnnTensors& in,
           const GradIn<V>& g, const GradOut<V>& out, const V* trace, BackwardBuffers<V>& buffers)
      : a_(a), s_(s), lens_(lens), in_(in), g_(g), out_(out), shared_trace_(trace), buffers_(buffers),
        dg_all_(buffers.dg_all), h_in_(buffers.h_in), dg_rec_h_(buffers.dg_rec_h), rh_(buffers.rh), dg_(buffers.dg),
        slope_(buffers.slope), dh_(buffers.dh), dc_(buffers.dc), drh_(buffers.drh), dp_(buffers.dp) {}

  void run() {
    const int64_t N = s_.batch, H = s_.hidden, GH = s_.gates * H, rows = s_.seq * N;
    // dW = dG^T X and dR = dG^T H_prev in one product over the rows [X, H_prev] (reading dG once):
    // every cell but GRU, whose h gate has its own recurrent gradient and input.
    joint_weight_product_ = a_.cell != Cell::Gru && out_.of[kDW] && out_.of[kDR];
    in_width_ = joint_weight_product_ ? s_.input + H : H;
    const TraceLayout layout = trace_layout(a_, s_, lens_);
    dg_all_.resize(static_cast<size_t>(rows * GH));
    // Under trace_keeps_inputs the trace's h rows are [X, H_prev] in X's order: nothing to copy.
    h_in_.resize(static_cast<size_t>(layout.h_column > 0 ? 0 : rows * in_width_));
    if (a_.cell == Cell::Gru) {
      dg_rec_h_.resize(static_cast<size_t>(rows * H));
      if (!a_.linear_before_reset) rh_.resize(static_cast<size_t>(rows * H));
    }
    dg_.resize(static_cast<size_t>(N * GH));
    slope_.resize(static_cast<size_t>(N * (GH + H)));
    dh_.resize(static_cast<size_t>(N * H));
    dc_.resize(static_cast<size_t>(N * H));
    drh_.resize(static_cast<size_t>(N * H));
    dp_.resize(static_cast<size_t>(N * 3 * H));
    const int64_t longest = lens_.empty() ? 0 : *std::max_element(lens_.begin(), lens_.end());
    if (!shared_trace_) buffers_.trace.resize(static_cast<size_t>(layout.elements));
    for (int64_t d = 0; d < s_.directions; ++d) {
      if (shared_trace_) {  // read only: the view's pointers are not const, the backward pass never writes them
        trace_ = layout.view(const_cast<V*>(shared_trace_) + d * layout.elements, longest);
      } else {
        trace_ = layout.view(buffers_.trace.data(), 0);
        run_direction<V>(a_, s_, lens_, in_, d, nullptr, nullptr, nullptr, &trace_, buffers_.forward);
      }
      backward(d);
      weight_gradients(d);
    }
  }

 private:
  const V* weights(const Tensor& t, int64_t d) const { return RnnTensors::of_direction<V>(t, d, s_.directions); }
  // Row of a step-major trace buffer of `width` columns (null for a part the trace does not keep).
  static const V* at(const V* buffer, int64_t step, int64_t b, int64_t batch, int64_t width) {
    return buffer ? buffer + (step * batch + b) * width : nullptr;
  }

  // The gradients flowing into direction d's final states.
  void load_final_gradients(int64_t d) {
    const int64_t H = s_.hidden;
    for (int64_t b = 0; b < s_.batch; ++b) {
      V* dh = dh_.data() + b * H;
      V* dc = dc_.data() + b * H;
      const int64_t offset = s_.state_offset(d, b);
      if (g_.dy_h) std::copy(g_.dy_h + offset, g_.dy_h + offset + H, dh);
      else std::fill(dh, dh + H, V(0));
      if (g_.dy_c) std::copy(g_.dy_c + offset, g_.dy_c + offset + H, dc);
      else std::fill(dc, dc + H, V(0));
    }
  }

  // The steps write every row of the all-steps buffers an entry's sequence reaches; the rows
  // past its length stay zero.
  void zero_rows_past_lengths() {
    const int64_t H = s_.hidden, GH = s_.gates * H;
    for (int64_t b = 0; b < s_.batch; ++b) {
      for (int64_t t = lens_[static_cast<size_t>(b)]; t < s_.seq; ++t) {
        const int64_t row = s_.x_row(t, b);
        std::fill(dg_all_.begin() + row * GH, dg_all_.begin() + (row + 1) * GH, V(0));
        if (!h_in_.empty()) std::fill(h_in_.begin() + row * in_width_, h_in_.begin() + (row + 1) * in_width_, V(0));
        for (std::vector<V>* m : {&dg_rec_h_, &rh_}) {
          if (!m->empty()) std::fill(m->begin() + row * H, m->begin() + (row + 1) * H, V(0));
        }
      }
    }
  }

  void backward(int64_t d) {
    const int64_t N = s_.batch, H = s_.hidden, GH = s_.gates * H;
    zero_rows_past_lengths();
    bias_summed_ = false;
    std::fill(dp_.begin(), dp_.end(), V(0));
    load_final_gradients(d);
    const bool reverse = a_.reverse(d);
    const V* r = weights(in_.r, d);
    if (const int threads = batch_split_threads(d); threads > 1) {
      default_lstm_batch_split(d, reverse, threads);
      return;
    }
    for (int64_t step = trace_.steps - 1; step >= 0; --step) {
      // Entries past their length contribute zero rows to the step's GEMMs.
      for (int64_t b = 0; b < N; ++b) {
        if (time_of(step, lens_[static_cast<size_t>(b)], reverse) < 0) {
          std::fill(dg_.begin() + b * GH, dg_.begin() + (b + 1) * GH, V(0));
        }
      }
      switch (a_.cell) {
        case Cell::Rnn: rnn_step(d, step, reverse); break;
        case Cell::Gru: gru_step(d, step, reverse); break;
        case Cell::Lstm: lstm_step(d, step, reverse); break;
      }
      // dH_prev += dG R over the blocks whose recurrent input is H_prev.
      const int64_t blocks = a_.cell == Cell::Gru && !a_.linear_before_reset ? 2 * H : GH;
      gemm<V>(false, false, N, H, blocks, dg_.data(), GH, r, H, dh_.data(), H, true);
    }
  }

  // dH at time t of entry b: the gradient from the later steps plus dY[t].
  V* step_dh(int64_t d, int64_t b, int64_t t) {
    V* dh = dh_.data() + b * s_.hidden;
    if (g_.dy) {
      const V* dy = g_.dy + s_.y_offset(t, d, b);
      for (int64_t j = 0; j < s_.hidden; ++j) dh[j] += dy[j];
    }
    return dh;
  }
  // The slopes of entry b's gates (LSTM: then of h at C).
  V* gate_slopes(int64_t b) { return slope_.data() + b * (s_.gates + 1) * s_.hidden; }

  // Keeps entry b's gate gradients and recurrent input of time t for the weight gradients.
  void keep_row(int64_t step, int64_t b, int64_t t) {
    const int64_t GH = s_.gates * s_.hidden, row = s_.x_row(t, b);
    std::copy(dg_.begin() + b * GH, dg_.begin() + (b + 1) * GH, dg_all_.begin() + row * GH);
    keep_input_row(step, b, t);
  }
  // The recurrent input alone (the gate gradients written into dg_all_ already), after the row
  // of X under joint_weight_product_; nothing where the trace's rows hold both (trace_keeps_inputs).
  void keep_input_row(int64_t step, int64_t b, int64_t t) {
    if (inputs_in_trace()) return;
    const int64_t H = s_.hidden, I = s_.input, row = s_.x_row(t, b);
    const V* h_prev = trace_.h_row(step, b, s_.batch);
    V* to = h_in_.data() + row * in_width_;
    if (joint_weight_product_) {
      const V* x = in_.x.data<V>() + row * I;
      to = std::copy(x, x + I, to);
    }
    std::copy(h_prev, h_prev + H, to);
  }

  void rnn_step(int64_t d, int64_t step, bool reverse) {
    const int64_t H = s_.hidden;
    for_active(lens_, step, reverse, 8 * H, [&](int64_t b, int64_t t) {
      V* __restrict dh = step_dh(d, b, t);
      V* __restrict slope = gate_slopes(b);
      slopes(a_.act(d, 0), a_.clip, at(trace_.pre, step, b, s_.batch, H), at(trace_.gates, step, b, s_.batch, H), slope,
             H);
      V* __restrict da = dg_.data() + b * H;
      for (int64_t j = 0; j < H; ++j) da[j] = dh[j] * slope[j];
      std::fill(dh, dh + H, V(0));  // all of dH_prev comes through R
      keep_row(step, b, t);
    });
  }

  void gru_step(int64_t d, int64_t step, bool reverse) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 3 * H;
    const bool lbr = a_.linear_before_reset;
    // Pass 1: the gates, dz, dah, and the direct part dH z of dH_prev.
    for_active(lens_, step, reverse, 16 * H, [&](int64_t b, int64_t t) {
      V* __restrict dh = step_dh(d, b, t);
      const V* pre = at(trace_.pre, step, b, N, GH);
      const V* y = at(trace_.gates, step, b, N, GH);
      V* __restrict slope = gate_slopes(b);
      slopes(a_.act(d, 0), a_.clip, pre, y, slope, 2 * H);
      slopes(a_.act(d, 1), a_.clip, pre ? pre + 2 * H : nullptr, y + 2 * H, slope + 2 * H, H);
      const V* z = y;
      const V* hh = y + 2 * H;
      const V* h_prev = trace_.h_row(step, b, N);
      V* __restrict dg = dg_.data() + b * GH;
      for (int64_t j = 0; j < H; ++j) {
        dg[j] = dh[j] * (h_prev[j] - hh[j]) * slope[j];                // daz
        dg[2 * H + j] = dh[j] * (V(1) - z[j]) * slope[2 * H + j];      // dah
        dh[j] *= z[j];
      }
    });
    if (!lbr) {  // d(rH) = dah Rh
      gemm<V>(false, false, N, H, H, dg_.data() + 2 * H, GH, weights(in_.r, d) + 2 * H * H, H, drh_.data(), H, false);
    }
    // Pass 2: dr, and what the weight gradients need.
    for_active(lens_, step, reverse, 8 * H, [&](int64_t b, int64_t t) {
      const V* r = at(trace_.gates, step, b, N, GH) + H;
      const V* slope_r = gate_slopes(b) + H;
      const V* h_prev = trace_.h_row(step, b, N);
      V* __restrict dg = dg_.data() + b * GH;
      V* __restrict dah = dg + 2 * H;
      const int64_t row = s_.x_row(t, b);
      V* __restrict rec = dg_rec_h_.data() + row * H;  // the gradient of the h gate's recurrent product
      if (lbr) {
        const V* hr = at(trace_.hr, step, b, N, H);
        for (int64_t j = 0; j < H; ++j) {
          dg[H + j] = dah[j] * hr[j] * slope_r[j];
          rec[j] = dah[j] * r[j];
        }
      } else {
        const V* drh = drh_.data() + b * H;
        V* __restrict dh = dh_.data() + b * H;
        V* __restrict rh = rh_.data() + row * H;
        for (int64_t j = 0; j < H; ++j) {
          dg[H + j] = drh[j] * h_prev[j] * slope_r[j];
          dh[j] += drh[j] * r[j];
          rec[j] = dah[j];
          rh[j] = r[j] * h_prev[j];
        }
      }
      keep_row(step, b, t);
      if (lbr) std::copy(rec, rec + H, dah);  // the step's GEMM with R takes dah r
    });
  }

  void lstm_step(int64_t d, int64_t step, bool reverse) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 4 * H;
    if (default_lstm(d)) {
      for_active(lens_, step, reverse, 16 * H, [&](int64_t b, int64_t t) { default_lstm_entry(d, step, b, t); });
      return;
    }
    const Activation& f = a_.act(d, 0);
    const Activation& h_act = a_.act(d, 2);
    const V* p = in_.p.defined() ? weights(in_.p, d) : nullptr;
    for_active(lens_, step, reverse, 32 * H, [&](int64_t b, int64_t t) {
      V* __restrict dh = step_dh(d, b, t);
      V* __restrict dc = dc_.data() + b * H;
      // Gate blocks i o f c (f = 1 - i under input_forget, which has no f slope).
      const V* pre = at(trace_.pre, step, b, N, GH);
      const V* y = at(trace_.gates, step, b, N, GH);
      V* __restrict slope = gate_slopes(b);
      slopes(f, a_.clip, pre, y, slope, 2 * H);
      if (!a_.input_forget) slopes(f, a_.clip, pre ? pre + 2 * H : nullptr, y + 2 * H, slope + 2 * H, H);
      slopes(a_.act(d, 1), a_.clip, pre ? pre + 3 * H : nullptr, y + 3 * H, slope + 3 * H, H);
      const V* c_prev = at(trace_.c, step, b, N, H);
      const V* c = at(trace_.c, step + 1, b, N, H);
      const V* hc = at(trace_.hc, step, b, N, H);  // h(C) and its slope
      V* __restrict hc_slope = slope + GH;
      slopes(h_act, std::optional<float>(), c, hc, hc_slope, H);
      const V *i = y, *o = y + H, *ff = y + 2 * H, *cc = y + 3 * H;
      V* __restrict dg = dg_.data() + b * GH;
      V* __restrict dp = dp_.data() + b * 3 * H;
      for (int64_t j = 0; j < H; ++j) {
        const V dao = dh[j] * hc[j] * slope[H + j];
        V dct = dc[j] + dh[j] * o[j] * hc_slope[j] + (p ? dao * p[H + j] : V(0));
        const V df = dct * c_prev[j];
        const V di = dct * cc[j] - (a_.input_forget ? df : V(0));
        const V dai = di * slope[j];
        const V daf = a_.input_forget ? V(0) : df * slope[2 * H + j];
        const V dac = dct * i[j] * slope[3 * H + j];
        dc[j] = dct * ff[j] + (p ? dai * p[j] + daf * p[2 * H + j] : V(0));
        dg[j] = dai;
        dg[H + j] = dao;
        dg[2 * H + j] = daf;
        dg[3 * H + j] = dac;
        dp[j] += dai * c_prev[j];
        dp[H + j] += dao * c[j];
        dp[2 * H + j] += daf * c_prev[j];
      }
      std::fill(dh, dh + H, V(0));  // all of dH_prev comes through R
      keep_row(step, b, t);
    });
  }

  // Whether the trace's h rows are [X, H_prev] in X's order (trace_keeps_inputs): h_in_ is empty.
  bool inputs_in_trace() const { return trace_.h_column > 0; }

  bool default_lstm(int64_t d) const { return is_default_lstm(a_, in_.p.defined(), d); }

  // lstm_step's arithmetic for entry b at time t of a default LSTM, in one loop over the hidden
  // units, each slope formed from the gate's value where it is used (sigmoid' = y (1 - y), tanh'
  // = 1 - y^2) instead of a pass through the slope buffer; the loop vectorizes (the general one,
  // with its peephole and input_forget terms, does not).
  // With `in_place` the gate gradients go straight to the entry's row of dg_all_ (not dg_). With
  // `bias_sums` ([4H]) they are also added to it, while in cache (the bias gradient's column sums).
  void default_lstm_entry(int64_t d, int64_t step, int64_t b, int64_t t, bool in_place = false,
                          V* __restrict bias_sums = nullptr) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 4 * H;
    V* __restrict dh = step_dh(d, b, t);
    V* __restrict dc = dc_.data() + b * H;
    const V* __restrict y = at(trace_.gates, step, b, N, GH);  // gate blocks i o f c
    const V* __restrict c_prev = at(trace_.c, step, b, N, H);
    const V* __restrict hc = at(trace_.hc, step, b, N, H);      // tanh(C)
    V* __restrict dg = in_place ? dg_all_.data() + s_.x_row(t, b) * GH : dg_.data() + b * GH;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const V i = y[j], o = y[H + j], f = y[2 * H + j], c = y[3 * H + j], h = hc[j];
      const V dao = dh[j] * h * (o * (V(1) - o));
      const V dct = dc[j] + dh[j] * o * (V(1) - h * h);
      dc[j] = dct * f;
      dg[j] = dct * c * (i * (V(1) - i));
      dg[H + j] = dao;
      dg[2 * H + j] = dct * c_prev[j] * (f * (V(1) - f));
      dg[3 * H + j] = dct * i * (V(1) - c * c);
      dh[j] = V(0);  // all of dH_prev comes through R
    }
    if (bias_sums) {
#pragma omp simd
      for (int64_t j = 0; j < GH; ++j) bias_sums[j] += dg[j];
    }
    if (in_place) {
      keep_input_row(step, b, t);
    } else {
      keep_row(step, b, t);
    }
  }

  // Whether, and on how many threads, direction d's steps run as default_lstm_batch_split:
  // a float32 default LSTM with at least kSplitRows batch entries per thread.
  int batch_split_threads(int64_t d) const {
    if (!std::is_same_v<V, float> || !default_lstm(d) || omp_in_parallel()) return 1;
    return static_cast<int>(std::min<int64_t>(omp_get_max_threads(), s_.batch / kSplitRows));
  }
  static constexpr int64_t kSplitRows = 8;

  // backward()'s steps in one parallel region, the batch split between the threads as in the
  // forward pass (rnn.cpp lstm_batch_split): an entry's gradients depend on no other entry's, so
  // each thread walks the steps back for its rows [b0, b1) alone (default_lstm_entry, then dH_prev
  // += dG R for its rows through a single-threaded sgemm), with no barrier between steps; the
  // general path forks twice per step. The same arithmetic up to float32 rounding in sgemm (its
  // sums over a thread's rows may be blocked otherwise than over the whole batch). At a step where
  // all the thread's rows run at the same time t (every step of a batch of equal lengths), their
  // rows of dg_all_ lie at one stride (X's layout), so the gate gradients are written there and
  // sgemm reads them in place, instead of through dg_ and a copy per row (bench/workloads.py's
  // LSTM training: the copies were ~1.9 % of the step's samples by `perf`).
  void default_lstm_batch_split(int64_t d, bool reverse, int threads) {
    const int64_t N = s_.batch, H = s_.hidden, GH = 4 * H;
    const V* r = weights(in_.r, d);
    std::vector<V>& bias_sums = buffers_.bias_sums;
    bias_sums.assign(static_cast<size_t>(threads * GH), V(0));
    bias_summed_ = true;
#pragma omp parallel num_threads(threads)
    {
      const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t b0 = N * id / count, b1 = N * (id + 1) / count;
      V* sums = bias_sums.data() + id * GH;
      for (int64_t step = trace_.steps - 1; step >= 0; --step) {
        const int64_t t0 = b1 > b0 ? time_of(step, lens_[static_cast<size_t>(b0)], reverse) : -1;
        bool in_place = t0 >= 0;
        for (int64_t b = b0 + 1; b < b1 && in_place; ++b) {
          in_place = time_of(step, lens_[static_cast<size_t>(b)], reverse) == t0;
        }
        if (in_place) {
          for (int64_t b = b0; b < b1; ++b) {
            if (b + kPrefetchEntries < b1) prefetch_rows(t0, b + kPrefetchEntries);
            default_lstm_entry(d, step, b, t0, true, sums);
          }
          const int64_t lda = b1 - b0 > 1 ? (s_.x_row(t0, b0 + 1) - s_.x_row(t0, b0)) * GH : GH;
          gemm<V>(false, false, b1 - b0, H, GH, dg_all_.data() + s_.x_row(t0, b0) * GH, lda, r, H, dh_.data() + b0 * H,
                  H, true);
          continue;
        }
        for (int64_t b = b0; b < b1; ++b) {
          if (b + kPrefetchEntries < b1) {
            const int64_t ahead = time_of(step, lens_[static_cast<size_t>(b + kPrefetchEntries)], reverse);
            if (ahead >= 0) prefetch_rows(ahead, b + kPrefetchEntries);
          }
          const int64_t t = time_of(step, lens_[static_cast<size_t>(b)], reverse);
          if (t >= 0) {
            default_lstm_entry(d, step, b, t, false, sums);
          } else {  // past the entry's length: zero rows, dH and dC unchanged
            std::fill(dg_.begin() + b * GH, dg_.begin() + (b + 1) * GH, V(0));
          }
        }
        gemm<V>(false, false, b1 - b0, H, GH, dg_.data() + b0 * GH, GH, r, H, dh_.data() + b0 * H, H, true);
      }
    }
  }

  // How many entries ahead default_lstm_batch_split fetches the rows an entry will write.
  static constexpr int64_t kPrefetchEntries = 2;
  // Fetches entry b's rows of dg_all_ and h_in_ at time t into the cache ahead of their writing.
  // Those rows (16 MB and 4-8 MB a layer at bench/workloads.py's LSTM) were last touched a step's
  // worth of work ago and come from memory: an ordinary store first reads its line (the read for
  // ownership), and the entry's stores waited on those reads. Asked for two entries ahead, the
  // reads overlap the work of the entries between. A read prefetch (prefetcht0): x86-64-v3, the
  // build's target, has no prefetchw, and GCC emits nothing for a write prefetch there. (Not
  // streaming stores: the step's product reads the rows of dG right after.) Always inlined: as a
  // call, GCC 12 finds the function free of side effects (a prefetch is none to it) and drops the
  // calls. The LSTM's LSTMGrad 48.2-53.5 ms a step against 55.6-57.9 without, its kernels
  // 81.0-90.3 against 91.0-94.6 (ONNXTRAIN_PROFILE, 33 minus 3 steps, four alternating pairs).
  [[gnu::always_inline]] void prefetch_rows(int64_t t, int64_t b) const {
    const int64_t row = s_.x_row(t, b), GH = s_.gates * s_.hidden;
    const char* g = reinterpret_cast<const char*>(dg_all_.data() + row * GH);
    for (size_t k = 0; k < static_cast<size_t>(GH) * sizeof(V); k += 64) __builtin_prefetch(g + k, 0, 3);
    if (inputs_in_trace()) return;  // nothing written to h_in_
    const char* h = reinterpret_cast<const char*>(h_in_.data() + row * in_width_);
    for (size_t k = 0; k < static_cast<size_t>(in_width_) * sizeof(V); k += 64) __builtin_prefetch(h + k, 0, 3);
  }

  void weight_gradients(int64_t d) {
    const int64_t N = s_.batch, H = s_.hidden, I = s_.input, G = s_.gates, GH = G * H, rows = s_.seq * N;
    const bool gru = a_.cell == Cell::Gru;
    const V* dg = dg_all_.data();
    // The rows [X, H_prev] (under joint_weight_product_) or H_prev, in X's row order, and their
    // stride: h_in_'s, or the trace's own under trace_keeps_inputs.
    const V* h_in = h_in_.data();
    int64_t h_in_ld = in_width_;
    if (inputs_in_trace()) {
      h_in = trace_.h + (joint_weight_product_ ? 0 : trace_.h_column);
      h_in_ld = trace_.h_width;
    }
    if (V* dx = out_.of[kDX]) gemm<V>(false, false, rows, I, GH, dg, GH, weights(in_.w, d), I, dx, I, d > 0);
    if (joint_weight_product_) {  // [dW, dR]^T = [X, H_prev]^T dG, then each transposed to its output
      std::vector<V>& both = buffers_.dw_dr;
      both.resize(static_cast<size_t>(GH * in_width_));
      gemm<V>(true, false, in_width_, GH, rows, h_in, h_in_ld, dg, GH, both.data(), GH, false);
      transpose_weight_gradients(both.data(), out_.of[kDW] + d * GH * I, out_.of[kDR] + d * GH * H);
    } else if (V* dw = out_.of[kDW]) {
      gemm<V>(true, false, GH, I, rows, dg, GH, in_.x.data<V>(), I, dw + d * GH * I, I, false);
    }
    if (V* dr = out_.of[kDR]; dr && !joint_weight_product_) {
      dr += d * GH * H;
      const int64_t shared = gru ? 2 * H : GH;  // gate rows whose recurrent input is H_prev
      gemm<V>(true, false, shared, H, rows, dg, GH, h_in, h_in_ld, dr, H, false);
      if (gru) {
        const V* input = a_.linear_before_reset ? h_in_.data() : rh_.data();
        gemm<V>(true, false, H, H, rows, dg_rec_h_.data(), H, input, H, dr + 2 * H * H, H, false);
      }
    }
    if (V* db = out_.of[kDB]) {
      db += d * 2 * GH;
      if (bias_summed_) {  // default_lstm_batch_split's sums, thread by thread
        const std::vector<V>& sums = buffers_.bias_sums;
        std::fill(db, db + GH, V(0));
        for (size_t k = 0; k < sums.size(); k += static_cast<size_t>(GH)) {
          for (int64_t j = 0; j < GH; ++j) db[j] += sums[k + static_cast<size_t>(j)];
        }
      } else {
        column_sums(dg, rows, GH, GH, db);         // Wb
      }
      std::copy(db, db + GH, db + GH);           // Rb: the same sums, but GRU's h gate's
      if (gru) column_sums(dg_rec_h_.data(), rows, H, H, db + GH + 2 * H);
    }
    const std::vector<V>* states[2] = {&dh_, &dc_};
    for (int k : {kDInitialH, kDInitialC}) {
      V* out = out_.of[k];
      if (!out) continue;
      const std::vector<V>& state = *states[k - kDInitialH];
      for (int64_t b = 0; b < N; ++b) {
        std::copy(state.begin() + b * H, state.begin() + (b + 1) * H, out + s_.state_offset(d, b));
      }
    }
    if (V* dp = out_.of[kDP]) column_sums(dp_.data(), N, 3 * H, 3 * H, dp + d * 3 * H);
  }

  // dW [G*H, I] and dR [G*H, H] from their transposes side by side, both_t [I + H, G*H] (rows of
  // X's columns, then H_prev's), in tiles of kTile x kTile that both sides keep in cache.
  void transpose_weight_gradients(const V* both_t, V* dw, V* dr) const {
    const int64_t I = s_.input, H = s_.hidden, GH = s_.gates * H;
    constexpr int64_t kTile = 32;
    const int64_t gate_tiles = (GH + kTile - 1) / kTile, column_tiles = (in_width_ + kTile - 1) / kTile;
    parallel_for(gate_tiles * column_tiles, std::max<int64_t>(1, kParallelGrain / (kTile * kTile)), [&](int64_t begin, int64_t end) {
      for (int64_t tile = begin; tile < end; ++tile) {
        const int64_t g0 = tile / column_tiles * kTile, k0 = tile % column_tiles * kTile;
        const int64_t g1 = std::min(GH, g0 + kTile), k1 = std::min(in_width_, k0 + kTile);
        const int64_t split = std::clamp(I, k0, k1);  // columns [k0, split) are X's, [split, k1) H_prev's
        for (int64_t g = g0; g < g1; ++g) {
          for (int64_t k = k0; k < split; ++k) dw[g * I + k] = both_t[k * GH + g];
          for (int64_t k = split; k < k1; ++k) dr[g * H + (k - I)] = both_t[k * GH + g];
        }
      }
    });
  }

  const RnnAttrs& a_;
  const RnnShape& s_;
  const std::vector<int64_t>& lens_;
  const RnnTensors& in_;
  const GradIn<V>& g_;
  const GradOut<V>& out_;
  const V* shared_trace_;
  BackwardBuffers<V>& buffers_;
  Trace<V> trace_;
  // All steps, rows in X's order (zero for times past an entry's length):
  std::vector<V>& dg_all_;    // [S * N, G*H]: gradients of the gates' pre-activations
  std::vector<V>& h_in_;      // [S * N, in_width_]: each row's X row (joint_weight_product_), then H_prev;
                              // empty under trace_keeps_inputs (the trace's h rows are those rows)
  bool joint_weight_product_ = false;  // dW and dR as one product (run())
  int64_t in_width_ = 0;               // I + H under joint_weight_product_, else H
  bool bias_summed_ = false;           // direction's dB from default_lstm_batch_split's bias_sums
  std::vector<V>& dg_rec_h_;  // GRU: [S * N, H]: gradient of the h gate's recurrent product
  std::vector<V>& rh_;        // GRU without linear_before_reset: [S * N, H]: r . H_prev
  // One step, rows by batch entry:
  std::vector<V>& dg_;             // [N, G*H]: the gradients multiplied by R
  std::vector<V>& slope_;          // [N, (G+1)*H]: the gates' slopes (LSTM: and h's at C)
  std::vector<V>& dh_;             // [N, H]: gradients flowing into the state
  std::vector<V>& dc_;
  std::vector<V>& drh_;            // GRU: [N, H]: d(r . H_prev)
  std::vector<V>& dp_;             // LSTM: [N, 3H]: the peepholes' gradient per entry
};

class RnnGradKernel final : public Kernel {
 public:
  explicit RnnGradKernel(RnnAttrs attrs) : a_(std::move(attrs)) {}

  void run(KernelContext& ctx) override {
    const RnnShape s = check_inputs(ctx, a_);
    const std::vector<int64_t> lens = sequence_lengths(ctx, s);
    const DataType dtype = ctx.input(kX).dtype();
    const GradLayout layout = GradLayout::of(a_);
    const int grads_in = a_.cell == Cell::Lstm ? 3 : 2;
    for (int k = 0; k < grads_in; ++k) {
      const int i = layout.dy + k;
      if (!ctx.has_input(i)) continue;
      if (ctx.input(i).dtype() != dtype) {
        fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected " +
             std::string(dtype_name(dtype)) + " like " + ctx.input_name(kX));
      }
      expect_shape(ctx, i, k == 0 ? s.y_shape() : s.state_shape(),
                   std::string(k == 0 ? "the shape of Y" : k == 1 ? "the shape of Y_h" : "the shape of Y_c"));
    }
    const int outputs = a_.cell == Cell::Lstm ? 7 : 5;
    for (int k = 0; k < outputs; ++k) {
      if (ctx.has_output(k) && !ctx.has_input(input_of_output(k))) {
        fail("output " + ctx.output_name(k) + " is the gradient of input " + std::to_string(input_of_output(k)) +
             ", which is omitted; leave the output unnamed");
      }
    }
    const int trace_input = layout.dy + grads_in;
    if (ctx.has_input(trace_input)) {
      const Shape want{s.directions, trace_layout(a_, s, lens).elements};
      const Tensor& trace = ctx.input(trace_input);
      if (trace.dtype() != dtype || trace.shape() != want) {
        fail("input " + ctx.input_name(trace_input) + " is " + trace.description() + ", expected the trace of " +
             a_.op + "Training on these inputs: " + std::string(dtype_name(dtype)) + " " + want.to_string());
      }
    }
    visit_dtype<TypeList<float, double>>(dtype, a_.op + "Grad input " + ctx.input_name(kX), [&]<class V>() {
      const RnnTensors in = load_inputs(ctx, a_, false);
      GradIn<V> g;
      auto grad = [&](int i) { return ctx.has_input(i) ? ctx.input(i).data<V>() : nullptr; };
      g.dy = grad(layout.dy);
      g.dy_h = grad(layout.dy_h);
      if (a_.cell == Cell::Lstm) g.dy_c = grad(layout.dy_c);
      GradOut<V> out;
      for (int k = 0; k < outputs; ++k) {
        if (!ctx.has_output(k)) continue;
        out.of[k] = ctx.allocate_output(k, dtype, ctx.input(input_of_output(k)).shape()).template data<V>();
      }
      const V* trace = ctx.has_input(trace_input) ? ctx.input(trace_input).template data<V>() : nullptr;
      Backward<V>(a_, s, lens, in, g, out, trace, buffers_.template get<V>()).run();
    });
  }

 private:
  RnnAttrs a_;
  BuffersByType<BackwardBuffers> buffers_;
};

}  // namespace

std::unique_ptr<Kernel> make_rnn_grad(const KernelInit& init) {
  return std::make_unique<RnnGradKernel>(parse_attrs(init));
}

}  // namespace onnxtrain::ops
