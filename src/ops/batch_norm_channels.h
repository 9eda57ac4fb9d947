// What BatchNormalization's training-mode kernels over the channels of X share
// (ops/sync_batch_norm.cpp: the forward across ranks; ops/batch_norm_grad.cpp: the gradients).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "ops/kernel.h"

namespace onnxtrain::ops::batch_norm {

// X seen as [batch, channels, size]: a 1-D X has one channel.
struct Layout {
  int64_t batch = 0, channels = 1, size = 1;
  double count() const { return static_cast<double>(batch * size); }  // elements per channel
};

// The layout of input i; a scalar is an error.
inline Layout layout_of(const KernelContext& ctx, int i) {
  const Tensor& x = ctx.input(i);
  if (x.rank() == 0) fail("input " + ctx.input_name(i) + " is a scalar, expected [N, C, D1..Dn] or [N]");
  Layout l;
  l.batch = x.dim(0);
  l.channels = x.rank() == 1 ? 1 : x.dim(1);
  l.size = x.shape().numel(std::min<size_t>(2, x.rank()), x.rank());
  return l;
}

// The values of input i, which must be a floating [channels] tensor (one value per channel of
// input `of`).
inline std::vector<double> per_channel(const KernelContext& ctx, int i, const Layout& l, int of) {
  const Tensor& t = ctx.input(i);
  if (t.rank() != 1 || t.dim(0) != l.channels || !is_floating(t.dtype())) {
    fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a floating [" +
         std::to_string(l.channels) + "] (one value per channel of input " + ctx.input_name(of) + ")");
  }
  return t.to_double_vector();
}

// In place: each element becomes its sum over the ranks (nothing with one process).
inline void sum_across_ranks(const KernelContext& ctx, std::vector<double>& values) {
  const auto& sum = ctx.run_context().sum_across_ranks;
  if (sum) sum(std::span<double>(values));
}

// A [values.size()] tensor of `dtype` (a floating type) holding `values`.
inline Tensor channel_tensor(DataType dtype, const std::vector<double>& values) {
  Tensor t(dtype, Shape{static_cast<int64_t>(values.size())});
  visit_dtype<FloatTypes>(dtype, "statistics", [&]<class T>() {
    for (size_t i = 0; i < values.size(); ++i) t.data<T>()[i] = convert<T>(values[i]);
  });
  return t;
}

}  // namespace onnxtrain::ops::batch_norm
