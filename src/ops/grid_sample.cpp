// GridSample (ai.onnx versions 16, 20, 22) and AffineGrid (version 20), ONNX operator docs and
// the ONNX reference (onnx/reference/ops/op_grid_sample.py, op_affine_grid.py), with their
// backward ops GridSampleGrad and AffineGridGrad (ai.onnxtrain, version 1).
//
// GridSample(X [N, C, D1..Dr], grid [N, O1..Or, r]) -> Y [N, C, O1..Or]. Version 16 takes only
// r = 2 and names its modes bilinear / nearest / bicubic; version 20 on any r >= 1, linear /
// nearest / cubic. grid[n, o, :] lists normalized coordinates innermost dim first (x for Dr,
// y for Dr-1, ...). For spatial dim d of size D a coordinate g maps to
//   align_corners = 1: x = (g + 1) / 2 (D - 1);   align_corners = 0: x = ((g + 1) D - 1) / 2.
// nearest rounds x half to even first. A coordinate outside [0, D - 1] (align_corners = 1) or
// [-0.5, D - 0.5] (align_corners = 0) becomes, by padding_mode: border: clamped to [0, D - 1];
// reflection: reflected at those bounds until inside; zeros: kept. Then nearest reads index x,
// linear the indices floor(x), floor(x) + 1 with weights 1 - t, t (t = x - floor(x)), cubic
// floor(x) - 1 .. floor(x) + 2 with Keys' weights (a = -0.75); the interpolation is the product
// over dims. An index outside [0, D) reads 0 (zeros), the clamped index (border) or the index
// reflected at the same bounds (reflection). X numeric (integers are interpolated in double and
// converted back), grid float types; computation in double.
//
// GridSampleGrad(dY, X, grid) -> (dX, dgrid), GridSample's attributes: dX adds each output's
// dY times its weights to the elements it read; dgrid is the derivative of the weights in each
// coordinate (chained through the normalization and the padding's clamp (0) or reflection
// (+-1)) against the values read; nearest gives dgrid = 0.
//
// AffineGrid(theta [N, 2, 3] or [N, 3, 4], size = [N, C, H, W] or [N, C, D, H, W] int64) -> grid
// [N, H, W, 2] or [N, D, H, W, 3]: grid[n, ..., :] = theta[n] (x, y[, z], 1) with the base
// coordinate of index i of a dim of length L: align_corners = 1: -1 + 2 i / (L - 1) (0 when
// L = 1, as PyTorch's affine_grid); align_corners = 0: (2 i + 1) / L - 1.
// AffineGridGrad(dgrid, size) -> dtheta: dtheta[n, i, j] = sum over positions of
// dgrid[n, pos, i] base_j(pos) (base_r = 1).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

// ---------------------------------------------------------------------------------------------
// GridSample

enum class Interp { Nearest, Linear, Cubic };
enum class Padding { Zeros, Border, Reflection };

struct GridSampleAttrs {
  Interp mode = Interp::Linear;
  Padding padding = Padding::Zeros;
  bool align_corners = false;
  bool only_2d = false;  // version 16
};

GridSampleAttrs parse_grid_sample(const KernelInit& init, int version) {
  GridSampleAttrs a;
  a.align_corners = init.attr_int("align_corners", 0) != 0;
  // The backward op (version 0 here) takes either version's names.
  const bool v16 = version == 16, any = version == 0;
  const std::string mode = init.attr_string("mode", v16 ? "bilinear" : "linear");
  if (mode == "nearest") {
    a.mode = Interp::Nearest;
  } else if ((mode == "bilinear" && (v16 || any)) || (mode == "linear" && !v16)) {
    a.mode = Interp::Linear;
  } else if ((mode == "bicubic" && (v16 || any)) || (mode == "cubic" && !v16)) {
    a.mode = Interp::Cubic;
  } else {
    throw Error("attribute 'mode' is '" + mode + "', expected " +
                (v16 ? "bilinear, nearest or bicubic (GridSample-16)" : "linear, nearest or cubic"));
  }
  const std::string pad = init.attr_string("padding_mode", "zeros");
  if (pad == "zeros") {
    a.padding = Padding::Zeros;
  } else if (pad == "border") {
    a.padding = Padding::Border;
  } else if (pad == "reflection") {
    a.padding = Padding::Reflection;
  } else {
    throw Error("attribute 'padding_mode' is '" + pad + "', expected zeros, border or reflection");
  }
  a.only_2d = v16;
  return a;
}

