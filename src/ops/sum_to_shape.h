// ai.onnxtrain.SumToShape (gradient_ops.cpp) as functions, for the kernels that compute a bias
// gradient alongside their own output (activation.cpp: GeluGrad with a shape input;
// normalization.cpp: LayerNormalizationGrad with attribute dx_sum).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/kernel.h"

namespace onnxtrain::ops {

// Input i of ctx read as a shape: a 1-D int64 tensor of dims >= 0. Throws Error naming the input
// otherwise.
Shape shape_input(const KernelContext& ctx, int i);

// Throws Error, naming `g_name`, unless `target` broadcasts to `g` (numpy rules: at most g's rank,
// each dim equal to g's or 1).
void check_sum_to_shape(const Shape& g, const Shape& target, const std::string& g_name);

// out (shaped `target`, typed like g, any numeric type) = g summed over the dims `target`
// broadcasts: SumToShape(g, target). g's rows (its last dim) split into sum_to_shape_parts(g)
// contiguous ranges, rows * p / parts to rows * (p + 1) / parts, one per thread, each summed row
// by row in order in the compute type (float for float32), then the ranges' sums added in order.
void sum_to_shape_into(const Tensor& g, const Shape& target, Tensor& out);

// Whether SumToShape(t, target) of a t shaped `shape` sums over every dim but the last: target is
// the last dim, with or without leading 1s.
inline bool sums_to_last_dim(const Shape& shape, const Shape& target) {
  if (shape.empty() || target.empty() || target[target.size() - 1] != shape[shape.size() - 1]) return false;
  return std::all_of(target.begin(), target.end() - 1, [](int64_t d) { return d == 1; });
}

// The number of row ranges sum_to_shape_into splits a g of `shape` into: one per thread, at most
// one per row, fewer for small g.
int64_t sum_to_shape_parts(const Shape& shape);

// sum_to_shape_into's order of sums for a g of `shape` (rank >= 1) and n output values: range p
// of the sum_to_shape_parts(shape) ranges covers rows [rows * p / parts, rows * (p + 1) / parts)
// (rows = numel / last dim); accumulate(p, r0, r1, acc) adds those rows, in order, into acc (n
// values of type C, zeroed), one range per thread; the ranges' sums are then added in order.
// Returns the n sums. A kernel that makes g row by row (ops/activation.cpp's GeluGrad) passes an
// accumulate that makes each row before adding it, and gets SumToShape's bits.
template <class C, class F>
std::vector<C> sum_row_ranges(const Shape& shape, size_t n, F accumulate) {
  const int64_t inner = shape[shape.size() - 1];
  const int64_t rows = inner ? shape.numel() / inner : 0;
  const int64_t parts = sum_to_shape_parts(shape);
  std::vector<C> acc(n * static_cast<size_t>(parts), C(0));
  if (rows == 0) return acc;
  parallel_for(parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      accumulate(p, rows * p / parts, rows * (p + 1) / parts, acc.data() + static_cast<size_t>(p) * n);
    }
  });
  for (int64_t p = 1; p < parts; ++p) {
    const C* part = acc.data() + static_cast<size_t>(p) * n;
    for (size_t i = 0; i < n; ++i) acc[i] += part[i];
  }
  acc.resize(n);
  return acc;
}

}  // namespace onnxtrain::ops
