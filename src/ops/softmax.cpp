// Softmax, LogSoftmax, Hardmax (ai.onnx opset 1+), and the gradients of the first two
// (ai.onnxtrain.SoftmaxGrad, LogSoftmaxGrad: below, before the factories).
//
// Opset 13+: the op runs along `axis` (default -1, in [-r, r-1]): with X seen as
// [outer, n, inner] (n = dims[axis]), each of the outer * inner lines of n elements is
// normalized on its own. Before opset 13 X is coerced to 2-D [prod(dims[:axis]),
// prod(dims[axis:])] (axis default 1) and the op runs along the second dim, i.e. the same with
// n = prod(dims[axis:]) and inner = 1.
//   Softmax:    y = exp(x - max) / sum(exp(x - max))
//   LogSoftmax: y = (x - max) - log(sum(exp(x - max)))
//   Hardmax:    y = 1 at the first maximum of the line (the first NaN, like numpy's argmax,
//               when the line holds one), 0 elsewhere.
// Subtracting the line's maximum keeps exp from overflowing. Float16/BFloat16 are computed in
// float; float lines use a vectorizable exp (exp_nonpositive, relative error < 1e-7), double
// lines std::exp. Lines along the innermost axis are contiguous rows (the fast path); other
// axes work on tiles of up to kTile neighbouring lines at once so the inner loops stay
// contiguous.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

enum class Kind { Softmax, LogSoftmax, Hardmax };

constexpr int64_t kTile = 256;  // lines per task when the axis is not the innermost

template <class V>
bool is_nan(V v) {
  return std::isnan(v);
}

// exp(x) for x <= 0 (x - max always is) or NaN, in float, written so that loops over it
// vectorize: Cody-Waite reduction x = n ln2 + r with |r| <= ln2 / 2 (n rounded by the 1.5 * 2^23
// trick), e^r from the degree-7 Taylor-like minimax polynomial of Cephes' expf, 2^n added to the
// exponent bits; x < -87 (e^x below float's normal range) gives 0 and NaN stays NaN through
// integer masks rather than branches. Relative error < 1e-7.
inline float exp_nonpositive(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float t = x * 1.44269504088896341f + kRound;
  const uint32_t n = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound);
  const float fn = t - kRound;
  const float r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const uint32_t e = std::bit_cast<uint32_t>(y) + (n << 23);
  const uint32_t bits = std::bit_cast<uint32_t>(x), magnitude = bits & 0x7fffffffu;
  const uint32_t nan_mask = 0u - static_cast<uint32_t>(magnitude > 0x7f800000u);
  const uint32_t tiny_mask = 0u - static_cast<uint32_t>(magnitude > 0x42ae0000u);  // |x| > 87, or NaN
  return std::bit_cast<float>((e & ~tiny_mask) | (bits & nan_mask));
}

template <class V>
V exp_shifted(V x) {
  if constexpr (std::is_same_v<V, float>) {
    return exp_nonpositive(x);
  } else {
    return std::exp(x);
  }
}

// One contiguous row of n elements. `work` holds n values of the compute type (it may be y
// itself when T is the compute type).
template <class T, class V = compute_t<T>>
void row_op(Kind kind, const T* x, T* y, V* work, int64_t n) {
  if (kind == Kind::Hardmax) {
    int64_t best = 0;
    V best_v = convert<V>(x[0]);
    for (int64_t i = 1; i < n; ++i) {
      const V v = convert<V>(x[i]);
      if (v > best_v || (is_nan(v) && !is_nan(best_v))) {
        best = i;
        best_v = v;
      }
    }
    for (int64_t i = 0; i < n; ++i) y[i] = convert<T>(0);
    y[best] = convert<T>(1);
    return;
  }
  V m = convert<V>(x[0]);
#pragma omp simd reduction(max : m)
  for (int64_t i = 1; i < n; ++i) {
    const V v = convert<V>(x[i]);
    m = v > m ? v : m;
  }
  V sum = 0;
  if (kind == Kind::Softmax) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      const V e = exp_shifted(convert<V>(x[i]) - m);
      work[i] = e;
      sum += e;
    }
    const V inv = V(1) / sum;
    for (int64_t i = 0; i < n; ++i) y[i] = convert<T>(work[i] * inv);
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += exp_shifted(convert<V>(x[i]) - m);
    const V log_sum = std::log(sum);
    for (int64_t i = 0; i < n; ++i) y[i] = convert<T>((convert<V>(x[i]) - m) - log_sum);
  }
}

