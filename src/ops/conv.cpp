// Conv and ConvTranspose (ONNX operator docs "Conv", "ConvTranspose").
//
// Conv: X [N, C, D1..Dn], W [M, C/group, k1..kn], optional B [M] -> Y [N, M, O1..On] with
//   O = floor((D + pad_begin + pad_end - ((k - 1) * dilation + 1)) / stride) + 1
// (auto_pad SAME_*: O = ceil(D / stride) and the pads that give it; VALID: no pads).
// ConvTranspose: X [N, C, D...], W [C, M/group, k...], optional B [M] -> Y [N, M, O...] with
//   O = stride * (D - 1) + output_padding + ((k - 1) * dilation + 1) - pad_begin - pad_end;
// `output_shape` (or auto_pad SAME_*, which asks for O = D * stride) sets the pads instead:
//   total = stride * (D - 1) + output_padding + ((k - 1) * dilation + 1) - O, split by
//   SAME_UPPER as begin = total / 2, otherwise end = total / 2 (floor division).
// kernel_shape, when given, must match W.
//
// float32 with 1 to 3 spatial dims runs through oneDNN (convolution_forward /
// deconvolution_forward, plain layouts, oneDNN dilation = ONNX dilation - 1), one primitive per
// input shape, cached in the kernel; float16/bfloat16 are converted to float32 and back;
// float64 and other ranks use the im2col reference of conv_ref.h.
#include <cstring>
#include <unordered_map>

#include "core/dispatch.h"
#include "ops/conv_ref.h"
#include "ops/dnnl_util.h"
#include "ops/factories.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

namespace {

namespace du = dnnl_util;

struct ConvAttrs {
  bool transpose = false;  // ConvTranspose
  AutoPad auto_pad = AutoPad::NotSet;
  int64_t group = 1;
  std::optional<std::vector<int64_t>> kernel_shape, strides, dilations, pads;
  std::optional<std::vector<int64_t>> output_padding, output_shape;  // ConvTranspose
};

// Checks X, W and B and fills everything but the output dims and pads.
ConvGeometry common_geometry(const KernelContext& ctx, const ConvAttrs& a) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  if (x.rank() < 3) {
    fail("input " + ctx.input_name(0) + " has shape " + x.shape().to_string() +
         ", expected rank >= 3 ([N, C, spatial...])");
  }
  if (w.rank() != x.rank()) {
    fail("input " + ctx.input_name(1) + " has shape " + w.shape().to_string() + ", expected rank " +
         std::to_string(x.rank()) + " like " + ctx.input_name(0) + " " + x.shape().to_string());
  }
  const size_t nd = x.rank() - 2;
  ConvGeometry g;
  g.N = x.dim(0);
  g.C = x.dim(1);
  g.G = a.group;
  const auto dims = x.shape().to_vector();
  g.in.assign(dims.begin() + 2, dims.end());
  const auto w_dims = w.shape().to_vector();
  g.kernel.assign(w_dims.begin() + 2, w_dims.end());
  for (int64_t k : g.kernel) {
    if (k < 1) {
      fail("input " + ctx.input_name(1) + " has shape " + w.shape().to_string() +
           ", an empty kernel");
    }
  }
  if (a.kernel_shape && *a.kernel_shape != g.kernel) {
    fail("attribute 'kernel_shape' is " + ints_to_string(*a.kernel_shape) + " but input " +
         ctx.input_name(1) + " has shape " + w.shape().to_string());
  }
  g.stride = spatial_values(a.strides, "strides", nd, 1);
  g.dilation = spatial_values(a.dilations, "dilations", nd, 1);
  const std::string group = "group " + std::to_string(g.G);
  if (!a.transpose) {  // W [M, C/group, k...]
    if (g.C != w.dim(1) * g.G || w.dim(0) % g.G != 0) {
      fail("input " + ctx.input_name(0) + " has " + std::to_string(g.C) + " channels but " +
           ctx.input_name(1) + " " + w.shape().to_string() + " with " + group + " expects " +
           std::to_string(w.dim(1) * g.G) + " (W[1] * group), and W[0] must divide by group");
    }
    g.M = w.dim(0);
  } else {  // W [C, M/group, k...]
    if (g.C != w.dim(0) || g.C % g.G != 0) {
      fail("input " + ctx.input_name(0) + " has " + std::to_string(g.C) + " channels but " +
           ctx.input_name(1) + " " + w.shape().to_string() +
           " expects W[0] channels, divisible by " + group);
    }
    g.M = w.dim(1) * g.G;
  }
  for (int i = 1; i < 3; ++i) {
    if (ctx.has_input(i) && ctx.input(i).dtype() != x.dtype()) {
      fail("input " + ctx.input_name(i) + " is " + ctx.input(i).description() + ", expected " +
           std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(0));
    }
  }
  if (ctx.has_input(2) && !(ctx.input(2).shape() == Shape{g.M})) {
    fail("input " + ctx.input_name(2) + " has shape " + ctx.input(2).shape().to_string() +
         ", expected [" + std::to_string(g.M) + "] (one bias per output channel)");
  }
  return g;
}

