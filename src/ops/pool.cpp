// MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool (ONNX operator docs, opsets 1-28:
// AveragePool-19 documents `dilations`, which every version here reads; the versions 22 add
// bfloat16 and state the ceil_mode rule below for the windows that would start in the padding).
//
// X [N, C, D1..Dn] -> Y [N, C, O1..On]. Per spatial dim, with extent = (k - 1) * dilation + 1:
//   NOTSET:  O = floor((D + pad_begin + pad_end - extent) / stride + 1), or ceil with
//            ceil_mode (opset 10+), dropping a last window that would start in the right
//            padding (start >= D + pad_begin);
//   VALID:   O = ceil((D - extent + 1) / stride), no padding;
//   SAME_*:  O = ceil(D / stride), total padding (O - 1) * stride + extent - D split with the
//            odd element at the end (SAME_UPPER) or beginning (SAME_LOWER).
// Padding never takes part in a maximum. AveragePool divides by the number of input elements in
// the window, or with count_include_pad = 1 (opset 7+) by the number of window elements inside
// the padded input (in ceil mode a window may reach past it). MaxPool's optional second output
// Indices (opset 8+, int64) holds the flattened index of each maximum in X: (n * C + c) * D1*..*Dn
// plus the spatial offset in row-major (storage_order 0) or column-major (storage_order 1)
// order. A NaN in a window makes its maximum NaN. Pooling runs in parallel over N * C.
//
// ai.onnxtrain.MaxPoolChannelBlocked (made by runtime/fusion.h block_convolution_tensors, never
// saved) is MaxPool without Indices on X blocked by b channels (attribute x_channel_block = b):
// X [N, C / b, D..., b] -> Y [N, C / b, O..., b] with y_channel_block = b, or the plain Y
// [N, C, O...] with y_channel_block = 0; MaxPool's other attributes and windows; float32 only.
// With attribute activation = "Relu" it is Relu(MaxPool(X)), which equals MaxPool(Relu(X)) (both
// monotonic, NaN kept; only the sign of a zero may differ).
//
// Attribute parsing, the window plan and the divisors are declared in pool_plan.h:
// MaxPoolGrad / AveragePoolGrad (pool_grad.cpp) use them to see the windows the forward saw.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/data_movement.h"
#include "ops/factories.h"
#include "ops/pool_plan.h"

// The 2x2 loops pass core/simd.h vectors between inline functions; without AVX in the build
// GCC warns that such calls would change the ABI, which no call here crosses.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace onnxtrain::ops {

namespace {

using pool_detail::ceil_div;
using pool_detail::grain_for;

// Output dims and per-dim taps; throws when a window does not fit.
std::vector<std::vector<Taps>> dim_taps(const PoolAttrs& a, const std::string& x_name,
                                        PoolPlan& p) {
  const size_t nd = p.rank;
  std::vector<std::vector<Taps>> taps(nd);
  p.out.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t in = p.in[d], stride = a.strides[d], dilation = a.dilations[d];
    const int64_t extent = (a.kernel[d] - 1) * dilation + 1;
    int64_t begin = a.pads[d], end = a.pads[d + nd], out = 0;
    if (a.auto_pad == AutoPad::SameUpper || a.auto_pad == AutoPad::SameLower) {
      out = ceil_div(in, stride);
      split_padding(std::max<int64_t>(0, (out - 1) * stride + extent - in),
                    a.auto_pad == AutoPad::SameUpper, begin, end);
    } else {
      if (a.auto_pad == AutoPad::Valid) begin = end = 0;
      const int64_t span = in + begin + end - extent;
      if (span < 0) {
        fail("the pooling window spans " + std::to_string(extent) + " elements along spatial dim " +
             std::to_string(d) + " (kernel " + std::to_string(a.kernel[d]) + ", dilation " +
             std::to_string(dilation) + "), more than the padded size " +
             std::to_string(in + begin + end) + " of input " + x_name);
      }
      out =
          (a.ceil_mode && a.auto_pad == AutoPad::NotSet ? ceil_div(span, stride) : span / stride) +
          1;
      if (a.ceil_mode && (out - 1) * stride >= in + begin) --out;
    }
    p.out[d] = out;
    for (int64_t o = 0; o < out; ++o) {
      Taps t;
      t.start = o * stride - begin;
      t.lo = t.start >= 0 ? 0 : ceil_div(-t.start, dilation);
      t.hi = std::min(a.kernel[d], std::max<int64_t>(0, ceil_div(in - t.start, dilation)));
      t.hi = std::max(t.hi, t.lo);
      t.padded =
          std::min(a.kernel[d], std::max<int64_t>(0, ceil_div(in + end - t.start, dilation)));
      taps[d].push_back(t);
    }
  }
  return taps;
}

}  // namespace

