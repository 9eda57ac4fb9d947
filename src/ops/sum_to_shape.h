// ai.onnxtrain.SumToShape (gradient_ops.cpp) as functions, for the kernels that compute a bias
// gradient alongside their own output (activation.cpp: GeluGrad with a shape input).
#pragma once

#include <cstdint>
#include <string>

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

// The number of row ranges sum_to_shape_into splits a g of `shape` into: one per thread, at most
// one per row, fewer for small g.
int64_t sum_to_shape_parts(const Shape& shape);

}  // namespace onnxtrain::ops
