// Copies that write around the cache (streaming, non-temporal stores) for values a kernel makes
// and nothing reads again soon: the backward pass's saved tensors, written in the forward pass
// and read tens of milliseconds later. Ordinary stores first read each line of the destination
// into the cache (the read for ownership) and leave it there, in place of what the next kernel
// reads; streaming stores do neither.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace onnxtrain {

// dst[0, n) = src[0, n): for float32 where the build has AVX2, each whole 32-byte aligned block of
// 8 floats of dst by a streaming store (the elements before the first and after the last block
// by ordinary ones); otherwise an ordinary copy. end_streaming_stores() must follow before the
// values are read by another thread (the end of the kernel's parallel task).
template <class T>
inline void store_streaming(const T* src, T* dst, int64_t n) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float>) {
    int64_t i = 0;
    for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; ++i) dst[i] = src[i];
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

// Orders this thread's streaming stores before its later stores (sfence).
inline void end_streaming_stores() {
#if defined(__AVX2__)
  _mm_sfence();
#endif
}

}  // namespace onnxtrain
