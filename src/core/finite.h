// Whether floating-point values are all finite (no NaN, no Inf), for the training session's NaN
// guard and the optimizer kernels that check their outputs for it.
#pragma once

#include <cstdint>

#include "onnxtrain/dtype.h"

namespace onnxtrain {

// p[begin, end) holds no NaN and no Inf. A sum of every element times 0 stays 0 exactly when
// each element is finite: one vectorizable pass, no early exit. T: float, double, Float16 or
// BFloat16 (summed in compute_t<T>).
template <class T>
inline bool all_finite(const T* p, int64_t begin, int64_t end) {
  using V = compute_t<T>;
  const T* __restrict q = p;
  V sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = begin; i < end; ++i) sum += static_cast<V>(q[i]) * V(0);
  return sum == V(0);
}

}  // namespace onnxtrain