PoolPlan make_pool_plan(const PoolAttrs& a, const Shape& x, const std::string& x_name) {
  const size_t nd = a.kernel.size();
  if (x.size() != nd + 2) {
    fail("input " + x_name + " has shape " + x.to_string() + ", expected rank " +
         std::to_string(nd + 2) + " ([N, C] and the " + std::to_string(nd) +
         " spatial dims of kernel_shape " + ints_to_string(a.kernel) + ")");
  }
  PoolPlan p;
  p.rank = nd;
  p.channels = x[0] * x[1];
  const auto dims = x.to_vector();
  p.in.assign(dims.begin() + 2, dims.end());
  p.taps = dim_taps(a, x_name, p);
  const auto& taps = p.taps;
  std::vector<int64_t> row_stride(nd, 1), column_stride(nd, 1);
  for (size_t d = nd; d-- > 1;) row_stride[d - 1] = row_stride[d] * p.in[d];
  for (size_t d = 1; d < nd; ++d) column_stride[d] = column_stride[d - 1] * p.in[d - 1];
  for (size_t d = 0; d < nd; ++d) {
    p.in_size *= p.in[d];
    p.out_size *= p.out[d];
  }
  p.dilations = a.dilations;
  p.last_column_stride = column_stride[nd - 1];
  p.last_stride = a.strides[nd - 1];
  const int64_t out_last = p.out[nd - 1], in_last = p.in[nd - 1];
  const int64_t pad_last = p.out[nd - 1] > 0 ? -p.last_taps()[0].start : 0;
  for (int64_t k = 0; k < a.kernel[nd - 1]; ++k) {
    const int64_t shift = k * a.dilations[nd - 1] - pad_last;
    const int64_t first = std::clamp<int64_t>(ceil_div(-shift, p.last_stride), 0, out_last);
    p.last_shift.push_back(shift);
    p.last_first.push_back(first);
    p.last_last.push_back(
        std::clamp<int64_t>(ceil_div(in_last - shift, p.last_stride), first, out_last));
  }
  const auto tiles = [&](size_t d) {
    if (a.kernel[d] != 2 || a.strides[d] != 2 || a.dilations[d] != 1 || p.out[d] == 0) return false;
    for (int64_t o = 0; o < p.out[d]; ++o) {
      const Taps& t = p.taps[d][static_cast<size_t>(o)];
      if (t.start != 2 * o || t.lo != 0 || t.hi != 2) return false;
    }
    return true;
  };
  p.windows_2x2 = nd == 2 && tiles(0) && tiles(1);
  if (p.out_size == 0) return p;
  // Walk the output lines with an odometer over the outer dims.
  const int64_t lines = p.out_size / p.out[nd - 1];
  std::vector<int64_t> o(nd, 0);
  p.line_begin.push_back(0);
  for (int64_t l = 0; l < lines; ++l) {
    const size_t first = p.row_base.size();
    p.row_base.push_back(0);
    p.column_base.push_back(0);
    int64_t padded = 1;
    for (size_t d = 0; d + 1 < nd; ++d) {  // extend every partial position by this dim's taps
      const Taps& t = taps[d][static_cast<size_t>(o[d])];
      padded *= t.padded;
      const size_t count = p.row_base.size() - first;
      for (size_t b = 0; b < count; ++b) {
        const int64_t row = p.row_base[first + b], column = p.column_base[first + b];
        for (int64_t k = t.lo; k < t.hi; ++k) {
          const int64_t i = t.start + k * a.dilations[d];
          p.row_base.push_back(row + i * row_stride[d]);
          p.column_base.push_back(column + i * column_stride[d]);
        }
      }
      p.row_base.erase(p.row_base.begin() + static_cast<std::ptrdiff_t>(first),
                       p.row_base.begin() + static_cast<std::ptrdiff_t>(first + count));
      p.column_base.erase(p.column_base.begin() + static_cast<std::ptrdiff_t>(first),
                          p.column_base.begin() + static_cast<std::ptrdiff_t>(first + count));
    }
    p.line_begin.push_back(static_cast<int64_t>(p.row_base.size()));
    p.line_padded.push_back(padded);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++o[d] < p.out[d]) break;
      o[d] = 0;
    }
  }
  return p;
}

