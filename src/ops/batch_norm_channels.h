// What BatchNormalization's training-mode kernels over the channels of X share
// (ops/sync_batch_norm.cpp: the forward across ranks; ops/batch_norm_grad.cpp: the gradients).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
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

// ---- column by column: X as rows [batch, width = channels size], column j in channel j / size ----
//
// Summing channel by channel runs a vectorized loop over each plane of `size` elements: on
// small planes (ResNet's late layers, 4x4 to 1x1; [N, C] input) its set-up costs more than its
// work (BatchNormalization of [32, 512, 1, 1] took 0.13 ms, one of [32, 64, 16, 16] 0.07 ms).
// Planes smaller than kColumnPlanes are summed column by column instead: each column over the
// rows, vectorized across the columns, then the columns of each channel added.
inline constexpr int64_t kColumnPlanes = 64;

inline int64_t column_grain(const Layout& l) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, l.batch));
}

// Per channel, the sum of its columns.
inline std::vector<double> add_columns(const std::vector<double>& columns, const Layout& l) {
  std::vector<double> sums(static_cast<size_t>(l.channels), 0.0);
  for (size_t j = 0; j < columns.size(); ++j) sums[j / static_cast<size_t>(l.size)] += columns[j];
  return sums;
}

// A per-channel value repeated for each column of its channel.
template <class V>
std::vector<V> per_column(const Layout& l, auto value) {
  std::vector<V> v(static_cast<size_t>(l.channels * l.size));
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<V>(value(j / static_cast<size_t>(l.size)));
  return v;
}

// Per channel c, the sum in double of x, or with `center`, of (x - center[c])^2, column by column.
template <class T>
std::vector<double> column_channel_sums(const T* x, const Layout& l, const std::vector<double>* center = nullptr) {
  const int64_t width = l.channels * l.size;
  std::vector<double> columns(static_cast<size_t>(width), 0.0);
  const std::vector<double> m = center ? per_column<double>(l, [&](size_t c) { return (*center)[c]; }) : std::vector<double>();
  parallel_for(width, column_grain(l), [&](int64_t begin, int64_t end) {
    double* __restrict acc = columns.data();
    for (int64_t n = 0; n < l.batch; ++n) {
      const T* __restrict row = x + n * width;
      if (center) {
        const double* __restrict pm = m.data();
#pragma omp simd
        for (int64_t j = begin; j < end; ++j) {
          const double d = convert<double>(row[j]) - pm[j];
          acc[j] += d * d;
        }
      } else {
#pragma omp simd
        for (int64_t j = begin; j < end; ++j) acc[j] += convert<double>(row[j]);
      }
    }
  });
  return add_columns(columns, l);
}

}  // namespace onnxtrain::ops::batch_norm
