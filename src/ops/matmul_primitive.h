// oneDNN's matmul primitive planned once and run on new buffers every call, shared by the
// float32 products of matmul.cpp (MatMul, Gemm, MatMulAdd, ...) and rnn.cpp (the recurrent
// layers' weight gradients), and the rules that send a transposed-A product to it or through its
// transpose.
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <unordered_map>

namespace onnxtrain::ops {

// A primitive with the memory objects of its arguments, rebound to new buffers on every run.
struct MatMulEntry {
  bool use_reference = false;  // oneDNN has no implementation for these shapes
  dnnl::matmul primitive;
  dnnl::memory src, weights, bias, dst;        // bias: only when planned with one
  std::unordered_map<int, dnnl::memory> args;  // the memories above by role
};

// Plans dst = src x weights (+ bias) with `attr` (output scales, post-ops). `bias`: a zero desc
// (the default) for none, else the bias the primitive adds in its epilogue. An entry with
// use_reference set when oneDNN has no implementation; throws Error when it fails otherwise.
MatMulEntry make_entry(const dnnl::memory::desc& src, const dnnl::memory::desc& weights,
                       const dnnl::memory::desc& dst, const dnnl::primitive_attr& attr,
                       const dnnl::memory::desc& bias = {});

// Runs a planned entry on these buffers (float32, laid out as the entry's descriptors say);
// `bias`: for an entry planned with one. Throws Error when oneDNN fails.
void execute(MatMulEntry& entry, const float* a, const float* b, float* y, const float* bias = nullptr);

// Whether C [M, N] = A^T B over K rows (A stored [K, M], B [K, N], row-major) runs faster through
// oneDNN's matmul primitive, A described by strides, than through sgemm with a transposed A: for
// large outputs with more rows than columns, such as a weight gradient dW = dY^T X of a layer
// whose outputs outnumber its inputs (BERT's first feed-forward layer, 1024 x 256 over 4096 rows)
// or a recurrent layer's dW and dR (gates x hidden by input or hidden, over seq x batch rows).
// Measured alone on this project's two EPYC cores (the fastest of 10, bench/bench_gemm.cpp):
// [1024, 256] over 4096 rows 4.7-5.1 ms against 5.5-7.0; [1024, 32] 0.74-0.75 against 0.70-0.72
// and [256, 1024] (fewer rows than columns) 5.4 against 4.6, so those keep sgemm.
// CPUs without AVX-512 answer false: there oneDNN's matmul primitive runs the same sgemm
// (gemm:jit), and transposed_a_prefers_swap decides.
bool transposed_a_prefers_matmul(int64_t M, int64_t N, int64_t K);

// Whether C [M, N] = A^T B over K rows (A stored [K, M], B [K, N]) runs faster as its transpose,
// C^T = B^T A (the same sgemm with a transposed A, N x M), written into a buffer and transposed
// into C, than directly. On CPUs without AVX-512, oneDNN 2.6's sgemm with a transposed A runs at
// about half its speed when M outnumbers N (AMD EPYC Zen 3, 2 threads, the fastest of 7 alone:
// [1024, 256] over 4096 rows 37.9 ms against 21.8 the swapped way with its transpose, [1024, 128]
// 19.9 against 10.5, [512, 256] 14.4 against 10.2, [1024, 32] 5.4 against 4.8), and not when
// N is larger ([1024, 512] 34.9 against 36.1), M small ([256, 32] 0.55 against 0.59) or K short
// ([512, 128] over 128 rows 0.18 against 0.19). Such products are the weight gradients of
// layers with more outputs than inputs: BERT's first feed-forward layers, the LSTM's dW and dR.
// False with AVX-512 (transposed_a_prefers_matmul decides there).
bool transposed_a_prefers_swap(int64_t M, int64_t N, int64_t K);

// C [M, N] (row stride ldc) = alpha A^T B + beta C the way transposed_a_prefers_swap describes:
// A stored [K, M] (row stride lda), B [K, N] (ldb), float32; beta = 0 does not read C. The
// transpose C^T lives in a buffer of the calling thread (M N floats, kept for its next call).
// Throws Error when oneDNN fails.
void swapped_transposed_a_product(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace onnxtrain::ops
