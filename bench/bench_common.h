// What the bench tools that time oneDNN share (bench_conv.cpp, bench_gemm.cpp,
// bench_primitives.cpp): the timing rule, a peak, the fastest of `repeats` runs after one
// untimed warm-up run (first touch of the operands, oneDNN's JIT); and the operands' values,
// small, varied and finite. Uses only what oneDNN 2.6's and 3.x's C++ APIs have in common, since
// bench_primitives.cpp builds against both.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

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

// One primitive run with these arguments, waited for, as the timed unit.
inline double time_best_ms(dnnl::stream& stream, const dnnl::primitive& p,
                           const std::unordered_map<int, dnnl::memory>& args, int repeats) {
  return time_best_ms(
      [&] {
        p.execute(stream, args);
        stream.wait();
      },
      repeats);
}

// data[i] = scale (0.01 (i mod 97) - 0.4), i < count.
inline void fill_values(float* data, size_t count, float scale = 1.0f) {
  for (size_t i = 0; i < count; ++i) data[i] = scale * (0.01f * static_cast<float>(i % 97) - 0.4f);
}

// A float32 memory of `desc`, filled by fill_values.
inline dnnl::memory filled(const dnnl::memory::desc& desc, const dnnl::engine& engine, float scale = 1.0f) {
  dnnl::memory m(desc, engine);
  fill_values(static_cast<float*>(m.get_data_handle()), desc.get_size() / sizeof(float), scale);
  return m;
}
