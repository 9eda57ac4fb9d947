// Times inference of a model in process: onnxtrain-bench-infer MODEL --batch B [--iters N]
// [--threads T] [--int-high H]. Feeds random inputs whose symbolic batch dim is B (float32
// inputs uniform in [0, 1); int64 inputs, such as a language model's token ids, uniform integers
// in [0, H), H = 2 unless given), runs a few warm-up iterations, then prints the median
// milliseconds per run as JSON: {"ms": ..., "batch": B}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "onnxtrain/session.h"

int main(int argc, char** argv) {
  CLI::App app{"Times onnxtrain inference"};
  std::string model;
  int64_t batch = 1;
  int iters = 200, threads = 0;
  int64_t int_high = 2;
  app.add_option("model", model)->required();
  app.add_option("--batch", batch);
  app.add_option("--iters", iters);
  app.add_option("--threads", threads);
  app.add_option("--int-high", int_high, "int64 inputs are uniform integers in [0, int-high)")->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  CLI11_PARSE(app, argc, argv);
  onnxtrain::runtime::Session session(model, {.threads = threads});
  onnxtrain::runtime::NamedTensors feeds;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (const auto& in : session.inputs()) {
    onnxtrain::Shape shape;
    for (size_t d = 0; d < in.dims.size(); ++d) shape.push_back(in.dims[d] < 0 ? batch : in.dims[d]);
    if (in.dtype == onnxtrain::DataType::Int64) {
      std::uniform_int_distribution<int64_t> ids(0, int_high - 1);
      std::vector<int64_t> values(static_cast<size_t>(shape.numel()));
      for (int64_t& v : values) v = ids(rng);
      feeds[in.name] = onnxtrain::Tensor::from_vector<int64_t>(shape, values);
      continue;
    }
    std::vector<float> values(static_cast<size_t>(shape.numel()));
    for (float& v : values) v = dist(rng);
    feeds[in.name] = onnxtrain::Tensor::from_vector<float>(shape, values);
  }
  for (int i = 0; i < 10; ++i) session.run(feeds);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    session.run(feeds);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
  std::cout << "{\"ms\": " << ms[ms.size() / 2] << ", \"batch\": " << batch << "}\n";
  return 0;
}
