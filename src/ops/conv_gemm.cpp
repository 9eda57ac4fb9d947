// Convolutions with small output maps as one matrix product over the batch (conv_gemm.h).
#include "ops/conv_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/vector_math.h"
#include "ops/dnnl_util.h"
#include "ops/matmul_primitive.h"
#include "ops/relu.h"

namespace onnxtrain::ops {

namespace du = dnnl_util;

#if defined(ONNXTRAIN_VMATH_AVX512)
// conv_stream_avx512.cpp (compiled for x86-64-v4): only ever called when vmath::lanes() is 16.
namespace conv_stream_avx512 {
// The rows of W a group takes there.
int64_t group_rows();
// y[r, m] = b[m] + P[r] . W[m], Relu after when `relu`, for the `patches` (1-4) rows of P [patches, K]
// and the rows m of W [M, K] in groups [begin, end) of group_rows() rows (the last group of M may be
// shorter); y is [patches, M]. The sums as conv_gemm.h describes, at 16 lanes.
void stream_groups(int patches, const float* p, int64_t K, const float* w, int64_t M, int64_t begin, int64_t end,
                   const float* b, bool relu, float* y);
}  // namespace conv_stream_avx512
#endif

// The 8-lane variant of the streaming convolution rows, compiled like the rest of the project.
namespace stream8 {
namespace {
constexpr int kLanes = 8, kGroup = 3;
#include "ops/conv_stream_lanes.inl"
}  // namespace
}  // namespace stream8

namespace {

// Output positions per image up to which prefer_conv_gemm holds (conv_gemm.h).
constexpr int64_t kMaxOutputPositions = 4;
// Output positions per image up to which, and images from which, prefer_conv_gemm_channels_last
// holds.
constexpr int64_t kMaxOutputPositionsChannelsLast = 16, kMinImagesChannelsLast = 4;

// For output position o and kernel tap t (row-major over the spatial dims), the offset of the
// input element the tap reads inside one channel plane, or -1 where it reads padding:
// offsets[o * kernel_size + t].
std::vector<int64_t> tap_offsets(const ConvGeometry& g) {
  const size_t nd = g.rank();
  const int64_t out_size = g.out_size(), taps = g.kernel_size();
  std::vector<int64_t> offsets(static_cast<size_t>(out_size * taps));
  std::vector<int64_t> o(nd, 0), t(nd, 0);
  for (int64_t oi = 0; oi < out_size; ++oi) {
    int64_t rest = oi;
    for (size_t d = nd; d-- > 0;) {
      o[d] = rest % g.out[d];
      rest /= g.out[d];
    }
    for (int64_t ti = 0; ti < taps; ++ti) {
      rest = ti;
      for (size_t d = nd; d-- > 0;) {
        t[d] = rest % g.kernel[d];
        rest /= g.kernel[d];
      }
      int64_t offset = 0;
      for (size_t d = 0; d < nd && offset >= 0; ++d) {
        const int64_t i = o[d] * g.stride[d] - g.pad_begin[d] + t[d] * g.dilation[d];
        offset = (i < 0 || i >= g.in[d]) ? -1 : offset * g.in[d] + i;
      }
      offsets[static_cast<size_t>(oi * taps + ti)] = offset;
    }
  }
  return offsets;
}

// The sizes of one call's matrices (conv_gemm.h) and its tap offsets.
struct Lowered {
  int64_t out_size, taps, rows, K;
  std::vector<int64_t> offsets;

  explicit Lowered(const ConvGeometry& g)
      : out_size(g.out_size()), taps(g.kernel_size()), rows(g.N * g.out_size()), K(g.C * g.kernel_size()),
        offsets(tap_offsets(g)) {}
};

// f(n, offsets, row) for each row (n, o) of P [rows, K], in parallel: n the image, offsets the
// tap offsets of output position o (tap_offsets), row its K elements.
template <class F>
void for_each_patch_row(const Lowered& l, float* p, F&& f) {
  parallel_for(l.rows, std::max<int64_t>(1, kParallelGrain / l.K), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r / l.out_size, l.offsets.data() + (r % l.out_size) * l.taps, p + r * l.K);
  });
}

