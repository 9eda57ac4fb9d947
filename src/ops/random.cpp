// Random generators: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike
// (ai.onnx opset 1+) and Bernoulli (opset 15+); their version 22 only adds bfloat16.
//
// Numbers come from Philox4x32-10 (core/rng.h) keyed by the seed and the node's first output
// name, counted by the run index: with the `seed` attribute the key is that seed, otherwise the
// session's seed. Each run draws new numbers; replaying a run index replays them. Normal
// values use the Box-Muller transform on pairs of uniforms.
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

enum class Distribution { Normal, Uniform };

struct RandomSpec {
  Distribution distribution = Distribution::Uniform;
  double a = 0, b = 1;  // normal: mean, scale; uniform: low, high
  bool has_seed = false;
  uint64_t seed = 0;
  uint64_t stream = 0;
};

RandomSpec read_spec(const KernelInit& init, Distribution distribution) {
  RandomSpec spec;
  spec.distribution = distribution;
  if (distribution == Distribution::Normal) {
    spec.a = init.attr_float("mean", 0.0f);
    spec.b = init.attr_float("scale", 1.0f);
  } else {
    spec.a = init.attr_float("low", 0.0f);
    spec.b = init.attr_float("high", 1.0f);
  }
  if (init.has_attr("seed")) {
    const float seed = init.attr_float("seed", 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &seed, sizeof(bits));
    spec.has_seed = true;
    spec.seed = bits;
  }
  spec.stream = init.has_output(0) ? stream_id(init.graph().value(init.node().outputs[0]).name) : 0;
  return spec;
}

DataType read_dtype(const KernelInit& init, DataType fallback) {
  if (!init.has_attr("dtype")) return fallback;
  return dtype_from_onnx(static_cast<int32_t>(init.attr_int("dtype", 1)), "attribute 'dtype'");
}

// Fills `out` (a floating tensor) with draws for this run.
void fill(Tensor& out, const RandomSpec& spec, const RunContext& run) {
  const Philox philox(spec.has_seed ? spec.seed : run.seed, spec.stream);
  const int64_t n = out.numel();
  const int64_t blocks = (n + 3) / 4;
  visit_dtype<FloatTypes>(out.dtype(), "random output", [&]<class T>() {
    T* p = out.data<T>();
    parallel_for(blocks, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        const auto w = philox.block(run.run_index, static_cast<uint64_t>(blk));
        double v[4];
        for (int k = 0; k < 4; ++k) v[k] = Philox::to_unit_double(w[k], w[(k + 1) % 4]);
        if (spec.distribution == Distribution::Normal) {
          // Box-Muller: two uniforms (u1 in (0, 1]) give two independent standard normals.
          for (int k = 0; k < 4; k += 2) {
            const double r = std::sqrt(-2.0 * std::log(1.0 - v[k]));
            const double theta = 2.0 * std::numbers::pi * v[k + 1];
            v[k] = spec.a + spec.b * r * std::cos(theta);
            v[k + 1] = spec.a + spec.b * r * std::sin(theta);
          }
        } else {
          for (double& x : v) x = spec.a + (spec.b - spec.a) * x;
        }
        for (int k = 0; k < 4 && blk * 4 + k < n; ++k) p[blk * 4 + k] = convert<T>(v[k]);
      }
    });
  });
}

void check_float_dtype(DataType dtype) {
  if (!is_floating(dtype)) {
    fail("attribute 'dtype' is " + std::string(dtype_name(dtype)) + "; random values need a floating type");
  }
}

}  // namespace

std::unique_ptr<Kernel> make_random(const KernelInit& init) {
  const bool normal = init.op_type() == "RandomNormal" || init.op_type() == "RandomNormalLike";
  const RandomSpec spec = read_spec(init, normal ? Distribution::Normal : Distribution::Uniform);
  const bool like = init.op_type().ends_with("Like");
  if (like) {
    const bool has_dtype = init.has_attr("dtype");
    const DataType dtype = read_dtype(init, DataType::Float32);
    if (has_dtype) check_float_dtype(dtype);
    return make_kernel([spec, has_dtype, dtype](KernelContext& ctx) {
      const Tensor& input = ctx.input(0);
      const DataType out_type = has_dtype ? dtype : input.dtype();
      if (!is_floating(out_type)) {
        fail("input " + ctx.input_name(0) + " is " + input.description() +
             "; without a 'dtype' attribute the output takes its type, which must be floating");
      }
      fill(ctx.allocate_output(0, out_type, input.shape()), spec, ctx.run_context());
    });
  }
  const DataType dtype = read_dtype(init, DataType::Float32);
  check_float_dtype(dtype);
  const std::vector<int64_t> dims = init.attr_ints("shape");
  if (!init.has_attr("shape")) fail("required attribute 'shape' is missing");
  for (int64_t d : dims) {
    if (d < 0) fail("attribute 'shape' has a negative dim " + std::to_string(d));
  }
  const Shape shape(dims);
  return make_kernel([spec, dtype, shape](KernelContext& ctx) {
    fill(ctx.allocate_output(0, dtype, shape), spec, ctx.run_context());
  });
}

// Bernoulli: output 1 with probability p (the input element), else 0.
std::unique_ptr<Kernel> make_bernoulli(const KernelInit& init) {
  const RandomSpec spec = read_spec(init, Distribution::Uniform);
  const bool has_dtype = init.has_attr("dtype");
  const DataType dtype = read_dtype(init, DataType::Float32);
  return make_kernel([spec, has_dtype, dtype](KernelContext& ctx) {
    const Tensor& p = ctx.input(0);
    Tensor u(DataType::Float64, p.shape());
    fill(u, spec, ctx.run_context());
    const std::vector<double> probabilities = p.to_double_vector();
    for (size_t i = 0; i < probabilities.size(); ++i) {
      if (!(probabilities[i] >= 0.0 && probabilities[i] <= 1.0)) {
        fail("input " + ctx.input_name(0) + " holds " + std::to_string(probabilities[i]) + " at element " +
             std::to_string(i) + "; probabilities must be in [0, 1]");
      }
    }
    const double* us = u.data<double>();
    Tensor& out = ctx.allocate_output(0, has_dtype ? dtype : p.dtype(), p.shape());
    visit_dtype<AllTypes>(out.dtype(), "Bernoulli output", [&]<class T>() {
      T* o = out.data<T>();
      for (size_t i = 0; i < probabilities.size(); ++i) o[i] = convert<T>(us[i] < probabilities[i] ? 1 : 0);
    });
  });
}

}  // namespace onnxtrain::ops
