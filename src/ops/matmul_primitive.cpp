#include "ops/matmul_primitive.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "ops/dnnl_util.h"

namespace onnxtrain::ops {

namespace du = dnnl_util;

MatMulEntry make_entry(const dnnl::memory::desc& src, const dnnl::memory::desc& weights,
                       const dnnl::memory::desc& dst, const dnnl::primitive_attr& attr,
                       const dnnl::memory::desc& bias) {
  MatMulEntry entry;
  const dnnl::engine& engine = du::cpu_engine();
  const bool has_bias = !bias.is_zero();
  try {
    dnnl::matmul::primitive_desc pd(has_bias ? dnnl::matmul::desc(src, weights, bias, dst)
                                             : dnnl::matmul::desc(src, weights, dst),
                                    attr, engine);
    entry.primitive = dnnl::matmul(pd);
  } catch (const dnnl::error&) {  // no implementation for these shapes: use the reference
    entry.use_reference = true;
    return entry;
  }
  du::checked("prepare matmul memories", [&] {
    entry.src = dnnl::memory(src, engine, nullptr);
    entry.weights = dnnl::memory(weights, engine, nullptr);
    entry.dst = dnnl::memory(dst, engine, nullptr);
    if (has_bias) entry.bias = dnnl::memory(bias, engine, nullptr);
  });
  entry.args = {
      {DNNL_ARG_SRC, entry.src}, {DNNL_ARG_WEIGHTS, entry.weights}, {DNNL_ARG_DST, entry.dst}};
  if (has_bias) entry.args[DNNL_ARG_BIAS] = entry.bias;
  return entry;
}

void execute(MatMulEntry& entry, const float* a, const float* b, float* y, const float* bias) {
  dnnl::stream& stream = du::cpu_stream();
  du::checked("run a matmul", [&] {
    entry.src.set_data_handle(const_cast<float*>(a));
    entry.weights.set_data_handle(const_cast<float*>(b));
    entry.dst.set_data_handle(y);
    if (bias) entry.bias.set_data_handle(const_cast<float*>(bias));
    entry.primitive.execute(stream, entry.args);
    stream.wait();
  });
}

bool transposed_a_prefers_matmul(int64_t M, int64_t N, int64_t K) {
  return du::has_avx512() && N >= 128 && M > N && M * N * K >= (int64_t{1} << 26);
}

bool transposed_b_prefers_matmul(int64_t M, int64_t N, int64_t K) {
  return du::has_avx512() && M >= 32 && M <= 512 && N * K >= 32768;
}

bool transposed_a_prefers_swap(int64_t M, int64_t N, int64_t K) {
  return !du::has_avx512() && N <= 256 && M >= 2 * N && M >= 512 && K >= 1024;
}

void swapped_transposed_a_product(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> transposed;  // C^T [N, M]
  transposed.resize(static_cast<size_t>(M * N));
  float* ct = transposed.data();
  du::check_status(row_major_sgemm('T', 'N', N, M, K, alpha, b, ldb, a, lda, 0.0f, ct, M), "run sgemm");
  // C = C^T transposed (+ beta C), in tiles of 32 x 32 so that both sides stay in cache.
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (M + kTile - 1) / kTile, col_tiles = (N + kTile - 1) / kTile;
  parallel_for(row_tiles * col_tiles, std::max<int64_t>(1, kParallelGrain / (kTile * kTile)),
               [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t m0 = tile / col_tiles * kTile, n0 = tile % col_tiles * kTile;
      const int64_t m1 = std::min(M, m0 + kTile), n1 = std::min(N, n0 + kTile);
      for (int64_t m = m0; m < m1; ++m) {
        float* __restrict row = c + m * ldc;
        if (beta == 0.0f) {
          for (int64_t n = n0; n < n1; ++n) row[n] = ct[n * M + m];
        } else {
          for (int64_t n = n0; n < n1; ++n) row[n] = ct[n * M + m] + beta * row[n];
        }
      }
    }
  });
}

bool unaligned_b_is_faster(int64_t M, int64_t N, int64_t ldb) {
  return !du::has_avx512() && M >= 32 && N >= 512 && ldb % 512 == 0 && 1.0 / M + 1.0 / N >= 0.0038;
}

bool padded_transposed_a_is_faster(int64_t M, int64_t N, int64_t lda) {
  return !du::has_avx512() && M >= 32 && lda % 512 == 0 && 1.0 / M + 1.0 / N >= 0.0038;
}

namespace {

// The largest copy row_major_sgemm keeps per thread: 16 MiB.
constexpr int64_t kMaxPaddedFloats = int64_t{1} << 22;

// A [K, M] (row stride lda) copied into `padded` with rows of M + 16 floats (M + 32 where that
// is a multiple of 512); returns the new row stride, or 0 when the copy would exceed
// kMaxPaddedFloats or the buffer cannot be allocated.
int64_t copy_with_padded_rows(const float* a, int64_t lda, int64_t K, int64_t M, std::vector<float>& padded) noexcept {
  int64_t stride = M + 16;
  if (stride % 512 == 0) stride += 16;
  if (K > kMaxPaddedFloats / stride) return 0;
  try {
    padded.resize(static_cast<size_t>(K * stride));
  } catch (...) {  // std::bad_alloc, std::length_error
    return 0;
  }
  float* out = padded.data();
  parallel_for(K, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(M, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) std::copy_n(a + k * lda, M, out + k * stride);
  });
  return stride;
}

}  // namespace

dnnl_status_t row_major_sgemm(char trans_a, char trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                              int64_t ldc) noexcept {
  if ((trans_a == 'T' || trans_a == 't') && K > 0 && padded_transposed_a_is_faster(M, N, lda)) {
    thread_local std::vector<float> padded;
    if (const int64_t stride = copy_with_padded_rows(a, lda, K, M, padded); stride > 0) {
      a = padded.data();
      lda = stride;
    }
  }
  const bool plain_b = trans_b == 'N' || trans_b == 'n';
  if (!plain_b || K == 0 || reinterpret_cast<std::uintptr_t>(b) % 32 != 0 || !unaligned_b_is_faster(M, N, ldb)) {
    return dnnl_sgemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  const dnnl_status_t rest = dnnl_sgemm(trans_a, 'N', M, N - 1, K, alpha, a, lda, b + 1, ldb, beta, c + 1, ldc);
  if (rest != dnnl_success) return rest;
  return dnnl_sgemm(trans_a, 'N', M, 1, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace onnxtrain::ops