// Row (n, o) of P from x [N, C, D...] (conv_gemm.h): offsets are output position o's.
void gather_patch_row(const ConvGeometry& g, const Lowered& l, const float* x, int64_t n, const int64_t* offsets,
                      float* __restrict row) {
  const int64_t in_size = g.in_size();
  for (int64_t c = 0; c < g.C; ++c) {
    const float* plane = x + (n * g.C + c) * in_size;
    for (int64_t t = 0; t < l.taps; ++t) row[c * l.taps + t] = offsets[t] < 0 ? 0.0f : plane[offsets[t]];
  }
}

// P [rows, K] from x [N, C, D...] (conv_gemm.h).
void gather_patches(const ConvGeometry& g, const Lowered& l, const float* x, float* p) {
  for_each_patch_row(l, p, [&](int64_t n, const int64_t* offsets, float* row) {
    gather_patch_row(g, l, x, n, offsets, row);
  });
}

// P [rows, taps * C] from channels-last x [N, D..., C], columns in the order (t, c): each
// tap's C channels are one contiguous run of x.
void gather_patches_channels_last(const ConvGeometry& g, const Lowered& l, const float* x, float* p) {
  const int64_t in_size = g.in_size();
  for_each_patch_row(l, p, [&](int64_t n, const int64_t* offsets, float* row) {
    for (int64_t t = 0; t < l.taps; ++t) {
      float* dst = row + t * g.C;
      if (offsets[t] < 0) {
        std::fill(dst, dst + g.C, 0.0f);
      } else {
        std::memcpy(dst, x + (n * in_size + offsets[t]) * g.C, sizeof(float) * static_cast<size_t>(g.C));
      }
    }
  });
}

// dx [N, C, D...] = the sum of dP [rows, K] over every (o, t) whose patch read each element.
void scatter_patches(const ConvGeometry& g, const Lowered& l, const float* dp, float* dx) {
  const int64_t in_size = g.in_size();
  parallel_for(g.N * g.C, std::max<int64_t>(1, kParallelGrain / (l.out_size * l.taps + in_size)),
               [&](int64_t begin, int64_t end) {
    for (int64_t plane_index = begin; plane_index < end; ++plane_index) {
      const int64_t n = plane_index / g.C, c = plane_index % g.C;
      float* __restrict plane = dx + plane_index * in_size;
      std::fill(plane, plane + in_size, 0.0f);
      for (int64_t o = 0; o < l.out_size; ++o) {
        const int64_t* offsets = l.offsets.data() + o * l.taps;
        const float* row = dp + (n * l.out_size + o) * l.K + c * l.taps;
        for (int64_t t = 0; t < l.taps; ++t) {
          if (offsets[t] >= 0) plane[offsets[t]] += row[t];
        }
      }
    }
  });
}

// rows_of [(n, o), m] = t [n, m, o] for t [N, M, O...]: the output's rows.
void output_rows(const ConvGeometry& g, const Lowered& l, const float* t, float* rows_of) {
  parallel_for(g.N, std::max<int64_t>(1, kParallelGrain / (g.M * l.out_size)), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m = 0; m < g.M; ++m) {
        const float* src = t + (n * g.M + m) * l.out_size;
        for (int64_t o = 0; o < l.out_size; ++o) rows_of[(n * l.out_size + o) * g.M + m] = src[o];
      }
    }
  });
}

void sgemm(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc) {
  du::check_status(row_major_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc),
                   "run sgemm for a convolution");
}