// Conv output dims and pads.
void conv_output(const KernelContext& ctx, const ConvAttrs& a, ConvGeometry& g) {
  const size_t nd = g.rank();
  const auto pads = spatial_values(a.pads, "pads", nd, 0, 2);
  g.out.resize(nd);
  g.pad_begin.resize(nd);
  g.pad_end.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t extent = (g.kernel[d] - 1) * g.dilation[d] + 1;
    if (a.auto_pad == AutoPad::SameUpper || a.auto_pad == AutoPad::SameLower) {
      g.out[d] = (g.in[d] + g.stride[d] - 1) / g.stride[d];
      const int64_t total = std::max<int64_t>(0, (g.out[d] - 1) * g.stride[d] + extent - g.in[d]);
      split_padding(total, a.auto_pad == AutoPad::SameUpper, g.pad_begin[d], g.pad_end[d]);
      continue;
    }
    const bool valid = a.auto_pad == AutoPad::Valid;
    g.pad_begin[d] = valid ? 0 : pads[d];
    g.pad_end[d] = valid ? 0 : pads[d + nd];
    const int64_t padded = g.in[d] + g.pad_begin[d] + g.pad_end[d];
    if (padded < extent) {
      fail("the kernel of " + ctx.input_name(1) + " spans " + std::to_string(extent) +
           " elements along spatial dim " + std::to_string(d) + " (kernel " +
           std::to_string(g.kernel[d]) + ", dilation " + std::to_string(g.dilation[d]) +
           "), more than the padded input size " + std::to_string(padded) + " of " +
           ctx.input_name(0));
    }
    g.out[d] = (padded - extent) / g.stride[d] + 1;
  }
}

// ConvTranspose output dims and the crops of the full transposed output (see ConvGeometry).
void conv_transpose_output(const KernelContext& ctx, const ConvAttrs& a, ConvGeometry& g) {
  const size_t nd = g.rank();
  const auto pads = spatial_values(a.pads, "pads", nd, 0, 2);
  const auto output_padding = spatial_values(a.output_padding, "output_padding", nd, 0);
  std::optional<std::vector<int64_t>> target = a.output_shape;
  if (target && target->size() == nd + 2) target->erase(target->begin(), target->begin() + 2);
  if (target && target->size() != nd) {
    throw Error("attribute 'output_shape' is " + ints_to_string(*a.output_shape) + ", expected " +
                std::to_string(nd) + " spatial dims");
  }
  const bool same = a.auto_pad == AutoPad::SameUpper || a.auto_pad == AutoPad::SameLower;
  g.out.resize(nd);
  g.pad_begin.resize(nd);
  g.pad_end.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t full = g.stride[d] * (g.in[d] - 1) + (g.kernel[d] - 1) * g.dilation[d] + 1;
    if (target || same) {
      const int64_t wanted = target ? (*target)[d] : g.in[d] * g.stride[d];
      split_padding(full + output_padding[d] - wanted, a.auto_pad == AutoPad::SameUpper,
                    g.pad_begin[d], g.pad_end[d]);
    } else if (a.auto_pad == AutoPad::NotSet) {
      g.pad_begin[d] = pads[d];
      g.pad_end[d] = pads[d + nd];
    } else {
      g.pad_begin[d] = g.pad_end[d] = 0;
    }
    g.out[d] = full + output_padding[d] - g.pad_begin[d] - g.pad_end[d];
    if (g.out[d] < 0) {
      fail("the output of ConvTranspose would have " + std::to_string(g.out[d]) +
           " elements along spatial dim " + std::to_string(d) + " for input " + ctx.input_name(0) +
           " " + ctx.input(0).shape().to_string() + " (pads " + std::to_string(g.pad_begin[d]) +
           ", " + std::to_string(g.pad_end[d]) + ")");
    }
    g.pad_end[d] -= output_padding[d];
  }
}

