// Col2Im (ai.onnx version 18), CenterCropPad (18) and Upsample (7, 9), ONNX operator docs and the
// ONNX reference (onnx/reference/ops/op_col2im.py, op_center_crop_pad.py), with Col2Im's
// backward op Col2ImGrad (ai.onnxtrain, version 1).
//
// Col2Im(input [N, C * prod(block_shape), L], image_shape [r], block_shape [r]) -> [N, C,
// image_shape...], attributes dilations, strides (default 1) and pads (default 0, [begin..., end...]),
// as PyTorch's fold: with B_d = (image_d + pad_begin_d + pad_end_d - (dilation_d (block_d - 1) + 1))
// / stride_d + 1 blocks along dim d (L must be their product), column (c, k) of block l adds to
// image position l_d stride_d - pad_begin_d + k_d dilation_d (skipped when outside the image);
// blocks and kernel offsets are enumerated row-major. Numeric types, summed in compute_t<T> (integers
// in double).
// Col2ImGrad(dY [N, C, image...], image_shape, block_shape) -> [N, C * prod(block_shape), L]:
// the unfold (im2col) of dY with the same geometry, 0 where a column falls outside the image.
//
// CenterCropPad(input_data, shape (int32/int64 [len(axes)]), attribute axes (default all, negative
// counts from the end)) -> output_data: each listed axis becomes shape[i] long, centered: a
// crop starts at floor((dim - shape) / 2), a pad puts floor((shape - dim) / 2) zeros before and
// the rest after. Any element type.
//
// Upsample-7 (scales attribute) and Upsample-9 (scales input, float): output dims floor(dim *
// scale), scales >= 1 (the op doc). As ONNX Runtime and the Upsample -> Resize conversion read
// it, output index o maps to x = o / scale; nearest reads index floor(x); linear (N-linear over
// every dim) weighs floor(x) and floor(x) + 1 by 1 - t and t (t = x - floor(x)), an index past
// the end reading the last element. nearest takes any element type, linear numeric ones
// (computed in double). Upsample-10 is deprecated (its schema says so; ONNX's checker rejects
// it): models of opset 10 and later use Resize, so no row serves it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/factories.h"
#include "ops/registry.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

