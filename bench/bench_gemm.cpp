// oneDNN's matrix products at a workload's shapes, in isolation: the product half of the
// yardstick of docs/performance.md (the roofline of a GEMM-bound step), as bench_conv.cpp is
// for convolutions.
//
//   onnxtrain-bench-gemm --shapes SHAPES.json [--threads T] [--repeats R]
//
// SHAPES.json is a list of products, each an object
//   {"m", "n", "k", "batch": 1, "trans_a": false, "trans_b": false, "count": 1, "what": "..."}
// meaning `batch` independent products C[m, n] = op(A) op(B), float32, row-major, A stored as
// [m, k] (or [k, m] when trans_a), B as [k, n] (or [n, k] when trans_b), C written (beta 0);
// `count` says how many times one training step computes it (an LSTM's recurrence: once per
// time step), `what` is a label copied to the output. Each product is timed two ways, each R
// times after one warm-up run, the fastest run counting (a peak, operands warm in cache):
// dnnl_sgemm (once per batch entry) and oneDNN's matmul primitive (one call over the batch,
// operands described by strides, so no reorder is timed). The faster of the two is the product's
// time. Output, one JSON object:
//   {"products": [{"what", "sgemm_ms", "matmul_ms", "ms", "count", "total_ms", "gflop"}...],
//    "total_ms", "gflop"}
// where a product's total_ms is ms x count, the sums add them, and gflop counts 2 FLOPs per
// multiply-add, times count.
#include <dnnl.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "json_list.h"

namespace {

using dnnl::memory;
using Dims = memory::dims;

struct Product {
  int64_t m = 0, n = 0, k = 0, batch = 1, count = 1;
  bool trans_a = false, trans_b = false;
  std::string what;
};

Product product_of(const nlohmann::json& j) {
  Product p;
  for (auto [key, to] : {std::pair{"m", &p.m}, {"n", &p.n}, {"k", &p.k}}) {
    if (!j.contains(key)) throw std::runtime_error(std::string("a product without \"") + key + "\": " + j.dump());
    *to = j.at(key).get<int64_t>();
  }
  p.batch = j.value("batch", int64_t{1});
  p.count = j.value("count", int64_t{1});
  p.trans_a = j.value("trans_a", false);
  p.trans_b = j.value("trans_b", false);
  p.what = j.value("what", std::string());
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.batch < 1 || p.count < 1) {
    throw std::runtime_error("a product with a dimension, batch or count below 1: " + j.dump());
  }
  return p;
}

nlohmann::json measure(const Product& p, int repeats, const dnnl::engine& engine, dnnl::stream& stream) {
  const int64_t a_size = p.m * p.k, b_size = p.k * p.n, c_size = p.m * p.n;
  std::vector<float> a(static_cast<size_t>(p.batch * a_size)), b(static_cast<size_t>(p.batch * b_size)),
      c(static_cast<size_t>(p.batch * c_size));
  fill_values(a.data(), a.size());
  fill_values(b.data(), b.size());
  const int64_t lda = p.trans_a ? p.m : p.k, ldb = p.trans_b ? p.k : p.n;
  const double sgemm_ms = time_best_ms(
      [&] {
        for (int64_t i = 0; i < p.batch; ++i) {
          const dnnl_status_t status =
              dnnl_sgemm(p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f, a.data() + i * a_size, lda,
                         b.data() + i * b_size, ldb, 0.0f, c.data() + i * c_size, p.n);
          if (status != dnnl_success) throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(status));
        }
      },
      repeats);

  // The same product as one matmul primitive: [batch, m, k] x [batch, k, n] with the stored
  // layouts given as strides.
  const auto f32 = memory::data_type::f32;
  const memory::desc a_md({p.batch, p.m, p.k}, f32, p.trans_a ? Dims{a_size, 1, p.m} : Dims{a_size, p.k, 1});
  const memory::desc b_md({p.batch, p.k, p.n}, f32, p.trans_b ? Dims{b_size, 1, p.k} : Dims{b_size, p.n, 1});
  const memory::desc c_md({p.batch, p.m, p.n}, f32, Dims{c_size, p.n, 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
  const dnnl::matmul matmul(pd);
  memory am(a_md, engine, a.data()), bm(b_md, engine, b.data()), cm(c_md, engine, c.data());
  const double matmul_ms = time_best_ms(
      [&] {
        matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        stream.wait();
      },
      repeats);

  const double gflop = 2.0 * static_cast<double>(p.batch * p.m) * static_cast<double>(p.n * p.k) *
                       static_cast<double>(p.count) / 1e9;
  return {{"what", p.what},
          {"sgemm_ms", sgemm_ms},
          {"matmul_ms", matmul_ms},
          {"matmul_implementation", pd.impl_info_str()},
          {"ms", std::min(sgemm_ms, matmul_ms)},
          {"count", p.count},
          {"total_ms", std::min(sgemm_ms, matmul_ms) * static_cast<double>(p.count)},
          {"gflop", gflop}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times oneDNN's matrix products at given shapes (docs/performance.md)"};
  std::string shapes_path;
  int threads = 0, repeats = 10;
  app.add_option("--shapes", shapes_path, "JSON list of products")->required();
  app.add_option("--threads", threads, "OpenMP threads (default: all)");
  app.add_option("--repeats", repeats, "timed runs per product and method; the fastest counts")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return measure_each(shapes_path, threads, "products",
                      [&](const nlohmann::json& j, const dnnl::engine& engine, dnnl::stream& stream) {
                        return measure(product_of(j), repeats, engine, stream);
                      });
}
