// The 16-lane variant of conv_gemm.h's streaming convolution rows
// (conv_stream_forward_channels_last): conv_stream_lanes.inl with 16 lanes and groups of six rows
// of W, this file alone compiled for x86-64-v4 (src/CMakeLists.txt, where the compiler takes
// -march=x86-64-v4); conv_gemm.cpp calls it only when vmath::lanes() is 16, i.e. on CPUs that run
// AVX-512 F/BW/CD/DQ/VL. Nothing here may instantiate a library template or inline function (see
// conv_stream_lanes.inl).
#include <cstdint>

namespace onnxtrain::ops::conv_stream_avx512 {

#pragma GCC diagnostic ignored "-Wpsabi"

namespace {
constexpr int kLanes = 16, kGroup = 6;
#include "ops/conv_stream_lanes.inl"
}  // namespace

int64_t group_rows() { return kGroup; }

void stream_groups(int patches, const float* p, int64_t K, const float* w, int64_t M, int64_t begin, int64_t end,
                   const float* b, bool relu, float* y) {
  stream_group_range(patches, p, K, w, M, begin, end, b, relu, y);
}

}  // namespace onnxtrain::ops::conv_stream_avx512