namespace {

using pool_detail::is_nan;

// Both pools work one output line of one channel at a time: for every window position over
// the outer dims and every kernel tap along the last dim, a contiguous loop over the line's
// outputs (vectorizable), so taps are visited in row-major window order for each output.

// max_pool without indices for p.windows_2x2: each output the maximum of its four inputs, the
// first of them in row-major order on a tie, one output row at a time over the two input rows
// it reads (float32 in vectors of 8 or 4 outputs).
template <class T>
void max_pool_2x2(const PoolPlan& p, const T* x, T* y) {
  using V = compute_t<T>;
  using namespace pool_detail;
  using namespace simd;
  const int64_t in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  const int64_t rows = p.channels * oh_count;
  parallel_for(rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 4 * ow_count)),
               [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t c = r / oh_count, oh = r % oh_count;
      const T* r0 = x + c * p.in_size + 2 * oh * in_w;
      const T* r1 = r0 + in_w;
      T* yr = y + r * ow_count;
      if constexpr (std::is_same_v<T, float>) {
        if (ow_count >= 4) {
          cover_in_chunks(ow_count, [&]<int W>(int64_t s) {
            const Floats<W> a0 = load<W>(r0 + 2 * s), a1 = load<W>(r0 + 2 * s + W);
            const Floats<W> b0 = load<W>(r1 + 2 * s), b1 = load<W>(r1 + 2 * s + W);
            const Floats<W> top = max_or_nan(odds<W>(a0, a1), evens<W>(a0, a1));
            const Floats<W> bottom = max_or_nan(odds<W>(b0, b1), evens<W>(b0, b1));
            store<W>(yr + s, max_or_nan(bottom, top));
          });
          continue;
        }
      }
      for (int64_t ow = 0; ow < ow_count; ++ow) {
        const V top = max_or_nan(static_cast<V>(r0[2 * ow + 1]), static_cast<V>(r0[2 * ow]));
        const V bottom = max_or_nan(static_cast<V>(r1[2 * ow + 1]), static_cast<V>(r1[2 * ow]));
        yr[ow] = static_cast<T>(max_or_nan(bottom, top));
      }
    }
  });
}

