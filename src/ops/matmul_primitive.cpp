#include "ops/matmul_primitive.h"

#include "ops/dnnl_util.h"

namespace onnxtrain::ops {

namespace du = dnnl_util;

MatMulEntry make_entry(const dnnl::memory::desc& src, const dnnl::memory::desc& weights,
                       const dnnl::memory::desc& dst, const dnnl::primitive_attr& attr,
                       const dnnl::memory::desc& bias) {
  MatMulEntry entry;
  const dnnl::engine& engine = du::cpu_engine();
  const bool has_bias = !bias.is_zero();
  try {
    dnnl::matmul::primitive_desc pd(has_bias ? dnnl::matmul::desc(src, weights, bias, dst)
                                             : dnnl::matmul::desc(src, weights, dst),
                                    attr, engine);
    entry.primitive = dnnl::matmul(pd);
  } catch (const dnnl::error&) {  // no implementation for these shapes: use the reference
    entry.use_reference = true;
    return entry;
  }
  du::checked("prepare matmul memories", [&] {
    entry.src = dnnl::memory(src, engine, nullptr);
    entry.weights = dnnl::memory(weights, engine, nullptr);
    entry.dst = dnnl::memory(dst, engine, nullptr);
    if (has_bias) entry.bias = dnnl::memory(bias, engine, nullptr);
  });
  entry.args = {
      {DNNL_ARG_SRC, entry.src}, {DNNL_ARG_WEIGHTS, entry.weights}, {DNNL_ARG_DST, entry.dst}};
  if (has_bias) entry.args[DNNL_ARG_BIAS] = entry.bias;
  return entry;
}

void execute(MatMulEntry& entry, const float* a, const float* b, float* y, const float* bias) {
  dnnl::stream& stream = du::cpu_stream();
  du::checked("run a matmul", [&] {
    entry.src.set_data_handle(const_cast<float*>(a));
    entry.weights.set_data_handle(const_cast<float*>(b));
    entry.dst.set_data_handle(y);
    if (bias) entry.bias.set_data_handle(const_cast<float*>(bias));
    entry.primitive.execute(stream, entry.args);
    stream.wait();
  });
}

}  // namespace onnxtrain::ops
