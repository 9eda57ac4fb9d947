// DeformConv (ai.onnx versions 19, 22; ONNX operator doc "DeformConv", the papers it cites and the
// ONNX reference onnx/reference/ops/op_deform_conv.py) and its backward op DeformConvGrad
// (ai.onnxtrain, version 1).
//
// DeformConv(X [N, C, D1..Dr], W [oC, C / group, k1..kr], offset [N, offset_group * K * r, O1..Or],
// B [oC] optional, mask [N, offset_group * K, O1..Or] optional) -> Y [N, oC, O1..Or], K = k1 * ..
// * kr, O_d = (D_d + pad_begin_d + pad_end_d - (dilation_d (k_d - 1) + 1)) / stride_d + 1.
// Kernel tap k of output o samples X at o_d stride_d - pad_begin_d + k_d dilation_d plus
// offset[n, (g K + k) r + d, o] along dim d, where g = c / (C / offset_group) is the channel's
// offset group; the sample is r-linear interpolation of X with 0 outside it (GridSample with
// align_corners = 1 and zero padding, as the reference computes it), times mask[n, g K + k, o]
// (default 1). Y = W * (those samples) per group of channels, plus B. Computed as an im2col of the
// samples followed by one GEMM per group (rnn::gemm: oneDNN's sgemm for float32, plain loops for
// float64; float16 / bfloat16 through float32).
//
// DeformConvGrad(dY, X, W, offset, mask (optional)) -> (dX, dW, doffset, dB, dmask), DeformConv's
// attributes: dcols = W^T dY and dW = dY cols^T per group; dX scatters dcols mask times the
// interpolation weights; dmask = sum over the group's channels of dcols times the sample;
// doffset = the same of dcols mask times the derivative of the interpolation in each dim; dB =
// dY summed over N and the output positions. Outputs that are not asked for are not computed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/rnn_common.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

