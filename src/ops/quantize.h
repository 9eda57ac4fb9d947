// Helpers shared by the quantization kernels (quantize.cpp, quantize_matmul.cpp,
// quantize_conv.cpp): integer ranges, parameters broadcast over an operand, and the
// "requantize" step y = saturate(round(acc * multiplier) + zero_point).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/kernel.h"

namespace onnxtrain::ops {

// [lo, hi] of a quantized integer type: int8, uint8, int16, uint16, int4, uint4, int2, uint2
// (QuantizeLinear-21+'s saturation list).
struct IntRange {
  int64_t lo = 0, hi = 0;
};
IntRange quant_range(DataType dtype);
bool is_quant_integer(DataType dtype);

// round(v) to nearest, ties to even, plus zero_point, clamped to `range`. NaN gives the zero
// point (ONNX leaves it undefined).
inline int64_t saturate_round(double v, double zero_point, IntRange range) {
  const double r = (std::isnan(v) ? 0.0 : std::nearbyint(v)) + zero_point;
  if (r <= static_cast<double>(range.lo)) return range.lo;
  if (r >= static_cast<double>(range.hi)) return range.hi;
  return static_cast<int64_t>(r);
}

// Stores an integer already within T's range into an element of T (int8 .. uint16, int4 ..).
template <class T>
inline T store_int(int64_t v) {
  if constexpr (is_sub_byte_int_v<T>) {
    return T::wrap(v);
  } else {
    return static_cast<T>(v);
  }
}

// The values of parameter `p` (input `name` of the node) broadcast to `shape` by numpy rules,
// in row-major order of `shape`, as doubles. Throws an Error naming the input when p's shape
// does not broadcast to `shape` (each dim of p, aligned at the right, equal to shape's or 1).
std::vector<double> expand_param(const Tensor& p, const Shape& shape, const std::string& name);

// The values of a tensor as doubles in its row-major order (any tensor type).
std::vector<double> values_of(const Tensor& t);

}  // namespace onnxtrain::ops