// ---------------------------------------------------------------------------------------------
// oneDNN

// A convolution or deconvolution primitive with its argument memories.
struct ConvEntry {
  bool use_reference = false;  // oneDNN has no implementation for these shapes
  dnnl::primitive primitive;
  dnnl::memory src, user_weights, weights, bias, dst;
  bool reorder_weights = false;  // the primitive wants another weights layout than ONNX's
  dnnl::reorder weights_reorder;
  std::unordered_map<int, dnnl::memory> args;  // the memories above by role
  // ConvTranspose with negative crops: oneDNN fills only dst_dims of y, at dst_offset.
  bool embed = false;
  std::vector<int64_t> dst_dims, dst_offset;
  std::vector<float> dst_buffer;
};

dnnl::memory::dims dims_of(int64_t a, int64_t b, const std::vector<int64_t>& rest) {
  dnnl::memory::dims d{a, b};
  d.insert(d.end(), rest.begin(), rest.end());
  return d;
}

// oneDNN's view of W: [M, C, k...] (ConvTranspose: [M, C, k...] over ONNX's [C, M, k...]),
// or [G, M/G, C/G, k...] with groups.
dnnl::memory::desc weights_desc(const ConvGeometry& g, bool transpose) {
  const int64_t cg = g.C / g.G, mg = g.M / g.G, k = g.kernel_size();
  const bool grouped = g.G > 1;
  dnnl::memory::dims dims =
      grouped ? dnnl::memory::dims{g.G, mg, cg} : dnnl::memory::dims{g.M, g.C};
  dims.insert(dims.end(), g.kernel.begin(), g.kernel.end());
  if (!transpose) return du::plain_f32(dims);
  // ONNX ConvTranspose W is [G, C/G, M/G, k...] in memory: swap the strides of the channel dims.
  dnnl::memory::dims strides =
      grouped ? dnnl::memory::dims{cg * mg * k, k, mg * k} : dnnl::memory::dims{k, g.M * k};
  std::vector<int64_t> ks(g.kernel.size(), 1);
  for (size_t d = ks.size(); d-- > 1;) ks[d - 1] = ks[d] * g.kernel[d];
  strides.insert(strides.end(), ks.begin(), ks.end());
  return du::strided_f32(dims, strides);
}