// y = max over each window, without indices: the maximum over the window's input rows first,
// element by element along whole rows (contiguous), then over the taps along the last dim:
// rows + taps strided passes instead of rows x taps (the maximum, NaN if any, does not depend
// on the order). ResNet-18's 3x3 stride-2 stem pool on [32, 64, 16, 16], one thread: 0.908 ->
// 0.324 ms against a pass per tap and row.
template <class T>
void max_pool_values(const PoolPlan& p, int64_t window, const T* x, T* y) {
  if (p.windows_2x2) return max_pool_2x2(p, x, y);
  using V = compute_t<T>;
  const int64_t out_last = p.out.back(), in_last = p.in.back();
  const V lowest = std::numeric_limits<V>::has_infinity ? -std::numeric_limits<V>::infinity()
                                                        : std::numeric_limits<V>::lowest();
  parallel_for(p.channels, grain_for(p, window), [&](int64_t begin, int64_t end) {
    std::vector<V> best(static_cast<size_t>(out_last)), rows_max(static_cast<size_t>(in_last));
    for (int64_t c = begin; c < end; ++c) {
      const T* xc = x + c * p.in_size;
      for (size_t l = 0; l + 1 < p.line_begin.size(); ++l) {
        std::fill(best.begin(), best.end(), lowest);
        const int64_t b0 = p.line_begin[l], b1 = p.line_begin[l + 1];
        if (b0 < b1) {  // else no input row: the window lies in the padding
          const T* __restrict first = xc + p.row_base[static_cast<size_t>(b0)];
          const V* rows = nullptr;  // the maximum over the rows, element by element
          if constexpr (std::is_same_v<T, V>) {
            if (b1 - b0 == 1) rows = first;  // one row: read in place
          }
          if (!rows) {
            V* __restrict m = rows_max.data();
            for (int64_t w = 0; w < in_last; ++w) m[w] = static_cast<V>(first[w]);
            for (int64_t b = b0 + 1; b < b1; ++b) {
              const T* __restrict row = xc + p.row_base[static_cast<size_t>(b)];
#pragma omp simd
              for (int64_t w = 0; w < in_last; ++w) m[w] = pool_detail::max_or_nan(static_cast<V>(row[w]), m[w]);
            }
            rows = m;
          }
          for (size_t k = 0; k < p.last_shift.size(); ++k) {
            const V* __restrict in = rows + p.last_shift[k];
            V* __restrict out = best.data();
            const int64_t stride = p.last_stride;
#pragma omp simd
            for (int64_t o = p.last_first[k]; o < p.last_last[k]; ++o) {
              out[o] = pool_detail::max_or_nan(in[o * stride], out[o]);
            }
          }
        }
        T* yl = y + c * p.out_size + static_cast<int64_t>(l) * out_last;
        for (int64_t o = 0; o < out_last; ++o) yl[o] = static_cast<T>(best[static_cast<size_t>(o)]);
      }
    }
  });
}

// y = max over each window; indices (when kIndices) = the flattened position of the first
// maximum, found by walking each window tap by tap in row-major order.
template <class T, bool kIndices>
void max_pool(const PoolPlan& p, int64_t window, bool column_major, const T* x, T* y,
              int64_t* indices) {
  if constexpr (!kIndices) {
    return max_pool_values(p, window, x, y);
  } else {
    using V = compute_t<T>;
    const int64_t out_last = p.out.back();
    const V lowest = std::numeric_limits<V>::has_infinity ? -std::numeric_limits<V>::infinity()
                                                          : std::numeric_limits<V>::lowest();
    parallel_for(p.channels, grain_for(p, window), [&](int64_t begin, int64_t end) {
      std::vector<V> best(static_cast<size_t>(out_last));
      std::vector<int64_t> best_b(static_cast<size_t>(out_last)), best_i(best_b.size());
      for (int64_t c = begin; c < end; ++c) {
        const T* xc = x + c * p.in_size;
        for (size_t l = 0; l + 1 < p.line_begin.size(); ++l) {
          std::fill(best.begin(), best.end(), lowest);
          std::fill(best_b.begin(), best_b.end(), -1);
          for (int64_t b = p.line_begin[l]; b < p.line_begin[l + 1]; ++b) {
            const T* row = xc + p.row_base[static_cast<size_t>(b)];
            for (size_t k = 0; k < p.last_shift.size(); ++k) {
              for (int64_t o = p.last_first[k]; o < p.last_last[k]; ++o) {
                const int64_t i = o * p.last_stride + p.last_shift[k];
                const V v = static_cast<V>(row[i]);
                V& m = best[static_cast<size_t>(o)];
                auto& bb = best_b[static_cast<size_t>(o)];  // first maximum; the first NaN beats everything
                if (v > m || bb < 0 || (is_nan(v) && !is_nan(m))) {
                  m = v;
                  bb = b;
                  best_i[static_cast<size_t>(o)] = i;
                }
              }
            }
          }
          T* yl = y + c * p.out_size + static_cast<int64_t>(l) * out_last;
          for (int64_t o = 0; o < out_last; ++o) yl[o] = static_cast<T>(best[static_cast<size_t>(o)]);
          int64_t* il = indices + c * p.out_size + static_cast<int64_t>(l) * out_last;
          for (size_t o = 0; o < best_b.size(); ++o) {
            const int64_t b = best_b[o];
            const auto bb = static_cast<size_t>(std::max<int64_t>(b, 0));
            il[o] = b < 0 ? -1  // a window with no input element
                    : column_major
                        ? c * p.in_size + p.column_base[bb] + best_i[o] * p.last_column_stride
                        : c * p.in_size + p.row_base[bb] + best_i[o];
          }
        }
      }
    });
  }
}

