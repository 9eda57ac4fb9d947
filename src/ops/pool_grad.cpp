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
// MaxPoolGrad with attribute x_channel_block = b (8 or 16; made by runtime/fusion.h
// block_convolution_tensors, never saved) reads X and writes dX blocked by b channels, [N, C / b,
// H, W, b] for two spatial dims, and dY so too with dy_channel_block = b, else plain; float32.
//
// MaxPoolGrad with attribute routing_mask = 1 (with x_channel_block = b; made by runtime/fusion.h
// block_convolution_tensors, never saved) reads, instead of X, the bit mask [N, C / b, H, W, b / 8]
// (uint8) a pooled ai.onnxtrain.FusedConv wrote beside its output (set where the gradient of its
// 2x2 window goes: pool_plan.h max_pool_relu_with_mask) and writes dX [N, C / b, H, W, b] = dY of
// the element's window where the bit is set, else 0.
//
// MaxPoolGrad with attribute activation = "Relu" (made by runtime/fusion.h, never saved) is
// MaxPoolGrad followed by ReluGrad over the same X: X is a Relu's output, and dX is 0 also where
// X > 0 fails (ReluGrad's rule), in the same pass for 2x2 windows.
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "core/dispatch.h"
#include "ops/data_movement.h"
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
            Floats<W> gs[4];
            pool_detail::route_2x2<W, kRelu>({v0, v1, v2, v3}, load<W>(g + s), gs);
            store<W>(d0 + 2 * s, interleave<W, 0>(gs[0], gs[1]));
            store<W>(d0 + 2 * s + W, interleave<W, 1>(gs[0], gs[1]));
            store<W>(d1 + 2 * s, interleave<W, 0>(gs[2], gs[3]));
            store<W>(d1 + 2 * s + W, interleave<W, 1>(gs[2], gs[3]));
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

// MaxPoolGrad for p.windows_2x2 on tensors blocked by B channels: dx [images, H, W, B] = dY of the
// element's window where the window routes it, else 0 (the row and column no window reads too);
// every dx element is written once. The route comes from x [images, H, W, B] (first_max_2x2, with
// kRelu its mask) or, when x is null, from the bit mask [images, H, W, B / 8] of
// max_pool_relu_with_mask (pool.cpp). dy [images, OH, OW, B] when dy_blocked, else the plain
// [N, C, OH, OW] (channel c = image % (C / B) x B + lane).
template <int B, bool kRelu>
void max_pool_grad_2x2_blocked(const PoolPlan& p, int64_t images, int64_t channels, const float* x, const uint8_t* mask,
                               const float* dy, bool dy_blocked, float* dx) {
  using namespace simd;
  constexpr int W = 8;  // lanes per vector (AVX): B / W vectors, and mask bytes, per position
  const int64_t in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  const int64_t image_in = p.in_size * B, image_out = oh_count * ow_count, blocks = channels / B;
  parallel_for(images * oh_count, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, 4 * ow_count * B)),
               [&](int64_t begin, int64_t end) {
    std::vector<float> lanes(dy_blocked ? 0 : static_cast<size_t>(ow_count * B));  // a plain dY row as [OW, B]
    for (int64_t r = begin; r < end; ++r) {
      const int64_t image = r / oh_count, oh = r % oh_count;
      const int64_t offset = image * image_in + 2 * oh * in_w * B;
      float* d0 = dx + offset;
      float* d1 = d0 + in_w * B;
      const float* g_row = dy + (image * image_out + oh * ow_count) * B;
      if (!dy_blocked) {  // read each lane's OW values contiguously
        const float* g_plain = dy + ((image / blocks) * channels + (image % blocks) * B) * image_out + oh * ow_count;
        for (int l = 0; l < B; ++l) {
          for (int64_t ow = 0; ow < ow_count; ++ow) lanes[static_cast<size_t>(ow * B + l)] = g_plain[l * image_out + ow];
        }
        g_row = lanes.data();
      }
      for (int64_t ow = 0; ow < ow_count; ++ow) {
        for (int h = 0; h < B; h += W) {
          const int64_t at = 2 * ow * B + h;
          Masks<W> routed[4];
          if (x) {
            const float* x0 = x + offset + at;
            pool_detail::first_max_2x2<W, kRelu>({load<W>(x0), load<W>(x0 + B), load<W>(x0 + in_w * B),
                                                  load<W>(x0 + (in_w + 1) * B)}, routed);
          } else {
            const uint8_t* m0 = mask + (offset + at) / W;
            routed[0] = bits_mask(m0[0]);
            routed[1] = bits_mask(m0[B / W]);
            routed[2] = bits_mask(m0[in_w * B / W]);
            routed[3] = bits_mask(m0[(in_w + 1) * B / W]);
          }
          const Floats<W> g = load<W>(g_row + ow * B + h), zero{};
          store<W>(d0 + at, routed[0] ? g : zero);
          store<W>(d0 + at + B, routed[1] ? g : zero);
          store<W>(d1 + at, routed[2] ? g : zero);
          store<W>(d1 + at + B, routed[3] ? g : zero);
        }
      }
      for (int64_t i = 2 * ow_count * B; i < in_w * B; ++i) d0[i] = d1[i] = 0.0f;  // odd width
      if (oh == oh_count - 1) {  // the rows below the last window (odd height)
        std::fill(dx + image * image_in + 2 * oh_count * in_w * B, dx + (image + 1) * image_in, 0.0f);
      }
    }
  });
}