ConvEntry plan(const ConvGeometry& g, bool transpose, bool has_bias) {
  using dnnl::memory;
  const size_t nd = g.rank();
  ConvEntry e;
  memory::dims strides(g.stride.begin(), g.stride.end()), dilates(nd), pad_l(nd), pad_r(nd);
  e.dst_dims = g.out;
  e.dst_offset.assign(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    dilates[d] = g.dilation[d] - 1;
    pad_l[d] = std::max<int64_t>(g.pad_begin[d], 0);
    pad_r[d] = std::max<int64_t>(g.pad_end[d], 0);
    e.dst_offset[d] = pad_l[d] - g.pad_begin[d];
    e.dst_dims[d] -= e.dst_offset[d] + (pad_r[d] - g.pad_end[d]);
    e.embed = e.embed || e.dst_dims[d] != g.out[d];
  }
  if (std::any_of(e.dst_dims.begin(), e.dst_dims.end(), [](int64_t d) { return d <= 0; })) {
    e.use_reference = true;  // only outputs no input reaches
    return e;
  }
  const memory::desc src = du::plain_f32(dims_of(g.N, g.C, g.in));
  const memory::desc dst = du::plain_f32(dims_of(g.N, g.M, e.dst_dims));
  const memory::desc user_weights = weights_desc(g, transpose);
  const memory::desc any_weights(user_weights.dims(), memory::data_type::f32,
                                 memory::format_tag::any);
  const memory::desc bias = has_bias ? du::plain_f32({g.M}) : memory::desc();
  const dnnl::engine& engine = du::cpu_engine();
  memory::desc weights;
  try {
    if (!transpose) {
      using P = dnnl::convolution_forward;
      const P::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                         src, any_weights, bias, dst, strides, dilates, pad_l, pad_r);
      const P::primitive_desc pd(desc, engine);
      e.primitive = P(pd);
      weights = pd.weights_desc();
    } else {
      using P = dnnl::deconvolution_forward;
      const P::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                         src, any_weights, bias, dst, strides, dilates, pad_l, pad_r);
      const P::primitive_desc pd(desc, engine);
      e.primitive = P(pd);
      weights = pd.weights_desc();
    }
  } catch (const dnnl::error&) {  // no implementation for these shapes: use the reference
    e.use_reference = true;
    return e;
  }
  du::checked("prepare convolution memories", [&] {
    e.src = memory(src, engine, nullptr);
    e.user_weights = memory(user_weights, engine, nullptr);
    e.dst = memory(dst, engine, nullptr);
    if (has_bias) e.bias = memory(bias, engine, nullptr);
    e.reorder_weights = weights != user_weights;
    if (e.reorder_weights) {
      e.weights = memory(weights, engine);  // owned buffer in the primitive's layout
      e.weights_reorder = dnnl::reorder(e.user_weights, e.weights);
    }
    e.args = {{DNNL_ARG_SRC, e.src},
              {DNNL_ARG_WEIGHTS, e.reorder_weights ? e.weights : e.user_weights},
              {DNNL_ARG_DST, e.dst}};
    if (has_bias) e.args[DNNL_ARG_BIAS] = e.bias;
  });
  if (e.embed) e.dst_buffer.resize(static_cast<size_t>(g.N * g.M * dims_product(e.dst_dims)));
  return e;
}

// Copies the [N*M, dst_dims...] block oneDNN computed into y [N*M, out...] at dst_offset.
void embed_block(const ConvGeometry& g, const ConvEntry& e, float* y) {
  const size_t nd = g.rank();
  const int64_t block = dims_product(e.dst_dims), out_size = g.out_size();
  const int64_t row = e.dst_dims[nd - 1];
  if (block == 0) return;
  std::vector<int64_t> out_stride(nd, 1), idx(nd, 0);
  for (size_t d = nd; d-- > 1;) out_stride[d - 1] = out_stride[d] * g.out[d];
  for (int64_t c = 0; c < g.N * g.M; ++c) {
    const float* src = e.dst_buffer.data() + c * block;
    float* dst = y + c * out_size;
    std::fill(idx.begin(), idx.end(), 0);
    for (int64_t line = 0; line < block / row; ++line, src += row) {
      int64_t offset = 0;
      for (size_t d = 0; d < nd; ++d) offset += (idx[d] + e.dst_offset[d]) * out_stride[d];
      std::copy(src, src + row, dst + offset);
      for (size_t d = nd - 1; d-- > 0;) {
        if (++idx[d] < e.dst_dims[d]) break;
        idx[d] = 0;
      }
    }
  }
}

void execute(ConvEntry& e, const ConvGeometry& g, const float* x, const float* w, const float* b,
             float* y) {
  if (e.embed) conv_ref_detail::fill_bias(g.N, g.M, g.out_size(), b, y);
  dnnl::stream& stream = du::cpu_stream();
  du::checked("run a convolution", [&] {
    e.src.set_data_handle(const_cast<float*>(x));
    e.user_weights.set_data_handle(const_cast<float*>(w));
    e.dst.set_data_handle(e.embed ? e.dst_buffer.data() : y);
    if (b) e.bias.set_data_handle(const_cast<float*>(b));
    if (e.reorder_weights) e.weights_reorder.execute(stream, e.user_weights, e.weights);
    e.primitive.execute(stream, e.args);
    stream.wait();
  });
  if (e.embed) embed_block(g, e, y);
}