namespace {

struct DeformAttrs {
  std::optional<std::vector<int64_t>> strides, dilations, pads, kernel_shape;
  int64_t group = 1, offset_group = 1;
};

struct DeformGeometry {
  int64_t n = 0, c = 0, oc = 0, groups = 1, offset_groups = 1, k = 1, o = 1, in_size = 1;
  std::vector<int64_t> in, kernel, strides, dilations, pads, out;
  size_t rank() const { return in.size(); }
  int64_t corners() const { return int64_t{1} << rank(); }
};

DeformGeometry deform_geometry(const DeformAttrs& a, const KernelContext& ctx, int first) {
  const Tensor& x = ctx.input(first);
  const Tensor& w = ctx.input(first + 1);
  const Tensor& off = ctx.input(first + 2);
  if (x.rank() < 3 || x.rank() > 10 || w.rank() != x.rank() || w.dtype() != x.dtype()) {
    fail("inputs " + ctx.input_name(first) + " " + x.description() + " and " + ctx.input_name(first + 1) + " " + w.description() +
         " do not fit: expected X [N, C, D1..Dr] and W [oC, C / group, k1..kr] of one float type");
  }
  DeformGeometry g;
  const size_t r = x.rank() - 2;
  g.n = x.dim(0), g.c = x.dim(1), g.oc = w.dim(0), g.groups = a.group, g.offset_groups = a.offset_group;
  if (g.c % g.groups != 0 || g.oc % g.groups != 0 || w.dim(1) * g.groups != g.c || g.c % g.offset_groups != 0) {
    fail("input " + ctx.input_name(first + 1) + " has shape " + w.shape().to_string() + ": C = " + std::to_string(g.c) +
         " and oC must be divisible by group " + std::to_string(g.groups) + ", W's dim 1 must be C / group and C divisible by offset_group " +
         std::to_string(g.offset_groups));
  }
  for (size_t d = 0; d < r; ++d) {
    g.in.push_back(x.dim(d + 2));
    g.kernel.push_back(w.dim(d + 2));
    g.in_size *= g.in.back();
    g.k *= g.kernel.back();
  }
  if (a.kernel_shape && *a.kernel_shape != g.kernel) {
    fail("attribute 'kernel_shape' is " + ints_to_string(*a.kernel_shape) + " but W " + ctx.input_name(first + 1) + " has " +
         w.shape().to_string());
  }
  g.strides = spatial_values(a.strides, "strides", r, 1);
  g.dilations = spatial_values(a.dilations, "dilations", r, 1);
  g.pads = spatial_values(a.pads, "pads", r, 0, 2);
  Shape want_offset{g.n, g.offset_groups * g.k * static_cast<int64_t>(r)};
  for (size_t d = 0; d < r; ++d) {
    const int64_t span = g.in[d] + g.pads[d] + g.pads[d + r] - (g.dilations[d] * (g.kernel[d] - 1) + 1);
    if (span < 0) fail("the kernel of " + ctx.input_name(first + 1) + " does not fit in the padded input along spatial dim " + std::to_string(d));
    g.out.push_back(span / g.strides[d] + 1);
    g.o *= g.out.back();
    want_offset.push_back(g.out.back());
  }
  if (off.dtype() != x.dtype() || off.shape() != want_offset) {
    fail("offset " + ctx.input_name(first + 2) + " is " + off.description() + ", expected " + std::string(dtype_name(x.dtype())) +
         want_offset.to_string());
  }
  return g;
}

Shape mask_shape(const DeformGeometry& g) {
  Shape s{g.n, g.offset_groups * g.k};
  for (int64_t d : g.out) s.push_back(d);
  return s;
}

// A tensor's elements in compute type V (no copy when it already is V).
template <class V>
struct Values {
  std::vector<V> copy;
  const V* p = nullptr;
};
template <class T, class V>
Values<V> values_of(const Tensor& t) {
  Values<V> v;
  if constexpr (std::is_same_v<T, V>) {
    v.p = t.data<T>();
  } else {
    v.copy.resize(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.copy.size(); ++i) v.copy[i] = static_cast<V>(t.data<T>()[i]);
    v.p = v.copy.data();
  }
  return v;
}

// Every sample point (offset group, kernel tap, output position) of one batch entry: its 2^r
// corners as offsets into a channel plane (-1: outside, reads 0), weights and, per dim, the
// derivative of each weight in the position.
template <class V>
struct Samples {
  std::vector<int64_t> off;
  std::vector<V> w, dw;
};

template <class V>
Samples<V> sample_points(const DeformGeometry& g, const V* offset, int64_t n, bool derivs) {
  const size_t r = g.rank();
  const int64_t nc = g.corners(), points = g.offset_groups * g.k * g.o;
  Samples<V> s;
  s.off.resize(static_cast<size_t>(points * nc));
  s.w.resize(s.off.size());
  s.dw.resize(derivs ? s.off.size() * r : 0);
  parallel_for(points, 256, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> lo(r);
    std::vector<V> t(r);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t gk = p / g.o, o = p % g.o, k = gk % g.k;
      bool any = false;  // a non-finite or huge position reads 0 everywhere
      int64_t ko = k, oo = o;
      for (size_t d = r; d-- > 0;) {  // unravel k and o, last dim first
        const int64_t kd = ko % g.kernel[d], od = oo % g.out[d];
        ko /= g.kernel[d], oo /= g.out[d];
        const V pos = static_cast<V>(od * g.strides[d] - g.pads[d] + kd * g.dilations[d]) +
                      offset[((n * g.offset_groups * g.k + gk) * static_cast<int64_t>(r) + static_cast<int64_t>(d)) * g.o + o];
        if (!(std::abs(pos) < V(1e15))) {
          any = true, lo[d] = 0, t[d] = 0;
          continue;
        }
        const V f = std::floor(pos);
        lo[d] = static_cast<int64_t>(f);
        t[d] = pos - f;
      }
      for (int64_t j = 0; j < nc; ++j) {
        const size_t at = static_cast<size_t>(p * nc + j);
        int64_t flat = any ? -1 : 0;
        V w = 1;
        for (size_t d = 0; d < r; ++d) {
          const bool up = (j >> (r - 1 - d)) & 1;
          const int64_t i = lo[d] + (up ? 1 : 0);
          if (flat >= 0) flat = i < 0 || i >= g.in[d] ? -1 : flat * g.in[d] + i;
          w *= up ? t[d] : V(1) - t[d];
        }
        s.off[at] = flat;
        s.w[at] = w;
        for (size_t e = 0; derivs && e < r; ++e) {  // d w / d pos_e: the other dims' factors, +-1 for e
          V dw = 1;
          for (size_t d = 0; d < r; ++d) {
            const bool up = (j >> (r - 1 - d)) & 1;
            dw *= d == e ? (up ? V(1) : V(-1)) : (up ? t[d] : V(1) - t[d]);
          }
          s.dw[at * r + e] = dw;
        }
      }
    }
  });
  return s;
}

