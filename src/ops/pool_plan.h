// MaxPool and AveragePool attributes and window geometry, shared by the forward pools (pool.cpp,
// where the functions are defined) and their gradients MaxPoolGrad / AveragePoolGrad
// (pool_grad.cpp), which receive the forward node's attributes verbatim and must see exactly
// the windows and divisors the forward saw. The formulas are in pool.cpp's header.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "core/simd.h"
#include "onnxtrain/shape.h"
#include "ops/kernel.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

struct PoolAttrs {
  bool is_max = true;
  AutoPad auto_pad = AutoPad::NotSet;
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides, dilations, pads;
  bool ceil_mode = false;
  bool count_include_pad = false;
  bool column_major = false;  // storage_order 1
};

// The taps of one window along one dim: input coords start + k * dilation for k in [lo, hi)
// lie inside the input; `padded` taps (k from 0) lie inside the padded input.
struct Taps {
  int64_t start = 0, lo = 0, hi = 0, padded = 0;
};

// Parses and checks the attributes of MaxPool (is_max) or AveragePool, or of their gradient
// ops, which carry the forward node's attributes; throws Error.
PoolAttrs parse_pool_attrs(const KernelInit& init, bool is_max);

// Everything about the windows that does not depend on the channel, made once per input shape.
struct PoolPlan {
  int64_t channels = 0;  // N * C
  size_t rank = 0;
  std::vector<int64_t> in, out;
  int64_t in_size = 1, out_size = 1;
  std::vector<std::vector<Taps>> taps;  // per spatial dim, per output coord along it
  std::vector<int64_t> dilations;       // per spatial dim
  const std::vector<Taps>& last_taps() const { return taps.back(); }  // along the last dim
  int64_t last_column_stride = 1;
  // Along the last dim, kernel tap k of output ol reads input ol * stride + shift[k], inside the
  // input for ol in [first[k], last[k]).
  int64_t last_stride = 1;
  std::vector<int64_t> last_shift, last_first, last_last;
  // Per output line (all coords but the last fixed): the valid window positions over the other
  // dims as row-major and column-major offsets, in [line_begin[l], line_begin[l + 1]), and the
  // product of their `padded` tap counts.
  std::vector<int64_t> line_begin, row_base, column_base, line_padded;
  // Two spatial dims, 2x2 windows at stride 2 with no dilation, each wholly inside the input:
  // output (oh, ow) reads rows 2 oh, 2 oh + 1 and columns 2 ow, 2 ow + 1, nothing else (a last
  // odd row or column is read by no window). The pools and their gradients run dedicated loops.
  bool windows_2x2 = false;
};

// The plan for input X of shape `x` (named `x_name` in errors): output dims and windows.
// Throws Error when X's rank does not fit kernel_shape or a window does not fit.
PoolPlan make_pool_plan(const PoolAttrs& a, const Shape& x, const std::string& x_name);

// A kernel's plan for the last input shape it saw: made again only when the shape changes.
class PoolPlanCache {
 public:
  const PoolPlan& get(const PoolAttrs& a, const Shape& x, const std::string& x_name) {
    if (!plan_ || !(shape_ == x)) {
      plan_ = make_pool_plan(a, x, x_name);
      shape_ = x;
    }
    return *plan_;
  }

 private:
  Shape shape_;
  std::optional<PoolPlan> plan_;
};

// MaxPool without the Indices output: y [N, C, O...] = the maximum of each window of the plain
// x [N, C, D...] (`p` made for x's shape); a NaN in a window gives NaN. Any numeric dtype.
void max_pool_forward(const PoolPlan& p, const Tensor& x, Tensor& y);

// The same from a channels-last float32 x [N, D..., C] (a convolution's output in oneDNN's
// nhwc-style layout; `p` made for the plain shape [N', C, D...] of any batch N', as the windows
// do not depend on it) into the plain y [N, C, O...], or the channels-last y [N, O..., C] when
// `y_channels_last`, then Relu (max(v, 0), NaN kept) when `relu`; N = `images`. MaxPool then
// Relu equals Relu then MaxPool, as both are monotonic and keep NaN, so this also runs Conv ->
// Relu -> MaxPool (runtime/fusion.h).
void max_pool_channels_last(const PoolPlan& p, int64_t images, int64_t channels, bool relu, const float* x, float* y,
                            bool y_channels_last = false);