template <class T>
void average_pool(const PoolPlan& p, int64_t window, bool count_include_pad, const T* x, T* y) {
  using V = compute_t<T>;
  const int64_t out_last = p.out.back();
  parallel_for(p.channels, grain_for(p, window), [&](int64_t begin, int64_t end) {
    std::vector<V> sum(static_cast<size_t>(out_last));
    for (int64_t c = begin; c < end; ++c) {
      const T* xc = x + c * p.in_size;
      for (size_t l = 0; l + 1 < p.line_begin.size(); ++l) {
        std::fill(sum.begin(), sum.end(), V(0));
        for (int64_t b = p.line_begin[l]; b < p.line_begin[l + 1]; ++b) {
          const T* row = xc + p.row_base[static_cast<size_t>(b)];
          for (size_t k = 0; k < p.last_shift.size(); ++k) {
            for (int64_t o = p.last_first[k]; o < p.last_last[k]; ++o) {
              sum[static_cast<size_t>(o)] +=
                  static_cast<V>(row[o * p.last_stride + p.last_shift[k]]);
            }
          }
        }
        T* yl = y + c * p.out_size + static_cast<int64_t>(l) * out_last;
        for (int64_t o = 0; o < out_last; ++o) {
          const int64_t count = average_pool_count(p, l, o, count_include_pad);
          yl[o] = static_cast<T>(sum[static_cast<size_t>(o)] / static_cast<V>(count));
        }
      }
    }
  });
}

class PoolKernel final : public Kernel {
 public:
  explicit PoolKernel(PoolAttrs attrs) : a_(std::move(attrs)) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const PoolPlan& p = plans_.get(a_, x.shape(), ctx.input_name(0));
    Shape out{x.dim(0), x.dim(1)};
    for (int64_t d : p.out) out.push_back(d);
    int64_t window = 1;
    for (int64_t k : a_.kernel) window *= k;
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(0);
    if (a_.is_max) {
      visit_dtype<NumericTypes>(x.dtype(), what, [&]<class T>() {
        Tensor& y = ctx.allocate_output(0, x.dtype(), out);
        if (ctx.has_output(1)) {
          int64_t* indices = ctx.allocate_output(1, DataType::Int64, out).data<int64_t>();
          max_pool<T, true>(p, window, a_.column_major, x.data<T>(), y.data<T>(), indices);
        } else {
          max_pool<T, false>(p, window, a_.column_major, x.data<T>(), y.data<T>(), nullptr);
        }
      });
    } else {
      visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
        Tensor& y = ctx.allocate_output(0, x.dtype(), out);
        average_pool<T>(p, window, a_.count_include_pad, x.data<T>(), y.data<T>());
      });
    }
  }

 private:
  PoolAttrs a_;
  PoolPlanCache plans_;
};

