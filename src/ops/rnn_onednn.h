// A float32 LSTM direction through oneDNN's LSTM primitive (dnnl::lstm_forward,
// forward_inference; its brgemm implementation on AVX-512), for rnn.cpp's kernel.
//
// It takes the LSTM of rnn.cpp's header comment in the form the primitive computes: default
// activations (Sigmoid, Tanh, Tanh), no clip, no input_forget, no peepholes (P omitted), every
// sequence as long as X (sequence_lens omitted or all seq_length), no trace (not
// ai.onnxtrain.LSTMTraining), and at least kMinBatch batch entries, where it runs faster than
// rnn.cpp's own recurrence (bench/workloads.py's 2-layer LSTM, seq 64, hidden 256, two AMD
// EPYC cores: batch 8 2.9 against 4.4 ms, batch 16 5.1 against 7.0, batch 64 17.2-17.7 against
// 23.8-24.6; ONNX Runtime 21.8-22.2 at batch 64), not at batch 1 (1.30 against 1.06 ms).
// Results are the same equations with oneDNN's own sigmoid and tanh and sums, so they differ
// from rnn.cpp's recurrence in the last bits.
//
// The primitive's gates are ordered i f c o (ONNX: i o f c) and its bias is one vector per gate
// (ONNX: Wb and Rb, summed here); the weights are copied into that order and reordered into the
// primitive's layout at every run, or once while their data stays the same when they are
// constant (initializers no run replaces).
#pragma once

#include <memory>
#include <vector>

#include "ops/rnn_common.h"

namespace onnxtrain::ops::rnn {

class OneDnnLstm {
 public:
  static constexpr int64_t kMinBatch = 8;

  OneDnnLstm();
  ~OneDnnLstm();

  // Whether this LSTM run can take the primitive (see above).
  static bool applies(const RnnAttrs& a, const RnnShape& s, const std::vector<int64_t>& lens, const RnnTensors& in);

  // Runs direction d of a float32 LSTM that applies(): writes its part of y (Y), y_h (Y_h) and
  // y_c (Y_c) where not null, in the layouts of rnn.cpp's header, and returns true; returns
  // false, having written nothing, when oneDNN has no implementation for the problem (the
  // caller runs rnn.cpp's recurrence). `weights_constant`: W, R and B hold the same values at
  // every run whose pointers are unchanged. Throws Error when a oneDNN call fails at run time.
  bool run(const RnnAttrs& a, const RnnShape& s, const RnnTensors& in, int64_t d, float* y, float* y_h, float* y_c,
           bool weights_constant);

 private:
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace onnxtrain::ops::rnn
