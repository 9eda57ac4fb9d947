// Resize (ai.onnx opsets 11-19; ONNX operator doc "Resize"): nearest, linear and cubic
// interpolation of X [D0, D1, ...] to the output size given by `sizes`, or floor(in * scale)
// from `scales`. From opset 18 the attribute `axes` names the dims that roi, scales and sizes
// describe (the others keep their size), and keep_aspect_ratio_policy reads `sizes` as a bound:
// stretch (default) takes them as they are; not_larger / not_smaller use one scale for all the
// axes, the smallest / largest of sizes[i] / in[axes[i]], and out = round_half_up(scale in).
// Each output coordinate x maps to the input coordinate of coordinate_transformation_mode
// (scale = out / in when `sizes` is given, the common scale with a keep_aspect_ratio_policy):
//   half_pixel (default)  (x + 0.5) / scale - 0.5
//   half_pixel_symmetric  (opset 19) c (1 - out / (in scale)) + (x + 0.5) / scale - 0.5, c = in / 2
//                         (centres the sampled region when floor() shrinks the output)
//   pytorch_half_pixel    out > 1 ? (x + 0.5) / scale - 0.5 : 0
//   align_corners         out > 1 ? x (in - 1) / (in scale - 1) : 0  (in scale = out for sizes)
//   asymmetric            x / scale
//   tf_half_pixel_for_nn  (x + 0.5) / scale
//   tf_crop_and_resize    out > 1 ? roi_start (in - 1) + x (roi_end - roi_start)(in - 1) / (out - 1)
//                                 : (roi_start + roi_end) (in - 1) / 2; outside [0, in - 1]
//                         the output is extrapolation_value
// nearest: the input element at that coordinate rounded by nearest_mode (round_prefer_floor,
// round_prefer_ceil, floor, ceil); linear: the two neighbours weighted 1 - r, r (r the
// fractional part); cubic: four neighbours with Keys' coefficients for cubic_coeff_a (default
// -0.75). Neighbours outside the input repeat the edge, or with exclude_outside = 1 get weight
// 0 and the others are renormalized. With antialias = 1 (opset 18) and scale < 1, linear and
// cubic stretch their kernel by 1 / scale, so that more inputs contribute to each output: the
// taps are the inputs within 1 / scale (linear) or 2 / scale (cubic) of the coordinate, weighted
// by the kernel at scale * distance and normalized to sum to 1 (the ONNX reference's filter).
// Dims are resized one after the other (the interpolation is separable), computed in double.
// Opset 10's Resize is not implemented.
//
// ResizeGrad(dY, X, roi, scales, sizes) (domain ai.onnxtrain, version 1, Resize's attributes),
// emitted by Resize's gradient rule: dX, shaped like X, is the transpose of the interpolation
// applied to dY: each dY element adds weight * dY to each input element it was interpolated
// from (extrapolated outputs add nothing).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

struct Tap {
  int64_t index;
  double weight;
};

struct ResizeAttrs {
  // Parsed once, when the node is planned; the orders are those of the lists in the factory.
  enum class Mode { Nearest, Linear, Cubic } mode = Mode::Nearest;
  enum class Transform {
    HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric, TfHalfPixelForNn, TfCropAndResize, HalfPixelSymmetric
  };
  Transform transform = Transform::HalfPixel;
  enum class Rounding { RoundPreferFloor, RoundPreferCeil, Floor, Ceil } nearest_mode = Rounding::RoundPreferFloor;
  enum class Policy { Stretch, NotLarger, NotSmaller } policy = Policy::Stretch;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation_value = 0;
  std::optional<std::vector<int64_t>> axes;  // the `axes` attribute (opset 18)
};

// Keys' cubic convolution kernel with coefficient a, at distance d.
double keys(double d, double a) {
  d = std::abs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0;
}

