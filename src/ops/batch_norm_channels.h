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

// X seen as [batch, channels, size]: a 1-D X has one channel. With `block` (b > 0) X is blocked
// by b channels, [batch, channels / b, D1..Dn, b] (runtime/fusion.h block_convolution_tensors),
// and `size` is still the product of D1..Dn.
struct Layout {
  int64_t batch = 0, channels = 1, size = 1, block = 0;
  double count() const { return static_cast<double>(batch * size); }  // elements per channel
};

// The layout of input i, blocked by `block` channels when it is not 0; a scalar, or a blocked
// input of another shape than [N, C / block, D1..Dn, block], is an error.
inline Layout layout_of(const KernelContext& ctx, int i, int64_t block = 0) {
  const Tensor& x = ctx.input(i);
  if (x.rank() == 0) fail("input " + ctx.input_name(i) + " is a scalar, expected [N, C, D1..Dn] or [N]");
  Layout l;
  l.batch = x.dim(0);
  if (block > 0) {
    if (x.rank() < 3 || x.dim(x.rank() - 1) != block) {
      fail("input " + ctx.input_name(i) + " is " + x.description() + ", expected [N, C / " + std::to_string(block) +
           ", D1..Dn, " + std::to_string(block) + "] (attribute channel_block = " + std::to_string(block) + ")");
    }
    l.channels = x.dim(1) * block;
    l.size = x.shape().numel(2, x.rank() - 1);
    l.block = block;
    return l;
  }
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
// (blocked by b channels: column j in channel (j / (size b)) b + j % b)
//
// Summing channel by channel runs a vectorized loop over each plane of `size` elements: on
// small planes (ResNet's late layers, 4x4 to 1x1; [N, C] input) its set-up costs more than its
// work (BatchNormalization of [32, 512, 1, 1] took 0.13 ms, one of [32, 64, 16, 16] 0.07 ms).
// Planes smaller than kColumnPlanes are summed column by column instead: each column over the
// rows, vectorized across the columns, then the columns of each channel added. The kernels below
// work on the columns of a range of whole channels [c0, c1); for_channel_ranges splits the
// channels between the threads, so that one task can run every pass of a kernel over its range
// while the range stays in its core's cache, with one parallel region per kernel.
inline constexpr int64_t kColumnPlanes = 64;

// Whether the kernels run block by block (X blocked by 8 or 16 channels, planes of kColumnPlanes
// or more: below) or column by column (small planes, and X blocked otherwise); else channel by
// channel.
inline bool block_kernels(int64_t block) { return block == 8 || block == 16; }  // the block by block kernels' blocks
inline bool by_blocks(const Layout& l) { return block_kernels(l.block) && l.size >= kColumnPlanes; }
inline bool by_columns(const Layout& l) { return !by_blocks(l) && (l.block > 0 || l.size < kColumnPlanes); }

// The channel of column j (counted from the first column of channel c0, which starts a block when
// X is blocked).
inline int64_t column_channel(const Layout& l, int64_t c0, int64_t j) {
  return l.block > 0 ? c0 + j / (l.size * l.block) * l.block + j % l.block : c0 + j / l.size;
}

// Runs f(c0, c1) over ranges of whole channels in parallel, each of at least kColumnGrain elements
// (a [32, 256, 2, 2] X: two ranges of 128 channels; a [32, 512, 1, 1] one, on one thread); whole
// blocks of channels when X is blocked.
inline constexpr int64_t kColumnGrain = 1 << 14;
template <class F>
void for_channel_ranges(const Layout& l, F&& f) {
  const int64_t b = std::max<int64_t>(1, l.block);
  parallel_for(l.channels / b, std::max<int64_t>(1, kColumnGrain / std::max<int64_t>(1, l.batch * l.size * b)),
               [&](int64_t begin, int64_t end) { f(begin * b, end * b); });
}

// For the columns of channels [c0, c1): value(c) of each column's channel c.
template <class V>
std::vector<V> per_column(const Layout& l, int64_t c0, int64_t c1, auto value) {
  std::vector<V> v(static_cast<size_t>((c1 - c0) * l.size));
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<V>(value(column_channel(l, c0, static_cast<int64_t>(j))));
  return v;
}

// out[c] for each channel c of [c0, c1): the sum of its columns in `columns` (those of c0 first),
// in the order of the positions of a plane (so blocked and plain X sum alike).
inline void add_columns(const std::vector<double>& columns, const Layout& l, int64_t c0, int64_t c1, double* out) {
  for (int64_t c = c0; c < c1; ++c) {
    // Column k of channel c's plane, and the step between k and k + 1.
    const int64_t first = l.block > 0 ? (c - c0) / l.block * l.size * l.block + (c - c0) % l.block : (c - c0) * l.size;
    const int64_t step = l.block > 0 ? l.block : 1;
    double s = 0;
    for (int64_t k = 0; k < l.size; ++k) s += columns[static_cast<size_t>(first + k * step)];
    out[c] = s;
  }
}

// out[c] for each channel c of [c0, c1): the sum in double of x over channel c, or with `center`
// (per channel), of (x - center[c])^2.
template <class T>
void column_sums(const T* x, const Layout& l, int64_t c0, int64_t c1, double* out, const double* center = nullptr) {
  const int64_t width = l.channels * l.size, first = c0 * l.size, count = (c1 - c0) * l.size;
  std::vector<double> columns(static_cast<size_t>(count), 0.0);
  const std::vector<double> m =
      center ? per_column<double>(l, c0, c1, [&](int64_t c) { return center[c]; }) : std::vector<double>();
  double* __restrict acc = columns.data();
  for (int64_t n = 0; n < l.batch; ++n) {
    const T* __restrict row = x + n * width + first;
    if (center) {
      const double* __restrict pm = m.data();
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) {
        const double d = convert<double>(row[j]) - pm[j];
        acc[j] += d * d;
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) acc[j] += convert<double>(row[j]);
    }
  }
  add_columns(columns, l, c0, c1, out);
}

