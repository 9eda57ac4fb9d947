// LpPool, LpNormalization and MeanVarianceNormalization (ONNX operator docs), and LpPool's
// backward op LpPoolGrad.
//
// LpPool (versions 1, 2, 11, 18, 22): X [N, C, D1..Dn] -> Y [N, C, O1..On],
//   Y = (sum of |x|^p over the window's elements inside X)^(1/p)
// (padding adds nothing, as zeros would). The windows are MaxPool's (pool.cpp's plan: kernel_shape,
// strides, pads, auto_pad, and from version 18 dilations and ceil_mode). p is a float attribute in
// version 1 and an int from version 2 (default 2); it must be > 0. Version 1 without
// kernel_shape (allowed by its schema, with no stated meaning) is an error.
//
// LpPoolGrad(dY, X, Y) -> dX (ai.onnxtrain, version 1, LpPool's attributes): each window adds
//   dY |x|^(p-1) sign(x) / Y^(p-1)
// to its elements (nothing where Y = 0, i.e. the window is all zeros, for p > 1).
//
// LpNormalization (versions 1, 22): Y = X / ||X||_p along `axis` (default -1), p in {1, 2}
// (default 2); where the norm is 0, Y is 0.
//
// MeanVarianceNormalization (versions 9, 13): over `axes` (default [0, 2, 3]; negative axes
// count from the end), Y = (X - mean) / (sqrt(mean((X - mean)^2)) + 1e-9), the epsilon of the
// op's function body. Statistics are computed in double.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/pool_plan.h"

namespace onnxtrain::ops {

namespace {

// ---------------------------------------------------------------------------------------------
// LpPool

struct LpWindows {
  PoolPlan plan;
  // Output o's window: the spatial offsets in X of offsets[begin[o], begin[o + 1]).
  std::vector<int64_t> begin, offsets;
};

LpWindows lp_windows(const PoolAttrs& a, const Shape& x, const std::string& name) {
  LpWindows w;
  w.plan = make_pool_plan(a, x, name);
  const PoolPlan& p = w.plan;
  const size_t nd = p.rank;
  std::vector<int64_t> in_stride(nd, 1);
  for (size_t d = nd; d-- > 1;) in_stride[d - 1] = in_stride[d] * p.in[d];
  std::vector<int64_t> o(nd, 0);
  w.begin.push_back(0);
  for (int64_t flat = 0; flat < p.out_size; ++flat) {
    // Every in-input tap combination of this output, as a spatial offset.
    std::vector<int64_t> offs{0};
    for (size_t d = 0; d < nd; ++d) {
      const Taps& t = p.taps[d][static_cast<size_t>(o[d])];
      std::vector<int64_t> next;
      for (int64_t base : offs) {
        for (int64_t k = t.lo; k < t.hi; ++k) next.push_back(base + (t.start + k * p.dilations[d]) * in_stride[d]);
      }
      offs.swap(next);
    }
    w.offsets.insert(w.offsets.end(), offs.begin(), offs.end());
    w.begin.push_back(static_cast<int64_t>(w.offsets.size()));
    for (size_t d = nd; d-- > 0;) {
      if (++o[d] < p.out[d]) break;
      o[d] = 0;
    }
  }
  return w;
}

double read_p(const KernelInit& init) {
  const ir::Attribute* a = init.attr("p");
  double p = 2;
  if (a) p = a->type == ir::AttributeType::Float ? static_cast<double>(init.attr_float("p", 2)) : static_cast<double>(init.attr_int("p", 2));
  if (!(p > 0)) throw Error("attribute 'p' is " + std::to_string(p) + ", expected a value > 0");
  return p;
}

// |v|^p and s^(1/p), with the common p = 1 and 2 exact and fast.
template <class V>
V abs_pow(V v, double p) {
  if (p == 2) return v * v;
  if (p == 1) return std::abs(v);
  return std::pow(std::abs(v), static_cast<V>(p));
}
template <class V>
V root(V s, double p) {
  if (p == 2) return std::sqrt(s);
  if (p == 1) return s;
  return std::pow(s, static_cast<V>(1 / p));
}

class LpPoolKernel final : public Kernel {
 public:
  LpPoolKernel(PoolAttrs a, double p, bool grad) : a_(std::move(a)), p_(p), grad_(grad) {}