// The 2x2 pool (p.windows_2x2) of x [images, H, W, B] into y [images, OH, OW, B] when
// `y_blocked`, else [images, B, OH, OW]: the four taps in vectors of 8 lanes (max_or_nan's rule),
// then Relu when `relu`. With `mask` (and `relu`), also the routing bit mask of
// max_pool_relu_with_mask (pool_plan.h).
template <int B>
void max_pool_2x2_blocked(const PoolPlan& p, int64_t images, bool relu, const float* x, float* y, bool y_blocked,
                          uint8_t* mask = nullptr) {
  using namespace simd;
  constexpr int W = 8;  // lanes per vector (AVX): B / W vectors, and mask bytes, per position
  const int64_t in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  const int64_t image_in = p.in_size * B, image_out = p.out_size;
  parallel_for(images * oh_count, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 4 * ow_count * B)),
               [&](int64_t begin, int64_t end) {
    std::vector<float> row(y_blocked ? 0 : static_cast<size_t>(ow_count * B));  // [OW, B], then lane by lane
    for (int64_t r = begin; r < end; ++r) {
      const int64_t image = r / oh_count, oh = r % oh_count;
      const int64_t offset = image * image_in + 2 * oh * in_w * B;
      const float* x0 = x + offset;
      const float* x1 = x0 + in_w * B;
      float* out = y_blocked ? y + (image * image_out + oh * ow_count) * B : row.data();
      for (int64_t ow = 0; ow < ow_count; ++ow) {
        for (int h = 0; h < B; h += W) {
          const int64_t at = 2 * ow * B + h;
          const Floats<W> v[4] = {load<W>(x0 + at), load<W>(x0 + at + B), load<W>(x1 + at), load<W>(x1 + at + B)};
          using pool_detail::max_or_nan;
          Floats<W> m = max_or_nan(max_or_nan(v[1], v[0]), max_or_nan(v[3], v[2]));
          if (relu) m = m < Floats<W>{} ? Floats<W>{} : m;
          store<W>(out + ow * B + h, m);
          if (mask) {
            Masks<W> routed[4];
            pool_detail::first_max_2x2<W, true>(v, routed);
            uint8_t* m0 = mask + (offset + at) / W;
            m0[0] = mask_bits(routed[0]);
            m0[B / W] = mask_bits(routed[1]);
            m0[in_w * B / W] = mask_bits(routed[2]);
            m0[(in_w + 1) * B / W] = mask_bits(routed[3]);
          }
        }
      }
      if (mask) {  // the column and row no window reads (odd width, odd height)
        uint8_t* m0 = mask + offset / W;
        std::fill(m0 + 2 * ow_count * B / W, m0 + in_w * B / W, uint8_t{0});
        std::fill(m0 + (in_w + 2 * ow_count) * B / W, m0 + 2 * in_w * B / W, uint8_t{0});
        if (oh == oh_count - 1) {
          std::fill(mask + (image * image_in + 2 * oh_count * in_w * B) / W, mask + (image + 1) * image_in / W, uint8_t{0});
        }
      }
      if (!y_blocked) {  // each lane's OW outputs, contiguous in the plain y
        float* yr = y + image * B * image_out + oh * ow_count;
        for (int l = 0; l < B; ++l) {
          for (int64_t ow = 0; ow < ow_count; ++ow) yr[l * image_out + ow] = row[static_cast<size_t>(ow * B + l)];
        }
      }
    }
  });
}

// ai.onnxtrain.MaxPoolChannelBlocked: MaxPool without Indices on x blocked by b channels.
class BlockedMaxPoolKernel final : public Kernel {
 public:
  BlockedMaxPoolKernel(PoolAttrs attrs, int64_t x_block, int64_t y_block, bool relu)
      : a_(std::move(attrs)), x_block_(x_block), y_block_(y_block), relu_(relu) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t b = x_block_;
    const Shape plain = channels_merged_shape(x, ctx.input_name(0), a_.kernel.size(), b, "x_channel_block");
    if (x.dtype() != DataType::Float32) {
      fail("input " + ctx.input_name(0) + " is " + x.description() + ", expected float32 (" + ctx.node().op_type +
           " runs float32 only)");
    }
    const PoolPlan& p = plans_.get(a_, plain, ctx.input_name(0));
    Shape out{plain[0], plain[1]};
    for (int64_t d : p.out) out.push_back(d);
    Tensor& y = ctx.allocate_output(0, x.dtype(), y_block_ ? channel_blocked_shape(out, y_block_) : out);
    // N x C / b images of b channels each, channels-last; a plain y is [N x C / b, b, O...].
    const int64_t images = plain[0] * plain[1] / b;
    if (p.windows_2x2 && b == 16) {
      max_pool_2x2_blocked<16>(p, images, relu_, x.data<float>(), y.data<float>(), y_block_ != 0);
    } else if (p.windows_2x2 && b == 8) {
      max_pool_2x2_blocked<8>(p, images, relu_, x.data<float>(), y.data<float>(), y_block_ != 0);
    } else {
      max_pool_channels_last(p, images, b, relu_, x.data<float>(), y.data<float>(), y_block_ != 0);
    }
  }

 private:
  PoolAttrs a_;
  int64_t x_block_ = 0, y_block_ = 0;
  bool relu_ = false;  // attribute activation = "Relu": Relu after the pool
  PoolPlanCache plans_;  // for the plain input shape
};

