// MaxPoolGrad and AveragePoolGrad (domain ai.onnxtrain, version 1), emitted by the gradient
// rules of MaxPool and AveragePool.
//
//   MaxPoolGrad(dY, X) -> dX      with MaxPool's attributes
//   AveragePoolGrad(dY, X) -> dX  with AveragePool's attributes
// dY has the shape of the forward output Y [N, C, O...], dX that of X. The attributes are the
// forward node's, and the windows and divisors come from the forward's own plan (pool_plan.h),
// so they match it exactly (ceil_mode, dilations, pads, auto_pad, count_include_pad):
//   MaxPoolGrad: each dY element is added to the X element that was the maximum of its window,
//     the first one in row-major window order when several are equal (PyTorch's rule; with
//     NaNs, the first NaN): the element MaxPool's Indices output names. Padding never wins; a
//     window with no input element passes nothing.
//   AveragePoolGrad: each dY element, divided by the count its forward output was divided by,
//     is added to every X element of its window.
// storage_order does not matter to the gradient. Plain loops, in parallel over N * C;
// float16/bfloat16 accumulate in float.
//
// MaxPoolGrad with attribute activation = "Relu" (made by runtime/fusion.h, never saved) is
// MaxPoolGrad followed by ReluGrad over the same X: X is a Relu's output, and dX is 0 also where
// X > 0 fails (ReluGrad's rule), in the same pass for 2x2 windows.
#include <algorithm>
#include <optional>
#include <vector>

#include "core/dispatch.h"
#include "ops/factories.h"
#include "ops/pool_plan.h"

// The 2x2 loops pass core/simd.h vectors between inline functions; without AVX in the build
// GCC warns that such calls would change the ABI, which no call here crosses.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace onnxtrain::ops {

