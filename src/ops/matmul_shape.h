// The numpy.matmul reading of two operand shapes, shared by MatMul (matmul.cpp) and the integer
// and quantized products (quantize_matmul.cpp): a 1-D first operand is a row vector [1, K], a
// 1-D second operand a column vector [K, 1], and the added dim is removed from the result;
// dims before the last two are batch dims and broadcast by numpy rules (ONNX operator doc
// "MatMul").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/kernel.h"

namespace onnxtrain::ops {

struct MatMulShape {
  Shape batch;             // broadcast batch dims of the output
  Shape a_batch, b_batch;  // each operand's batch dims, left-padded with 1 to batch's rank
  int64_t M = 0, K = 0, N = 0;
  Shape out;
};

// The product of inputs `ia` and `ib` of the node. Throws Error naming both inputs for a
// scalar operand, inner dims that differ or batch dims that do not broadcast.
MatMulShape matmul_shape(const KernelContext& ctx, int ia, int ib);
// The same for operand shapes `a` and `b` (the shapes a kernel reads its inputs as), named
// `a_name` and `b_name` in its errors.
MatMulShape matmul_shape(const Shape& a, const Shape& b, const std::string& a_name, const std::string& b_name);

// For each output batch (row-major over `batch`): the element offset of an operand's matrix,
// whose batch dims `operand` are those of `batch` or 1 (broadcast).
std::vector<int64_t> batch_offsets(const Shape& operand, const Shape& batch, int64_t matrix_size);

}  // namespace onnxtrain::ops
