// The 16-lane variant of core/vector_math.h's array functions: vector_math_lanes.inl with
// kW = 16, this file alone compiled for x86-64-v4 (src/CMakeLists.txt, where the compiler takes
// -march=x86-64-v4). vector_math.cpp calls these only on CPUs that run AVX-512 F/BW/CD/DQ/VL.
// Nothing here may instantiate a library template or inline function (see vector_math_lanes.inl).
#include <cstddef>
#include <cstdint>

namespace onnxtrain::vmath {

#pragma GCC diagnostic ignored "-Wpsabi"

namespace {
constexpr int kW = 16;
#include "core/vector_math_lanes.inl"
}  // namespace

namespace avx512 {
void exp(const float* x, float* y, int64_t n) { exp_n(x, y, n); }
void sigmoid(const float* x, float* y, int64_t n) { sigmoid_n(x, y, n); }
void tanh(const float* x, float* y, int64_t n) { tanh_n(x, y, n); }
void erf(const float* x, float* y, int64_t n) { erf_n(x, y, n); }
void gelu(const float* x, float* y, int64_t n) { gelu_n(x, y, n); }
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) { gelu_backward_n(dy, x, dx, n); }
}  // namespace avx512

}  // namespace onnxtrain::vmath
