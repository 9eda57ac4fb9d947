// The 16-lane variant of conv_gemm.cpp's streaming convolution rows (conv_gemm.h,
// conv_stream_forward_channels_last): this file alone compiled for x86-64-v4 (src/CMakeLists.txt,
// where the compiler takes -march=x86-64-v4); conv_gemm.cpp calls it only when vmath::lanes() is
// 16, i.e. on CPUs that run AVX-512 F/BW/CD/DQ/VL. Nothing here may instantiate a library
// template or inline function: a copy compiled for AVX-512 could be the one the linker keeps for
// the whole program (the same rule as core/vector_math_avx512.cpp).
#include <cstdint>

namespace onnxtrain::ops::conv_stream_avx512 {

#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

constexpr int kLanes = 16;
// Rows of W a group: with four patches, 24 sums, 6 rows and a patch in AVX-512's 32 registers.
constexpr int kGroup = 6;

typedef float Floats __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

Floats load(const float* p) {
  Floats v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// The lanes of a added pairwise (lane i with lane i + 8, then i + 4, i + 2, i + 1).
float lane_sum(const Floats& a) {
  float h[8];
  for (int i = 0; i < 8; ++i) h[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) h[i] += h[i + 4];
  return (h[0] + h[2]) + (h[1] + h[3]);
}

// y[r, m0 + j] for the Rows rows of W from m0 against the R patches of P (conv_gemm.cpp's
// stream_group at 16 lanes).
template <int R, int Rows>
void group(const float* p, int64_t K, const float* w, int64_t M, int64_t m0, const float* b, bool relu,
           float* y) {
  Floats acc[Rows][R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    Floats wv[Rows];
    for (int j = 0; j < Rows; ++j) wv[j] = load(w + (m0 + j) * K + k);
    for (int r = 0; r < R; ++r) {
      const Floats pv = load(p + r * K + k);
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
      y[r * M + m0 + j] = relu && v < 0.0f ? 0.0f : v;  // NaN kept, as ops::relu
    }
  }
}

template <int R>
void groups(const float* p, int64_t K, const float* w, int64_t M, int64_t begin, int64_t end, const float* b,
            bool relu, float* y) {
  for (int64_t g = begin; g < end; ++g) {
    const int64_t m0 = g * kGroup, rows = M - m0 < kGroup ? M - m0 : kGroup;
    switch (rows) {
      case 6: group<R, 6>(p, K, w, M, m0, b, relu, y); break;
      case 5: group<R, 5>(p, K, w, M, m0, b, relu, y); break;
      case 4: group<R, 4>(p, K, w, M, m0, b, relu, y); break;
      case 3: group<R, 3>(p, K, w, M, m0, b, relu, y); break;
      case 2: group<R, 2>(p, K, w, M, m0, b, relu, y); break;
      default: group<R, 1>(p, K, w, M, m0, b, relu, y); break;
    }
  }
}

}  // namespace

int64_t group_rows() { return kGroup; }

void stream_groups(int patches, const float* p, int64_t K, const float* w, int64_t M, int64_t begin, int64_t end,
                   const float* b, bool relu, float* y) {
  switch (patches) {
    case 1: groups<1>(p, K, w, M, begin, end, b, relu, y); break;
    case 2: groups<2>(p, K, w, M, begin, end, b, relu, y); break;
    case 3: groups<3>(p, K, w, M, begin, end, b, relu, y); break;
    default: groups<4>(p, K, w, M, begin, end, b, relu, y); break;
  }
}

}  // namespace onnxtrain::ops::conv_stream_avx512
