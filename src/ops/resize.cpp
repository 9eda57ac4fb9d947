// Resize (ai.onnx opsets 11-17; ONNX operator doc "Resize"): nearest, linear and cubic
// interpolation of X [D0, D1, ...] to the output size given by `sizes`, or floor(in * scale)
// from `scales`. Each output coordinate x maps to the input coordinate of
// coordinate_transformation_mode (scale = out / in when `sizes` is given):
//   half_pixel (default)  (x + 0.5) / scale - 0.5
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
// 0 and the others are renormalized. Dims are resized one after the other (the interpolation
// is separable), computed in double. Opset 10's Resize and opset 18's antialias and axes are
// not implemented.
//
// ResizeGrad(dY, X, roi, scales, sizes) (domain ai.onnxtrain, version 1, Resize's attributes),
// emitted by Resize's gradient rule: dX, shaped like X, is the transpose of the interpolation
// applied to dY: each dY element adds weight * dY to each input element it was interpolated
// from (extrapolated outputs add nothing).
#include <algorithm>
#include <cmath>
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
  enum class Transform { HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric, TfHalfPixelForNn, TfCropAndResize };
  Transform transform = Transform::HalfPixel;
  enum class Rounding { RoundPreferFloor, RoundPreferCeil, Floor, Ceil } nearest_mode = Rounding::RoundPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation_value = 0;
};

// Per output coordinate of one dim: its taps, or none when it extrapolates.
std::vector<std::vector<Tap>> plan_dim(const ResizeAttrs& a, int64_t in, int64_t out, double scale, double roi_start,
                                       double roi_end) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const double xo = static_cast<double>(o);
    double x = 0;
    using T = ResizeAttrs::Transform;
    if (a.transform == T::HalfPixel) {
      x = (xo + 0.5) / scale - 0.5;
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
    if (a.mode == ResizeAttrs::Mode::Linear) {
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
  ResizeKernel(const KernelInit& init, bool grad) : grad_(grad) {
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
      fail("attribute '" + name + "' is '" + v + "', expected one of " + list);
    };
    a_.mode = static_cast<ResizeAttrs::Mode>(one_of("mode", {"nearest", "linear", "cubic"}));
    a_.transform = static_cast<ResizeAttrs::Transform>(one_of(
        "coordinate_transformation_mode",
        {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"}));
    a_.nearest_mode = static_cast<ResizeAttrs::Rounding>(
        one_of("nearest_mode", {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}));
  }

  void run(KernelContext& ctx) override {
    const int shift = grad_ ? 1 : 0;  // ResizeGrad: dY first, then Resize's inputs
    const Tensor& x = ctx.input(shift);
    const size_t rank = x.rank();
    std::vector<double> roi;
    if (ctx.has_input(1 + shift) && ctx.input(1 + shift).numel() > 0) roi = ctx.input(1 + shift).to_double_vector();
    if (a_.transform == ResizeAttrs::Transform::TfCropAndResize && roi.size() != 2 * rank) {
      fail("roi " + ctx.input_name(1 + shift) + " must hold 2 x rank = " + std::to_string(2 * rank) +
           " values for tf_crop_and_resize, got " + std::to_string(roi.size()));
    }
    const int si = 2 + shift, zi = 3 + shift;  // scales, sizes
    const bool has_scales = ctx.has_input(si) && ctx.input(si).numel() > 0;
    const bool has_sizes = ctx.has_input(zi) && ctx.input(zi).numel() > 0;
    if (has_scales == has_sizes) fail("exactly one of scales and sizes must be given (non-empty)");
    std::vector<double> scales(rank, 1.0);
    Shape out_shape = x.shape();
    if (has_scales) {
      const auto s = ctx.input(si).to_double_vector();
      if (s.size() != rank) fail("scales " + ctx.input_name(si) + " has " + std::to_string(s.size()) + " values for input rank " + std::to_string(rank));
      for (size_t d = 0; d < rank; ++d) {
        if (!(s[d] > 0)) fail("scales " + ctx.input_name(si) + " must be positive");
        scales[d] = s[d];
        out_shape[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.dim(d)) * s[d]));
      }
    } else {
      const auto s = ctx.input(zi).to_int64_vector("sizes " + ctx.input_name(zi));
      if (s.size() != rank) fail("sizes " + ctx.input_name(zi) + " has " + std::to_string(s.size()) + " values for input rank " + std::to_string(rank));
      for (size_t d = 0; d < rank; ++d) {
        if (s[d] < 0) fail("sizes " + ctx.input_name(zi) + " must not be negative");
        out_shape[d] = s[d];
        scales[d] = x.dim(d) > 0 ? static_cast<double>(s[d]) / static_cast<double>(x.dim(d)) : 1.0;
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
