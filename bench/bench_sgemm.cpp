// The machine's sgemm peak through oneDNN (dnnl_sgemm), the yardstick of docs/performance.md:
// onnxtrain-bench-sgemm [--size N] [--threads T] prints {"gflops": ...} for N x N x N products.
#include <dnnl.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app{"Measures oneDNN sgemm GFLOP/s"};
  int64_t n = 2048;
  int threads = 0;
  app.add_option("--size", n);
  app.add_option("--threads", threads);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);
  double best = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s / 1e9);
  }
  std::cout << "{\"gflops\": " << best << "}\n";
  return 0;
}
