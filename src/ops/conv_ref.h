// Reference Conv and ConvTranspose for any number of spatial dims: float64, shapes oneDNN
// cannot express (more than 3 spatial dims), and the oracle the unit tests compare oneDNN with.
// Both are "im2col + matrix product" (gemm_ref.h), per image and group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "ops/gemm_ref.h"

namespace onnxtrain::ops {

// The product of dims (1 for none).
inline int64_t dims_product(const std::vector<int64_t>& dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

// The resolved shape of one Conv or ConvTranspose: every attribute checked and defaulted,
// auto_pad and output_shape turned into pads.
struct ConvGeometry {
  int64_t N = 0;  // batch
  int64_t C = 0;  // input channels
  int64_t M = 0;  // output channels
  int64_t G = 1;  // groups
  std::vector<int64_t> in, out, kernel, stride, dilation;
  // Conv: the padding before/after each spatial dim (>= 0).
  // ConvTranspose: how much of the full transposed output is cut at each end; output_padding is
  // already subtracted from pad_end, and a negative value means extra outputs no input reaches.
  std::vector<int64_t> pad_begin, pad_end;

  size_t rank() const { return in.size(); }
  int64_t in_size() const { return dims_product(in); }
  int64_t out_size() const { return dims_product(out); }
  int64_t kernel_size() const { return dims_product(kernel); }
};

namespace conv_ref_detail {

// Row-major strides of dims.
inline std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) s[d - 1] = s[d] * dims[d];
  return s;
}

// The kernel coordinates of flat kernel index kk.
inline void kernel_coords(const ConvGeometry& g, int64_t kk, std::vector<int64_t>& k) {
  for (size_t d = g.rank(); d-- > 0;) {
    k[d] = kk % g.kernel[d];
    kk /= g.kernel[d];
  }
}

// Advances the first idx.size() - 1 coordinates of idx (the last dim is walked by the caller).
inline void next_line(std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  for (size_t d = dims.size() - 1; d-- > 0;) {
    if (++idx[d] < dims[d]) return;
    idx[d] = 0;
  }
}

// col[(c, kk), o] = x[c, o * stride - pad_begin + k * dilation] (0 in the padding), for the
// `channels` channels of one image and group; col is [channels * kernel_size, out_size].
template <class T>
void im2col(const ConvGeometry& g, const T* x, int64_t channels, T* col) {
  const size_t nd = g.rank();
  const int64_t kernel_size = g.kernel_size(), out_size = g.out_size(), in_size = g.in_size();
  const int64_t out_last = g.out[nd - 1], in_last = g.in[nd - 1];
  if (out_size == 0) return;
  const int64_t lines = out_size / out_last;
  const auto in_stride = strides_of(g.in);
  parallel_for(channels * kernel_size, std::max<int64_t>(1, kParallelGrain / out_size),
               [&](int64_t begin, int64_t end) {
                 std::vector<int64_t> k(nd), o(nd);
                 for (int64_t r = begin; r < end; ++r) {
                   const int64_t c = r / kernel_size;
                   kernel_coords(g, r - c * kernel_size, k);
                   const T* xc = x + c * in_size;
                   T* dst = col + r * out_size;
                   const int64_t last_offset = k[nd - 1] * g.dilation[nd - 1] - g.pad_begin[nd - 1];
                   std::fill(o.begin(), o.end(), 0);
                   for (int64_t line = 0; line < lines; ++line, dst += out_last) {
                     bool inside = true;
                     int64_t base = 0;
                     for (size_t d = 0; d + 1 < nd; ++d) {
                       const int64_t i = o[d] * g.stride[d] - g.pad_begin[d] + k[d] * g.dilation[d];
                       inside = inside && i >= 0 && i < g.in[d];
                       base += i * in_stride[d];
                     }
                     for (int64_t ol = 0; ol < out_last; ++ol) {
                       const int64_t i = ol * g.stride[nd - 1] + last_offset;
                       dst[ol] = inside && i >= 0 && i < in_last ? xc[base + i] : T(0);
                     }
                     next_line(o, g.out);
                   }
                 }
               });
}

// y[m, i * stride - pad_begin + k * dilation] += col[(m, kk), i] for the `channels` output
// channels of one image and group (outputs outside y are dropped); col is
// [channels * kernel_size, in_size]. Parallel over output channels, which own disjoint y.
template <class T>
void col2im(const ConvGeometry& g, const T* col, int64_t channels, T* y) {
  const size_t nd = g.rank();
  const int64_t kernel_size = g.kernel_size(), out_size = g.out_size(), in_size = g.in_size();
  const int64_t in_last = g.in[nd - 1], out_last = g.out[nd - 1];
  if (in_size == 0) return;
  const int64_t lines = in_size / in_last;
  const auto out_stride = strides_of(g.out);
  parallel_for(
      channels, std::max<int64_t>(1, kParallelGrain / (in_size * kernel_size)),
      [&](int64_t begin, int64_t end) {
        std::vector<int64_t> k(nd), i(nd);
        for (int64_t m = begin; m < end; ++m) {
          T* ym = y + m * out_size;
          for (int64_t kk = 0; kk < kernel_size; ++kk) {
            kernel_coords(g, kk, k);
            const T* src = col + (m * kernel_size + kk) * in_size;
            const int64_t last_offset = k[nd - 1] * g.dilation[nd - 1] - g.pad_begin[nd - 1];
            std::fill(i.begin(), i.end(), 0);
            for (int64_t line = 0; line < lines; ++line, src += in_last) {
              bool inside = true;
              int64_t base = 0;
              for (size_t d = 0; d + 1 < nd; ++d) {
                const int64_t o = i[d] * g.stride[d] - g.pad_begin[d] + k[d] * g.dilation[d];
                inside = inside && o >= 0 && o < g.out[d];
                base += o * out_stride[d];
              }
              if (inside) {
                for (int64_t il = 0; il < in_last; ++il) {
                  const int64_t o = il * g.stride[nd - 1] + last_offset;
                  if (o >= 0 && o < out_last) ym[base + o] += src[il];
                }
              }
              next_line(i, g.in);
            }
          }
        }
      });
}

// y[n, m, ...] = bias[m] (0 without bias).
template <class T>
void fill_bias(int64_t images, int64_t channels, int64_t size, const T* bias, T* y) {
  for (int64_t n = 0; n < images; ++n) {
    for (int64_t m = 0; m < channels; ++m) {
      T* ym = y + (n * channels + m) * size;
      std::fill(ym, ym + size, bias ? bias[m] : T(0));
    }
  }
}

}  // namespace conv_ref_detail

