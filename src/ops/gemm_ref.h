// Reference matrix products for the element types oneDNN does not cover (float64, integers),
// for shapes it cannot express, and for the im2col reference convolution. Loops run in i-k-j
// order (contiguous inner loop over output columns) and in parallel over output rows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"

namespace onnxtrain::ops {

// Accumulator type: floating types accumulate in themselves (float16/bfloat16 never get here);
// integers in an unsigned type of at least 32 bits, so that overflow wraps modulo 2^n as in
// numpy instead of being undefined behaviour.
template <class T, bool = std::is_floating_point_v<T>>
struct GemmAcc {
  using type = T;
};
template <class T>
struct GemmAcc<T, false> {
  using type =
      std::make_unsigned_t<std::conditional_t<(sizeof(T) < 4), int32_t, std::make_signed_t<T>>>;
};
template <class T>
using gemm_acc_t = typename GemmAcc<T>::type;

// For every batch b and row i of M:  y_b[i, :] = sum_k a_b[i, k] * b_b[k, :],
// with a_b = a + a_offsets[b] (row-major [M, K]), b_b = b + b_offsets[b] (row-major [K, N]) and
// y_b = y + b * M * N (row-major [M, N]). K may be 0 (rows of zeros).
template <class T>
void batched_matmul_ref(const T* a, std::span<const int64_t> a_offsets, const T* b,
                        std::span<const int64_t> b_offsets, T* y, int64_t M, int64_t K, int64_t N) {
  using Acc = gemm_acc_t<T>;
  const int64_t rows = static_cast<int64_t>(a_offsets.size()) * M;
  if (rows == 0 || N == 0) return;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, K * N));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc(static_cast<size_t>(N));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t batch = r / M;
      const int64_t i = r - batch * M;
      const T* a_row = a + a_offsets[static_cast<size_t>(batch)] + i * K;
      const T* b_mat = b + b_offsets[static_cast<size_t>(batch)];
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t k = 0; k < K; ++k) {
        const Acc av = static_cast<Acc>(a_row[k]);
        const T* b_row = b_mat + k * N;
        for (int64_t j = 0; j < N; ++j)
          acc[static_cast<size_t>(j)] += av * static_cast<Acc>(b_row[j]);
      }
      T* y_row = y + r * N;
      for (int64_t j = 0; j < N; ++j) y_row[j] = static_cast<T>(acc[static_cast<size_t>(j)]);
    }
  });
}

// y = a · b for one row-major [M, K] · [K, N] product.
template <class T>
void matmul_ref(const T* a, const T* b, T* y, int64_t M, int64_t K, int64_t N) {
  const int64_t zero[1] = {0};
  batched_matmul_ref<T>(a, zero, b, zero, y, M, K, N);
}

// A row-major copy of the transpose of the row-major [rows, cols] matrix m.
template <class T>
std::vector<T> transposed(const T* m, int64_t rows, int64_t cols) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = m[i * cols + j];
  }
  return t;
}

}  // namespace onnxtrain::ops