// x reflected at lo and hi until inside; *slope gets dx'/dx (+-1). lo == hi gives lo.
double reflect(double x, double lo, double hi, double* slope) {
  const double range = hi - lo;
  *slope = 1;
  if (range <= 0) {
    *slope = 0;
    return lo;
  }
  if (x >= lo && x <= hi) return x;
  const double dx = x < lo ? lo - x : x - hi;
  const double n = std::floor(dx / range);
  const double r = dx - n * range;
  const bool even = std::fmod(n, 2.0) == 0;
  if (x < lo) {
    *slope = even ? -1 : 1;
    return even ? lo + r : hi - r;
  }
  *slope = even ? -1 : 1;
  return even ? hi - r : lo + r;
}

// Keys' cubic weights (a = -0.75) of the taps floor(x) - 1 .. floor(x) + 2 at t = x - floor(x),
// and their derivatives in t.
void cubic_weights(double t, double* w, double* dw) {
  constexpr double A = -0.75;
  const auto outer = [](double u) { return ((A * u - 5 * A) * u + 8 * A) * u - 4 * A; };  // 1 <= u <= 2
  const auto outer_d = [](double u) { return (3 * A * u - 10 * A) * u + 8 * A; };
  const auto inner = [](double u) { return ((A + 2) * u - (A + 3)) * u * u + 1; };  // 0 <= u <= 1
  const auto inner_d = [](double u) { return (3 * (A + 2) * u - 2 * (A + 3)) * u; };
  w[0] = outer(t + 1), dw[0] = outer_d(t + 1);
  w[1] = inner(t), dw[1] = inner_d(t);
  w[2] = inner(1 - t), dw[2] = -inner_d(1 - t);
  w[3] = outer(2 - t), dw[3] = -outer_d(2 - t);
}

// The taps of one coordinate along one dim: index (-1: reads 0), weight, d weight / d g.
struct DimTaps {
  int count = 0;
  int64_t index[4];
  double w[4], dw[4];
};

class Sampler {
 public:
  Sampler(const GridSampleAttrs& a, std::vector<int64_t> dims) : a_(a), dims_(std::move(dims)) {}

  // The taps along dim d (size D) of normalized coordinate g.
  DimTaps taps(size_t d, double g) const {
    const auto D = static_cast<double>(dims_[d]);
    const double lo = a_.align_corners ? 0 : -0.5, hi = a_.align_corners ? D - 1 : D - 0.5;
    double x = a_.align_corners ? (g + 1) / 2 * (D - 1) : ((g + 1) * D - 1) / 2;
    double slope = a_.align_corners ? (D - 1) / 2 : D / 2;  // dx/dg
    if (a_.mode == Interp::Nearest) x = std::nearbyint(x);  // half to even
    if (x < lo || x > hi) {
      if (a_.padding == Padding::Border) {
        x = std::clamp(x, 0.0, D - 1), slope = 0;
      } else if (a_.padding == Padding::Reflection) {
        double s = 1;
        x = reflect(x, lo, hi, &s);
        slope *= s;
      }
    }
    DimTaps t;
    if (!(std::abs(x) < 1e15)) {  // a non-finite or huge coordinate reads 0
      t.count = 1;
      t.index[0] = -1, t.w[0] = 0, t.dw[0] = 0;
      return t;
    }
    if (a_.mode == Interp::Nearest) {
      t.count = 1;
      t.index[0] = pixel(d, static_cast<int64_t>(x)), t.w[0] = 1, t.dw[0] = 0;
      return t;
    }
    const double f = std::floor(x), r = x - f;
    const auto base = static_cast<int64_t>(f);
    if (a_.mode == Interp::Linear) {
      t.count = 2;
      t.index[0] = pixel(d, base), t.w[0] = 1 - r, t.dw[0] = -slope;
      t.index[1] = pixel(d, base + 1), t.w[1] = r, t.dw[1] = slope;
      return t;
    }
    t.count = 4;
    double dw[4];
    cubic_weights(r, t.w, dw);
    for (int k = 0; k < 4; ++k) t.index[k] = pixel(d, base - 1 + k), t.dw[k] = dw[k] * slope;
    return t;
  }

 private:
  // The element index i reads along dim d, or -1 for 0.
  int64_t pixel(size_t d, int64_t i) const {
    const int64_t D = dims_[d];
    if (i >= 0 && i < D) return i;
    if (a_.padding == Padding::Zeros) return -1;
    if (a_.padding == Padding::Border) return std::clamp<int64_t>(i, 0, D - 1);
    const double lo = a_.align_corners ? 0 : -0.5, hi = a_.align_corners ? static_cast<double>(D - 1) : static_cast<double>(D) - 0.5;
    double s = 1;
    return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi, &s)), 0, D - 1);
  }

  GridSampleAttrs a_;
  std::vector<int64_t> dims_;
};