// MaxPoolGrad with x_channel_block = B for two spatial dims: x and dx [images, H, W, B] (images =
// N x C / B), dy [images, OH, OW, B] when dy_blocked, else the plain [N, C, OH, OW] (its channel c
// = image % (C / B) x B + lane). Per window, lane by lane, the first maximum in row-major window
// order (the first NaN if any: first_argmax's rule) over the taps inside the input gets dY, then
// 0 where x > 0 fails with kRelu; dx is 0 elsewhere.
template <int B, bool kRelu>
void max_pool_grad_blocked_2d(const PoolPlan& p, int64_t images, int64_t channels, const float* x, const float* dy,
                              bool dy_blocked, float* dx) {
  const int64_t in_h = p.in[0], in_w = p.in[1], oh_count = p.out[0], ow_count = p.out[1];
  if (p.windows_2x2) return max_pool_grad_2x2_blocked<B, kRelu>(p, images, channels, x, nullptr, dy, dy_blocked, dx);
  const int64_t dh = p.dilations[0], dw = p.dilations[1];
  const int64_t image_in = in_h * in_w * B, image_out = oh_count * ow_count;
  const int64_t blocks = channels / B;
  parallel_for(images, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, image_in)),
               [&](int64_t begin, int64_t end) {
    alignas(64) float best[B], grad[B];
    alignas(64) int32_t at[B];
    for (int64_t image = begin; image < end; ++image) {
      const float* xi = x + image * image_in;
      float* di = dx + image * image_in;
      std::fill(di, di + image_in, 0.0f);
      // dY of output o, lane l: blocked, or channel (n, block x B + l) of the plain tensor.
      const float* dyi = dy_blocked ? dy + image * image_out * B
                                    : dy + ((image / blocks) * channels + (image % blocks) * B) * image_out;
      const int64_t lane_stride = dy_blocked ? 1 : image_out;
      for (int64_t oh = 0; oh < oh_count; ++oh) {
        const Taps& th = p.taps[0][static_cast<size_t>(oh)];
        if (th.lo == th.hi) continue;  // no input row: nothing flows back
        for (int64_t ow = 0; ow < ow_count; ++ow) {
          const Taps& tw = p.taps[1][static_cast<size_t>(ow)];
          if (tw.lo == tw.hi) continue;
          bool first = true;
          for (int64_t kh = th.lo; kh < th.hi; ++kh) {
            const int64_t h = th.start + kh * dh;
            for (int64_t kw = tw.lo; kw < tw.hi; ++kw) {
              const auto offset = static_cast<int32_t>((h * in_w + tw.start + kw * dw) * B);
              const float* v = xi + offset;
              if (first) {
                for (int l = 0; l < B; ++l) {
                  best[l] = v[l];
                  at[l] = offset;
                }
                first = false;
                continue;
              }
#pragma omp simd
              for (int l = 0; l < B; ++l) {
                const bool take = (v[l] > best[l]) | ((v[l] != v[l]) & (best[l] == best[l]));
                best[l] = take ? v[l] : best[l];
                at[l] = take ? offset : at[l];
              }
            }
          }
          const int64_t o = oh * ow_count + ow;
          if (dy_blocked) {
            for (int l = 0; l < B; ++l) grad[l] = dyi[o * B + l];
          } else {
            for (int l = 0; l < B; ++l) grad[l] = dyi[l * lane_stride + o];
          }
          for (int l = 0; l < B; ++l) {
            const float g = !kRelu || best[l] > 0.0f ? grad[l] : 0.0f;
            di[at[l] + l] += g;
          }
        }
      }
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
  PoolGradKernel(PoolAttrs attrs, bool relu, int64_t x_block, int64_t dy_block, bool routing_mask)
      : a_(std::move(attrs)), relu_(relu), x_block_(x_block), dy_block_(dy_block), routing_mask_(routing_mask) {
    for (int64_t k : a_.kernel) window_ *= k;
  }

  void run(KernelContext& ctx) override {
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);  // or the routing mask
    const int64_t b = x_block_;
    // X's plain shape [N, C, D...]: input 1's own, or read blocked by b channels, or the mask's.
    Shape plain = x.shape();
    if (routing_mask_) {
      if (x.rank() != 5 || x.dim(4) != b / 8 || x.dtype() != DataType::UInt8) {
        fail("input " + ctx.input_name(1) + " is " + x.description() + ", expected uint8 [N, C / " + std::to_string(b) +
             ", H, W, " + std::to_string(b / 8) + "] (attribute routing_mask = 1: the bit mask of a pooled FusedConv)");
      }
      plain = Shape{x.dim(0), x.dim(1) * b, x.dim(2), x.dim(3)};
    } else if (b) {
      plain = channels_merged_shape(x, ctx.input_name(1), 2, b, "x_channel_block");
    }
    // The channel-blocked forms run float32 only.
    const DataType dtype = b ? DataType::Float32 : x.dtype();
    for (int i : {0, 1}) {
      const Tensor& t = ctx.input(i);
      if ((i == 0 || !routing_mask_) && t.dtype() != dtype) {
        fail("input " + ctx.input_name(i) + " is " + t.description() + ", expected " + std::string(dtype_name(dtype)) +
             (b ? " (attribute x_channel_block)" : " like " + ctx.input_name(1)));
      }
    }
    const PoolPlan& p = plans_.get(a_, plain, ctx.input_name(1));
    Shape y_shape{plain[0], plain[1]};
    for (int64_t d : p.out) y_shape.push_back(d);
    const Shape dy_expected = dy_block_ ? channel_blocked_shape(y_shape, b) : y_shape;
    if (!(dy.shape() == dy_expected)) {
      fail("input " + ctx.input_name(0) + " has shape " + dy.shape().to_string() + ", expected " +
           dy_expected.to_string() + " (the output of " + (a_.is_max ? "MaxPool" : "AveragePool") + " for " +
           ctx.input_name(1) + " " + x.shape().to_string() + (dy_block_ ? ", blocked by attribute dy_channel_block" : "") +
           ")");
    }
    if (routing_mask_ && !p.windows_2x2) {
      fail("attribute routing_mask = 1 takes 2x2 windows at stride 2, not those of kernel_shape " + ints_to_string(a_.kernel) +
           " over " + ctx.input_name(1) + " " + plain.to_string());
    }
    if (!ctx.has_output(0)) return;
    if (b) {  // float32, X and dX [N, C / b, H, W, b]
      float* dx = ctx.allocate_output(0, DataType::Float32, channel_blocked_shape(plain, b)).data<float>();
      const int64_t images = plain[0] * plain[1] / b;
      const float* xb = routing_mask_ ? nullptr : x.data<float>();
      const uint8_t* mask = routing_mask_ ? x.data<uint8_t>() : nullptr;
      const auto run = [&]<int B>() {
        if (routing_mask_) {
          max_pool_grad_2x2_blocked<B, false>(p, images, plain[1], nullptr, mask, dy.data<float>(), dy_block_ != 0, dx);
        } else {
          (relu_ ? max_pool_grad_blocked_2d<B, true> : max_pool_grad_blocked_2d<B, false>)(p, images, plain[1], xb,
                                                                                         dy.data<float>(), dy_block_ != 0, dx);
        }
      };
      b == 16 ? run.template operator()<16>() : run.template operator()<8>();  // make_pool_grad allows 8 or 16
      return;
    }
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
  int64_t x_block_ = 0, dy_block_ = 0;  // attributes x_channel_block, dy_channel_block
  bool routing_mask_ = false;  // attribute routing_mask
  int64_t window_ = 1;  // kernel elements
  PoolPlanCache plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_pool_grad(const KernelInit& init) {
  const bool is_max = init.op_type() == "MaxPoolGrad";
  const std::string activation = init.attr_string("activation", "");
  if (!activation.empty() && (activation != "Relu" || !is_max)) {
    throw Error("attribute 'activation' is '" + activation + "', expected " +
                (is_max ? "Relu or none" : "none (only MaxPoolGrad takes one)"));
  }
  const int64_t x_block = init.attr_int("x_channel_block", 0), dy_block = init.attr_int("dy_channel_block", 0);
  if (x_block != 0 && (!is_max || (x_block != 8 && x_block != 16))) {
    throw Error("attribute 'x_channel_block' is " + std::to_string(x_block) + ", expected " +
                (is_max ? "8 or 16" : "none (only MaxPoolGrad takes one)"));
  }
  if (dy_block != 0 && dy_block != x_block) {
    throw Error("attribute 'dy_channel_block' is " + std::to_string(dy_block) + ", expected 0 (plain dY) or x_channel_block " +
                std::to_string(x_block));
  }
  PoolAttrs attrs = parse_pool_attrs(init, is_max);
  if (x_block != 0 && attrs.kernel.size() != 2) {
    throw Error("attribute 'x_channel_block' is set for a pool of " + std::to_string(attrs.kernel.size()) +
                " spatial dims, expected 2");
  }
  const bool routing_mask = init.attr_int("routing_mask", 0) != 0;
  if (routing_mask && (x_block == 0 || !activation.empty())) {
    throw Error("attribute 'routing_mask' = 1 needs x_channel_block and no activation (the mask has the Relu in it)");
  }
  return std::make_unique<PoolGradKernel>(std::move(attrs), activation == "Relu", x_block, dy_block, routing_mask);
}

}  // namespace onnxtrain::ops
