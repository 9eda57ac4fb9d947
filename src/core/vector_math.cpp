// The array functions of core/vector_math.h: the 8-lane variant (vector_math_lanes.inl with
// kW = 8, compiled like the rest of the project), the 16-lane variant where the build has
// vector_math_avx512.cpp (ONNXTRAIN_VMATH_AVX512), and the choice between them.
#include "core/vector_math.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace onnxtrain::vmath {

// Vectors cross only the inlined helpers and lambdas of the lane code, never a real call. (For
// the whole file: GCC reports these at the end of the translation unit, past any pop.)
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {
constexpr int kW = 8;
#include "core/vector_math_lanes.inl"
}  // namespace

#if defined(ONNXTRAIN_VMATH_AVX512)
// vector_math_avx512.cpp (compiled for x86-64-v4): only ever called when avx512_runs().
namespace avx512 {
void exp(const float* x, float* y, int64_t n);
void sigmoid(const float* x, float* y, int64_t n);
void tanh(const float* x, float* y, int64_t n);
void erf(const float* x, float* y, int64_t n);
void gelu(const float* x, float* y, int64_t n);
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n);
}  // namespace avx512
#endif

namespace {

// Whether this build has the 16-lane variant and this CPU runs what x86-64-v4 code may use
// (AVX-512 F, BW, CD, DQ and VL); asked once.
bool avx512_runs() {
#if defined(ONNXTRAIN_VMATH_AVX512)
  static const bool runs = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512vl");
  return runs;
#else
  return false;
#endif
}

std::atomic<int>& active() {
  static std::atomic<int> lanes{avx512_runs() ? 16 : 8};
  return lanes;
}

}  // namespace

int lanes() { return active().load(std::memory_order_relaxed); }

std::vector<int> available_lanes() {
  if (avx512_runs()) return {8, 16};
  return {8};
}

void set_lanes(int lanes) {
  if (lanes != 8 && !(lanes == 16 && avx512_runs())) {
    throw std::invalid_argument("vmath::set_lanes(" + std::to_string(lanes) +
                                "): this build and CPU run 8 lanes" + (avx512_runs() ? " or 16" : ""));
  }
  active().store(lanes, std::memory_order_relaxed);
}

#if defined(ONNXTRAIN_VMATH_AVX512)
#define ONNXTRAIN_VMATH_DISPATCH(f) \
  if (lanes() == 16) return avx512::f(x, y, n); \
  f##_n(x, y, n)
#else
#define ONNXTRAIN_VMATH_DISPATCH(f) f##_n(x, y, n)
#endif

void exp(const float* x, float* y, int64_t n) { ONNXTRAIN_VMATH_DISPATCH(exp); }
void sigmoid(const float* x, float* y, int64_t n) { ONNXTRAIN_VMATH_DISPATCH(sigmoid); }
void tanh(const float* x, float* y, int64_t n) { ONNXTRAIN_VMATH_DISPATCH(tanh); }
void erf(const float* x, float* y, int64_t n) { ONNXTRAIN_VMATH_DISPATCH(erf); }
void gelu(const float* x, float* y, int64_t n) { ONNXTRAIN_VMATH_DISPATCH(gelu); }

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
#if defined(ONNXTRAIN_VMATH_AVX512)
  if (lanes() == 16) return avx512::gelu_backward(dy, x, dx, n);
#endif
  gelu_backward_n(dy, x, dx, n);
}

#undef ONNXTRAIN_VMATH_DISPATCH

}  // namespace onnxtrain::vmath
