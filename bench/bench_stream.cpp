// The fastest an optimizer's pass over a model's parameters can run on this machine: the memory
// half of the ceiling of docs/performance.md (bench/ceiling.py), as bench_gemm.cpp and
// bench_conv.cpp are the arithmetic half.
//
//   onnxtrain-bench-stream --floats N --reads R --updates U [--threads T] [--repeats K]
//
// One pass reads R arrays of N float32 values and reads and writes U more, element by element,
// on T OpenMP threads (static split), with as little arithmetic as a pass can have: each updated
// value becomes a multiple of itself plus the sum of the read ones. Adam's update reads the
// gradient and updates the weight and both moments (R = 1, U = 3); Momentum's, the weight and
// the velocity (R = 1, U = 2). The pass is timed K times after one untimed pass (first touch),
// the fastest counting, with its arrays as warm as repeated passes leave them: a lower bound on
// the time such an update takes inside a training step, where the backward pass has just moved
// other data through the caches. Output, one JSON object:
//   {"ms": fastest pass, "gbytes_per_s": (R + 2 U) x 4 x N bytes over it, "bytes": ...}
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <vector>

#include "bench_common.h"

int main(int argc, char** argv) {
  CLI::App app{"Times a pass that reads R float32 arrays and updates U more, the traffic of an optimizer"};
  int64_t floats = 0;
  int reads = 1, updates = 3, threads = 0, repeats = 20;
  app.add_option("--floats", floats, "elements per array (the model's trained parameters)")->required();
  app.add_option("--reads", reads, "arrays read only (an optimizer's gradient)")->check(CLI::Range(0, 4));
  app.add_option("--updates", updates, "arrays read and written (weights, optimizer state)")->check(CLI::Range(1, 4));
  app.add_option("--threads", threads, "OpenMP threads (default: OpenMP's)");
  app.add_option("--repeats", repeats, "timed passes, the fastest counting");
  CLI11_PARSE(app, argc, argv);
  if (floats <= 0 || repeats <= 0) {
    std::cerr << "error: --floats and --repeats must be positive (got " << floats << " and " << repeats << ")\n";
    return 1;
  }
  if (threads > 0) omp_set_num_threads(threads);

  const auto n = static_cast<size_t>(floats);
  std::vector<std::vector<float>> read(static_cast<size_t>(reads)), update(static_cast<size_t>(updates));
  for (auto& a : read) a.resize(n);
  for (auto& a : update) a.resize(n);
  // First touch on the threads that will use each part, as the pass splits it.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < floats; ++i) {
    for (auto& a : read) a[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i % 97);
    for (auto& a : update) a[static_cast<size_t>(i)] = 0.02f * static_cast<float>(i % 89);
  }
  std::vector<const float*> r;
  std::vector<float*> u;
  for (auto& a : read) r.push_back(a.data());
  for (auto& a : update) u.push_back(a.data());

  // Each updated value: u_k = c_k u_k + the sum of the read values (c_k < 1 keeps them bounded),
  // in blocks of kBlock elements: the sums in a buffer in L1, then each array in a loop of two
  // pointers, which vectorizes.
  constexpr int64_t kBlock = 2048;
  const int64_t blocks = (floats + kBlock - 1) / kBlock;
  auto pass = [&] {
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t i0 = block * kBlock, count = std::min(kBlock, floats - i0);
      float sum[kBlock];
      std::fill(sum, sum + count, 0.0f);
      for (const float* a : r) {
        const float* __restrict x = a + i0;
        for (int64_t i = 0; i < count; ++i) sum[i] += x[i];
      }
      for (size_t k = 0; k < u.size(); ++k) {
        float* __restrict v = u[k] + i0;
        const float c = 0.5f + 0.1f * static_cast<float>(k);
        for (int64_t i = 0; i < count; ++i) v[i] = c * v[i] + sum[i];
      }
    }
  };
  const double ms = time_best_ms(pass, repeats);
  const double bytes = static_cast<double>(reads + 2 * updates) * 4.0 * static_cast<double>(floats);
  std::cout << "{\"ms\": " << ms << ", \"gbytes_per_s\": " << bytes / (ms * 1e6) << ", \"bytes\": " << bytes << "}\n";
  return 0;
}