// GlobalMaxPool / GlobalAveragePool: X [N, C, D...] -> Y [N, C, 1, ...], over all spatial dims.
template <class T>
void global_pool(bool is_max, int64_t channels, int64_t size, const T* x, T* y) {
  using V = compute_t<T>;
  parallel_for(channels, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, size)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t c = begin; c < end; ++c) {
                   const T* xc = x + c * size;
                   if (is_max) {
                     V best = -std::numeric_limits<V>::infinity();
                     for (int64_t i = 0; i < size; ++i) {
                       const V v = static_cast<V>(xc[i]);
                       best = v > best || std::isnan(v) ? v : best;
                     }
                     y[c] = static_cast<T>(best);
                   } else {
                     V sum = 0;
                     for (int64_t i = 0; i < size; ++i) sum += static_cast<V>(xc[i]);
                     y[c] = static_cast<T>(sum / static_cast<V>(size));
                   }
                 }
               });
}

}  // namespace

namespace {
// Taps per output, for the parallel grain: window positions of the first line times last-dim taps.
int64_t window_estimate(const PoolPlan& p) {
  const int64_t outer = p.line_begin.size() > 1 ? p.line_begin[1] - p.line_begin[0] : 1;
  return std::max<int64_t>(1, outer * static_cast<int64_t>(p.last_shift.size()));
}
}  // namespace

void max_pool_forward(const PoolPlan& p, const Tensor& x, Tensor& y) {
  visit_dtype<NumericTypes>(x.dtype(), "MaxPool input", [&]<class T>() {
    max_pool<T, false>(p, window_estimate(p), false, x.data<T>(), y.data<T>(), nullptr);
  });
}

void max_pool_channels_last(const PoolPlan& p, int64_t images, int64_t channels, bool relu, const float* x, float* y,
                            bool y_channels_last) {
  if (p.out_size == 0 || channels == 0 || images == 0) return;
  const int64_t C = channels, N = images, out_last = p.out.back();
  const int64_t lines = static_cast<int64_t>(p.line_begin.size()) - 1;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, out_last * C * window_estimate(p)));
  parallel_for(N * lines, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> best(static_cast<size_t>(out_last * C));  // [out_last, C], like the input
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / lines;
      const auto l = static_cast<size_t>(task % lines);
      const float* xn = x + n * p.in_size * C;
      std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
      for (int64_t b = p.line_begin[l]; b < p.line_begin[l + 1]; ++b) {
        const float* row = xn + p.row_base[static_cast<size_t>(b)] * C;
        for (size_t k = 0; k < p.last_shift.size(); ++k) {
          for (int64_t o = p.last_first[k]; o < p.last_last[k]; ++o) {
            const float* __restrict in = row + (o * p.last_stride + p.last_shift[k]) * C;
            float* __restrict out = best.data() + o * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              const float v = in[c], m = out[c];
              out[c] = pool_detail::max_or_nan(v, m);
            }
          }
        }
      }
      if (y_channels_last) {  // the line's [out_last, C] block as it is
        float* __restrict yl = y + (n * p.out_size + static_cast<int64_t>(l) * out_last) * C;
        const float* __restrict bl = best.data();
        for (int64_t i = 0; i < out_last * C; ++i) yl[i] = relu && bl[i] < 0.0f ? 0.0f : bl[i];
        continue;
      }
      float* yl = y + n * C * p.out_size + static_cast<int64_t>(l) * out_last;
      for (int64_t c = 0; c < C; ++c) {
        float* __restrict yc = yl + c * p.out_size;
        const float* __restrict bc = best.data() + c;
        for (int64_t o = 0; o < out_last; ++o) {
          const float v = bc[o * C];
          yc[o] = relu && v < 0.0f ? 0.0f : v;
        }
      }
    }
  });
}

