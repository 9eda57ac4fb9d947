// Which BatchNormalization nodes compute statistics of their batch (training mode).
#pragma once

#include <cstdint>

namespace onnxtrain::ops {

// Whether BatchNormalization-`opset` normalizes with the mean and variance of its input batch,
// as the ONNX op doc defines it per version: at opsets 1-6 (versions 1, 6) when attribute
// `is_test` is 0; at opsets 7-13 (versions 7, 9) when the node asks for any output beyond Y
// (`extra_outputs`: running or saved statistics); at opset 14+ (versions 14, 15) when
// attribute `training_mode` is 1. The kernel (ops/normalization.cpp), the gradient rule (autodiff/rules_nn.cpp) and
// --sync-batch-norm's rewrite (distributed/sync_batch_norm.cpp) all decide by it.
inline bool batch_norm_training(int opset, int64_t is_test, bool extra_outputs, int64_t training_mode) {
  if (opset < 7) return is_test == 0;
  if (opset < 14) return extra_outputs;
  return training_mode != 0;
}

}  // namespace onnxtrain::ops
