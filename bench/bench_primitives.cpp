// oneDNN's kernels at one workload shape, in a program that builds against oneDNN 2.6 (Debian's,
// which onnxtrain links; CMake target onnxtrain-bench-primitives) and against 3.x (PyPI's;
// bench/onednn_versions.py compiles it), so that the two releases can be compared on the
// primitives onnxtrain runs (docs/performance.md, "oneDNN 2.6 and 3.x"). One measurement per
// process, printed as one JSON object; every time is the fastest of --repeats runs after one
// warm-up run (a peak: operands warm, weights already in the layout the primitive asked for).
//
//   onnxtrain-bench-primitives product --m M --n N --k K
//     C[M, N] = A[M, K] B[K, N], float32, row-major: {"sgemm_ms", "matmul_ms", "matmul_impl", "gflop"}
//     sgemm_ms: dnnl_sgemm, the faster of B at a 64-byte-aligned address and B 16 bytes past one
//     (oneDNN 2.6's AVX2 sgemm runs at 55-65 % of its speed at some aligned addresses; onnxtrain's
//     row_major_sgemm shifts B there, ops/matmul_primitive.h). matmul_ms: the matmul primitive
//     with the weights in the layout it chooses (format_tag::any, reordered once, as onnxtrain
//     keeps constant weights).
//   onnxtrain-bench-primitives lstm --steps T --batch N --input C --hidden H
//     one unidirectional LSTM layer, forward_inference, no initial or final states:
//     {"ms", "impl", "gflop"}
//   onnxtrain-bench-primitives conv --batch N --in-channels C --out-channels M --size S
//                                   --kernel K [--stride 1] [--training]
//     a square convolution with pads K / 2, every memory format left to oneDNN:
//     {"forward_ms", "forward_impl", "gflop"} with forward_inference, or with --training the
//     forward_training, backward_data and backward_weights primitives' times and implementations.
//
// --threads sets OpenMP's thread count (oneDNN 2.6 and other OpenMP builds); a build on another
// runtime (PyPI's 3.x runs on SYCL) uses all the machine's cores. Exit status 2 with
// "error: ..." on stderr when a primitive cannot be created or run.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "bench_common.h"

namespace {

using dnnl::memory;
using Dims = memory::dims;
using Args = std::unordered_map<int, memory>;
constexpr auto f32 = memory::data_type::f32;
// The primitives' operand values: fill_values's scaled by 0.1, so that the LSTM's gates stay
// away from saturation.
constexpr float kScale = 0.1f;

// A buffer of `floats` values (small, varied, finite) starting `offset_bytes` past a 64-byte
// boundary.
struct Buffer {
  std::unique_ptr<float[], decltype(&std::free)> storage{nullptr, &std::free};
  float* data = nullptr;
  Buffer(int64_t floats, int64_t offset_bytes) {
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + static_cast<size_t>(offset_bytes) + 127) / 64 * 64;
    storage.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!storage) throw std::runtime_error("out of memory");
    data = storage.get() + offset_bytes / static_cast<int64_t>(sizeof(float));
    fill_values(data, static_cast<size_t>(floats));
  }
};

// Weights in the layout pd asked for, reordered once from plain values in `plain`'s layout.
memory weights_as(const memory::desc& plain, const memory::desc& wanted, const dnnl::engine& engine,
                  dnnl::stream& stream) {
  memory from = filled(plain, engine, kScale), to(wanted, engine);
  dnnl::reorder(from, to).execute(stream, from, to);
  stream.wait();
  return to;
}

nlohmann::json product(int64_t m, int64_t n, int64_t k, int repeats, const dnnl::engine& engine, dnnl::stream& stream) {
  Buffer a(m * k, 0), c(m * n, 0), b_aligned(k * n, 0), b_shifted(k * n, 16);
  double sgemm_ms = std::numeric_limits<double>::infinity();
  for (const Buffer* b : {&b_aligned, &b_shifted}) {
    const auto call = [&] {
      if (dnnl_sgemm('N', 'N', m, n, k, 1.0f, a.data, k, b->data, n, 0.0f, c.data, n) != dnnl_success) {
        throw std::runtime_error("dnnl_sgemm failed");
      }
    };
    sgemm_ms = std::min(sgemm_ms, time_best_ms(call, repeats));
  }
  const memory::desc a_md({m, k}, f32, memory::format_tag::ab), c_md({m, n}, f32, memory::format_tag::ab);
  const memory::desc b_any({k, n}, f32, memory::format_tag::any), b_plain({k, n}, f32, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc pd(engine, a_md, b_any, c_md);
#else
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), engine);
#endif
  const dnnl::matmul matmul(pd);
  const Args args{{DNNL_ARG_SRC, memory(a_md, engine, a.data)},
                  {DNNL_ARG_WEIGHTS, weights_as(b_plain, pd.weights_desc(), engine, stream)},
                  {DNNL_ARG_DST, memory(c_md, engine, c.data)}};
  return {{"sgemm_ms", sgemm_ms},
          {"matmul_ms", time_best_ms(stream, matmul, args, repeats)},
          {"matmul_impl", pd.impl_info_str()},
          {"gflop", 2e-9 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k)}};
}