namespace {

// ---------------------------------------------------------------------------------------------
// Col2Im

struct Col2ImGeometry {
  std::vector<int64_t> image, block, strides, dilations, pads, blocks;
  int64_t kernel = 1, length = 1, image_size = 1;
};

Col2ImGeometry col2im_geometry(const KernelContext& ctx, int first, const std::optional<std::vector<int64_t>>& strides,
                               const std::optional<std::vector<int64_t>>& dilations,
                               const std::optional<std::vector<int64_t>>& pads) {
  Col2ImGeometry g;
  for (int i : {first, first + 1}) {
    const Tensor& t = ctx.input(i);
    if (t.dtype() != DataType::Int64 || t.rank() != 1 || t.dim(0) < 1) {
      fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected a non-empty 1-D int64 tensor");
    }
  }
  g.image = ctx.input(first).to_int64_vector("image_shape");
  g.block = ctx.input(first + 1).to_int64_vector("block_shape");
  const size_t r = g.image.size();
  if (g.block.size() != r) {
    fail("block_shape " + ctx.input_name(first + 1) + " has " + std::to_string(g.block.size()) + " values for the " +
         std::to_string(r) + " dims of image_shape " + ctx.input_name(first));
  }
  g.strides = spatial_values(strides, "strides", r, 1);
  g.dilations = spatial_values(dilations, "dilations", r, 1);
  g.pads = spatial_values(pads, "pads", r, 0, 2);
  for (size_t d = 0; d < r; ++d) {
    if (g.image[d] < 0 || g.block[d] < 1) fail("image_shape must be >= 0 and block_shape >= 1");
    const int64_t span = g.image[d] + g.pads[d] + g.pads[d + r] - (g.dilations[d] * (g.block[d] - 1) + 1);
    if (span < 0) {
      fail("a block of block_shape " + ctx.input_name(first + 1) + " does not fit in the padded image along dim " + std::to_string(d));
    }
    g.blocks.push_back(span / g.strides[d] + 1);
    g.kernel *= g.block[d];
    g.length *= g.blocks.back();
    g.image_size *= g.image[d];
  }
  return g;
}

// The columns as runs along the last dim: run i covers columns first[i] + j for j in
// [0, count[i]), which meet image offsets image[i] + j * stride_last (all inside the image).
struct ColumnRuns {
  std::vector<int64_t> first, image, count;
  int64_t stride = 1;
};

ColumnRuns column_runs(const Col2ImGeometry& g) {
  const size_t r = g.image.size(), last = r - 1;
  const int64_t blocks_last = g.blocks[last], rows = g.kernel * g.length / blocks_last;
  ColumnRuns runs;
  runs.stride = g.strides[last];
  for (int64_t row = 0; row < rows; ++row) {
    // row = kernel offset kf, then the block index over all dims but the last.
    const int64_t kf = row / (g.length / blocks_last);
    int64_t lrest = row % (g.length / blocks_last), krest = kf, offset = 0, scale = g.image[last];
    const int64_t k_last = krest % g.block[last];
    krest /= g.block[last];
    for (size_t i = 1; i < r && offset >= 0; ++i) {  // the dims before the last, innermost first
      const size_t d = last - i;
      const int64_t k = krest % g.block[d], l = lrest % g.blocks[d];
      krest /= g.block[d], lrest /= g.blocks[d];
      const int64_t p = l * g.strides[d] - g.pads[d] + k * g.dilations[d];
      offset = p < 0 || p >= g.image[d] ? -1 : offset + p * scale;
      scale *= g.image[d];
    }
    if (offset < 0) continue;
    // Along the last dim, block j meets p = j * stride + shift: inside for p in [0, image).
    const int64_t shift = k_last * g.dilations[last] - g.pads[last];
    int64_t lo = 0, hi = blocks_last;
    while (lo < hi && lo * runs.stride + shift < 0) ++lo;
    while (hi > lo && (hi - 1) * runs.stride + shift >= g.image[last]) --hi;
    if (lo == hi) continue;
    runs.first.push_back(kf * g.length + (row % (g.length / blocks_last)) * blocks_last + lo);
    runs.image.push_back(offset + shift + lo * runs.stride);
    runs.count.push_back(hi - lo);
  }
  return runs;
}

std::unique_ptr<Kernel> make_col2im_kernel(const KernelInit& init, bool grad) {
  auto strides = ints_at_least(init, "strides", 1);
  auto dilations = ints_at_least(init, "dilations", 1);
  auto pads = ints_at_least(init, "pads", 0);
  return make_kernel([=](KernelContext& ctx) {
    const Tensor& in = ctx.input(0);
    const Col2ImGeometry g = col2im_geometry(ctx, 1, strides, dilations, pads);
    Shape out;
    int64_t channels = 0;
    if (!grad) {
      if (in.rank() != 3 || in.dim(1) % g.kernel != 0 || in.dim(2) != g.length) {
        fail("input " + ctx.input_name(0) + " has shape " + in.shape().to_string() + ", expected [N, C * " +
             std::to_string(g.kernel) + ", " + std::to_string(g.length) + "] (the product of block_shape, the number of blocks)");
      }
      channels = in.dim(1) / g.kernel;
      out = Shape{in.dim(0), channels};
      for (int64_t d : g.image) out.push_back(d);
    } else {
      bool ok = in.rank() == g.image.size() + 2;
      for (size_t d = 0; ok && d < g.image.size(); ++d) ok = in.dim(d + 2) == g.image[d];
      if (!ok) fail("input " + ctx.input_name(0) + " has shape " + in.shape().to_string() + ", expected [N, C, image_shape...]");
      channels = in.dim(1);
      out = Shape{in.dim(0), channels * g.kernel, g.length};
    }
    Tensor& y = ctx.allocate_output(0, in.dtype(), out);
    const int64_t planes = in.dim(0) * channels;
    const int64_t col_size = g.kernel * g.length;
    const ColumnRuns runs = column_runs(g);
    visit_dtype<NumericTypes>(in.dtype(), "Col2Im input " + ctx.input_name(0), [&]<class T>() {
      const T* src = in.data<T>();
      T* dst = y.data<T>();
      parallel_for(planes, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, col_size)), [&](int64_t begin, int64_t end) {
        using Acc = std::conditional_t<is_float_v<T>, compute_t<T>, double>;  // integers: exact in double
        std::vector<Acc> acc(static_cast<size_t>(g.image_size));
        for (int64_t p = begin; p < end; ++p) {
          if (grad) {
            const T* image = src + p * g.image_size;
            T* cols = dst + p * col_size;
            std::fill(cols, cols + col_size, convert<T>(0.0));
            for (size_t i = 0; i < runs.first.size(); ++i) {
              T* c = cols + runs.first[i];
              const T* im = image + runs.image[i];
              for (int64_t j = 0; j < runs.count[i]; ++j) c[j] = im[j * runs.stride];
            }
            continue;
          }
          std::fill(acc.begin(), acc.end(), Acc(0));
          const T* cols = src + p * col_size;
          for (size_t i = 0; i < runs.first.size(); ++i) {
            const T* c = cols + runs.first[i];
            Acc* im = acc.data() + runs.image[i];
            for (int64_t j = 0; j < runs.count[i]; ++j) im[j * runs.stride] += convert<Acc>(c[j]);
          }
          for (int64_t i = 0; i < g.image_size; ++i) dst[p * g.image_size + i] = convert<T>(acc[static_cast<size_t>(i)]);
        }
      });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// CenterCropPad and the nearest Upsample: byte copies of whole elements

// Copies elements of `size` bytes: dst[i] = src[index[i]] over a row.
void copy_elements(const char* src, char* dst, const int64_t* index, int64_t n, size_t size) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + static_cast<size_t>(i) * size, src + static_cast<size_t>(index[i]) * size, size);
}

std::unique_ptr<Kernel> make_center_crop_pad(const KernelInit& init) {
  const std::optional<std::vector<int64_t>> axes_attr = init.optional_ints("axes");
  return make_kernel([axes_attr](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& s = ctx.input(1);
    const auto r = static_cast<int64_t>(x.rank());
    std::vector<int64_t> axes;
    if (axes_attr) {
      axes = *axes_attr;
    } else {
      for (int64_t a = 0; a < r; ++a) axes.push_back(a);
    }
    if ((s.dtype() != DataType::Int64 && s.dtype() != DataType::Int32) || s.rank() != 1 ||
        s.dim(0) != static_cast<int64_t>(axes.size())) {
      fail("shape " + ctx.input_name(1) + " is " + s.description() + ", expected int32 or int64 [" + std::to_string(axes.size()) +
           "] (one value per axis)");
    }
    const std::vector<int64_t> target = s.to_int64_vector("shape");
    Shape out = x.shape();
    std::vector<int64_t> in_start(x.rank(), 0), out_start(x.rank(), 0);
    std::vector<bool> seen(x.rank(), false);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = axes[i] < 0 ? axes[i] + r : axes[i];
      if (a < 0 || a >= r || seen[static_cast<size_t>(a)]) {
        fail("attribute 'axes' holds " + std::to_string(axes[i]) + ", out of range or repeated for input " + ctx.input_name(0) +
             " of rank " + std::to_string(r));
      }
      seen[static_cast<size_t>(a)] = true;
      if (target[i] < 0) fail("shape " + ctx.input_name(1) + " holds a negative size");
      const int64_t dim = x.dim(static_cast<size_t>(a));
      out[static_cast<size_t>(a)] = target[i];
      (target[i] < dim ? in_start : out_start)[static_cast<size_t>(a)] = std::abs(dim - target[i]) / 2;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out);
    std::memset(y.raw_data(), 0, y.nbytes());
    if (y.numel() == 0 || x.numel() == 0) return;
    // Copy the common box row by row (the last dim contiguous).
    const size_t es = dtype_size(x.dtype());
    std::vector<int64_t> extent(x.rank());
    for (size_t d = 0; d < x.rank(); ++d) extent[d] = std::min(x.dim(d), out[d]);
    if (x.rank() == 0) {
      std::memcpy(y.raw_data(), x.raw_data(), es);
      return;
    }
    std::vector<int64_t> idx(x.rank(), 0);
    const auto* src = static_cast<const char*>(x.raw_data());
    auto* dst = static_cast<char*>(y.raw_data());
    const int64_t rows = Shape(extent).numel() / extent.back();
    for (int64_t row = 0; row < rows; ++row) {
      int64_t si = 0, di = 0;
      for (size_t d = 0; d < x.rank(); ++d) {
        const int64_t v = d + 1 == x.rank() ? 0 : idx[d];
        si = si * x.dim(d) + in_start[d] + v;
        di = di * out[d] + out_start[d] + v;
      }
      std::memcpy(dst + static_cast<size_t>(di) * es, src + static_cast<size_t>(si) * es, static_cast<size_t>(extent.back()) * es);
      for (size_t d = x.rank() - 1; d-- > 0;) {
        if (++idx[d] < extent[d]) break;
        idx[d] = 0;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Upsample

std::vector<double> upsample_scales(const KernelContext& ctx, const std::vector<float>& attr, bool from_input) {
  const Tensor& x = ctx.input(0);
  std::vector<double> scales(attr.begin(), attr.end());
  if (from_input) {
    const Tensor& s = ctx.input(1);
    if (s.dtype() != DataType::Float32 || s.rank() != 1) fail("scales " + ctx.input_name(1) + " is " + s.description() + ", expected 1-D float32");
    scales = s.to_double_vector();
  }
  if (scales.size() != x.rank()) {
    fail("scales has " + std::to_string(scales.size()) + " values for input " + ctx.input_name(0) + " of rank " + std::to_string(x.rank()));
  }
  for (double v : scales) {
    if (!(v >= 1 && v < 1e9)) fail("scales holds " + std::to_string(v) + ", expected finite values >= 1 (Upsample)");
  }
  return scales;
}

std::unique_ptr<Kernel> make_upsample(const KernelInit& init) {
  const std::string mode = init.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear") throw Error("attribute 'mode' is '" + mode + "', expected nearest or linear");
  const bool linear = mode == "linear";
  const bool from_input = op_version("", "Upsample", init.opset()) >= 9;
  std::vector<float> attr;
  if (!from_input) {
    if (!init.has_attr("scales")) throw Error("required attribute 'scales' is missing");
    attr = init.attr_floats("scales");
  }
  return make_kernel([linear, from_input, attr](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const std::vector<double> scales = upsample_scales(ctx, attr, from_input);
    const size_t r = x.rank();
    Shape out = x.shape();
    for (size_t d = 0; d < r; ++d) out[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.dim(d)) * scales[d]));
    Tensor& y = ctx.allocate_output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    if (r == 0) {  // a scalar: nothing to resize
      std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
      return;
    }
    // Per dim and output index: the lower source index and its fraction t.
    std::vector<std::vector<int64_t>> lower(r);
    std::vector<std::vector<double>> frac(r);
    for (size_t d = 0; d < r; ++d) {
      for (int64_t o = 0; o < out[d]; ++o) {
        const double v = static_cast<double>(o) / scales[d];
        const double f = std::floor(v);
        lower[d].push_back(std::min(static_cast<int64_t>(f), x.dim(d) - 1));
        frac[d].push_back(v - f);
      }
    }
    if (!linear) {
      const size_t es = dtype_size(x.dtype());
      const int64_t last = out[r - 1], rows = y.numel() / last;
      std::vector<int64_t> idx(r, 0);
      for (int64_t row = 0; row < rows; ++row) {
        int64_t base = 0;
        for (size_t d = 0; d + 1 < r; ++d) base = (base + lower[d][static_cast<size_t>(idx[d])]) * x.dim(d + 1);
        std::vector<int64_t> index(lower[r - 1]);
        for (int64_t& i : index) i += base;
        copy_elements(static_cast<const char*>(x.raw_data()), static_cast<char*>(y.raw_data()) + static_cast<size_t>(row * last) * es,
                      index.data(), last, es);
        for (size_t d = r - 1; d-- > 0;) {
          if (++idx[d] < out[d]) break;
          idx[d] = 0;
        }
      }
      return;
    }
    visit_dtype<NumericTypes>(x.dtype(), "Upsample input " + ctx.input_name(0), [&]<class T>() {
      // Dim by dim, last first, in double.
      std::vector<double> cur(static_cast<size_t>(x.numel()));
      for (size_t i = 0; i < cur.size(); ++i) cur[i] = convert<double>(x.data<T>()[i]);
      Shape shape = x.shape();
      for (size_t d = r; d-- > 0;) {
        if (scales[d] == 1) continue;  // x = o: the identity
        const int64_t in = shape[d], outer = shape.numel(0, d), inner = shape.numel(d + 1, r);
        std::vector<double> next(static_cast<size_t>(outer * out[d] * inner));
        for (int64_t b = 0; b < outer; ++b) {
          for (int64_t o = 0; o < out[d]; ++o) {
            const int64_t i0 = lower[d][static_cast<size_t>(o)], i1 = std::min(i0 + 1, in - 1);
            const double t = frac[d][static_cast<size_t>(o)];
            const double* a = cur.data() + (b * in + i0) * inner;
            const double* c = cur.data() + (b * in + i1) * inner;
            double* dst = next.data() + (b * out[d] + o) * inner;
            for (int64_t k = 0; k < inner; ++k) dst[k] = (1 - t) * a[k] + t * c[k];
          }
        }
        cur.swap(next);
        shape[d] = out[d];
      }
      T* py = y.data<T>();
      for (size_t i = 0; i < cur.size(); ++i) py[i] = convert<T>(cur[i]);
    });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_vision(const KernelInit& init) {
  const std::string& op = init.op_type();
  if (op == "Col2Im" || op == "Col2ImGrad") return make_col2im_kernel(init, op == "Col2ImGrad");
  if (op == "CenterCropPad") return make_center_crop_pad(init);
  return make_upsample(init);
}

}  // namespace onnxtrain::ops
