// oneDNN's convolutions at a workload's shapes, in isolation: the convolution half of the
// yardstick of docs/performance.md (the roofline of a convolution-bound step).
//
//   onnxtrain-bench-conv --shapes SHAPES.json [--threads T] [--repeats R] [--inference]
//
// SHAPES.json is a list of convolutions, each an object
//   {"n", "c", "h", "w", "m", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "pb", "pr",
//    "group", "bias": bool, "input_grad": bool}
// (ONNX Conv semantics: NCHW input [n, c, h, w], weights [m, c / group, kh, kw], pads begin
// pt, pl and end pb, pr, dilations dh, dw >= 1). For each one the program creates the float32
// primitives oneDNN 2.6 chooses with every memory format left to it (format_tag::any, so no
// reorder is timed): forward_training, backward_data (when input_grad) and backward_weights
// (with the bias gradient when bias), or forward_inference alone with --inference. Each runs
// R times after one warm-up run; the fastest run counts (a peak). Output, one JSON object:
//   {"convolutions": [{"forward_ms", "backward_data_ms", "backward_weights_ms", "gflop"}...],
//    "total_ms", "gflop"}
// gflop counts 2 FLOPs per multiply-add over every kernel tap (padding included, as
// torch.utils.flop_counter counts), forward + backward_data + backward_weights.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "bench_common.h"
#include "json_list.h"