// One sample point: the X offsets it reads with their weights and, with `derivs`, the
// derivative of each weight in each coordinate (r per tap, innermost grid component last).
struct Combos {
  std::vector<int64_t> offset;
  std::vector<double> weight, dweight;
};

// The combos of the point whose normalized coordinates are g[0..r) (g[k] for spatial dim r-1-k),
// built in `c` dim by dim through the scratch `next` (both keep their capacity between calls).
void combine(const Sampler& s, const std::vector<int64_t>& stride, const double* g, bool derivs, Combos& c, Combos& next) {
  const size_t r = stride.size();
  c.offset.assign(1, 0);
  c.weight.assign(1, 1.0);
  c.dweight.assign(derivs ? r : 0, 1.0);
  for (size_t d = 0; d < r; ++d) {
    const DimTaps t = s.taps(d, g[r - 1 - d]);
    next.offset.clear(), next.weight.clear(), next.dweight.clear();
    for (size_t k = 0; k < c.offset.size(); ++k) {
      for (int j = 0; j < t.count; ++j) {
        const bool zero = t.index[j] < 0 || c.offset[k] < 0;
        next.offset.push_back(zero ? -1 : c.offset[k] + t.index[j] * stride[d]);
        next.weight.push_back(c.weight[k] * t.w[j]);
        for (size_t e = 0; derivs && e < r; ++e) {
          // d/d(coordinate of dim e): the derivative factor for e, the weight for the others.
          next.dweight.push_back(c.dweight[k * r + e] * (e == d ? t.dw[j] : t.w[j]));
        }
      }
    }
    std::swap(c, next);
  }
}

struct GridShape {
  int64_t n = 0, c = 0, in_size = 1, out_size = 1;
  std::vector<int64_t> in, stride;  // spatial dims of X and their row-major strides
  Shape y;
};

GridShape grid_shape(const GridSampleAttrs& a, const KernelContext& ctx, int xi, int gi) {
  const Tensor& x = ctx.input(xi);
  const Tensor& grid = ctx.input(gi);
  const size_t r = grid.rank() >= 2 ? grid.rank() - 2 : 0;
  if (x.rank() < 3 || x.rank() > 10 || grid.rank() != x.rank() || grid.dim(0) != x.dim(0) ||
      grid.dim(grid.rank() - 1) != static_cast<int64_t>(r) || (a.only_2d && r != 2)) {
    fail("inputs " + ctx.input_name(xi) + " " + x.shape().to_string() + " and " + ctx.input_name(gi) + " " +
         grid.shape().to_string() + " do not fit: expected X [N, C, D1..Dr] and grid [N, O1..Or, r]" +
         (a.only_2d ? " with r = 2 (GridSample-16)" : " with 1 <= r <= 8"));
  }
  if (!is_floating(grid.dtype())) fail("grid " + ctx.input_name(gi) + " is " + grid.description() + ", expected a float type");
  GridShape s;
  s.n = x.dim(0), s.c = x.dim(1);
  s.y = Shape{s.n, s.c};
  for (size_t d = 0; d < r; ++d) {
    s.in.push_back(x.dim(d + 2));
    s.in_size *= x.dim(d + 2);
    s.y.push_back(grid.dim(d + 1));
    s.out_size *= grid.dim(d + 1);
  }
  s.stride.assign(r, 1);
  for (size_t d = r; d-- > 1;) s.stride[d - 1] = s.stride[d] * s.in[d];
  return s;
}

class GridSampleKernel final : public Kernel {
 public:
  GridSampleKernel(GridSampleAttrs a, bool grad) : a_(a), grad_(grad) {}