// y[r, m] = b[m] + P[r] . W[m] for the `patches` rows of P [patches, K] and the rows m of W [M, K],
// Relu after when `relu`; y is [patches, M]. Each thread takes a range of W's rows, a group at a
// time, and reads each once: at vmath::lanes() 8 groups of three rows here, at 16 groups of six in
// conv_stream_avx512.cpp (conv_stream_lanes.inl; the sums as conv_gemm.h describes). Three rows
// a group instead of two read each 8 lanes of a patch once per three rows of W: at
// [4, 2304] x [256, 2304] 49-50 us against 61-65 with two rows a group (two threads, the weights
// of 16 such convolutions read in turn; one-off program).
void stream_rows(int patches, const float* p, int64_t K, const float* w, int64_t M, const float* b, bool relu,
                 float* y) {
#if defined(ONNXTRAIN_VMATH_AVX512)
  const bool wide = vmath::lanes() == 16;
  const int64_t rows = wide ? conv_stream_avx512::group_rows() : stream8::kGroup;
#else
  const int64_t rows = stream8::kGroup;
#endif
  const int64_t groups = (M + rows - 1) / rows;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, K * rows));
  parallel_for(groups, grain, [&](int64_t begin, int64_t end) {
#if defined(ONNXTRAIN_VMATH_AVX512)
    if (wide) return conv_stream_avx512::stream_groups(patches, p, K, w, M, begin, end, b, relu, y);
#endif
    stream8::stream_group_range(patches, p, K, w, M, begin, end, b, relu, y);
  });
}

}  // namespace

bool prefer_conv_stream_channels_last(const ConvGeometry& g) {
  constexpr int64_t kMinWeights = int64_t{1} << 16;
  return g.G == 1 && g.rank() >= 1 && g.N * g.out_size() <= kMaxStreamRows && g.M * g.C * g.kernel_size() >= kMinWeights;
}

void conv_stream_forward_channels_last(const ConvGeometry& g, const float* x, const float* w_taps_first,
                                       const float* b, float* y, bool relu) {
  const Lowered l(g);
  if (l.rows < 1 || l.rows > kMaxStreamRows) {
    throw Error("conv_stream_forward_channels_last: " + std::to_string(l.rows) + " rows, at most " +
                std::to_string(kMaxStreamRows) + " (prefer_conv_stream_channels_last)");
  }
  float* p = reinterpret_cast<float*>(du::thread_scratch(sizeof(float) * static_cast<size_t>(l.rows * l.K)));
  gather_patches_channels_last(g, l, x, p);
  stream_rows(static_cast<int>(l.rows), p, l.K, w_taps_first, g.M, b, relu, y);
}

bool prefer_conv_gemm(const ConvGeometry& g) {
  return !du::has_avx512() && g.G == 1 && g.rank() >= 1 && g.out_size() <= kMaxOutputPositions;
}

bool prefer_conv_gemm_channels_last(const ConvGeometry& g) {
  return !du::has_avx512() && g.G == 1 && g.rank() >= 1 && g.out_size() <= kMaxOutputPositionsChannelsLast &&
         g.N >= kMinImagesChannelsLast;
}

void conv_gemm_forward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                       bool relu) {
  const Lowered l(g);
  float* p = reinterpret_cast<float*>(du::thread_scratch(sizeof(float) * static_cast<size_t>(l.rows * (l.K + g.M))));
  float* product = p + l.rows * l.K;
  gather_patches(g, l, x, p);
  sgemm('N', 'T', l.rows, g.M, l.K, p, l.K, w, l.K, product, g.M);
  parallel_for(g.N, std::max<int64_t>(1, kParallelGrain / (g.M * l.out_size)), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m = 0; m < g.M; ++m) {
        float* dst = y + (n * g.M + m) * l.out_size;
        const float bias = b ? b[m] : 0.0f;
        for (int64_t o = 0; o < l.out_size; ++o) {
          const float v = product[(n * l.out_size + o) * g.M + m] + bias;
          dst[o] = relu ? ops::relu(v) : v;
        }
      }
    }
  });
}