// cols [C * K, O] of batch entry n: each channel's masked samples.
template <class V>
void im2col(const DeformGeometry& g, const Samples<V>& s, const V* x, const V* mask, int64_t n, V* cols) {
  const int64_t nc = g.corners(), per_group = g.c / g.offset_groups;
  parallel_for(g.c * g.k, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.o * nc)), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t c = row / g.k, k = row % g.k, gk = (c / per_group) * g.k + k;
      const V* xc = x + (n * g.c + c) * g.in_size;
      V* out = cols + row * g.o;
      for (int64_t o = 0; o < g.o; ++o) {
        const size_t base = static_cast<size_t>((gk * g.o + o) * nc);
        V v = 0;
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t at = s.off[base + static_cast<size_t>(j)];
          if (at >= 0) v += s.w[base + static_cast<size_t>(j)] * xc[at];
        }
        out[o] = mask ? v * mask[(n * g.offset_groups * g.k + gk) * g.o + o] : v;
      }
    }
  });
}

template <class V>
void deform_forward(const DeformGeometry& g, const V* x, const V* w, const V* offset, const V* b, const V* mask, V* y) {
  const int64_t cg = g.c / g.groups * g.k, ocg = g.oc / g.groups;
  std::vector<V> cols(static_cast<size_t>(g.c * g.k * g.o));
  for (int64_t n = 0; n < g.n; ++n) {
    const Samples<V> s = sample_points(g, offset, n, false);
    im2col(g, s, x, mask, n, cols.data());
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      V* yg = y + (n * g.oc + grp * ocg) * g.o;
      rnn::gemm<V>(false, false, ocg, g.o, cg, w + grp * ocg * cg, cg, cols.data() + grp * cg * g.o, g.o, yg, g.o, false);
    }
    if (b) {
      for (int64_t m = 0; m < g.oc; ++m) {
        V* ym = y + (n * g.oc + m) * g.o;
        for (int64_t o = 0; o < g.o; ++o) ym[o] += b[m];
      }
    }
  }
}

// Gradients into zero-filled buffers; a null pointer skips that gradient.
struct DeformGrads {
  double *dx = nullptr, *dw = nullptr, *doffset = nullptr, *db = nullptr, *dmask = nullptr;
};