namespace {

// The X offset of the first maximum in output o's window (row-major window order; the first
// NaN if there is one), or -1 for a window with no input element. Two scans, both free of
// unpredictable branches: the maximum (and whether a NaN occurs), then the first tap equal to it.
template <class T>
int64_t first_argmax(const PoolPlan& p, const T* xc, size_t l, int64_t o) {
  using V = compute_t<T>;
  const Taps& t = p.last_taps()[static_cast<size_t>(o)];
  const int64_t b_begin = p.line_begin[l], b_end = p.line_begin[l + 1];
  if (t.lo == t.hi || b_begin == b_end) return -1;
  const auto tap = [&](int64_t b, int64_t k) {
    return p.row_base[static_cast<size_t>(b)] + o * p.last_stride +
           p.last_shift[static_cast<size_t>(k)];
  };
  V best = static_cast<V>(xc[tap(b_begin, t.lo)]);
  bool nan = false;
  for (int64_t b = b_begin; b < b_end; ++b) {
    for (int64_t k = t.lo; k < t.hi; ++k) {
      const V v = static_cast<V>(xc[tap(b, k)]);
      best = v > best ? v : best;
      nan |= v != v;
    }
  }
  for (int64_t b = b_begin; b < b_end; ++b) {
    for (int64_t k = t.lo; k < t.hi; ++k) {
      const V v = static_cast<V>(xc[tap(b, k)]);
      if (nan ? v != v : v == best) return tap(b, k);
    }
  }
  return -1;  // not reached
}

// max_pool_grad for two spatial dims, one output row at a time. First the window's input rows,
// column by column: each column's first maximum (the first NaN if any) and its row. Then, for
// each tap along the last dim (one pass over the row's outputs whose window holds it), the
// columns' maxima: the first maximum of the window in row-major order is the one with the
// smallest flat index among those equal to the maximum (the smallest row, then column), so a
// tie goes to the smaller index (first_argmax's order and NaN rule). The passes are selects
// over independent outputs, not branches, since which tap wins is unpredictable (the CNN's pool
// gradients: 9.1 -> 4.2 ms per step against the line-table walk below). Taking the rows first
// (instead of a pass per tap and row): ResNet-18's 3x3 stride-2 stem pool 0.79-0.83 -> 0.45 ms
// per training step.
template <class T>
void max_pool_grad_2d(const PoolPlan& p, const T* x, const T* dy, T* dx) {
  using V = compute_t<T>;
  const int64_t in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  const int64_t dh = p.dilations[0];
  parallel_for(p.channels, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, p.in_size)),
               [&](int64_t begin, int64_t end) {
    std::vector<V> acc(std::is_same_v<V, T> ? 0 : static_cast<size_t>(p.in_size));
    std::vector<V> best(static_cast<size_t>(ow_count)), column_max(static_cast<size_t>(in_w));
    std::vector<int32_t> at(static_cast<size_t>(ow_count));  // offsets in one channel (< 2^31, checked)
    std::vector<int32_t> column_row(static_cast<size_t>(in_w));  // the row offset of column_max
    for (int64_t c = begin; c < end; ++c) {
      const T* xc = x + c * p.in_size;
      const T* dyc = dy + c * p.out_size;
      V* out = nullptr;
      if constexpr (std::is_same_v<V, T>) {
        out = dx + c * p.in_size;
      } else {
        out = acc.data();
      }
      std::fill(out, out + p.in_size, V(0));
      for (int64_t oh = 0; oh < oh_count; ++oh) {
        const Taps& th = p.taps[0][static_cast<size_t>(oh)];
        std::fill(at.begin(), at.end(), int32_t{-1});
        if (th.lo == th.hi) continue;  // no input row: nothing flows back
        {
          V* __restrict cm = column_max.data();
          int32_t* __restrict cr = column_row.data();
          const auto first = static_cast<int32_t>((th.start + th.lo * dh) * in_w);
          for (int64_t w = 0; w < in_w; ++w) {
            cm[w] = static_cast<V>(xc[first + w]);
            cr[w] = first;
          }
          for (int64_t kh = th.lo + 1; kh < th.hi; ++kh) {
            const auto row = static_cast<int32_t>((th.start + kh * dh) * in_w);
            const T* __restrict xr = xc + row;
#pragma omp simd
            for (int64_t w = 0; w < in_w; ++w) {
              const V v = static_cast<V>(xr[w]);
              const V m = cm[w];
              const bool take = (v > m) | ((v != v) & (m == m));  // the first maximum, the first NaN
              cm[w] = take ? v : m;
              cr[w] = take ? row : cr[w];
            }
          }
        }
        for (size_t k = 0; k < p.last_shift.size(); ++k) {
          const auto shift = static_cast<int32_t>(p.last_shift[k]);
          const auto stride = static_cast<int32_t>(p.last_stride);
          V* __restrict bs = best.data();
          int32_t* __restrict as = at.data();
          const V* __restrict cm = column_max.data();
          const int32_t* __restrict cr = column_row.data();
#pragma omp simd
          for (int64_t ow = p.last_first[k]; ow < p.last_last[k]; ++ow) {
            const int32_t w = shift + static_cast<int32_t>(ow) * stride;
            const V v = cm[w];
            const int32_t i = cr[w] + w;
            const V b = bs[ow];
            const int32_t a = as[ow];
            // The first candidate; a larger value; an equal one earlier in row-major order; the
            // first NaN in that order.
            const bool take = (a < 0) | (v > b) | ((v == b) & (i < a)) | ((v != v) & ((b == b) | (i < a)));
            bs[ow] = take ? v : b;
            as[ow] = take ? i : a;
          }
        }
        const T* dyl = dyc + oh * ow_count;
        for (int64_t ow = 0; ow < ow_count; ++ow) {
          const int32_t a = at[static_cast<size_t>(ow)];
          if (a >= 0) out[a] += static_cast<V>(dyl[ow]);  // a window with no input passes nothing
        }
      }
      if constexpr (!std::is_same_v<V, T>) {
        T* dxc = dx + c * p.in_size;
        for (int64_t i = 0; i < p.in_size; ++i) dxc[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
      }
    }
  });
}

