// RoiAlign (ai.onnx versions 10, 16, 22; ONNX operator doc "RoiAlign" and the ONNX reference
// onnx/reference/ops/op_roi_align.py, which follows ONNX Runtime) and its backward op
// RoiAlignGrad (ai.onnxtrain, version 1).
//
// RoiAlign(X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R] int64) -> Y [R, C,
// output_height, output_width]. Per RoI, in X's compute type: start = coord * spatial_scale - o
// with o = 0.5 for coordinate_transformation_mode half_pixel (version 16's default) and 0 for
// output_half_pixel (version 10's only behaviour, which also widens a RoI to at least 1x1);
// each output bin of size roi_size / output_size takes a grid of sampling_ratio (or, when 0,
// ceil(roi_size / output_size)) points per dim at the centers of its sub-cells. A point
// bilinearly interpolates X: points with y < -1, y > H, x < -1 or x > W read 0 with all weights
// 0; others are clamped to >= 0, and a coordinate at or past the last row / column reads that
// row / column. mode avg averages the points' values (divided by the grid size, at least 1);
// mode max takes, as ONNX Runtime does, the maximum over points of the largest of the four
// weighted corners w_i X[p_i].
//
// RoiAlignGrad(dY, X, rois, batch_indices) -> dX (RoiAlign's attributes): avg adds dY w_i /
// count to each corner of each point; max adds dY w to the corner that gave the maximum (the
// first in order on a tie). rois and batch_indices get no gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/registry.h"

namespace onnxtrain::ops {

namespace {

struct RoiAttrs {
  bool max = false;
  int64_t out_h = 1, out_w = 1, sampling_ratio = 0;
  float spatial_scale = 1;
  bool half_pixel = true;
};

RoiAttrs parse_roi_attrs(const KernelInit& init, int version) {
  RoiAttrs a;
  const std::string mode = init.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max") throw Error("attribute 'mode' is '" + mode + "', expected avg or max");
  a.max = mode == "max";
  a.out_h = init.attr_int("output_height", 1);
  a.out_w = init.attr_int("output_width", 1);
  if (a.out_h < 1 || a.out_w < 1) throw Error("attributes 'output_height' and 'output_width' must be >= 1");
  a.sampling_ratio = init.attr_int("sampling_ratio", 0);
  if (a.sampling_ratio < 0) throw Error("attribute 'sampling_ratio' must be >= 0");
  a.spatial_scale = init.attr_float("spatial_scale", 1.0f);
  // Version 10 has no coordinate_transformation_mode and behaves as output_half_pixel.
  const std::string ctm = init.attr_string("coordinate_transformation_mode", version == 10 ? "output_half_pixel" : "half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel") {
    throw Error("attribute 'coordinate_transformation_mode' is '" + ctm + "', expected half_pixel or output_half_pixel");
  }
  a.half_pixel = ctm == "half_pixel";
  return a;
}

// One sampling point: four X offsets within a channel plane and their weights.
struct Point {
  int64_t pos[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

// A RoI's points, bin by bin (out_h * out_w bins of `per_bin` points), and the avg divisor.
struct RoiPlan {
  std::vector<Point> points;
  int64_t per_bin = 0, count = 1;
};

// V: X's compute type, in which ONNX Runtime and the reference compute the geometry.
template <class V>
RoiPlan plan_roi(const RoiAttrs& a, int64_t height, int64_t width, const V* roi) {
  const V offset = a.half_pixel ? V(0.5) : V(0);
  const V scale = static_cast<V>(a.spatial_scale);
  const V start_w = roi[0] * scale - offset, start_h = roi[1] * scale - offset;
  V roi_w = roi[2] * scale - offset - start_w, roi_h = roi[3] * scale - offset - start_h;
  if (!a.half_pixel) roi_w = std::max(roi_w, V(1)), roi_h = std::max(roi_h, V(1));
  const V bin_h = roi_h / static_cast<V>(a.out_h), bin_w = roi_w / static_cast<V>(a.out_w);
  const auto grid = [&](V roi_size, int64_t out) {
    if (a.sampling_ratio > 0) return a.sampling_ratio;
    return std::max<int64_t>(0, static_cast<int64_t>(std::ceil(roi_size / static_cast<V>(out))));
  };
  const int64_t grid_h = grid(roi_h, a.out_h), grid_w = grid(roi_w, a.out_w);
  RoiPlan p;
  p.per_bin = grid_h * grid_w;
  p.count = std::max<int64_t>(p.per_bin, 1);
  p.points.reserve(static_cast<size_t>(a.out_h * a.out_w * p.per_bin));
  const auto H = static_cast<V>(height), W = static_cast<V>(width);
  for (int64_t ph = 0; ph < a.out_h; ++ph) {
    for (int64_t pw = 0; pw < a.out_w; ++pw) {
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const V yy = start_h + static_cast<V>(ph) * bin_h + (static_cast<V>(iy) + V(0.5)) * bin_h / static_cast<V>(grid_h);
        for (int64_t ix = 0; ix < grid_w; ++ix) {
          V x = start_w + static_cast<V>(pw) * bin_w + (static_cast<V>(ix) + V(0.5)) * bin_w / static_cast<V>(grid_w);
          V y = yy;
          Point pt;
          if (!(y >= V(-1) && y <= H && x >= V(-1) && x <= W)) {  // NaN too
            p.points.push_back(pt);
            continue;
          }
          y = std::max(y, V(0)), x = std::max(x, V(0));
          auto y_low = static_cast<int64_t>(y), x_low = static_cast<int64_t>(x);
          int64_t y_high = y_low + 1, x_high = x_low + 1;
          if (y_low >= height - 1) y_high = y_low = height - 1, y = static_cast<V>(y_low);
          if (x_low >= width - 1) x_high = x_low = width - 1, x = static_cast<V>(x_low);
          const V ly = y - static_cast<V>(y_low), lx = x - static_cast<V>(x_low);
          const V hy = V(1) - ly, hx = V(1) - lx;
          pt.pos[0] = y_low * width + x_low, pt.pos[1] = y_low * width + x_high;
          pt.pos[2] = y_high * width + x_low, pt.pos[3] = y_high * width + x_high;
          pt.w[0] = hy * hx, pt.w[1] = hy * lx, pt.w[2] = ly * hx, pt.w[3] = ly * lx;
          p.points.push_back(pt);
        }
      }
    }
  }
  return p;
}

class RoiAlignKernel final : public Kernel {
 public:
  RoiAlignKernel(RoiAttrs a, bool grad) : a_(a), grad_(grad) {}