  void run(KernelContext& ctx) override {
    const int xi = grad_ ? 1 : 0;
    const Tensor& x = ctx.input(xi);
    if (!windows_ || planned_for_ != x.shape()) {  // the windows of the last input shape are kept
      windows_ = std::make_unique<LpWindows>(lp_windows(a_, x.shape(), ctx.input_name(xi)));
      planned_for_ = x.shape();
    }
    const LpWindows& w = *windows_;
    Shape out{x.dim(0), x.dim(1)};
    for (int64_t d : w.plan.out) out.push_back(d);
    if (grad_) return run_grad(ctx, x, w, out);
    Tensor& y = ctx.allocate_output(0, x.dtype(), out);
    visit_dtype<FloatTypes>(x.dtype(), "LpPool input " + ctx.input_name(0), [&]<class T>() {
      using V = compute_t<T>;
      const T* px = x.data<T>();
      T* py = y.data<T>();
      const PoolPlan& p = w.plan;
      parallel_for(p.channels, pool_detail::grain_for(p, 4), [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const T* xc = px + c * p.in_size;
          for (int64_t o = 0; o < p.out_size; ++o) {
            V s = 0;
            for (int64_t k = w.begin[static_cast<size_t>(o)]; k < w.begin[static_cast<size_t>(o) + 1]; ++k) {
              s += abs_pow(static_cast<V>(xc[w.offsets[static_cast<size_t>(k)]]), p_);
            }
            py[c * p.out_size + o] = static_cast<T>(root(s, p_));
          }
        }
      });
    });
  }

 private:
  void run_grad(KernelContext& ctx, const Tensor& x, const LpWindows& w, const Shape& out) {
    const Tensor& dy = ctx.input(0);
    const Tensor& y = ctx.input(2);
    for (int i : {0, 2}) {
      const Tensor& t = ctx.input(i);
      if (t.dtype() != x.dtype() || t.shape() != out) {
        fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected " + std::string(dtype_name(x.dtype())) +
             out.to_string() + " (LpPool's output for " + ctx.input_name(1) + ")");
      }
    }
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    visit_dtype<FloatTypes>(x.dtype(), "LpPoolGrad input " + ctx.input_name(1), [&]<class T>() {
      using V = compute_t<T>;
      const PoolPlan& p = w.plan;
      const T *px = x.data<T>(), *py = y.data<T>(), *pdy = dy.data<T>();
      T* pdx = dx.data<T>();
      parallel_for(p.channels, pool_detail::grain_for(p, 4), [&](int64_t begin, int64_t end) {
        std::vector<V> acc(static_cast<size_t>(p.in_size));
        for (int64_t c = begin; c < end; ++c) {
          std::fill(acc.begin(), acc.end(), V(0));
          const T* xc = px + c * p.in_size;
          for (int64_t o = 0; o < p.out_size; ++o) {
            const V yo = static_cast<V>(py[c * p.out_size + o]);
            const V g = static_cast<V>(pdy[c * p.out_size + o]);
            if (p_ != 1 && yo == V(0)) continue;
            const V scale = p_ == 1 ? g : p_ == 2 ? g / yo : g / std::pow(yo, static_cast<V>(p_ - 1));
            for (int64_t k = w.begin[static_cast<size_t>(o)]; k < w.begin[static_cast<size_t>(o) + 1]; ++k) {
              const int64_t i = w.offsets[static_cast<size_t>(k)];
              const V v = static_cast<V>(xc[i]);
              const V sign = v > 0 ? V(1) : v < 0 ? V(-1) : V(0);
              const V d = p_ == 1 ? sign : p_ == 2 ? v : sign * std::pow(std::abs(v), static_cast<V>(p_ - 1));
              acc[static_cast<size_t>(i)] += scale * d;
            }
          }
          for (int64_t i = 0; i < p.in_size; ++i) pdx[c * p.in_size + i] = static_cast<T>(acc[static_cast<size_t>(i)]);
        }
      });
    });
  }

  PoolAttrs a_;
  double p_;
  bool grad_;
  std::unique_ptr<LpWindows> windows_;
  Shape planned_for_;
};

// ---------------------------------------------------------------------------------------------
// LpNormalization

// X seen as [outer, axis, inner].
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit split_at(const Shape& s, int64_t axis, const std::string& name) {
  const int64_t r = static_cast<int64_t>(s.size());
  if (axis < -r || axis >= r) {
    fail("attribute 'axis' is " + std::to_string(axis) + ", out of range for input " + name + " of rank " +
         std::to_string(r));
  }
  if (axis < 0) axis += r;
  const auto a = static_cast<size_t>(axis);
  return {s.numel(0, a), s[a], s.numel(a + 1, s.size())};
}

template <class T>
void lp_normalize(const AxisSplit& sp, int64_t p, const T* x, T* y) {
  using V = compute_t<T>;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, sp.n * sp.inner));
  parallel_for(sp.outer, grain, [&](int64_t begin, int64_t end) {
    std::vector<V> norm(static_cast<size_t>(sp.inner));
    for (int64_t o = begin; o < end; ++o) {
      const T* xo = x + o * sp.n * sp.inner;
      T* yo = y + o * sp.n * sp.inner;
      std::fill(norm.begin(), norm.end(), V(0));
      for (int64_t i = 0; i < sp.n; ++i) {
        for (int64_t k = 0; k < sp.inner; ++k) {
          const V v = static_cast<V>(xo[i * sp.inner + k]);
          norm[static_cast<size_t>(k)] += p == 1 ? std::abs(v) : v * v;
        }
      }
      if (p == 2) {
        for (V& v : norm) v = std::sqrt(v);
      }
      for (int64_t i = 0; i < sp.n; ++i) {
        for (int64_t k = 0; k < sp.inner; ++k) {
          const V nk = norm[static_cast<size_t>(k)];
          yo[i * sp.inner + k] = static_cast<T>(nk == V(0) ? V(0) : static_cast<V>(xo[i * sp.inner + k]) / nk);
        }
      }
    }
  });
}

