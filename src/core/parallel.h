// Parallel loops over OpenMP (the runtime oneDNN uses, so both share one thread pool).
//
// parallel_for(n, grain, f) calls f(begin, end) on disjoint chunks covering [0, n), in
// parallel when n >= 2 * grain and more than one thread is available. f must not throw.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace onnxtrain {

// Below this many elements an element-wise loop runs on one thread.
inline constexpr int64_t kParallelGrain = 1 << 15;

// The threads a parallel region started here would get: 1 inside one (nested regions run on
// the calling thread), else OpenMP's current maximum (the session's thread count).
inline int available_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>(available_threads(), std::max<int64_t>(1, n / std::max<int64_t>(grain, 1)));
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks;
    const int64_t end = n * (c + 1) / chunks;
    f(begin, end);
  }
}

}  // namespace onnxtrain