nlohmann::json lstm(int64_t steps, int64_t batch, int64_t input, int64_t hidden, int repeats,
                    const dnnl::engine& engine, dnnl::stream& stream) {
  using tag = memory::format_tag;
  const memory::desc src({steps, batch, input}, f32, tag::tnc), dst({steps, batch, hidden}, f32, tag::tnc);
  const memory::desc layer_any({1, 1, input, 4, hidden}, f32, tag::any), iter_any({1, 1, hidden, 4, hidden}, f32, tag::any);
  const memory::desc bias({1, 1, 4, hidden}, f32, tag::ldgo), none;
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto direction = dnnl::rnn_direction::unidirectional_left2right;
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::lstm_forward::primitive_desc pd(engine, prop, direction, src, none, none, layer_any, iter_any, bias, dst,
                                              none, none);
#else
  const dnnl::lstm_forward::primitive_desc pd(
      dnnl::lstm_forward::desc(prop, direction, src, none, none, layer_any, iter_any, bias, dst, none, none), engine);
#endif
  const dnnl::lstm_forward primitive(pd);
  const memory::desc layer_plain({1, 1, input, 4, hidden}, f32, tag::ldigo), iter_plain({1, 1, hidden, 4, hidden}, f32, tag::ldigo);
  const Args args{{DNNL_ARG_SRC_LAYER, filled(src, engine, kScale)},
                  {DNNL_ARG_WEIGHTS_LAYER, weights_as(layer_plain, pd.weights_layer_desc(), engine, stream)},
                  {DNNL_ARG_WEIGHTS_ITER, weights_as(iter_plain, pd.weights_iter_desc(), engine, stream)},
                  {DNNL_ARG_BIAS, filled(bias, engine, kScale)},
                  {DNNL_ARG_DST_LAYER, memory(dst, engine)}};
  return {{"ms", time_best_ms(stream, primitive, args, repeats)},
          {"impl", pd.impl_info_str()},
          {"gflop", 2e-9 * static_cast<double>(steps * batch) * static_cast<double>(4 * hidden) *
                        static_cast<double>(input + hidden)}};
}

