// The Relu op's rule (ONNX operator doc "Relu": y = max(x, 0)) and ai.onnxtrain.ReluGrad's
// (dx = dy where y > 0, else 0), as loops other kernels apply to their own outputs: the Relu and
// ReluGrad kernels' fusions into FusedConv / ConvChannelsLast (conv.cpp) and FusedGemm
// (matmul.cpp), and the ReluGrad kernel (gradient_ops.cpp). NaN stays NaN in relu (x < 0 is
// false for it) and -0 stays -0; relu_grad keeps dy where y > 0 only (NaN or -0 in y give 0).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "core/select.h"

namespace onnxtrain::ops {

// max(v, 0) for any numeric T, NaN kept.
template <class T>
T relu(T v) {
  return v < T(0) ? T(0) : v;
}

// y[i] = relu(y[i]) for i in [0, n), in parallel; nothing for unsigned T.
template <class T>
void relu_in_place(T* y, int64_t n) {
  if constexpr (std::is_unsigned_v<T>) return;
  parallel_for(n, kParallelGrain, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = relu(y[i]);
  });
}

// out[i] = dy[i] where y[i] > 0 (compared in compute_t<T>), else 0, for i in [0, n); out may be
// dy (in place). Floating T (float, double, float16, bfloat16).
template <class T>
void relu_grad(const T* y, const T* dy, T* out, int64_t n) {
  parallel_for(n, kParallelGrain, [=](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      out[i] = select_bits(static_cast<compute_t<T>>(y[i]) > compute_t<T>(0), dy[i], T(0));
    }
  });
}

}  // namespace onnxtrain::ops
