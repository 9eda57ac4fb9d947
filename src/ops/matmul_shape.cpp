#include "ops/matmul_shape.h"

#include <algorithm>

#include "ops/broadcast.h"

namespace onnxtrain::ops {

namespace {

Shape left_padded(const Shape& s, size_t rank) {
  Shape r = Shape::filled(rank - s.size(), 1);
  for (int64_t d : s) r.push_back(d);
  return r;
}

}  // namespace

MatMulShape matmul_shape(const KernelContext& ctx, int ia, int ib) {
  return matmul_shape(ctx.input(ia).shape(), ctx.input(ib).shape(), ctx.input_name(ia), ctx.input_name(ib));
}

MatMulShape matmul_shape(const Shape& a, const Shape& b, const std::string& a_name, const std::string& b_name) {
  if (a.size() == 0) fail("input " + a_name + " is a scalar; a matrix product needs rank >= 1");
  if (b.size() == 0) fail("input " + b_name + " is a scalar; a matrix product needs rank >= 1");
  MatMulShape s;
  s.M = a.size() == 1 ? 1 : a[a.size() - 2];
  s.K = a.back();
  const int64_t b_rows = b.size() == 1 ? b[0] : b[b.size() - 2];
  s.N = b.size() == 1 ? 1 : b.back();
  if (b_rows != s.K) {
    fail("inputs " + a_name + " " + a.to_string() + " and " + b_name + " " +
         b.to_string() + " cannot be multiplied: " + std::to_string(s.K) + " columns against " +
         std::to_string(b_rows) + " rows");
  }
  const Shape a_batch(a.dims().first(a.size() - std::min<size_t>(2, a.size())));
  const Shape b_batch(b.dims().first(b.size() - std::min<size_t>(2, b.size())));
  try {
    s.batch = broadcast_shapes(a_batch, b_batch);
  } catch (const Error& e) {
    fail("batch dims of " + a_name + " " + a.to_string() + " and " + b_name +
         " " + b.to_string() + " do not broadcast: " + e.what());
  }
  s.a_batch = left_padded(a_batch, s.batch.size());
  s.b_batch = left_padded(b_batch, s.batch.size());
  s.out = s.batch;
  if (a.size() > 1) s.out.push_back(s.M);
  if (b.size() > 1) s.out.push_back(s.N);
  return s;
}

std::vector<int64_t> batch_offsets(const Shape& operand, const Shape& batch, int64_t matrix_size) {
  const size_t rank = batch.size();
  std::vector<int64_t> stride(rank);
  int64_t running = matrix_size;
  for (size_t d = rank; d-- > 0;) {
    stride[d] = operand[d] == 1 ? 0 : running;
    running *= operand[d];
  }
  std::vector<int64_t> offsets(static_cast<size_t>(batch.numel()));
  std::vector<int64_t> index(rank, 0);
  int64_t offset = 0;
  for (auto& o : offsets) {
    o = offset;
    for (size_t d = rank; d-- > 0;) {  // odometer step
      offset += stride[d];
      if (++index[d] < batch[d]) break;
      offset -= stride[d] * batch[d];
      index[d] = 0;
    }
  }
  return offsets;
}

}  // namespace onnxtrain::ops