  void run(KernelContext& ctx) override {
    const int xi = grad_ ? 1 : 0;
    const GridShape s = grid_shape(a_, ctx, xi, xi + 1);
    const Tensor& x = ctx.input(xi);
    const std::vector<double> grid = ctx.input(xi + 1).to_double_vector();
    const Sampler sampler(a_, s.in);
    if (grad_) return run_grad(ctx, s, sampler, grid);
    Tensor& y = ctx.allocate_output(0, x.dtype(), s.y);
    if (y.numel() == 0) return;
    if (x.numel() == 0) fail("input " + ctx.input_name(0) + " is empty but the output is not");
    const size_t r = s.in.size();
    visit_dtype<NumericTypes>(x.dtype(), "GridSample input " + ctx.input_name(0), [&]<class T>() {
      const T* px = x.data<T>();
      T* py = y.data<T>();
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 8 * s.c));
      parallel_for(s.n * s.out_size, grain, [&](int64_t begin, int64_t end) {
        Combos cb, scratch;
        for (int64_t p = begin; p < end; ++p) {
          const int64_t n = p / s.out_size, o = p % s.out_size;
          combine(sampler, s.stride, grid.data() + p * static_cast<int64_t>(r), false, cb, scratch);
          for (int64_t c = 0; c < s.c; ++c) {
            const T* xc = px + (n * s.c + c) * s.in_size;
            double v = 0;
            for (size_t k = 0; k < cb.offset.size(); ++k) {
              if (cb.offset[k] >= 0) v += cb.weight[k] * convert<double>(xc[cb.offset[k]]);
            }
            py[(n * s.c + c) * s.out_size + o] = convert<T>(v);
          }
        }
      });
    });
  }

 private:
  void run_grad(KernelContext& ctx, const GridShape& s, const Sampler& sampler, const std::vector<double>& grid) {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& g = ctx.input(2);
    if (dy.dtype() != x.dtype() || dy.shape() != s.y) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + std::string(dtype_name(x.dtype())) +
           s.y.to_string() + " (GridSample's output)");
    }
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    Tensor& dgrid = ctx.allocate_output(1, g.dtype(), g.shape());
    const size_t r = s.in.size();
    std::vector<double> dxv(static_cast<size_t>(x.numel()), 0.0), dgv(grid.size(), 0.0);
    visit_dtype<FloatTypes>(x.dtype(), "GridSampleGrad input " + ctx.input_name(1), [&]<class T>() {
      const T* px = x.data<T>();
      const T* pdy = dy.data<T>();
      for (int64_t n = 0; n < s.n; ++n) {
        // Every point's combos of this batch entry, then dX by channel and dgrid by point.
        std::vector<Combos> all(static_cast<size_t>(s.out_size));
        parallel_for(s.out_size, 64, [&](int64_t begin, int64_t end) {
          Combos scratch;
          for (int64_t o = begin; o < end; ++o) {
            combine(sampler, s.stride, grid.data() + (n * s.out_size + o) * static_cast<int64_t>(r), true,
                    all[static_cast<size_t>(o)], scratch);
          }
        });
        parallel_for(s.c, 1, [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c) {
            double* dxc = dxv.data() + (n * s.c + c) * s.in_size;
            const T* dyc = pdy + (n * s.c + c) * s.out_size;
            for (int64_t o = 0; o < s.out_size; ++o) {
              const Combos& cb = all[static_cast<size_t>(o)];
              const double gy = convert<double>(dyc[o]);
              for (size_t k = 0; k < cb.offset.size(); ++k) {
                if (cb.offset[k] >= 0) dxc[cb.offset[k]] += cb.weight[k] * gy;
              }
            }
          }
        });
        parallel_for(s.out_size, 64, [&](int64_t begin, int64_t end) {
          for (int64_t o = begin; o < end; ++o) {
            const Combos& cb = all[static_cast<size_t>(o)];
            double* dg = dgv.data() + (n * s.out_size + o) * static_cast<int64_t>(r);
            for (int64_t c = 0; c < s.c; ++c) {
              const T* xc = px + (n * s.c + c) * s.in_size;
              const double gy = convert<double>(pdy[(n * s.c + c) * s.out_size + o]);
              for (size_t k = 0; k < cb.offset.size(); ++k) {
                if (cb.offset[k] < 0) continue;
                const double v = gy * convert<double>(xc[cb.offset[k]]);
                // dweight is per spatial dim d; grid component r-1-d.
                for (size_t d = 0; d < r; ++d) dg[r - 1 - d] += v * cb.dweight[k * r + d];
              }
            }
          }
        });
      }
      T* pdx = dx.data<T>();
      for (size_t i = 0; i < dxv.size(); ++i) pdx[i] = convert<T>(dxv[i]);
    });
    visit_dtype<FloatTypes>(g.dtype(), "grid " + ctx.input_name(2), [&]<class G>() {
      G* p = dgrid.data<G>();
      for (size_t i = 0; i < dgv.size(); ++i) p[i] = convert<G>(dgv[i]);
    });
  }

  GridSampleAttrs a_;
  bool grad_;
};

// ---------------------------------------------------------------------------------------------
// AffineGrid