nlohmann::json conv(int64_t batch, int64_t in_channels, int64_t out_channels, int64_t size, int64_t kernel,
                    int64_t stride, bool training, int repeats, const dnnl::engine& engine, dnnl::stream& stream) {
  const int64_t pad = kernel / 2, out_size = (size + 2 * pad - kernel) / stride + 1;
  const auto any = [](const Dims& d) { return memory::desc(d, f32, memory::format_tag::any); };
  const memory::desc src = any({batch, in_channels, size, size}), weights = any({out_channels, in_channels, kernel, kernel});
  const memory::desc dst = any({batch, out_channels, out_size, out_size});
  const Dims strides{stride, stride}, pads{pad, pad};
  const auto direct = dnnl::algorithm::convolution_direct;
  const auto prop = training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  using Fwd = dnnl::convolution_forward;
  using BwdData = dnnl::convolution_backward_data;
  using BwdWeights = dnnl::convolution_backward_weights;
#if DNNL_VERSION_MAJOR >= 3
  const Fwd::primitive_desc fwd(engine, prop, direct, src, weights, dst, strides, pads, pads);
#else
  const Fwd::primitive_desc fwd(Fwd::desc(prop, direct, src, weights, dst, strides, pads, pads), engine);
#endif
  const Fwd forward(fwd);
  const Args fwd_args{{DNNL_ARG_SRC, filled(fwd.src_desc(), engine, kScale)},
                      {DNNL_ARG_WEIGHTS, filled(fwd.weights_desc(), engine, kScale)},
                      {DNNL_ARG_DST, memory(fwd.dst_desc(), engine)}};
  const double taps = static_cast<double>(batch * out_channels * out_size * out_size) *
                      static_cast<double>(in_channels * kernel * kernel);
  nlohmann::json out{{"forward_ms", time_best_ms(stream, forward, fwd_args, repeats)},
                     {"forward_impl", fwd.impl_info_str()},
                     {"gflop", 2e-9 * taps * (training ? 3 : 1)}};
  if (!training) return out;
#if DNNL_VERSION_MAJOR >= 3
  const BwdData::primitive_desc bwd_data(engine, direct, src, weights, dst, strides, pads, pads, fwd);
  const BwdWeights::primitive_desc bwd_weights(engine, direct, src, weights, dst, strides, pads, pads, fwd);
#else
  const BwdData::primitive_desc bwd_data(BwdData::desc(direct, src, weights, dst, strides, pads, pads), engine, fwd);
  const BwdWeights::primitive_desc bwd_weights(BwdWeights::desc(direct, src, weights, dst, strides, pads, pads), engine,
                                               fwd);
#endif
  const BwdData backward_data(bwd_data);
  const Args data_args{{DNNL_ARG_DIFF_DST, filled(bwd_data.diff_dst_desc(), engine, kScale)},
                       {DNNL_ARG_WEIGHTS, filled(bwd_data.weights_desc(), engine, kScale)},
                       {DNNL_ARG_DIFF_SRC, memory(bwd_data.diff_src_desc(), engine)}};
  const BwdWeights backward_weights(bwd_weights);
  const Args weights_args{{DNNL_ARG_SRC, filled(bwd_weights.src_desc(), engine, kScale)},
                          {DNNL_ARG_DIFF_DST, filled(bwd_weights.diff_dst_desc(), engine, kScale)},
                          {DNNL_ARG_DIFF_WEIGHTS, memory(bwd_weights.diff_weights_desc(), engine)}};
  out["backward_data_ms"] = time_best_ms(stream, backward_data, data_args, repeats);
  out["backward_data_impl"] = bwd_data.impl_info_str();
  out["backward_weights_ms"] = time_best_ms(stream, backward_weights, weights_args, repeats);
  out["backward_weights_impl"] = bwd_weights.impl_info_str();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times oneDNN's kernels at one shape (docs/performance.md, \"oneDNN 2.6 and 3.x\")"};
  int threads = 0, repeats = 20;
  app.add_option("--threads", threads, "OpenMP threads (default: all)");
  app.add_option("--repeats", repeats, "timed runs; the fastest counts")->check(CLI::Range(1, 1000000));
  app.require_subcommand(1);
  app.fallthrough();  // --threads and --repeats also after the subcommand
  const auto positive = CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max());
  int64_t m = 0, n = 0, k = 0;
  CLI::App* product_cmd = app.add_subcommand("product", "C[M, N] = A[M, K] B[K, N]: dnnl_sgemm and the matmul primitive");
  product_cmd->add_option("--m", m)->required()->check(positive);
  product_cmd->add_option("--n", n)->required()->check(positive);
  product_cmd->add_option("--k", k)->required()->check(positive);
  int64_t steps = 0, batch = 0, input = 0, hidden = 0;
  CLI::App* lstm_cmd = app.add_subcommand("lstm", "one LSTM layer, forward_inference");
  lstm_cmd->add_option("--steps", steps)->required()->check(positive);
  lstm_cmd->add_option("--batch", batch)->required()->check(positive);
  lstm_cmd->add_option("--input", input)->required()->check(positive);
  lstm_cmd->add_option("--hidden", hidden)->required()->check(positive);
  int64_t in_channels = 0, out_channels = 0, size = 0, kernel = 0, stride = 1;
  bool training = false;
  CLI::App* conv_cmd = app.add_subcommand("conv", "a square 2-D convolution with pads kernel / 2");
  conv_cmd->add_option("--batch", batch)->required()->check(positive);
  conv_cmd->add_option("--in-channels", in_channels)->required()->check(positive);
  conv_cmd->add_option("--out-channels", out_channels)->required()->check(positive);
  conv_cmd->add_option("--size", size, "input height and width")->required()->check(positive);
  conv_cmd->add_option("--kernel", kernel)->required()->check(positive);
  conv_cmd->add_option("--stride", stride)->check(positive);
  conv_cmd->add_flag("--training", training, "forward_training and both backward primitives");
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) omp_set_num_threads(threads);
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    nlohmann::json out;
    if (*product_cmd) out = product(m, n, k, repeats, engine, stream);
    if (*lstm_cmd) out = lstm(steps, batch, input, hidden, repeats, engine, stream);
    if (*conv_cmd) out = conv(batch, in_channels, out_channels, size, kernel, stride, training, repeats, engine, stream);
    out["onednn"] = std::to_string(dnnl_version()->major) + "." + std::to_string(dnnl_version()->minor) + "." +
                    std::to_string(dnnl_version()->patch);
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