// max_pool_grad for p.windows_2x2, one output row at a time: the first maximum of the four
// inputs (the order and NaN rule of first_argmax) gets dY, the other three 0, so every dX
// element is written once and none is read; the row and column no window reads get 0. float32
// runs in vectors of 8 or 4 outputs.
template <class T, bool kRelu>
void max_pool_grad_2x2(const PoolPlan& p, const T* x, const T* dy, T* dx) {
  using V = compute_t<T>;
  using namespace pool_detail;
  using namespace simd;
  const int64_t in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  const int64_t rows = p.channels * oh_count;
  // The first NaN, or else the first strict maximum: whether v replaces best.
  const auto beats = [](auto v, auto best) { return (v > best) | ((v != v) & (best == best)); };
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 8 * ow_count)),
               [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t c = r / oh_count, oh = r % oh_count;
      const int64_t offset = c * p.in_size + 2 * oh * in_w;
      const T* x0 = x + offset;
      const T* x1 = x0 + in_w;
      const T* g = dy + r * ow_count;
      T* d0 = dx + offset;
      T* d1 = d0 + in_w;
      bool done = false;
      if constexpr (std::is_same_v<T, float>) {
        if (ow_count >= 4) {
          cover_in_chunks(ow_count, [&]<int W>(int64_t s) {
            const Floats<W> a0 = load<W>(x0 + 2 * s), a1 = load<W>(x0 + 2 * s + W);
            const Floats<W> b0 = load<W>(x1 + 2 * s), b1 = load<W>(x1 + 2 * s + W);
            const Floats<W> v0 = evens<W>(a0, a1), v1 = odds<W>(a0, a1);
            const Floats<W> v2 = evens<W>(b0, b1), v3 = odds<W>(b0, b1);
            const auto t1 = beats(v1, v0);
            const Floats<W> best01 = t1 ? v1 : v0;
            const auto t2 = beats(v2, best01);
            const Floats<W> best012 = t2 ? v2 : best01;
            const auto t3 = beats(v3, best012);
            Floats<W> gv = load<W>(g + s);
            const Floats<W> zero{};
            if constexpr (kRelu) gv = (t3 ? v3 : best012) > zero ? gv : zero;
            const Floats<W> g0 = (t1 | t2 | t3) ? zero : gv, g1 = (t1 & ~(t2 | t3)) ? gv : zero;
            const Floats<W> g2 = (t2 & ~t3) ? gv : zero, g3 = t3 ? gv : zero;
            store<W>(d0 + 2 * s, interleave<W, 0>(g0, g1));
            store<W>(d0 + 2 * s + W, interleave<W, 1>(g0, g1));
            store<W>(d1 + 2 * s, interleave<W, 0>(g2, g3));
            store<W>(d1 + 2 * s + W, interleave<W, 1>(g2, g3));
          });
          done = true;
        }
      }
      if (!done) {
        for (int64_t ow = 0; ow < ow_count; ++ow) {
          const V v0 = static_cast<V>(x0[2 * ow]), v1 = static_cast<V>(x0[2 * ow + 1]);
          const V v2 = static_cast<V>(x1[2 * ow]), v3 = static_cast<V>(x1[2 * ow + 1]);
          const bool t1 = beats(v1, v0);
          const V best01 = t1 ? v1 : v0;
          const bool t2 = beats(v2, best01);
          const V best012 = t2 ? v2 : best01;
          const bool t3 = beats(v3, best012);
          const int at = t3 ? 3 : t2 ? 2 : t1 ? 1 : 0;
          const T zero = T(0);
          const T gv = !kRelu || (t3 ? v3 : best012) > V(0) ? g[ow] : zero;
          d0[2 * ow] = at == 0 ? gv : zero;
          d0[2 * ow + 1] = at == 1 ? gv : zero;
          d1[2 * ow] = at == 2 ? gv : zero;
          d1[2 * ow + 1] = at == 3 ? gv : zero;
        }
      }
      for (int64_t w = 2 * ow_count; w < in_w; ++w) d0[w] = d1[w] = T(0);  // odd width
      if (oh == oh_count - 1) {  // the rows below the last window (odd height)
        std::fill(dx + c * p.in_size + 2 * oh_count * in_w, dx + (c + 1) * p.in_size, T(0));
      }
    }
  });
}

// dx = dy scattered to the first maximum of each window (then 0 where x > 0 fails, with relu).
template <class T>
void max_pool_grad(const PoolPlan& p, int64_t window, bool relu, const T* x, const T* dy, T* dx) {
  if (p.windows_2x2) {
    return relu ? max_pool_grad_2x2<T, true>(p, x, dy, dx) : max_pool_grad_2x2<T, false>(p, x, dy, dx);
  }
  if (relu) {
    max_pool_grad(p, window, false, x, dy, dx);
    parallel_for(p.channels * p.in_size, kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        dx[i] = static_cast<compute_t<T>>(x[i]) > compute_t<T>(0) ? dx[i] : T(0);
      }
    });
    return;
  }
  if (p.rank == 2 && p.in_size < (int64_t{1} << 31)) return max_pool_grad_2d(p, x, dy, dx);
  using V = compute_t<T>;
  const int64_t out_last = p.out.back();
  parallel_for(p.channels, pool_detail::grain_for(p, window), [&](int64_t begin, int64_t end) {
    std::vector<V> acc(static_cast<size_t>(p.in_size));
    for (int64_t c = begin; c < end; ++c) {
      std::fill(acc.begin(), acc.end(), V(0));
      const T* xc = x + c * p.in_size;
      for (size_t l = 0; l + 1 < p.line_begin.size(); ++l) {
        const T* dyl = dy + c * p.out_size + static_cast<int64_t>(l) * out_last;
        for (int64_t o = 0; o < out_last; ++o) {
          const int64_t at = first_argmax(p, xc, l, o);
          if (at >= 0) acc[static_cast<size_t>(at)] += static_cast<V>(dyl[o]);
        }
      }
      T* dxc = dx + c * p.in_size;
      for (int64_t i = 0; i < p.in_size; ++i) dxc[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
    }
  });
}