template <class V>
void deform_backward(const DeformGeometry& g, const V* dy, const V* x, const V* w, const V* offset, const V* mask,
                     const DeformGrads& out) {
  const size_t r = g.rank();
  const int64_t cg = g.c / g.groups * g.k, ocg = g.oc / g.groups, nc = g.corners(), per_group = g.c / g.offset_groups;
  std::vector<V> cols(static_cast<size_t>(g.c * g.k * g.o)), dcols(cols.size()), dwg(static_cast<size_t>(ocg * cg));
  for (int64_t n = 0; n < g.n; ++n) {
    const V* dyn = dy + n * g.oc * g.o;
    if (out.db) {
      for (int64_t m = 0; m < g.oc; ++m) {
        for (int64_t o = 0; o < g.o; ++o) out.db[m] += static_cast<double>(dyn[m * g.o + o]);
      }
    }
    const Samples<V> s = sample_points(g, offset, n, true);
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      const V* dyg = dyn + grp * ocg * g.o;
      rnn::gemm<V>(true, false, cg, g.o, ocg, w + grp * ocg * cg, cg, dyg, g.o, dcols.data() + grp * cg * g.o, g.o, false);
    }
    if (out.dw) {
      im2col(g, s, x, mask, n, cols.data());
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        rnn::gemm<V>(false, true, ocg, cg, g.o, dyn + grp * ocg * g.o, g.o, cols.data() + grp * cg * g.o, g.o, dwg.data(), cg, false);
        double* dw = out.dw + grp * ocg * cg;
        for (size_t i = 0; i < dwg.size(); ++i) dw[i] += static_cast<double>(dwg[i]);
      }
    }
    const auto m_at = [&](int64_t gk, int64_t o) { return mask ? mask[(n * g.offset_groups * g.k + gk) * g.o + o] : V(1); };
    if (out.dx) {
      parallel_for(g.c, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          double* dxc = out.dx + (n * g.c + c) * g.in_size;
          for (int64_t k = 0; k < g.k; ++k) {
            const int64_t gk = (c / per_group) * g.k + k;
            for (int64_t o = 0; o < g.o; ++o) {
              const V gv = dcols[static_cast<size_t>((c * g.k + k) * g.o + o)] * m_at(gk, o);
              const size_t base = static_cast<size_t>((gk * g.o + o) * nc);
              for (int64_t j = 0; j < nc; ++j) {
                const int64_t at = s.off[base + static_cast<size_t>(j)];
                if (at >= 0) dxc[at] += static_cast<double>(gv * s.w[base + static_cast<size_t>(j)]);
              }
            }
          }
        }
      });
    }
    if (!out.doffset && !out.dmask) continue;
    parallel_for(g.offset_groups * g.k * g.o, 64, [&](int64_t begin, int64_t end) {
      std::vector<double> dpos(r);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t gk = p / g.o, o = p % g.o, grp = gk / g.k, k = gk % g.k;
        const size_t base = static_cast<size_t>(p * nc);
        double dm = 0;
        std::fill(dpos.begin(), dpos.end(), 0.0);
        for (int64_t c = grp * per_group; c < (grp + 1) * per_group; ++c) {
          const V* xc = x + (n * g.c + c) * g.in_size;
          const double d = static_cast<double>(dcols[static_cast<size_t>((c * g.k + k) * g.o + o)]);
          for (int64_t j = 0; j < nc; ++j) {
            const int64_t at = s.off[base + static_cast<size_t>(j)];
            if (at < 0) continue;
            const double v = static_cast<double>(xc[at]);
            dm += d * static_cast<double>(s.w[base + static_cast<size_t>(j)]) * v;
            for (size_t e = 0; e < r; ++e) dpos[e] += d * v * static_cast<double>(s.dw[(base + static_cast<size_t>(j)) * r + e]);
          }
        }
        if (out.dmask) out.dmask[(n * g.offset_groups * g.k + gk) * g.o + o] = dm;
        if (out.doffset) {
          const double m = static_cast<double>(m_at(gk, o));
          for (size_t e = 0; e < r; ++e) {
            out.doffset[((n * g.offset_groups * g.k + gk) * static_cast<int64_t>(r) + static_cast<int64_t>(e)) * g.o + o] = m * dpos[e];
          }
        }
      }
    });
  }
}

class DeformConvKernel final : public Kernel {
 public:
  DeformConvKernel(DeformAttrs a, bool grad) : a_(std::move(a)), grad_(grad) {}

