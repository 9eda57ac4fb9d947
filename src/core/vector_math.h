// Vectorized float32 transcendental functions over arrays (issue 18): GCC does not vectorize
// calls to std::exp / std::tanh / std::erf without -ffast-math (which onnxtrain does not use),
// and glibc's scalar expf/tanhf/erff took 21 % of the LSTM training step. These run 8 lanes at a
// time (one AVX register under the default x86-64-v3 build, two SSE registers in a portable
// build, same results either way up to FMA contraction), or 16 (one AVX-512 register) where the
// build has the x86-64-v4 variant (core/vector_math_avx512.cpp, built beside the default one when
// the compiler takes -march=x86-64-v4) and the CPU runs AVX-512: see lanes(). On this project's
// AMD EPYC, one core: erf 0.90 -> 0.46 ns per element, exp 0.38 -> 0.21, tanh 0.62 -> 0.34,
// sigmoid 0.49 -> 0.27. Both variants do the same arithmetic per lane: in the project's build
// they gave the same bits for each of 1.2 M inputs compared (every multiple of 2^-10 in
// [-100, 100] and 10^6 random floats), but another compiler or flags may contract into FMA
// differently, so the tests hold each variant to the bounds below rather than to the other's bits.
//
// Callers: ops/elementwise_unary.cpp (float32 Exp, Sigmoid, Tanh, Erf; other dtypes keep std::),
// the float32 Tanh and Sigmoid gate activations of LSTM / GRU / RNN (ops/rnn_common.h `activate`),
// and float32 Gelu and GeluGrad (ops/activation.cpp).
//
// Every function: y[i] = f(x[i]) (gelu_backward: dx[i] = f(dy[i], x[i])) for i in [0, n), n >= 0
// (any n: the tail is handled); x == y (in place) is allowed, other overlaps are not.
// Single-threaded: callers split the range.
//
// Accuracy: the bound each test asserts, in units in the last place (ulp) of the exact value's
// binade (below FLT_MIN one ulp is 2^-149), and the largest error measured against the function
// in float64 by tests/unit/vector_math_test.cpp over every multiple of 2^-10 in [-100, 100], 512
// floats in every binade from 2^-149 to 2^7 of both signs, and 10^6 random bit patterns, in the
// x86-64-v3 build (FMA contracted; 16 lanes: the same maxima) and in a portable x86-64 build:
//   exp      <= 1.5 ulp  (measured 0.98, portable 0.97)
//   sigmoid  <= 2.5 ulp  (measured 2.02, portable 2.02)  1 / (1 + e^-x); e^x / (1 + e^x) for x < 0
//   tanh     <= 2 ulp    (measured 1.25, portable 1.25)  relative, tiny |x| included
//   erf      <= 1.5 ulp  (measured 0.90, portable 1.04)  relative, tiny |x| included
//   gelu     <= 8 + x^2 / 2 ulp (measured 6.9 for x >= -4, 63.8 at x = -12.3):
//            the rounding of x^2 in e^(-x^2 / 2) grows with x^2 in the lower tail
//   gelu_backward within 9 + x^2 / 2 ulp of |dy| times the larger of |Phi(x)| and |x phi(x)|
//            (the derivative is their sum and crosses 0 at x = -0.752, where no relative bound
//            holds; dy adds a rounding) (measured 60.4 at x = -12.9)
// Special values: NaN in gives NaN out; exp(-inf) = 0, exp(+inf) = inf, e^x overflows to inf
// for x > 88.72 and underflows through the subnormals to 0 below -103.97; sigmoid(-inf) = 0,
// sigmoid(+inf) = 1; tanh(+-inf) = +-1; erf(+-inf) = +-1; tanh and erf keep the sign of zero
// and are odd; gelu(+inf) = inf, gelu(-inf) = NaN and gelu_backward at +-inf NaN (inf times a
// zero density, as the formulas in float64 give), gelu(-0) = -0; subnormal inputs are computed,
// not flushed.
#pragma once

#include <cstdint>
#include <vector>

namespace onnxtrain::vmath {

// y = e^x.
void exp(const float* x, float* y, int64_t n);
// y = 1 / (1 + e^-x), the logistic sigmoid.
void sigmoid(const float* x, float* y, int64_t n);
// y = tanh(x).
void tanh(const float* x, float* y, int64_t n);
// y = erf(x) = 2/sqrt(pi) * integral from 0 to x of e^(-t^2) dt.
void erf(const float* x, float* y, int64_t n);
// y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), Phi the standard normal cumulative distribution:
// the ONNX Gelu op (Gelu-20, approximate "none"). Computed as 0.5 x erfc(-x / sqrt 2) from one
// e^(-x^2 / 2) (vector_math_lanes.inl normal_lanes), so it keeps its relative accuracy for x < 0.
void gelu(const float* x, float* y, int64_t n);
// dx = dy (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi): Gelu's derivative times dy,
// for ai.onnxtrain.GeluGrad. dx may be dy or x (in place); no other overlap.
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n);

// The lanes the functions above take per step in this process: 16 where the build has the
// x86-64-v4 variant and the CPU runs AVX-512 F, BW, CD, DQ and VL (checked once), else 8.
int lanes();
// The lane counts this build and CPU can run: {8}, or {8, 16}.
std::vector<int> available_lanes();
// Makes every later call in the process take `lanes` per step (for tests and comparisons; not
// to be called while another thread runs these functions). Throws std::invalid_argument for a
// count not in available_lanes().
void set_lanes(int lanes);

}  // namespace onnxtrain::vmath