// The antialiasing taps of linear / cubic interpolation at x when downscaling by scale < 1: the
// kernel stretched by 1 / scale, over the inputs base + start ... base + (-start + 1) (base + r
// = x, r in (0, 1]), normalized to sum 1.
void antialias_taps(const ResizeAttrs& a, double x, double scale, std::vector<Tap>& t) {
  const double fl = std::floor(x);
  const double r = x == fl ? 1.0 : x - fl;  // the input on the left of x is the base
  const auto base = static_cast<int64_t>(fl) - (x == fl ? 1 : 0);
  const double support = a.mode == ResizeAttrs::Mode::Linear ? 1.0 : 2.0;
  const auto start = static_cast<int64_t>(std::floor(-support / scale)) + 1;
  double sum = 0;
  for (int64_t k = start; k < 2 - start; ++k) {
    const double d = scale * (static_cast<double>(k) - r);
    const double w = a.mode == ResizeAttrs::Mode::Linear ? std::clamp(1 - std::abs(d), 0.0, 1.0) : keys(d, a.cubic_a);
    t.push_back({base + k, w});
    sum += w;
  }
  for (Tap& tap : t) tap.weight /= sum;
}

// Per output coordinate of one dim: its taps, or none when it extrapolates.
std::vector<std::vector<Tap>> plan_dim(const ResizeAttrs& a, int64_t in, int64_t out, double scale, double roi_start,
                                       double roi_end) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(out));
  const double out_exact = static_cast<double>(in) * scale;
  for (int64_t o = 0; o < out; ++o) {
    const double xo = static_cast<double>(o);
    double x = 0;
    using T = ResizeAttrs::Transform;
    if (a.transform == T::HalfPixel) {
      x = (xo + 0.5) / scale - 0.5;
    } else if (a.transform == T::HalfPixelSymmetric) {
      const double center = static_cast<double>(in) / 2;
      x = center * (1 - static_cast<double>(out) / out_exact) + (xo + 0.5) / scale - 0.5;
    } else if (a.transform == T::PytorchHalfPixel) {
      x = out > 1 ? (xo + 0.5) / scale - 0.5 : 0;
    } else if (a.transform == T::AlignCorners) {  // out as in * scale, before flooring (the reference's)
      x = out > 1 ? xo * static_cast<double>(in - 1) / (static_cast<double>(in) * scale - 1) : 0;
    } else if (a.transform == T::Asymmetric) {
      x = xo / scale;
    } else if (a.transform == T::TfHalfPixelForNn) {
      x = (xo + 0.5) / scale;
    } else {  // tf_crop_and_resize
      x = out > 1 ? roi_start * static_cast<double>(in - 1) +
                        xo * (roi_end - roi_start) * static_cast<double>(in - 1) / static_cast<double>(out - 1)
                  : 0.5 * (roi_start + roi_end) * static_cast<double>(in - 1);
      if (x < 0 || x > static_cast<double>(in - 1)) continue;  // extrapolation_value
    }
    auto& t = taps[static_cast<size_t>(o)];
    const auto clamp = [in](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
    if (a.mode == ResizeAttrs::Mode::Nearest) {
      const double f = std::floor(x);
      const double frac = x - f;
      int64_t i = static_cast<int64_t>(f);
      using R = ResizeAttrs::Rounding;
      if (a.nearest_mode == R::Ceil) {
        i = static_cast<int64_t>(std::ceil(x));
      } else if (a.nearest_mode == R::RoundPreferCeil) {
        i += frac >= 0.5 ? 1 : 0;
      } else if (a.nearest_mode == R::RoundPreferFloor) {
        i += frac > 0.5 ? 1 : 0;
      }  // floor: i as is
      t.push_back({clamp(i), 1.0});
      continue;
    }
    const double f = std::floor(x);
    const double r = x - f;
    const auto base = static_cast<int64_t>(f);
    if (a.antialias && scale < 1) {
      antialias_taps(a, x, scale, t);
    } else if (a.mode == ResizeAttrs::Mode::Linear) {
      t.push_back({base, 1 - r});
      t.push_back({base + 1, r});
    } else {  // cubic, Keys' kernel
      const double A = a.cubic_a;
      const double s = 1 - r;
      t.push_back({base - 1, ((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A});
      t.push_back({base, ((A + 2) * r - (A + 3)) * r * r + 1});
      t.push_back({base + 1, ((A + 2) * s - (A + 3)) * s * s + 1});
      t.push_back({base + 2, ((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A});
    }
    if (a.exclude_outside) {
      double sum = 0;
      for (Tap& tap : t) {
        if (tap.index < 0 || tap.index >= in) tap.weight = 0;
        sum += tap.weight;
      }
      for (Tap& tap : t) tap.weight = sum != 0 ? tap.weight / sum : 0;
    }
    for (Tap& tap : t) tap.index = clamp(tap.index);
  }
  return taps;
}

class ResizeKernel final : public Kernel {
 public:
  // ResizeGrad (ai.onnxtrain, version 1) takes the attributes of the Resize node it
  // differentiates, which the Resize kernel checked against that node's opset.
  ResizeKernel(const KernelInit& init, bool grad) : grad_(grad) {
    const int opset = grad ? 19 : init.opset();
    a_.cubic_a = init.attr_float("cubic_coeff_a", -0.75f);
    a_.exclude_outside = init.attr_int("exclude_outside", 0) != 0;
    a_.extrapolation_value = init.attr_float("extrapolation_value", 0.0f);
    // The index of the attribute's value in `allowed` (its default: the first).
    auto one_of = [&](const std::string& name, std::initializer_list<const char*> allowed) {
      const std::string v = init.attr_string(name, *allowed.begin());
      std::string list;
      int i = 0;
      for (const char* x : allowed) {
        if (v == x) return i;
        list += (list.empty() ? "" : ", ") + std::string(x);
        ++i;
      }
      fail("attribute '" + name + "' is '" + v + "', expected one of " + list + " (opset " + std::to_string(opset) + ")");
    };
    a_.mode = static_cast<ResizeAttrs::Mode>(one_of("mode", {"nearest", "linear", "cubic"}));
    if (opset >= 19) {
      a_.transform = static_cast<ResizeAttrs::Transform>(
          one_of("coordinate_transformation_mode", {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                                    "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"}));
    } else {
      a_.transform = static_cast<ResizeAttrs::Transform>(
          one_of("coordinate_transformation_mode", {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                                    "tf_half_pixel_for_nn", "tf_crop_and_resize"}));
    }
    a_.nearest_mode = static_cast<ResizeAttrs::Rounding>(
        one_of("nearest_mode", {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}));
    if (opset < 18) {
      for (const char* name : {"antialias", "axes", "keep_aspect_ratio_policy"}) {
        if (init.has_attr(name)) {
          fail("attribute '" + std::string(name) + "' needs opset 18 or later (the model imports opset " +
               std::to_string(opset) + ")");
        }
      }
      return;
    }
    a_.antialias = init.attr_int("antialias", 0) != 0;
    if (a_.antialias && a_.mode == ResizeAttrs::Mode::Nearest) fail("attribute 'antialias' applies to linear and cubic modes, not nearest");
    a_.axes = init.optional_ints("axes");
    a_.policy = static_cast<ResizeAttrs::Policy>(one_of("keep_aspect_ratio_policy", {"stretch", "not_larger", "not_smaller"}));
  }

  void run(KernelContext& ctx) override {
    const int shift = grad_ ? 1 : 0;  // ResizeGrad: dY first, then Resize's inputs
    const Tensor& x = ctx.input(shift);
    const size_t rank = x.rank();
    // The dims roi, scales and sizes describe: `axes`, or all.
    std::vector<size_t> axes;
    if (a_.axes) {
      std::vector<bool> seen(rank, false);
      for (int64_t a : *a_.axes) {
        const auto d = static_cast<size_t>(normalize_axis(a, static_cast<int64_t>(rank), "Resize attribute 'axes'"));
        if (seen[d]) fail("attribute 'axes' names axis " + std::to_string(d) + " twice");
        seen[d] = true;
        axes.push_back(d);
      }
    } else {
      for (size_t d = 0; d < rank; ++d) axes.push_back(d);
    }
    const size_t n = axes.size();
    // roi matters to tf_crop_and_resize only (other modes ignore it, as the doc says).
    std::vector<double> roi;
    const bool crop = a_.transform == ResizeAttrs::Transform::TfCropAndResize;
    if (crop && ctx.has_input(1 + shift) && ctx.input(1 + shift).numel() > 0) {
      const std::vector<double> given = ctx.input(1 + shift).to_double_vector();
      if (given.size() != 2 * n) {
        fail("roi " + ctx.input_name(1 + shift) + " must hold 2 x " + std::to_string(n) + " values (start and end of " +
             (a_.axes ? "each of the axes" : "each dim") + "), got " + std::to_string(given.size()));
      }
      roi.assign(rank, 0.0);
      roi.resize(2 * rank, 1.0);
      for (size_t i = 0; i < n; ++i) {
        roi[axes[i]] = given[i];
        roi[axes[i] + rank] = given[i + n];
      }
    }
    if (crop && roi.empty()) {
      fail("tf_crop_and_resize needs the roi input (" + std::to_string(2 * n) + " values)");
    }
    const int si = 2 + shift, zi = 3 + shift;  // scales, sizes
    const bool has_scales = ctx.has_input(si) && ctx.input(si).numel() > 0;
    const bool has_sizes = ctx.has_input(zi) && ctx.input(zi).numel() > 0;
    if (has_scales == has_sizes) fail("exactly one of scales and sizes must be given (non-empty)");
    std::vector<double> scales(rank, 1.0);
    Shape out_shape = x.shape();
    const std::string what = a_.axes ? " values for the " + std::to_string(n) + " axes" : " values for input rank " + std::to_string(rank);
    if (has_scales) {
      const auto s = ctx.input(si).to_double_vector();
      if (s.size() != n) fail("scales " + ctx.input_name(si) + " has " + std::to_string(s.size()) + what);
      for (size_t i = 0; i < n; ++i) {
        const size_t d = axes[i];
        if (!(s[i] > 0)) fail("scales " + ctx.input_name(si) + " must be positive");
        scales[d] = s[i];
        out_shape[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.dim(d)) * s[i]));
      }
    } else {
      const auto s = ctx.input(zi).to_int64_vector("sizes " + ctx.input_name(zi));
      if (s.size() != n) fail("sizes " + ctx.input_name(zi) + " has " + std::to_string(s.size()) + what);
      for (size_t i = 0; i < n; ++i) {
        const size_t d = axes[i];
        if (s[i] < 0) fail("sizes " + ctx.input_name(zi) + " must not be negative");
        out_shape[d] = s[i];
        scales[d] = x.dim(d) > 0 ? static_cast<double>(s[i]) / static_cast<double>(x.dim(d)) : 1.0;
      }
      if (a_.policy != ResizeAttrs::Policy::Stretch && n > 0) {
        // One scale for every axis; the output rounds it half up.
        double common = scales[axes[0]];
        for (size_t d : axes) {
          common = a_.policy == ResizeAttrs::Policy::NotLarger ? std::min(common, scales[d]) : std::max(common, scales[d]);
        }
        for (size_t d : axes) {
          scales[d] = common;
          out_shape[d] = static_cast<int64_t>(std::floor(common * static_cast<double>(x.dim(d)) + 0.5));
        }
      }
    }
    if (grad_) return run_grad(ctx, x, out_shape, scales, roi);
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    if (x.numel() == 0) fail("input " + ctx.input_name(0) + " is empty but the output is not");
    visit_dtype<NumericTypes>(x.dtype(), "Resize input " + ctx.input_name(0), [&]<class T>() {
      // Dim by dim, last first, in double.
      std::vector<double> cur(static_cast<size_t>(x.numel()));
      const T* px = x.data<T>();
      for (size_t i = 0; i < cur.size(); ++i) cur[i] = convert<double>(px[i]);
      Shape shape = x.shape();
      for (size_t d = rank; d-- > 0;) {
        const int64_t in = shape[d], out = out_shape[d];
        if (unchanged(in, out, scales[d])) continue;
        const auto taps = plan_dim(a_, in, out, scales[d], roi.empty() ? 0 : roi[d], roi.empty() ? 1 : roi[d + rank]);
        const int64_t outer = shape.numel(0, d), inner = shape.numel(d + 1, rank);
        std::vector<double> next(static_cast<size_t>(outer * out * inner));
        parallel_for(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, out * inner)), [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) {
            for (int64_t o = 0; o < out; ++o) {
              double* dst = next.data() + (b * out + o) * inner;
              const auto& t = taps[static_cast<size_t>(o)];
              if (t.empty()) {
                std::fill(dst, dst + inner, a_.extrapolation_value);
                continue;
              }
              std::fill(dst, dst + inner, 0.0);
              for (const Tap& tap : t) {
                const double* src = cur.data() + (b * in + tap.index) * inner;
                for (int64_t k = 0; k < inner; ++k) dst[k] += tap.weight * src[k];
              }
            }
          }
        });
        cur.swap(next);
        shape[d] = out;
      }
      T* py = y.data<T>();
      for (size_t i = 0; i < cur.size(); ++i) py[i] = convert<T>(cur[i]);
    });
  }

 private:
  // dX = the transpose of the interpolation applied to dY, dim by dim, first dim first.
  void run_grad(KernelContext& ctx, const Tensor& x, const Shape& out_shape, const std::vector<double>& scales,
                const std::vector<double>& roi) {
    const Tensor& dy = ctx.input(0);
    if (dy.dtype() != x.dtype() || !(dy.shape() == out_shape)) {
      fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + std::string(dtype_name(x.dtype())) +
           out_shape.to_string() + " (Resize's output for " + ctx.input_name(1) + ")");
    }
    const size_t rank = x.rank();
    Tensor& dx = ctx.allocate_output(0, x.dtype(), x.shape());
    if (dx.numel() == 0) return;
    visit_dtype<FloatTypes>(x.dtype(), "ResizeGrad input " + ctx.input_name(0), [&]<class T>() {
      std::vector<double> cur(static_cast<size_t>(dy.numel()));
      const T* pdy = dy.data<T>();
      for (size_t i = 0; i < cur.size(); ++i) cur[i] = convert<double>(pdy[i]);
      Shape shape = out_shape;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t in = x.dim(d), out = out_shape[d];
        if (unchanged(in, out, scales[d])) continue;
        const auto taps = plan_dim(a_, in, out, scales[d], roi.empty() ? 0 : roi[d], roi.empty() ? 1 : roi[d + rank]);
        const int64_t outer = shape.numel(0, d), inner = shape.numel(d + 1, rank);
        std::vector<double> next(static_cast<size_t>(outer * in * inner), 0.0);
        parallel_for(outer, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, out * inner)), [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) {
            for (int64_t o = 0; o < out; ++o) {
              const double* src = cur.data() + (b * out + o) * inner;
              for (const Tap& tap : taps[static_cast<size_t>(o)]) {
                double* dst = next.data() + (b * in + tap.index) * inner;
                for (int64_t k = 0; k < inner; ++k) dst[k] += tap.weight * src[k];
              }
            }
          }
        });
        cur.swap(next);
        shape[d] = in;
      }
      T* pdx = dx.data<T>();
      for (size_t i = 0; i < cur.size(); ++i) pdx[i] = convert<T>(cur[i]);
    });
  }

  // A dim the interpolation maps onto itself (skipped).
  bool unchanged(int64_t in, int64_t out, double scale) const {
    return in == out && scale == 1.0 && a_.transform != ResizeAttrs::Transform::TfCropAndResize;
  }

  ResizeAttrs a_;
  bool grad_;
};

}  // namespace

std::unique_ptr<Kernel> make_resize(const KernelInit& init) { return std::make_unique<ResizeKernel>(init, init.op_type() == "ResizeGrad"); }

}  // namespace onnxtrain::ops