  void run(KernelContext& ctx) override {
    const int xi = grad_ ? 1 : 0;
    const Tensor& x = ctx.input(xi);
    const Tensor& rois = ctx.input(xi + 1);
    const Tensor& idx = ctx.input(xi + 2);
    if (x.rank() != 4) fail("input " + ctx.input_name(xi) + " has shape " + x.shape().to_string() + ", expected [N, C, H, W]");
    if (rois.rank() != 2 || rois.dim(1) != 4 || rois.dtype() != x.dtype()) {
      fail("rois " + ctx.input_name(xi + 1) + " is " + rois.description() + ", expected " + std::string(dtype_name(x.dtype())) +
           " [num_rois, 4]");
    }
    const int64_t R = rois.dim(0), N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
    if (idx.dtype() != DataType::Int64 || idx.rank() != 1 || idx.dim(0) != R) {
      fail("batch_indices " + ctx.input_name(xi + 2) + " is " + idx.description() + ", expected int64 [" + std::to_string(R) + "]");
    }
    const std::vector<int64_t> batch = idx.to_int64_vector("batch_indices");
    for (int64_t b : batch) {
      if (b < 0 || b >= N) fail("batch_indices " + ctx.input_name(xi + 2) + " holds " + std::to_string(b) + ", outside [0, " + std::to_string(N) + ")");
    }
    const Shape y_shape{R, C, a_.out_h, a_.out_w};
    if (grad_) {
      const Tensor& dy = ctx.input(0);
      if (dy.dtype() != x.dtype() || dy.shape() != y_shape) {
        fail("input " + ctx.input_name(0) + " is " + dy.description() + ", expected " + std::string(dtype_name(x.dtype())) +
             y_shape.to_string() + " (RoiAlign's output)");
      }
    }
    Tensor& out = ctx.allocate_output(0, x.dtype(), grad_ ? x.shape() : y_shape);
    if (R > 0 && (H == 0 || W == 0) && C > 0) fail("input " + ctx.input_name(xi) + " has an empty spatial dim");
    visit_dtype<FloatTypes>(x.dtype(), "RoiAlign input " + ctx.input_name(xi), [&]<class T>() {
      using V = compute_t<T>;
      std::vector<RoiPlan> plans(static_cast<size_t>(R));
      const T* pr = rois.data<T>();
      for (int64_t r = 0; r < R; ++r) {
        const V roi[4] = {static_cast<V>(pr[4 * r]), static_cast<V>(pr[4 * r + 1]), static_cast<V>(pr[4 * r + 2]),
                          static_cast<V>(pr[4 * r + 3])};
        plans[static_cast<size_t>(r)] = plan_roi<V>(a_, H, W, roi);
      }
      if (grad_) return backward<T, V>(ctx.input(0).data<T>(), x, plans, batch, out);
      forward<T, V>(x, plans, batch, out);
    });
  }