  void run(KernelContext& ctx) override {
    const int f = grad_ ? 1 : 0;  // DeformConvGrad: dY first
    const DeformGeometry g = deform_geometry(a_, ctx, f);
    const Tensor& x = ctx.input(f);
    const int mask_input = 4;  // DeformConv's and DeformConvGrad's
    const Tensor* mask = ctx.has_input(mask_input) ? &ctx.input(mask_input) : nullptr;
    if (mask && (mask->dtype() != x.dtype() || mask->shape() != mask_shape(g))) {
      fail("mask " + ctx.input_name(mask_input) + " is " + mask->description() + ", expected " + std::string(dtype_name(x.dtype())) +
           mask_shape(g).to_string());
    }
    Shape y_shape{g.n, g.oc};
    for (int64_t d : g.out) y_shape.push_back(d);
    if (grad_) return run_grad(ctx, g, mask, y_shape);
    const Tensor* b = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    if (b && (b->dtype() != x.dtype() || b->shape() != Shape{g.oc})) {
      fail("bias " + ctx.input_name(3) + " is " + b->description() + ", expected " + std::string(dtype_name(x.dtype())) + " [" +
           std::to_string(g.oc) + "]");
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), y_shape);
    if (y.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "DeformConv input " + ctx.input_name(0), [&]<class T>() {
      using V = compute_t<T>;
      const auto xv = values_of<T, V>(x), wv = values_of<T, V>(ctx.input(1)), ov = values_of<T, V>(ctx.input(2));
      Values<V> bv, mv;
      if (b) bv = values_of<T, V>(*b);
      if (mask) mv = values_of<T, V>(*mask);
      if constexpr (std::is_same_v<T, V>) {
        deform_forward<V>(g, xv.p, wv.p, ov.p, bv.p, mv.p, y.data<T>());
      } else {
        std::vector<V> out(static_cast<size_t>(y.numel()));
        deform_forward<V>(g, xv.p, wv.p, ov.p, bv.p, mv.p, out.data());
        for (size_t i = 0; i < out.size(); ++i) y.data<T>()[i] = static_cast<T>(out[i]);
      }
    });
  }

 private:
  void run_grad(KernelContext& ctx, const DeformGeometry& g, const Tensor* mask, const Shape& y_shape) {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    if (dy.dtype() != x.dtype() || dy.shape() != y_shape) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + std::string(dtype_name(x.dtype())) +
           y_shape.to_string() + " (DeformConv's output)");
    }
    // Buffers in double for the gradients asked for; bias and mask ones only when they exist.
    const Shape shapes[5] = {x.shape(), ctx.input(2).shape(), ctx.input(3).shape(), Shape{g.oc}, mask_shape(g)};
    std::vector<double> buf[5];
    double* ptr[5] = {};
    for (int i = 0; i < 5; ++i) {
      if (!ctx.has_output(i) || (i == 4 && !mask)) continue;
      buf[i].assign(static_cast<size_t>(shapes[i].numel()), 0.0);
      ptr[i] = buf[i].data();
    }
    visit_dtype<FloatTypes>(x.dtype(), "DeformConvGrad input " + ctx.input_name(1), [&]<class T>() {
      using V = compute_t<T>;
      const auto dyv = values_of<T, V>(dy), xv = values_of<T, V>(x), wv = values_of<T, V>(ctx.input(2)),
                 ov = values_of<T, V>(ctx.input(3));
      Values<V> mv;
      if (mask) mv = values_of<T, V>(*mask);
      deform_backward<V>(g, dyv.p, xv.p, wv.p, ov.p, mv.p, {ptr[0], ptr[1], ptr[2], ptr[3], ptr[4]});
      for (int i = 0; i < 5; ++i) {
        if (!ctx.has_output(i)) continue;
        Tensor& t = ctx.allocate_output(i, x.dtype(), shapes[i]);
        T* p = t.data<T>();
        for (int64_t j = 0; j < t.numel(); ++j) p[j] = ptr[i] ? static_cast<T>(static_cast<V>(buf[i][static_cast<size_t>(j)])) : static_cast<T>(V(0));
      }
    });
  }

  DeformAttrs a_;
  bool grad_;
};

}  // namespace

std::unique_ptr<Kernel> make_deform_conv(const KernelInit& init) {
  DeformAttrs a;
  a.strides = ints_at_least(init, "strides", 1);
  a.dilations = ints_at_least(init, "dilations", 1);
  a.pads = ints_at_least(init, "pads", 0);
  a.kernel_shape = ints_at_least(init, "kernel_shape", 1);
  a.group = init.attr_int("group", 1);
  a.offset_group = init.attr_int("offset_group", 1);
  if (a.group < 1 || a.offset_group < 1) throw Error("attributes 'group' and 'offset_group' must be >= 1");
  return std::make_unique<DeformConvKernel>(std::move(a), init.op_type() == "DeformConvGrad");
}

}  // namespace onnxtrain::ops
