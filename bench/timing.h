// The timing rule of the bench tools (bench_gemm.cpp, bench_primitives.cpp): a peak, the fastest
// of `repeats` runs after one untimed warm-up run (first touch of the operands, oneDNN's JIT).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>

inline double time_best_ms(const std::function<void()>& run, int repeats) {
  run();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}