// size [N, C, spatial...] with 2 or 3 spatial dims, checked.
std::vector<int64_t> read_affine_size(const KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  std::vector<int64_t> size;
  if (t.dtype() == DataType::Int64 && t.rank() == 1) size = t.to_int64_vector("size");
  if (size.size() != 4 && size.size() != 5) {
    fail("input " + ctx.input_name(i) + " is " + t.description() +
         ", expected int64 [4] (N, C, H, W) or [5] (N, C, D, H, W)");
  }
  for (int64_t d : size) {
    if (d < 0) fail("input " + ctx.input_name(i) + " has a negative size");
  }
  return size;
}

double base_coordinate(int64_t i, int64_t length, bool align_corners) {
  const auto x = static_cast<double>(i), l = static_cast<double>(length);
  if (align_corners) return length > 1 ? -1 + 2 * x / (l - 1) : 0;
  return (2 * x + 1) / l - 1;
}

// Calls f(position, base) for every grid position in row-major order, base = (x, y[, z], 1).
template <class F>
void for_each_base(const std::vector<int64_t>& size, bool align, F&& f) {
  const size_t r = size.size() - 2;  // spatial dims, outermost first
  std::vector<int64_t> idx(r, 0);
  int64_t count = 1;
  for (size_t d = 0; d < r; ++d) count *= size[d + 2];
  double base[4];
  for (int64_t p = 0; p < count; ++p) {
    for (size_t d = 0; d < r; ++d) base[r - 1 - d] = base_coordinate(idx[d], size[d + 2], align);
    base[r] = 1;
    f(p, base);
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < size[d + 2]) break;
      idx[d] = 0;
    }
  }
}

std::unique_ptr<Kernel> make_affine_grid_kernel(bool align, bool grad) {
  return make_kernel([align, grad](KernelContext& ctx) {
    const std::vector<int64_t> size = read_affine_size(ctx, 1);
    const int64_t r = static_cast<int64_t>(size.size()) - 2;
    Shape grid_shape{size[0]};
    for (int64_t d = 0; d < r; ++d) grid_shape.push_back(size[static_cast<size_t>(d) + 2]);
    grid_shape.push_back(r);
    const Shape theta_shape{size[0], r, r + 1};
    const Tensor& in = ctx.input(0);
    const Shape& want = grad ? grid_shape : theta_shape;
    if (in.shape() != want) {
      fail("input " + ctx.input_name(0) + " has shape " + in.shape().to_string() + ", expected " + want.to_string() +
           " for size " + ctx.input_name(1));
    }
    Tensor& out = ctx.allocate_output(0, in.dtype(), grad ? theta_shape : grid_shape);
    const int64_t positions = grid_shape.numel() / std::max<int64_t>(1, size[0] * r);
    visit_dtype<FloatTypes>(in.dtype(), "AffineGrid input " + ctx.input_name(0), [&]<class T>() {
      const T* pin = in.data<T>();
      T* pout = out.data<T>();
      for (int64_t n = 0; n < size[0]; ++n) {
        std::vector<double> theta(static_cast<size_t>(r * (r + 1)), 0.0);
        if (!grad) {
          for (size_t k = 0; k < theta.size(); ++k) theta[k] = convert<double>(pin[n * r * (r + 1) + static_cast<int64_t>(k)]);
        }
        for_each_base(size, align, [&](int64_t p, const double* base) {
          for (int64_t i = 0; i < r; ++i) {
            const int64_t at = (n * positions + p) * r + i;
            if (grad) {
              const double g = convert<double>(pin[at]);
              for (int64_t j = 0; j <= r; ++j) theta[static_cast<size_t>(i * (r + 1) + j)] += g * base[j];
            } else {
              double v = 0;
              for (int64_t j = 0; j <= r; ++j) v += theta[static_cast<size_t>(i * (r + 1) + j)] * base[j];
              pout[at] = convert<T>(v);
            }
          }
        });
        if (grad) {
          for (size_t k = 0; k < theta.size(); ++k) pout[n * r * (r + 1) + static_cast<int64_t>(k)] = convert<T>(theta[k]);
        }
      }
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_grid_sample(const KernelInit& init) {
  const std::string& op = init.op_type();
  const bool align = init.attr_int("align_corners", 0) != 0;
  if (op == "AffineGrid") return make_affine_grid_kernel(align, false);
  if (op == "AffineGridGrad") return make_affine_grid_kernel(align, true);
  const bool grad = op == "GridSampleGrad";
  return std::make_unique<GridSampleKernel>(parse_grid_sample(init, grad ? 0 : op_version("", "GridSample", init.opset())),
                                            grad);
}

}  // namespace onnxtrain::ops