 private:
  template <class T, class V>
  void forward(const Tensor& x, const std::vector<RoiPlan>& plans, const std::vector<int64_t>& batch, Tensor& y) {
    const int64_t C = x.dim(1), plane = x.dim(2) * x.dim(3), bins = a_.out_h * a_.out_w;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const auto R = static_cast<int64_t>(plans.size());
    parallel_for(R * C, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 4 * bins)), [&](int64_t begin, int64_t end) {
      for (int64_t rc = begin; rc < end; ++rc) {
        const int64_t r = rc / C, c = rc % C;
        const RoiPlan& p = plans[static_cast<size_t>(r)];
        const T* xc = px + (batch[static_cast<size_t>(r)] * C + c) * plane;
        for (int64_t b = 0; b < bins; ++b) {
          V acc = 0;
          for (int64_t k = 0; k < p.per_bin; ++k) {
            const Point& pt = p.points[static_cast<size_t>(b * p.per_bin + k)];
            if (!a_.max) {
              for (int i = 0; i < 4; ++i) acc += static_cast<V>(pt.w[i]) * static_cast<V>(xc[pt.pos[i]]);
              continue;
            }
            V v = static_cast<V>(pt.w[0]) * static_cast<V>(xc[pt.pos[0]]);
            for (int i = 1; i < 4; ++i) v = std::max(v, static_cast<V>(pt.w[i]) * static_cast<V>(xc[pt.pos[i]]));
            acc = k == 0 ? v : std::max(acc, v);
          }
          py[rc * bins + b] = static_cast<T>(a_.max ? acc : acc / static_cast<V>(p.count));
        }
      }
    });
  }

  template <class T, class V>
  void backward(const T* dy, const Tensor& x, const std::vector<RoiPlan>& plans, const std::vector<int64_t>& batch,
                Tensor& dx) {
    const int64_t C = x.dim(1), plane = x.dim(2) * x.dim(3), bins = a_.out_h * a_.out_w;
    const T* px = x.data<T>();
    std::vector<double> acc(static_cast<size_t>(x.numel()), 0.0);
    parallel_for(C, 1, [&](int64_t begin, int64_t end) {  // each channel's planes are written by one thread
      for (int64_t c = begin; c < end; ++c) {
        for (size_t r = 0; r < plans.size(); ++r) {
          const RoiPlan& p = plans[r];
          const int64_t at = (batch[r] * C + c) * plane;
          const T* xc = px + at;
          double* dc = acc.data() + at;
          for (int64_t b = 0; b < bins; ++b) {
            const double g = convert<double>(dy[(static_cast<int64_t>(r) * C + c) * bins + b]);
            if (!a_.max) {
              for (int64_t k = 0; k < p.per_bin; ++k) {
                const Point& pt = p.points[static_cast<size_t>(b * p.per_bin + k)];
                for (int i = 0; i < 4; ++i) dc[pt.pos[i]] += g * pt.w[i] / static_cast<double>(p.count);
              }
              continue;
            }
            // The first (point, corner) holding the maximum, as the forward's max() keeps.
            V best = 0;
            int64_t best_pos = -1;
            double best_w = 0;
            for (int64_t k = 0; k < p.per_bin; ++k) {
              const Point& pt = p.points[static_cast<size_t>(b * p.per_bin + k)];
              for (int i = 0; i < 4; ++i) {
                const V v = static_cast<V>(pt.w[i]) * static_cast<V>(xc[pt.pos[i]]);
                if (best_pos < 0 || v > best) best = v, best_pos = pt.pos[i], best_w = pt.w[i];
              }
            }
            if (best_pos >= 0) dc[best_pos] += g * best_w;
          }
        }
      }
    });
    T* pdx = dx.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) pdx[i] = convert<T>(acc[i]);
  }

  RoiAttrs a_;
  bool grad_;
};

}  // namespace

std::unique_ptr<Kernel> make_roi_align(const KernelInit& init) {
  const bool grad = init.op_type() == "RoiAlignGrad";
  return std::make_unique<RoiAlignKernel>(parse_roi_attrs(init, grad ? 16 : op_version("", "RoiAlign", init.opset())), grad);
}

}  // namespace onnxtrain::ops
