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
// and the float32 Tanh and Sigmoid gate activations of LSTM / GRU / RNN (ops/rnn_common.h `activate`).
//
// Every function: y[i] = f(x[i]) for i in [0, n), n >= 0 (any n: the tail is handled); x == y
// (in place) is allowed, other overlaps are not. Single-threaded: callers split the range.
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
// Special values: NaN in gives NaN out; exp(-inf) = 0, exp(+inf) = inf, e^x overflows to inf
// for x > 88.72 and underflows through the subnormals to 0 below -103.97; sigmoid(-inf) = 0,
// sigmoid(+inf) = 1; tanh(+-inf) = +-1; erf(+-inf) = +-1; tanh and erf keep the sign of zero
// and are odd; subnormal inputs are computed, not flushed.
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
