// oneDNN's matmul primitive planned once and run on new buffers every call, shared by the
// float32 products of matmul.cpp (MatMul, Gemm, MatMulAdd, ...) and rnn.cpp (the recurrent
// layers' weight gradients), the rules that send a transposed-A product to it or through its
// transpose, and row_major_sgemm, the entry to oneDNN's sgemm of every float32 product that
// does not run through a primitive (matmul.cpp, rnn.cpp, conv_gemm.cpp, attention_common.cpp).
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

// Whether C [M, N] = A B^T (A stored [M, K], B [N, K], row-major) runs faster through oneDNN's
// matmul primitive, B described by strides, than through sgemm with a transposed B: from 32 to
// 512 rows, where oneDNN 2.6's sgemm splits the work poorly between threads, such as a recurrent
// layer's input projection at batch 1 (X W^T over the sequence). Measured alone (AMD EPYC Zen 4,
// the fastest of 30, bench/bench_gemm.cpp; 2 threads, then 1): [64, 256] by [1024, 256]^T 163
// against 230 us, 311 against 330; [64, 32] by [1024, 32]^T 24 against 28, 41 against 41; 512 rows
// of 256 by 1024: 1.18 against 1.25 ms. Not at 8 rows (36 against 21 us) nor 4096 (10.0 against
// 9.6 ms). CPUs without AVX-512 answer false, as for transposed_a_prefers_matmul.
bool transposed_b_prefers_matmul(int64_t M, int64_t N, int64_t K);

// Whether C [M, N] = A^T B over K rows (A stored [K, M], B [K, N]) runs faster as its transpose,
// C^T = B^T A (the same sgemm with a transposed A, N x M), written into a buffer and transposed
// into C, than directly. On CPUs without AVX-512, oneDNN 2.6's sgemm with a transposed A runs at
// about half its speed when M outnumbers N (AMD EPYC Zen 3, 2 threads, the fastest of 7 alone:
// [1024, 256] over 4096 rows 37.9 ms against 21.8 the swapped way with its transpose, [1024, 128]
// 19.9 against 10.5, [512, 256] 14.4 against 10.2, [1024, 32] 5.4 against 4.8), and not when
// N is larger ([1024, 512] 34.9 against 36.1), M small ([256, 32] 0.55 against 0.59) or K short
// ([512, 128] over 128 rows 0.18 against 0.19). Such products are the weight gradients of
// layers with more outputs than inputs: BERT's first feed-forward layers, the LSTM's dW and dR.
// The swapped product reads A as its B, which runs at the faster of those speeds only from an
// address that is not a multiple of 32 bytes (unaligned_b_is_faster: 33-35 ms from an aligned
// one); row_major_sgemm, which runs it, sees to that. (The slow direct product is A's row stride
// of M floats, a multiple of 2 KiB at these shapes: padded_transposed_a_is_faster. Reading A from
// a copy with longer rows instead was about as fast at [1024, 256], [1024, 128] and [512, 256]
// over 4096 rows, 17.0-19.8 against 19.0-21.1 ms at [1024, 256], and slower at [1024, 32], 3.9-4.4
// against 3.2-3.5, so the swap stays where this rule holds.)
// False with AVX-512 (transposed_a_prefers_matmul decides there).
bool transposed_a_prefers_swap(int64_t M, int64_t N, int64_t K);