// Conv: x [N, C, in...], w [M, C/G, kernel...], bias [M] or nullptr, y [N, M, out...].
// Per image and group: y_g [M/G, out] = w_g [M/G, C/G * kernel] · im2col(x_g).
template <class T>
void conv_reference(const ConvGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  using namespace conv_ref_detail;
  const int64_t cg = g.C / g.G, mg = g.M / g.G;
  const int64_t rows = cg * g.kernel_size(), out_size = g.out_size();
  std::vector<T> col(static_cast<size_t>(rows * out_size));
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t grp = 0; grp < g.G; ++grp) {
      im2col(g, x + (n * g.C + grp * cg) * g.in_size(), cg, col.data());
      matmul_ref(w + grp * mg * rows, col.data(), y + (n * g.M + grp * mg) * out_size, mg, rows,
                 out_size);
    }
  }
  if (bias) {
    for (int64_t n = 0; n < g.N; ++n) {
      for (int64_t m = 0; m < g.M; ++m) {
        T* ym = y + (n * g.M + m) * out_size;
        for (int64_t o = 0; o < out_size; ++o) ym[o] += bias[m];
      }
    }
  }
}

// ConvTranspose: x [N, C, in...], w [C, M/G, kernel...], bias [M] or nullptr, y [N, M, out...].
// Per image and group: col [M/G * kernel, in] = w_g^T · x_g, then col2im adds each column into
// the outputs its kernel taps reach.
template <class T>
void conv_transpose_reference(const ConvGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  using namespace conv_ref_detail;
  const int64_t cg = g.C / g.G, mg = g.M / g.G;
  const int64_t rows = mg * g.kernel_size(), in_size = g.in_size();
  std::vector<std::vector<T>> w_t(static_cast<size_t>(g.G));  // per group [M/G * kernel, C/G]
  for (int64_t grp = 0; grp < g.G; ++grp)
    w_t[static_cast<size_t>(grp)] = transposed(w + grp * cg * rows, cg, rows);
  fill_bias(g.N, g.M, g.out_size(), bias, y);
  std::vector<T> col(static_cast<size_t>(rows * in_size));
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t grp = 0; grp < g.G; ++grp) {
      matmul_ref(w_t[static_cast<size_t>(grp)].data(), x + (n * g.C + grp * cg) * in_size,
                 col.data(), rows, cg, in_size);
      col2im(g, col.data(), mg, y + (n * g.M + grp * mg) * g.out_size());
    }
  }
}

}  // namespace onnxtrain::ops