// Lines j in [0, w) of one outer block: element k of line j is at k * inner + j.
template <class T, class V = compute_t<T>>
void tile_op(Kind kind, const T* x, T* y, V* work, int64_t n, int64_t inner, int64_t w) {
  V m[kTile], sum[kTile];
  for (int64_t j = 0; j < w; ++j) m[j] = convert<V>(x[j]);
  if (kind == Kind::Hardmax) {
    int64_t best[kTile] = {};
    for (int64_t k = 1; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) {
        const V v = convert<V>(x[k * inner + j]);
        if (v > m[j] || (is_nan(v) && !is_nan(m[j]))) {
          m[j] = v;
          best[j] = k;
        }
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) y[k * inner + j] = convert<T>(0);
    }
    for (int64_t j = 0; j < w; ++j) y[best[j] * inner + j] = convert<T>(1);
    return;
  }
  for (int64_t k = 1; k < n; ++k) {
    for (int64_t j = 0; j < w; ++j) {
      const V v = convert<V>(x[k * inner + j]);
      m[j] = v > m[j] ? v : m[j];
    }
  }
  for (int64_t j = 0; j < w; ++j) sum[j] = 0;
  if (kind == Kind::Softmax) {
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) {
        const V e = exp_shifted(convert<V>(x[k * inner + j]) - m[j]);
        work[k * inner + j] = e;
        sum[j] += e;
      }
    }
    for (int64_t j = 0; j < w; ++j) sum[j] = V(1) / sum[j];
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) y[k * inner + j] = convert<T>(work[k * inner + j] * sum[j]);
    }
  } else {
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) sum[j] += exp_shifted(convert<V>(x[k * inner + j]) - m[j]);
    }
    for (int64_t j = 0; j < w; ++j) sum[j] = std::log(sum[j]);
    for (int64_t k = 0; k < n; ++k) {
      for (int64_t j = 0; j < w; ++j) {
        y[k * inner + j] = convert<T>((convert<V>(x[k * inner + j]) - m[j]) - sum[j]);
      }
    }
  }
}

// The lines of a tensor seen as [outer, n, inner], each n elements along the middle dim, split
// between the threads: with inner == 1 each line is a contiguous row and `row(offset)` gets the
// offset of its first element; otherwise `tile(offset, w)` gets blocks of w <= kTile
// neighbouring lines of one outer block (element k of line j at offset + k * inner + j).
template <class Row, class Tile>
void for_each_line(int64_t outer, int64_t n, int64_t inner, Row row, Tile tile) {
  if (inner == 1) {
    parallel_for(outer, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) row(r * n);
    });
    return;
  }
  const int64_t tiles = (inner + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (n * std::min(inner, kTile)));
  parallel_for(outer * tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / tiles, j0 = (t % tiles) * kTile;
      tile(o * n * inner + j0, std::min(kTile, inner - j0));
    }
  });
}

template <class T>
void run_softmax(Kind kind, const Tensor& input, Tensor& output, int64_t outer, int64_t n, int64_t inner) {
  using V = compute_t<T>;
  const T* x = input.data<T>();
  T* y = output.data<T>();
  // Softmax keeps exp(x - max) until the sum is known: in y itself, or in float for halves.
  std::vector<V> scratch;
  V* work = nullptr;
  if constexpr (std::is_same_v<T, V>) {
    work = y;
  } else {
    if (kind == Kind::Softmax) scratch.resize(static_cast<size_t>(output.numel()));
    work = scratch.data();
  }
  const auto work_at = [&](int64_t offset) { return work + (kind == Kind::Softmax ? offset : 0); };
  for_each_line(
      outer, n, inner, [&](int64_t offset) { row_op<T>(kind, x + offset, y + offset, work_at(offset), n); },
      [&](int64_t offset, int64_t w) { tile_op<T>(kind, x + offset, y + offset, work_at(offset), n, inner, w); });
}

// ---------------------------------------------------------------------------------------------
// ai.onnxtrain.SoftmaxGrad(dY, Y) and ai.onnxtrain.LogSoftmaxGrad(dY, Y), attribute axis
// (default -1): the gradient of Softmax / LogSoftmax along one axis (opset-13 semantics; the
// rules of autodiff/rules_nn.cpp flatten older opsets' inputs to 2-D and pass axis 1), given
// the op's output Y and the gradient dY flowing into it, both of one shape; per line along axis:
//   SoftmaxGrad:    dX = Y (dY - sum(dY Y))
//   LogSoftmaxGrad: dX = dY - exp(Y) sum(dY)
// One pass over the line for the sum and one for dX, instead of the four to five element-wise
// ops (and their intermediate tensors) the formulas take as ONNX ops. Sums in the compute type
// (float for float16 and bfloat16).