// Per channel c, the sum in double of x, or with `center`, of (x - center[c])^2, column by column.
template <class T>
std::vector<double> column_channel_sums(const T* x, const Layout& l, const std::vector<double>* center = nullptr) {
  std::vector<double> sums(static_cast<size_t>(l.channels), 0.0);
  for_channel_ranges(l, [&](int64_t c0, int64_t c1) {
    column_sums(x, l, c0, c1, sums.data(), center ? center->data() : nullptr);
  });
  return sums;
}

// y = (x - center[c]) factor[c] + shift[c] over the columns of channels [c0, c1), computed in
// compute_t<T> (float for float32) from the double per-channel values.
template <class T>
void column_normalize(const T* x, T* y, const Layout& l, int64_t c0, int64_t c1, const double* center,
                      const double* factor, const double* shift) {
  using V = compute_t<T>;
  const int64_t width = l.channels * l.size, first = c0 * l.size, count = (c1 - c0) * l.size;
  const std::vector<V> m = per_column<V>(l, c0, c1, [&](int64_t c) { return center[c]; });
  const std::vector<V> f = per_column<V>(l, c0, c1, [&](int64_t c) { return factor[c]; });
  const std::vector<V> s = per_column<V>(l, c0, c1, [&](int64_t c) { return shift[c]; });
  const V *__restrict pm = m.data(), *__restrict pf = f.data(), *__restrict ps = s.data();
  for (int64_t n = 0; n < l.batch; ++n) {
    const T* __restrict row = x + n * width + first;
    T* __restrict out = y + n * width + first;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) out[j] = convert<T>((convert<V>(row[j]) - pm[j]) * pf[j] + ps[j]);
  }
}

// ---- block by block: X blocked by b channels, planes of kColumnPlanes or more ----
//
// A block of b channels is N runs of size x b floats, position by position, channel fastest. The
// kernels below run over one block, reading it in order, with one accumulator per channel of the
// block (two, for even and odd positions, so that the adds do not wait on each other), b a
// compile-time 8 or 16 (with_block) so that the accumulators stay in registers; for_channel_blocks
// splits the blocks between the threads. (The column path keeps a sum per column of a plane,
// 16384 of them for ResNet-18's [32, 64, 16, 16] stem output.)

// f.template operator()<B>() with B = l.block (8 or 16).
template <class F>
void with_block(const Layout& l, F&& f) {
  if (l.block == 8) {
    f.template operator()<8>();
  } else {
    f.template operator()<16>();
  }
}

// Runs f(cb) for each block cb of channels [cb b, cb b + b), in parallel.
template <class F>
void for_channel_blocks(const Layout& l, F&& f) {
  const int64_t blocks = l.channels / l.block;
  parallel_for(blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, l.batch * l.size * l.block)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t cb = begin; cb < end; ++cb) f(cb);
               });
}

// out[c] for the B channels c of block cb: the sum in double of x over channel c, or with
// `center` (per channel), of (x - center[c])^2.
template <int B, class T>
void block_sums(const T* x, const Layout& l, int64_t cb, double* out, const double* center = nullptr) {
  const int64_t blocks = l.channels / B, first = cb * B;
  double even[B] = {}, odd[B] = {}, m[B] = {};
  if (center) std::copy(center + first, center + first + B, m);
  // The pass over the block, adding f(x) of even and odd positions apart.
  const auto pass = [&](auto f) {
    for (int64_t n = 0; n < l.batch; ++n) {
      const T* __restrict p = x + (n * blocks + cb) * l.size * B;
      int64_t s = 0;
      for (; s + 2 <= l.size; s += 2) {
#pragma omp simd
        for (int k = 0; k < B; ++k) {
          even[k] += f(convert<double>(p[s * B + k]), k);
          odd[k] += f(convert<double>(p[s * B + B + k]), k);
        }
      }
      for (; s < l.size; ++s) {
#pragma omp simd
        for (int k = 0; k < B; ++k) even[k] += f(convert<double>(p[s * B + k]), k);
      }
    }
  };
  if (center) {
    pass([&](double v, int k) { return (v - m[k]) * (v - m[k]); });
  } else {
    pass([](double v, int) { return v; });
  }
  for (int k = 0; k < B; ++k) out[first + k] = even[k] + odd[k];
}

// y = (x - center[c]) factor[c] + shift[c] over block cb, computed in compute_t<T> (float for
// float32) from the double per-channel values.
template <int B, class T>
void block_normalize(const T* x, T* y, const Layout& l, int64_t cb, const double* center, const double* factor,
                     const double* shift) {
  using V = compute_t<T>;
  const int64_t blocks = l.channels / B, first = cb * B;
  V m[B], f[B], sh[B];
  for (int k = 0; k < B; ++k) {
    m[k] = static_cast<V>(center[first + k]);
    f[k] = static_cast<V>(factor[first + k]);
    sh[k] = static_cast<V>(shift[first + k]);
  }
  for (int64_t n = 0; n < l.batch; ++n) {
    const int64_t offset = (n * blocks + cb) * l.size * B;
    const T* __restrict in = x + offset;
    T* __restrict out = y + offset;
    for (int64_t s = 0; s < l.size; ++s) {
#pragma omp simd
      for (int k = 0; k < B; ++k) out[s * B + k] = convert<T>((convert<V>(in[s * B + k]) - m[k]) * f[k] + sh[k]);
    }
  }
}

}  // namespace onnxtrain::ops::batch_norm