// dx = dy / count spread over each window, walking the windows as the forward pool does.
template <class T>
void average_pool_grad(const PoolPlan& p, int64_t window, bool count_include_pad, const T* dy,
                       T* dx) {
  using V = compute_t<T>;
  const int64_t out_last = p.out.back();
  parallel_for(p.channels, pool_detail::grain_for(p, window), [&](int64_t begin, int64_t end) {
    std::vector<V> acc(static_cast<size_t>(p.in_size)), share(static_cast<size_t>(out_last));
    for (int64_t c = begin; c < end; ++c) {
      std::fill(acc.begin(), acc.end(), V(0));
      for (size_t l = 0; l + 1 < p.line_begin.size(); ++l) {
        const T* dyl = dy + c * p.out_size + static_cast<int64_t>(l) * out_last;
        for (int64_t o = 0; o < out_last; ++o) {  // a count of 0 has no taps: never read
          share[static_cast<size_t>(o)] =
              static_cast<V>(dyl[o]) /
              static_cast<V>(average_pool_count(p, l, o, count_include_pad));
        }
        for (int64_t b = p.line_begin[l]; b < p.line_begin[l + 1]; ++b) {
          V* row = acc.data() + p.row_base[static_cast<size_t>(b)];
          for (size_t k = 0; k < p.last_shift.size(); ++k) {
            for (int64_t o = p.last_first[k]; o < p.last_last[k]; ++o) {
              row[o * p.last_stride + p.last_shift[k]] += share[static_cast<size_t>(o)];
            }
          }
        }
      }
      T* dxc = dx + c * p.in_size;
      for (int64_t i = 0; i < p.in_size; ++i) dxc[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
    }
  });
}

class PoolGradKernel final : public Kernel {
 public:
  PoolGradKernel(PoolAttrs attrs, bool relu) : a_(std::move(attrs)), relu_(relu) {
    for (int64_t k : a_.kernel) window_ *= k;
  }

  void run(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    if (!plan_ || !(plan_shape_ == x.shape())) {
      plan_ = make_pool_plan(a_, x.shape(), ctx.input_name(1));
      plan_shape_ = x.shape();
    }
    const PoolPlan& p = *plan_;
    Shape y_shape{x.dim(0), x.dim(1)};
    for (int64_t d : p.out) y_shape.push_back(d);
    if (dy.dtype() != x.dtype()) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " +
           std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(1));
    }
    if (!(dy.shape() == y_shape)) {
      fail("input " + ctx.input_name(0) + " has shape " + dy.shape().to_string() + ", expected " +
           y_shape.to_string() + " (the output of " + (a_.is_max ? "MaxPool" : "AveragePool") +
           " for " + ctx.input_name(1) + " " + x.shape().to_string() + ")");
    }
    if (!ctx.has_output(0)) return;
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(1);
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      T* dx = ctx.allocate_output(0, x.dtype(), x.shape()).data<T>();
      if (a_.is_max) {
        max_pool_grad<T>(p, window_, relu_, x.data<T>(), dy.data<T>(), dx);
      } else {
        average_pool_grad<T>(p, window_, a_.count_include_pad, dy.data<T>(), dx);
      }
    });
  }

 private:
  PoolAttrs a_;
  bool relu_ = false;   // MaxPoolGrad with activation = "Relu"
  int64_t window_ = 1;  // kernel elements
  Shape plan_shape_;    // the X shape plan_ was made for
  std::optional<PoolPlan> plan_;
};

}  // namespace

std::unique_ptr<Kernel> make_pool_grad(const KernelInit& init) {
  const bool is_max = init.op_type() == "MaxPoolGrad";
  const std::string activation = init.attr_string("activation", "");
  if (!activation.empty() && (activation != "Relu" || !is_max)) {
    throw Error("attribute 'activation' is '" + activation + "', expected " +
                (is_max ? "Relu or none" : "none (only MaxPoolGrad takes one)"));
  }
  return std::make_unique<PoolGradKernel>(parse_pool_attrs(init, is_max), activation == "Relu");
}

}  // namespace onnxtrain::ops
