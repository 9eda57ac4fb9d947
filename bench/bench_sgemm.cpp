// The machine's sgemm peak through oneDNN (dnnl_sgemm), the yardstick of docs/performance.md:
// onnxtrain-bench-sgemm [--size N] [--threads T] prints {"gflops": ...} for N x N x N products;
// --m M --n N --k K measure one workload shape instead (C[M, N] = A[M, K] B[K, N], row-major).
// (bench_primitives.cpp compares the oneDNN releases, docs/performance.md "oneDNN 2.6 and 3.x".)
#include <dnnl.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"Measures oneDNN sgemm GFLOP/s"};
  int64_t size = 2048, m = 0, n = 0, k = 0;
  int threads = 0, repeats = 20;
  app.add_option("--size", size);
  app.add_option("--m", m);
  app.add_option("--n", n);
  app.add_option("--k", k);
  app.add_option("--threads", threads);
  app.add_option("--repeats", repeats);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  if (m <= 0) m = size;
  if (n <= 0) n = size;
  if (k <= 0) k = size;
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.5f),
      c(static_cast<size_t>(m * n), 0.0f);
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    dnnl_sgemm('N', 'N', m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / s / 1e9);
  }
  std::cout << "{\"gflops\": " << best << "}\n";
  return 0;
}