// C [M, N] (row stride ldc) = alpha A^T B + beta C the way transposed_a_prefers_swap describes:
// A stored [K, M] (row stride lda), B [K, N] (ldb), float32; beta = 0 does not read C. The
// transpose C^T lives in a buffer of the calling thread (M N floats, kept for its next call).
// Throws Error when oneDNN fails.
void swapped_transposed_a_product(int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether oneDNN 2.6's sgemm computes C [M, N] = op(A) B, B plain ([K, N], row stride ldb), faster
// when B's address is not a multiple of 32 bytes. Without AVX-512 that sgemm reads such a B in
// place in its no-copy kernels (which it takes when 1/M + 1/N >= 0.0038), and they run at 55-65 %
// of the speed they reach on the same B one float further on when the row stride is a multiple
// of 2 KiB (ldb % 512 == 0): AMD EPYC Zen 3, 2 threads, the fastest of 5 in one process,
// direct against shifted (row_major_sgemm): A^T B [256, 1024] over 4096 rows 33.3 against
// 20.8 ms, A B [256, 1024] over 4096 29.9 against 18.3, [64, 1024] over 256 (an LSTM step's
// product) 0.50 against 0.28, [128, 512] over 784 1.09 against 0.81, [512, 512] over 1024 5.8
// against 4.4; the same at 1 thread. Not faster, so false: strides not a multiple of 2 KiB (N
// 3136: 0.90-0.93x; 768, 1280, 2304: 0.98-1.01x), outputs past that threshold ([4096, 1024]
// over 256 0.95x, [512, 1024] 0.90-1.02x), fewer than 32 rows (2-16 rows: 0.60-0.78x), fewer
// than 512 columns, and CPUs with AVX-512 (another sgemm; not measured there).
bool unaligned_b_is_faster(int64_t M, int64_t N, int64_t ldb);

// Whether oneDNN 2.6's sgemm computes C [M, N] = A^T B (A stored [K, M], row stride lda) faster
// from a copy of A whose row stride is not a multiple of 2 KiB. Without AVX-512, in the no-copy
// kernels it takes when 1/M + 1/N >= 0.0038, it reads A^T in place, and with lda % 512 == 0 it
// runs at 50-80 % of the speed it reaches on the same A with rows 16 floats longer, whatever A's
// address (the row stride, not the address, is what matters here, unlike B's). AMD EPYC Zen 3,
// 2 threads, the fastest of 13 alone, direct against copied (the copy included): [512, 512] over
// 128 rows (the Fashion-MNIST MLP's second weight gradient) 0.59-0.70 against 0.47-0.57 ms, over
// 1024 rows 5.4-5.8 against 4.3-4.5, [2048, 128] over 128 1.05 against 0.56-0.62, [1024, 256]
// over 512 4.3 against 2.1-2.2, [512, 300] over 128 0.38 against 0.27-0.30; at 1 thread
// 1.3-2.4x likewise. Not faster, so false: outputs past the threshold ([512, 784] or [1024,
// 3136] over 128: 0.98-1.02x), strides not a multiple of 2 KiB, fewer than 32 rows (not
// measured), CPUs with AVX-512. transposed_a_prefers_swap is asked first where both hold.
bool padded_transposed_a_is_faster(int64_t M, int64_t N, int64_t lda);

// C [M, N] (row stride ldc) = alpha op(A) op(B) + beta C through oneDNN's sgemm, all row-major,
// float32: op(A) = A^T of A stored [K, M] (row stride lda) when trans_a is 'T', else A [M, K];
// op(B) likewise ('T': B stored [N, K]). beta = 0 does not read C. Where
// padded_transposed_a_is_faster says so, op(A) = A^T is read from a copy of A with rows 16 floats
// longer than M (or 32 where that length is a multiple of 512), kept in a buffer of the calling
// thread for its next call (K rows, at most 16 MiB); when the copy would be larger or the buffer
// cannot be had, A is read as given. Where
// unaligned_b_is_faster says so and B's address is a multiple of 32 bytes, it runs as two
// products: columns 1..N-1 with B read from one float further on (B + 1, not 32-byte aligned)
// and column 0 on its own (a matrix-vector product, which reads op(A) once more). Returns
// oneDNN's status and throws nothing, so it may run inside a parallel region (where oneDNN and
// the copy use the calling thread only).
dnnl_status_t row_major_sgemm(char trans_a, char trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                              int64_t ldc) noexcept;

}  // namespace onnxtrain::ops
