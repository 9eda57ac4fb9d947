// oneDNN's matmul primitive planned once and run on new buffers every call, shared by the
// float32 products of matmul.cpp (MatMul, Gemm, MatMulAdd, ...) and rnn.cpp (the recurrent
// layers' weight gradients), and the rule that sends a transposed-A product to it.
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
inline bool transposed_a_prefers_matmul(int64_t M, int64_t N, int64_t K) {
  return N >= 128 && M > N && M * N * K >= (int64_t{1} << 26);
}

}  // namespace onnxtrain::ops
