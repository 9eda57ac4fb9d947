// Times inference of a model in process: onnxtrain-bench-infer MODEL --batch B [--iters N]
// [--threads T] [--int-high H] [--lanes L]. Feeds random inputs whose symbolic batch dim is B (float32
// inputs uniform in [0, 1); int64 inputs, such as a language model's token ids, uniform integers
// in [0, H), H = 2 unless given), runs a few warm-up iterations, then prints the median
// milliseconds per run as JSON: {"ms": ..., "batch": B}. --lanes 8 or 16 sets the vector lanes of
// the kernels that have both variants (core/vector_math.h set_lanes; default: the widest the CPU
// runs), to compare them in one build; a count the build and CPU do not run is refused with the
// ones they do. A model that does not load or run, or an
// input of another type, prints "error: ..." (naming the model and input) and exits 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/vector_math.h"
#include "onnxtrain/dtype.h"
#include "onnxtrain/error.h"
#include "onnxtrain/session.h"

namespace {

// The model's inputs, batch dims set to `batch`: float32 uniform in [0, 1), int64 uniform in
// [0, int_high). Throws onnxtrain::Error for an input of any other type.
onnxtrain::runtime::NamedTensors random_feeds(const onnxtrain::runtime::Session& session, const std::string& model,
                                              int64_t batch, int64_t int_high) {
  onnxtrain::runtime::NamedTensors feeds;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> ids(0, int_high - 1);
  for (const auto& in : session.inputs()) {
    onnxtrain::Shape shape;
    for (size_t d = 0; d < in.dims.size(); ++d) shape.push_back(in.dims[d] < 0 ? batch : in.dims[d]);
    const auto count = static_cast<size_t>(shape.numel());
    if (in.dtype == onnxtrain::DataType::Int64) {
      std::vector<int64_t> values(count);
      for (int64_t& v : values) v = ids(rng);
      feeds[in.name] = onnxtrain::Tensor::from_vector<int64_t>(shape, values);
    } else if (in.dtype == onnxtrain::DataType::Float32) {
      std::vector<float> values(count);
      for (float& v : values) v = dist(rng);
      feeds[in.name] = onnxtrain::Tensor::from_vector<float>(shape, values);
    } else {
      throw onnxtrain::Error(model + ": input '" + in.name + "' is " +
                             std::string(onnxtrain::dtype_name(in.dtype)) +
                             "; onnxtrain-bench-infer feeds float32 and int64 inputs only");
    }
  }
  return feeds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times onnxtrain inference"};
  std::string model;
  int64_t batch = 1;
  int iters = 200, threads = 0, lanes = 0;
  int64_t int_high = 2;
  app.add_option("model", model)->required();
  app.add_option("--batch", batch)->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  app.add_option("--iters", iters)->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--threads", threads);
  app.add_option("--int-high", int_high, "int64 inputs are uniform integers in [0, int-high)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  app.add_option("--lanes", lanes, "vector lanes of the kernels with 8- and 16-lane variants (8 or 16)")
      ->check(CLI::IsMember(onnxtrain::vmath::available_lanes()));
  CLI11_PARSE(app, argc, argv);
  try {
    if (lanes != 0) onnxtrain::vmath::set_lanes(lanes);  // one of available_lanes(): checked above
    onnxtrain::runtime::Session session(model, {.threads = threads});
    const onnxtrain::runtime::NamedTensors feeds = random_feeds(session, model, batch, int_high);
    for (int i = 0; i < 10; ++i) session.run(feeds);
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      const auto start = std::chrono::steady_clock::now();
      session.run(feeds);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
    std::cout << "{\"ms\": " << ms[ms.size() / 2] << ", \"batch\": " << batch << "}\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