void conv_gemm_forward_channels_last(const ConvGeometry& g, const float* x, const float* w_taps_first,
                                     const float* b, float* y, bool relu) {
  const Lowered l(g);
  float* p = reinterpret_cast<float*>(du::thread_scratch(sizeof(float) * static_cast<size_t>(l.rows * l.K)));
  gather_patches_channels_last(g, l, x, p);
  sgemm('N', 'T', l.rows, g.M, l.K, p, l.K, w_taps_first, l.K, y, g.M);
  if (!b && !relu) return;
  parallel_for(l.rows, std::max<int64_t>(1, kParallelGrain / g.M), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* __restrict row = y + r * g.M;
      for (int64_t m = 0; m < g.M; ++m) {
        const float v = row[m] + (b ? b[m] : 0.0f);
        row[m] = relu ? ops::relu(v) : v;
      }
    }
  });
}

bool prefer_weight_grad_per_image(const ConvGeometry& g) {
  return !du::has_avx512() && g.G == 1 && g.rank() >= 1 && g.C == 1;
}

void conv_gemm_weight_grad_per_image(const ConvGeometry& g, const float* dy, const float* x, float* dw, float* db) {
  const Lowered l(g);
  // P_n's rows carry a column of ones after their K patch elements when db is wanted, so the
  // same product sums dY_n's rows into column K of the [M, K + 1] sum.
  const int64_t cols = l.K + (db ? 1 : 0);
  const int64_t threads = std::min<int64_t>(available_threads(), g.N);
  std::vector<float> sums(static_cast<size_t>(threads * g.M * cols));
  std::atomic<int> failed{dnnl_success};  // a failing sgemm's status, thrown after the region
  parallel_for(threads, 1, [&](int64_t begin, int64_t end) {
    float* p = reinterpret_cast<float*>(du::thread_scratch(sizeof(float) * static_cast<size_t>(l.out_size * cols)));
    if (db) {
      for (int64_t o = 0; o < l.out_size; ++o) p[o * cols + l.K] = 1.0f;
    }
    for (int64_t t = begin; t < end; ++t) {
      float* sum = sums.data() + t * g.M * cols;
      const int64_t first = g.N * t / threads, last = g.N * (t + 1) / threads;
      for (int64_t n = first; n < last; ++n) {
        for (int64_t o = 0; o < l.out_size; ++o) gather_patch_row(g, l, x, n, l.offsets.data() + o * l.taps, p + o * cols);
        // sum [M, cols] (+)= dY_n [M, O] P_n [O, cols]; inside the parallel region sgemm runs on this thread.
        const dnnl_status_t status = row_major_sgemm('N', 'N', g.M, cols, l.out_size, 1.0f, dy + n * g.M * l.out_size,
                                                     l.out_size, p, cols, n == first ? 0.0f : 1.0f, sum, cols);
        if (status != dnnl_success) failed = status;
      }
    }
  });
  du::check_status(static_cast<dnnl_status_t>(failed.load()), "run sgemm for a convolution's weight gradient");
  for (int64_t m = 0; m < g.M; ++m) {
    for (int64_t k = 0; k < cols; ++k) {
      float v = 0.0f;
      for (int64_t t = 0; t < threads; ++t) v += sums[static_cast<size_t>((t * g.M + m) * cols + k)];
      if (k < l.K) {
        dw[m * l.K + k] = v;
      } else {
        db[m] = v;
      }
    }
  }
}

void conv_gemm_backward(const ConvGeometry& g, const float* dy, const float* x, const float* w, float* dx,
                        float* dw) {
  if (!dx && !dw) return;
  const Lowered l(g);
  // dY's rows, then P (dW) or dP (dX), one after the other: both are [rows, K].
  float* dy_rows =
      reinterpret_cast<float*>(du::thread_scratch(sizeof(float) * static_cast<size_t>(l.rows * (g.M + l.K))));
  float* patches = dy_rows + l.rows * g.M;
  output_rows(g, l, dy, dy_rows);
  if (dw) {
    gather_patches(g, l, x, patches);
    sgemm('T', 'N', g.M, l.K, l.rows, dy_rows, g.M, patches, l.K, dw, l.K);
  }
  if (dx) {
    sgemm('N', 'N', l.rows, l.K, g.M, dy_rows, g.M, w, l.K, patches, l.K);
    scatter_patches(g, l, patches, dx);
  }
}

}  // namespace onnxtrain::ops