// ---------------------------------------------------------------------------------------------

class ConvKernel final : public Kernel {
 public:
  explicit ConvKernel(ConvAttrs attrs) : attrs_(std::move(attrs)) {}

  void run(KernelContext& ctx) override {
    ConvGeometry g = common_geometry(ctx, attrs_);
    if (attrs_.transpose) {
      conv_transpose_output(ctx, attrs_, g);
    } else {
      conv_output(ctx, attrs_, g);
    }
    const Tensor& x = ctx.input(0);
    Shape out{g.N, g.M};
    for (int64_t d : g.out) out.push_back(d);
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(0);
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      const Tensor& w = ctx.input(1);
      const Tensor b = ctx.has_input(2) ? ctx.input(2) : Tensor();
      if constexpr (is_half_v<T>) {
        const auto f32 = [](const Tensor& t) {
          return t.defined() ? t.cast(DataType::Float32) : Tensor();
        };
        Tensor y(DataType::Float32, out);
        compute<float>(g, f32(x), f32(w), f32(b), y);
        ctx.set_output(0, y.cast(x.dtype()));
      } else {
        compute<T>(g, x, w, b, ctx.allocate_output(0, x.dtype(), out));
      }
    });
  }

 private:
  template <class T>
  void compute(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& b,
               Tensor& y) {
    if (y.numel() == 0) return;
    const T* bias = b.defined() ? b.data<T>() : nullptr;
    if (x.numel() == 0 || w.numel() == 0) {  // no input reaches the output
      conv_ref_detail::fill_bias(g.N, g.M, g.out_size(), bias, y.data<T>());
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (g.rank() <= 3) {
        ConvEntry& e = cache_.get(du::CacheKey().add(x.shape()).add(w.shape()).add(b.defined()),
                                  [&] { return plan(g, attrs_.transpose, b.defined()); });
        if (!e.use_reference) {
          execute(e, g, x.data<float>(), w.data<float>(), bias, y.data<float>());
          return;
        }
      }
    }
    if (attrs_.transpose) {
      conv_transpose_reference<T>(g, x.data<T>(), w.data<T>(), bias, y.data<T>());
    } else {
      conv_reference<T>(g, x.data<T>(), w.data<T>(), bias, y.data<T>());
    }
  }

  ConvAttrs attrs_;
  du::PrimitiveCache<ConvEntry> cache_;
};

ConvAttrs parse_conv_attrs(const KernelInit& init, bool transpose) {
  ConvAttrs a;
  a.transpose = transpose;
  a.auto_pad = parse_auto_pad(init);
  a.group = init.attr_int("group", 1);
  if (a.group < 1) {
    throw Error("attribute 'group' is " + std::to_string(a.group) + ", expected >= 1");
  }
  a.kernel_shape = ints_at_least(init, "kernel_shape", 1);
  a.strides = ints_at_least(init, "strides", 1);
  a.dilations = ints_at_least(init, "dilations", 1);
  a.pads = ints_at_least(init, "pads", 0);
  if (a.pads && a.pads->size() % 2 != 0) {
    throw Error("attribute 'pads' is " + ints_to_string(*a.pads) +
                ", expected begin and end values for each spatial dim");
  }
  if (transpose) {
    a.output_padding = ints_at_least(init, "output_padding", 0);
    a.output_shape = ints_at_least(init, "output_shape", 0);
  }
  if (a.kernel_shape) {  // the spatial rank is known: check the lists now
    const size_t nd = a.kernel_shape->size();
    spatial_values(a.strides, "strides", nd, 1);
    spatial_values(a.dilations, "dilations", nd, 1);
    spatial_values(a.pads, "pads", nd, 0, 2);
    if (transpose) spatial_values(a.output_padding, "output_padding", nd, 0);
  }
  return a;
}

}  // namespace

std::unique_ptr<Kernel> make_conv(const KernelInit& init) {
  return std::make_unique<ConvKernel>(parse_conv_attrs(init, false));
}

std::unique_ptr<Kernel> make_conv_transpose(const KernelInit& init) {
  return std::make_unique<ConvKernel>(parse_conv_attrs(init, true));
}

}  // namespace onnxtrain::ops