// For p.windows_2x2 (two spatial dims), float32 x blocked by `block` (8 or 16) channels as
// `images` images [H, W, block]: y = Relu(MaxPool(x)), blocked [images, OH, OW, block] when
// `y_blocked`, else plain [images, block, OH, OW], and the routing mask of its gradient, one bit
// per element of x, mask [images, H, W, block / 8] (bit l of byte k: channel 8 k + l of the block):
// set at each window's first maximum (first_argmax's order and NaN rule) where that maximum is > 0,
// clear elsewhere (the row and column no window reads too). MaxPoolGrad with activation = "Relu"
// over x sends each dY element exactly where the bit is set, so max_pool_grad_2x2_blocked
// (pool_grad.cpp) gives its dX without x. Throws Error for other windows or blocks.
void max_pool_relu_with_mask(const PoolPlan& p, int64_t images, int64_t block, const float* x, float* y, bool y_blocked,
                             uint8_t* mask);

// The divisor of AveragePool for output o of output line l (see PoolPlan): the number of
// window elements inside the input, or inside the padded input with count_include_pad.
inline int64_t average_pool_count(const PoolPlan& p, size_t l, int64_t o, bool count_include_pad) {
  const Taps& t = p.last_taps()[static_cast<size_t>(o)];
  return count_include_pad ? p.line_padded[l] * t.padded
                           : (p.line_begin[l + 1] - p.line_begin[l]) * (t.hi - t.lo);
}

namespace pool_detail {

template <class V>
bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return a > 0 ? (a + b - 1) / b : -(-a / b); }

// The larger of v and m, NaN if either is; m on a tie. Scalars, or float vectors lane by lane.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // vectors of core/simd.h, inline only
template <class V>
inline V max_or_nan(V v, V m) {
  return ((v > m) | (v != v)) ? v : m;
}
#pragma GCC diagnostic pop


inline int64_t grain_for(const PoolPlan& p, int64_t window) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, p.out_size * window));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // vectors of core/simd.h, inline only
// Which of W 2x2 windows' taps v[0..3] (row-major: top left, top right, bottom left, bottom
// right) gets each window's gradient: lane masks, set at each window's first maximum (the order and
// NaN rule of first_argmax) and clear at the other three; with kRelu, clear also where that
// maximum > 0 fails.
template <int W, bool kRelu>
inline void first_max_2x2(const simd::Floats<W> (&v)[4], simd::Masks<W> (&routed)[4]) {
  using simd::Floats;
  const auto beats = [](Floats<W> a, Floats<W> best) { return (a > best) | ((a != a) & (best == best)); };
  const auto t1 = beats(v[1], v[0]);
  const Floats<W> best01 = t1 ? v[1] : v[0];
  const auto t2 = beats(v[2], best01);
  const Floats<W> best012 = t2 ? v[2] : best01;
  const auto t3 = beats(v[3], best012);
  const simd::Masks<W> passes = kRelu ? (t3 ? v[3] : best012) > Floats<W>{} : ~simd::Masks<W>{};
  routed[0] = ~(t1 | t2 | t3) & passes;
  routed[1] = t1 & ~(t2 | t3) & passes;
  routed[2] = t2 & ~t3 & passes;
  routed[3] = t3 & passes;
}

// The gradients of those taps for the windows' output gradients g: g where first_max_2x2 routes
// it, else 0.
template <int W, bool kRelu>
inline void route_2x2(const simd::Floats<W> (&v)[4], simd::Floats<W> g, simd::Floats<W> (&out)[4]) {
  simd::Masks<W> routed[4];
  first_max_2x2<W, kRelu>(v, routed);
  for (int k = 0; k < 4; ++k) out[k] = routed[k] ? g : simd::Floats<W>{};
}
#pragma GCC diagnostic pop

}  // namespace pool_detail

}  // namespace onnxtrain::ops