void max_pool_relu_with_mask(const PoolPlan& p, int64_t images, int64_t block, const float* x, float* y, bool y_blocked,
                             uint8_t* mask) {
  if (!p.windows_2x2 || (block != 8 && block != 16)) {
    throw Error("max_pool_relu_with_mask takes 2x2 windows at stride 2 over channel blocks of 8 or 16");
  }
  if (images == 0 || p.out_size == 0) {
    std::fill(mask, mask + images * p.in_size * block / 8, uint8_t{0});
    return;
  }
  if (block == 16) {
    max_pool_2x2_blocked<16>(p, images, true, x, y, y_blocked, mask);
  } else {
    max_pool_2x2_blocked<8>(p, images, true, x, y, y_blocked, mask);
  }
}

PoolAttrs parse_pool_attrs(const KernelInit& init, bool is_max) {
  PoolAttrs a;
  a.is_max = is_max;
  a.auto_pad = parse_auto_pad(init);
  if (!init.has_attr("kernel_shape")) throw Error("required attribute 'kernel_shape' is missing");
  a.kernel = *ints_at_least(init, "kernel_shape", 1);
  const size_t nd = a.kernel.size();
  if (nd == 0) throw Error("attribute 'kernel_shape' is empty, expected one value per spatial dim");
  a.strides = spatial_values(ints_at_least(init, "strides", 1), "strides", nd, 1);
  a.dilations = spatial_values(ints_at_least(init, "dilations", 1), "dilations", nd, 1);
  a.pads = spatial_values(ints_at_least(init, "pads", 0), "pads", nd, 0, 2);
  a.ceil_mode = init.attr_int("ceil_mode", 0) != 0;
  a.count_include_pad = init.attr_int("count_include_pad", 0) != 0;
  const int64_t storage_order = init.attr_int("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) {
    throw Error("attribute 'storage_order' is " + std::to_string(storage_order) +
                ", expected 0 (row major) or 1 (column major)");
  }
  a.column_major = storage_order == 1;
  return a;
}

std::unique_ptr<Kernel> make_pool(const KernelInit& init) {
  return std::make_unique<PoolKernel>(parse_pool_attrs(init, init.op_type() == "MaxPool"));
}

std::unique_ptr<Kernel> make_max_pool_channel_blocked(const KernelInit& init) {
  const int64_t x_block = init.attr_int("x_channel_block", 0), y_block = init.attr_int("y_channel_block", 0);
  if (x_block < 1) throw Error("attribute 'x_channel_block' is " + std::to_string(x_block) + ", expected >= 1");
  if (y_block != 0 && y_block != x_block) {
    throw Error("attribute 'y_channel_block' is " + std::to_string(y_block) + ", expected 0 (plain Y) or " +
                std::to_string(x_block) + " (x_channel_block)");
  }
  const std::string activation = init.attr_string("activation", "");
  if (!activation.empty() && activation != "Relu") {
    throw Error("attribute 'activation' is '" + activation + "', expected Relu or none");
  }
  return std::make_unique<BlockedMaxPoolKernel>(parse_pool_attrs(init, true), x_block, y_block, activation == "Relu");
}

std::unique_ptr<Kernel> make_global_pool(const KernelInit& init) {
  const bool is_max = init.op_type() == "GlobalMaxPool";
  return make_kernel([is_max](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2) {
      fail("input " + ctx.input_name(0) + " has shape " + x.shape().to_string() +
           ", expected rank >= 2 ([N, C, spatial...])");
    }
    Shape out = Shape::filled(x.rank(), 1);
    out[0] = x.dim(0);
    out[1] = x.dim(1);
    const int64_t channels = x.dim(0) * x.dim(1);
    const int64_t size = x.shape().numel(2, x.rank());
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(0);
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      Tensor& y = ctx.allocate_output(0, x.dtype(), out);
      global_pool<T>(is_max, channels, size, x.data<T>(), y.data<T>());
    });
  });
}

}  // namespace onnxtrain::ops