// Line sums for one contiguous row of n elements, then its dX.
template <class T, class V = compute_t<T>>
void row_grad(bool log, const T* dy, const T* y, T* dx, int64_t n) {
  V s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += convert<V>(dy[i]);
    for (int64_t i = 0; i < n; ++i) dx[i] = convert<T>(convert<V>(dy[i]) - std::exp(convert<V>(y[i])) * s);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += convert<V>(dy[i]) * convert<V>(y[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = convert<T>(convert<V>(y[i]) * (convert<V>(dy[i]) - s));
  }
}

// Lines j in [0, w) of one outer block, element k of line j at k * inner + j (as tile_op).
template <class T, class V = compute_t<T>>
void tile_grad(bool log, const T* dy, const T* y, T* dx, int64_t n, int64_t inner, int64_t w) {
  V s[kTile] = {};
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t j = 0; j < w; ++j) {
      const int64_t at = k * inner + j;
      s[j] += log ? convert<V>(dy[at]) : convert<V>(dy[at]) * convert<V>(y[at]);
    }
  }
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t j = 0; j < w; ++j) {
      const int64_t at = k * inner + j;
      const V g = convert<V>(dy[at]), v = convert<V>(y[at]);
      dx[at] = convert<T>(log ? g - std::exp(v) * s[j] : v * (g - s[j]));
    }
  }
}

template <class T>
void run_softmax_grad(bool log, const Tensor& dy, const Tensor& y, Tensor& dx, int64_t outer, int64_t n,
                      int64_t inner) {
  const T* g = dy.data<T>();
  const T* v = y.data<T>();
  T* out = dx.data<T>();
  for_each_line(
      outer, n, inner, [&](int64_t offset) { row_grad<T>(log, g + offset, v + offset, out + offset, n); },
      [&](int64_t offset, int64_t w) { tile_grad<T>(log, g + offset, v + offset, out + offset, n, inner, w); });
}

}  // namespace

std::unique_ptr<Kernel> make_softmax_grad(const KernelInit& init) {
  const bool log = init.op_type() == "LogSoftmaxGrad";
  const int64_t axis_attr = init.attr_int("axis", -1);
  return make_kernel([log, axis_attr](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& y = ctx.input(1);
    if (dy.dtype() != y.dtype() || !(dy.shape() == y.shape())) {
      fail("inputs " + ctx.input_name(0) + " " + dy.description() + " and " + ctx.input_name(1) + " " +
           y.description() + " must have one type and shape (the gradient of the output, and the output)");
    }
    const int64_t rank = static_cast<int64_t>(y.rank());
    const size_t axis = static_cast<size_t>(
        normalize_axis(axis_attr, rank, "attribute 'axis' for input " + ctx.input_name(1) + " " + y.description()));
    const Shape& s = y.shape();
    Tensor& dx = ctx.allocate_output(0, y.dtype(), s);
    if (y.numel() == 0) return;
    visit_dtype<FloatTypes>(y.dtype(), "input " + ctx.input_name(1), [&]<class T>() {
      run_softmax_grad<T>(log, dy, y, dx, s.numel(0, axis), s[axis], s.numel(axis + 1, s.size()));
    });
  });
}

std::unique_ptr<Kernel> make_softmax(const KernelInit& init) {
  const Kind kind = init.op_type() == "Softmax"      ? Kind::Softmax
                    : init.op_type() == "LogSoftmax" ? Kind::LogSoftmax
                                                     : Kind::Hardmax;
  const bool coerce_2d = init.opset() < 13;
  const int64_t axis_attr = init.attr_int("axis", coerce_2d ? 1 : -1);
  return make_kernel([kind, coerce_2d, axis_attr](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const size_t axis = static_cast<size_t>(
        normalize_axis(axis_attr, rank, "attribute 'axis' for input " + ctx.input_name(0) + " " + x.description()));
    const Shape& s = x.shape();
    const int64_t outer = s.numel(0, axis);
    const int64_t n = coerce_2d ? s.numel(axis, s.size()) : s[axis];
    const int64_t inner = coerce_2d ? 1 : s.numel(axis + 1, s.size());
    Tensor& y = ctx.allocate_output(0, x.dtype(), s);
    if (x.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "input " + ctx.input_name(0),
                            [&]<class T>() { run_softmax<T>(kind, x, y, outer, n, inner); });
  });
}

}  // namespace onnxtrain::ops
