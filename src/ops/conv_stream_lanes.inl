// The lane code of conv_gemm.h's conv_stream_forward_channels_last: y[r, m] = b[m] + P[r] . W[m]
// for a few patches P against groups of rows of W. Included by conv_gemm.cpp (kLanes = 8, kGroup =
// 3: twelve sums, three rows and a patch in AVX2's 16 registers) and by conv_stream_avx512.cpp
// (16 and 6: 24 sums in AVX-512's 32, compiled for x86-64-v4), each time inside an anonymous
// namespace that defines `constexpr int kLanes` and `constexpr int kGroup` first. It calls no
// library function or template, for the reason core/vector_math_lanes.inl gives (an AVX-512 copy
// of a library inline function could be the one the linker keeps for every caller); so Relu is
// written out here rather than taken from ops/relu.h.
//
// Each row's sums: kLanes-lane partial sums over K, the lanes added pairwise (lane i with
// i + kLanes / 2, ... down to four, then (0 + 2) + (1 + 3)), then the K % kLanes rest in order.

typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));

inline Floats load_lanes(const float* p) {
  Floats v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline float lane_sum(const Floats& a) {
  float h[kLanes];
  for (int i = 0; i < kLanes; ++i) h[i] = a[i];
  for (int width = kLanes / 2; width >= 4; width /= 2) {
    for (int i = 0; i < width; ++i) h[i] += h[i + width];
  }
  return (h[0] + h[2]) + (h[1] + h[3]);
}

// y[r, m0 + j] (y is [R, M]) for the Rows rows of W [M, K] from m0 against the R patches of
// P [R, K], Relu after when `relu` (NaN kept: v < 0 is false for it; -0 kept). Out of line: GCC
// inlined the 8-lane one-patch groups into stream_group_range and that ran 512 -> 512 on 1x1 maps
// 12x slower (0.24 against 0.02 ms a run, onnxtrain-bench-infer, 2026-12-02).
template <int R, int Rows>
__attribute__((noinline)) void stream_group(const float* p, int64_t K, const float* w, int64_t M, int64_t m0, const float* b, bool relu,
                  float* y) {
  Floats acc[Rows][R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    Floats wv[Rows];
    for (int j = 0; j < Rows; ++j) wv[j] = load_lanes(w + (m0 + j) * K + k);
    for (int r = 0; r < R; ++r) {
      const Floats pv = load_lanes(p + r * K + k);
      for (int j = 0; j < Rows; ++j) acc[j][r] += wv[j] * pv;
    }
  }
  for (int j = 0; j < Rows; ++j) {
    const float* wr = w + (m0 + j) * K;
    for (int r = 0; r < R; ++r) {
      const float* pr = p + r * K;
      float sum = lane_sum(acc[j][r]);
      for (int64_t kk = k; kk < K; ++kk) sum += pr[kk] * wr[kk];
      const float v = sum + (b ? b[m0 + j] : 0.0f);
      y[r * M + m0 + j] = relu && v < 0.0f ? 0.0f : v;
    }
  }
}

// stream_group for the `rows` (1 to Rows) rows from m0: the last group of M may be shorter.
template <int R, int Rows = kGroup>
void stream_group_of(int64_t rows, const float* p, int64_t K, const float* w, int64_t M, int64_t m0,
                     const float* b, bool relu, float* y) {
  if constexpr (Rows > 1) {
    if (rows < Rows) return stream_group_of<R, Rows - 1>(rows, p, K, w, M, m0, b, relu, y);
  }
  stream_group<R, Rows>(p, K, w, M, m0, b, relu, y);
}

// The groups [begin, end) of kGroup rows of W against the `patches` (1 to 4) rows of P.
inline void stream_group_range(int patches, const float* p, int64_t K, const float* w, int64_t M, int64_t begin,
                               int64_t end, const float* b, bool relu, float* y) {
  for (int64_t g = begin; g < end; ++g) {
    const int64_t m0 = g * kGroup, rows = M - m0 < kGroup ? M - m0 : kGroup;
    switch (patches) {
      case 1: stream_group_of<1>(rows, p, K, w, M, m0, b, relu, y); break;
      case 2: stream_group_of<2>(rows, p, K, w, M, m0, b, relu, y); break;
      case 3: stream_group_of<3>(rows, p, K, w, M, m0, b, relu, y); break;
      default: stream_group_of<4>(rows, p, K, w, M, m0, b, relu, y); break;
    }
  }
}