namespace {

using dnnl::memory;
using Dims = memory::dims;
using Args = std::unordered_map<int, memory>;

struct Shape {
  int64_t n, c, h, w, m, kh, kw, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0, pb = 0, pr = 0, group = 1;
  bool bias = false, input_grad = true;
};

Shape shape_of(const nlohmann::json& j) {
  Shape s{};
  const auto get = [&](const char* key, int64_t& to, bool required) {
    if (j.contains(key)) {
      to = j.at(key).get<int64_t>();
    } else if (required) {
      throw std::runtime_error(std::string("a convolution without \"") + key + "\": " + j.dump());
    }
  };
  for (auto [key, to] : {std::pair{"n", &s.n}, {"c", &s.c}, {"h", &s.h}, {"w", &s.w}, {"m", &s.m},
                         {"kh", &s.kh}, {"kw", &s.kw}}) {
    get(key, *to, true);
  }
  for (auto [key, to] : {std::pair{"sh", &s.sh}, {"sw", &s.sw}, {"dh", &s.dh}, {"dw", &s.dw},
                         {"pt", &s.pt}, {"pl", &s.pl}, {"pb", &s.pb}, {"pr", &s.pr}, {"group", &s.group}}) {
    get(key, *to, false);
  }
  s.bias = j.value("bias", false);
  s.input_grad = j.value("input_grad", true);
  if (s.group < 1 || s.c % s.group != 0 || s.m % s.group != 0) {
    throw std::runtime_error("channels not divisible by group: " + j.dump());
  }
  return s;
}

// Output length along one axis (ONNX's floor rule) and oneDNN's end padding for it: oneDNN
// wants the end padding that makes its own formula give exactly that length.
int64_t out_len(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1) {
  return (in + p0 + p1 - ((k - 1) * d + 1)) / s + 1;
}
int64_t dnnl_end_pad(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t p0) {
  return (out - 1) * s + (k - 1) * d + 1 - in - p0;
}

nlohmann::json measure(const Shape& s, bool inference, int repeats, const dnnl::engine& engine,
                       dnnl::stream& stream) {
  using dnnl::algorithm;
  using dnnl::prop_kind;
  const auto f32 = memory::data_type::f32;
  const auto any = [&](const Dims& d) { return memory::desc(d, f32, memory::format_tag::any); };
  const int64_t oh = out_len(s.h, s.kh, s.sh, s.dh, s.pt, s.pb);
  const int64_t ow = out_len(s.w, s.kw, s.sw, s.dw, s.pl, s.pr);
  if (oh < 1 || ow < 1) throw std::runtime_error("a convolution with an empty output");
  const Dims src{s.n, s.c, s.h, s.w}, dst{s.n, s.m, oh, ow}, bias{s.m};
  const Dims weights = s.group == 1 ? Dims{s.m, s.c, s.kh, s.kw}
                                    : Dims{s.group, s.m / s.group, s.c / s.group, s.kh, s.kw};
  const Dims strides{s.sh, s.sw}, dilates{s.dh - 1, s.dw - 1}, pad_l{s.pt, s.pl};
  const Dims pad_r{dnnl_end_pad(s.h, oh, s.kh, s.sh, s.dh, s.pt), dnnl_end_pad(s.w, ow, s.kw, s.sw, s.dw, s.pl)};
  const memory::desc bias_any = s.bias ? any(bias) : memory::desc();

  using Fwd = dnnl::convolution_forward;
  const Fwd::desc fwd_desc(inference ? prop_kind::forward_inference : prop_kind::forward_training,
                           algorithm::convolution_direct, any(src), any(weights), bias_any, any(dst), strides,
                           dilates, pad_l, pad_r);
  const Fwd::primitive_desc fwd_pd(fwd_desc, engine);
  Args fwd_args{{DNNL_ARG_SRC, filled(fwd_pd.src_desc(), engine)},
                {DNNL_ARG_WEIGHTS, filled(fwd_pd.weights_desc(), engine)},
                {DNNL_ARG_DST, memory(fwd_pd.dst_desc(), engine)}};
  if (s.bias) fwd_args.emplace(DNNL_ARG_BIAS, filled(fwd_pd.bias_desc(), engine));
  nlohmann::json result;
  result["implementation"] = fwd_pd.impl_info_str();
  result["forward_ms"] = time_best_ms(stream, Fwd(fwd_pd), fwd_args, repeats);
  const double taps = 2.0 * static_cast<double>(s.n * s.m * oh * ow) * static_cast<double>(s.c / s.group * s.kh * s.kw);
  double gflop = taps / 1e9;
  double total = result["forward_ms"].get<double>();
  if (!inference) {
    if (s.input_grad) {
      using Bwd = dnnl::convolution_backward_data;
      const Bwd::desc desc(algorithm::convolution_direct, any(src), any(weights), any(dst), strides, dilates, pad_l,
                           pad_r);
      const Bwd::primitive_desc pd(desc, engine, fwd_pd);
      const Args args{{DNNL_ARG_DIFF_DST, filled(pd.diff_dst_desc(), engine)},
                      {DNNL_ARG_WEIGHTS, filled(pd.weights_desc(), engine)},
                      {DNNL_ARG_DIFF_SRC, memory(pd.diff_src_desc(), engine)}};
      result["backward_data_ms"] = time_best_ms(stream, Bwd(pd), args, repeats);
      total += result["backward_data_ms"].get<double>();
      gflop += taps / 1e9;
    }
    using Bwd = dnnl::convolution_backward_weights;
    const Bwd::desc desc(algorithm::convolution_direct, any(src), any(weights), bias_any, any(dst), strides, dilates,
                         pad_l, pad_r);
    const Bwd::primitive_desc pd(desc, engine, fwd_pd);
    Args args{{DNNL_ARG_SRC, filled(pd.src_desc(), engine)},
              {DNNL_ARG_DIFF_DST, filled(pd.diff_dst_desc(), engine)},
              {DNNL_ARG_DIFF_WEIGHTS, memory(pd.diff_weights_desc(), engine)}};
    if (s.bias) args.emplace(DNNL_ARG_DIFF_BIAS, memory(pd.diff_bias_desc(), engine));
    result["backward_weights_ms"] = time_best_ms(stream, Bwd(pd), args, repeats);
    total += result["backward_weights_ms"].get<double>();
    gflop += taps / 1e9;
  }
  result["total_ms"] = total;
  result["gflop"] = gflop;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times oneDNN's convolutions at given shapes (docs/performance.md)"};
  std::string shapes_path;
  int threads = 0, repeats = 10;
  bool inference = false;
  app.add_option("--shapes", shapes_path, "JSON list of convolutions")->required();
  app.add_option("--threads", threads, "OpenMP threads (default: all)");
  app.add_option("--repeats", repeats, "timed runs per primitive; the fastest counts")->check(CLI::PositiveNumber);
  app.add_flag("--inference", inference, "forward_inference only");
  CLI11_PARSE(app, argc, argv);
  return measure_each(shapes_path, threads, "convolutions",
                      [&](const nlohmann::json& j, const dnnl::engine& engine, dnnl::stream& stream) {
                        return measure(shape_of(j), inference, repeats, engine, stream);
                      });
}