std::unique_ptr<Kernel> make_lp_normalization(const KernelInit& init) {
  const int64_t axis = init.attr_int("axis", -1);
  const int64_t p = init.attr_int("p", 2);
  if (p != 1 && p != 2) throw Error("attribute 'p' is " + std::to_string(p) + ", expected 1 or 2");
  return make_kernel([axis, p](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const AxisSplit sp = split_at(x.shape(), axis, ctx.input_name(0));
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    visit_dtype<FloatTypes>(x.dtype(), "LpNormalization input " + ctx.input_name(0),
                            [&]<class T>() { lp_normalize<T>(sp, p, x.data<T>(), y.data<T>()); });
  });
}

// ---------------------------------------------------------------------------------------------
// MeanVarianceNormalization

// Each element's group (its index over the kept dims) for x's shape: calls f(i, g) for every
// flat index i in order.
template <class F>
void for_each_group(const Shape& shape, const std::vector<bool>& reduced, F&& f) {
  const size_t r = shape.size();
  std::vector<int64_t> gstride(r, 0);
  int64_t running = 1;
  for (size_t d = r; d-- > 0;) {
    if (reduced[d]) continue;
    gstride[d] = running;
    running *= shape[d];
  }
  std::vector<int64_t> idx(r, 0);
  int64_t g = 0;
  const int64_t n = shape.numel();
  for (int64_t i = 0; i < n; ++i) {
    f(i, g);
    for (size_t d = r; d-- > 0;) {
      g += gstride[d];
      if (++idx[d] < shape[d]) break;
      g -= gstride[d] * shape[d];
      idx[d] = 0;
    }
  }
}

std::unique_ptr<Kernel> make_mean_variance_normalization(const KernelInit& init) {
  const std::vector<int64_t> axes = init.attr_ints("axes", {0, 2, 3});
  return make_kernel([axes](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto r = static_cast<int64_t>(x.rank());
    std::vector<bool> reduced(x.rank(), false);
    int64_t groups = 1, count = 1;
    for (int64_t a : axes) {
      if (a < -r || a >= r || reduced[static_cast<size_t>(a < 0 ? a + r : a)]) {
        fail("attribute 'axes' holds " + std::to_string(a) + ", out of range or repeated for input " +
             ctx.input_name(0) + " of rank " + std::to_string(r));
      }
      reduced[static_cast<size_t>(a < 0 ? a + r : a)] = true;
    }
    for (size_t d = 0; d < x.rank(); ++d) (reduced[d] ? count : groups) *= x.dim(d);
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    if (x.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "MeanVarianceNormalization input " + ctx.input_name(0), [&]<class T>() {
      const T* px = x.data<T>();
      T* py = y.data<T>();
      std::vector<double> mean(static_cast<size_t>(groups), 0.0), var(static_cast<size_t>(groups), 0.0);
      for_each_group(x.shape(), reduced, [&](int64_t i, int64_t g) { mean[static_cast<size_t>(g)] += static_cast<double>(static_cast<compute_t<T>>(px[i])); });
      for (double& m : mean) m /= static_cast<double>(count);
      for_each_group(x.shape(), reduced, [&](int64_t i, int64_t g) {
        const double d = static_cast<double>(static_cast<compute_t<T>>(px[i])) - mean[static_cast<size_t>(g)];
        var[static_cast<size_t>(g)] += d * d;
      });
      for (double& v : var) v = std::sqrt(v / static_cast<double>(count)) + 1e-9;
      for_each_group(x.shape(), reduced, [&](int64_t i, int64_t g) {
        const double v = static_cast<double>(static_cast<compute_t<T>>(px[i]));
        py[i] = static_cast<T>(static_cast<compute_t<T>>((v - mean[static_cast<size_t>(g)]) / var[static_cast<size_t>(g)]));
      });
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_lp(const KernelInit& init) {
  const std::string& op = init.op_type();
  if (op == "LpNormalization") return make_lp_normalization(init);
  if (op == "MeanVarianceNormalization") return make_mean_variance_normalization(init);
  // LpPool, LpPoolGrad: MaxPool's window attributes (storage_order and count_include_pad are not
  // LpPool's and stay at their defaults).
  if (!init.has_attr("kernel_shape")) throw Error("required attribute 'kernel_shape' is missing");
  return std::make_unique<LpPoolKernel>(parse_pool_attrs(init, false), read_p(init), op == "LpPoolGrad");
}

}  // namespace onnxtrain::ops
