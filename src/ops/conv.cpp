// Conv and ConvTranspose (ONNX operator docs "Conv", "ConvTranspose"; version 22 of both only
// adds bfloat16).
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
// float64 and other ranks use the im2col reference of conv_ref.h. A Conv whose outer kernel
// taps read only padding convolves over the others (conv_geometry.h crop_unreached_taps) when
// its weights are fed at every run, or on a CPU without AVX-512 (ConvKernel::tap_crop); one
// whose output maps are small runs as one matrix product over the batch instead of oneDNN's
// convolution where conv_gemm.h's prefer_conv_gemm says so (CPUs without AVX-512).
//
// ai.onnxtrain.FusedConv (made by runtime/fusion.h, never saved) is a Conv followed by Relu
// (attribute activation = "Relu") and/or MaxPool without Indices (MaxPool's attributes as
// pool_kernel_shape, pool_strides, ...; with the pool, attribute channels_last = 1 writes Y
// channels-last, [N, O..., M], for a chain of ConvChannelsLast nodes after it: runtime/fusion.h
// use_channels_last). Between two pooled FusedConvs (runtime/fusion.h block_pooled_conv_pairs) the
// first, with attribute y_channel_block = b, writes Y blocked by b channels, [N, M / b, O..., b],
// and the second, with x_channel_block = b, reads X so ([N, C / b, D..., b]; b is
// conv_geometry.h pooled_conv_channel_block()). A pooled FusedConv with a second output (made by
// runtime/fusion.h block_convolution_tensors for a training graph; float32, activation Relu, 2x2
// windows at stride 2) writes there the routing bit mask of MaxPoolGrad over the convolution's
// output, one bit per element of it blocked by b = conv_channel_block() channels, uint8 [N, M / b,
// O..., b / 8] (pool_plan.h max_pool_relu_with_mask), for a MaxPoolGrad with routing_mask = 1; the
// convolution's output itself is made chunk by chunk in cache and not kept. Without a pool the
// same channel-block attributes (block_convolution_tensors on AVX-512, b = 16) read X and write Y
// blocked by b channels, through oneDNN on those tensors as they are (float32), else the plain
// path between permutations. A FusedConv without the pool with attribute weight_taps = 1 (made by
// runtime/fusion.h share_weight_taps for a training graph) writes as output 1 the taps of W the
// convolution runs with when crop_unreached_taps crops them (float32 [M, C/group, cropped k...]),
// else an empty float32 [0]; its ConvGrad reads them as input 3. Without the pool and the attributes, float32 applies Relu while
// copying oneDNN's channel-blocked output into the plain tensor. For float32 through oneDNN the convolution writes
// a scratch block, channel-blocked (where pooled_conv_channel_block() is not 0, M divides by it and
// Y is not channels-last) or else channels-last, and max_pool_channels_last (pool.cpp) reads it, so
// the largest tensor of a CNN is never reordered nor kept; otherwise the three run one by one.
//
// ai.onnxtrain.ConvChannelsLast (made by runtime/fusion.h use_channels_last, never saved) is a
// Conv, with FusedConv's optional activation = "Relu", on channels-last tensors: X [N, D..., C],
// W [M, C/group, k...] and B [M] as Conv's, Y [N, O..., M]. float32 runs through oneDNN reading
// and writing that layout (its brgemm convolutions' own on AVX-512), so chains of convolutions
// and element-wise ops pass no reorders; on constant weights of 64 Ki or more with at most 4
// output positions over the batch (ResNet-18's last stages at batch 1), as dot products of the
// patches with W's reached taps, read once (conv_gemm.h prefer_conv_stream_channels_last).
//
// Attribute parsing, shape resolution and the oneDNN view of a geometry are declared in
// conv_geometry.h: ConvGrad / ConvTransposeGrad (conv_grad.cpp) resolve them the same way.
#include <cstring>
#include <unordered_map>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/broadcast.h"
#include "ops/conv_geometry.h"
#include "ops/conv_gemm.h"
#include "ops/data_movement.h"
#include "ops/dnnl_util.h"
#include "ops/factories.h"
#include "ops/pool_plan.h"
#include "ops/relu.h"

namespace onnxtrain::ops {

namespace du = dnnl_util;

namespace {

// Checks X and W and fills everything but the output dims and pads.
ConvGeometry common_geometry(const ConvAttrs& a, const ConvOperand& xo, const ConvOperand& wo) {
  const Tensor& x = xo.tensor;
  const Tensor& w = wo.tensor;
  if (x.rank() < 3) {
    fail("input " + xo.name + " has shape " + x.shape().to_string() +
         ", expected rank >= 3 ([N, C, spatial...])");
  }
  if (w.rank() != x.rank()) {
    fail("input " + wo.name + " has shape " + w.shape().to_string() + ", expected rank " +
         std::to_string(x.rank()) + " like " + xo.name + " " + x.shape().to_string());
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
      fail("input " + wo.name + " has shape " + w.shape().to_string() + ", an empty kernel");
    }
  }
  if (a.kernel_shape && *a.kernel_shape != g.kernel) {
    fail("attribute 'kernel_shape' is " + ints_to_string(*a.kernel_shape) + " but input " +
         wo.name + " has shape " + w.shape().to_string());
  }
  g.stride = spatial_values(a.strides, "strides", nd, 1);
  g.dilation = spatial_values(a.dilations, "dilations", nd, 1);
  const std::string group = "group " + std::to_string(g.G);
  if (!a.transpose) {  // W [M, C/group, k...]
    if (g.C != w.dim(1) * g.G || w.dim(0) % g.G != 0) {
      fail("input " + xo.name + " has " + std::to_string(g.C) + " channels but " + wo.name + " " +
           w.shape().to_string() + " with " + group + " expects " + std::to_string(w.dim(1) * g.G) +
           " (W[1] * group), and W[0] must divide by group");
    }
    g.M = w.dim(0);
  } else {  // W [C, M/group, k...]
    if (g.C != w.dim(0) || g.C % g.G != 0) {
      fail("input " + xo.name + " has " + std::to_string(g.C) + " channels but " + wo.name + " " +
           w.shape().to_string() + " expects W[0] channels, divisible by " + group);
    }
    g.M = w.dim(1) * g.G;
  }
  if (w.dtype() != x.dtype()) {
    fail("input " + wo.name + " is " + w.description() + ", expected " +
         std::string(dtype_name(x.dtype())) + " like " + xo.name);
  }
  return g;
}

// Conv output dims and pads.
void conv_output(const ConvAttrs& a, const ConvOperand& xo, const ConvOperand& wo,
                 ConvGeometry& g) {
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
      fail("the kernel of " + wo.name + " spans " + std::to_string(extent) +
           " elements along spatial dim " + std::to_string(d) + " (kernel " +
           std::to_string(g.kernel[d]) + ", dilation " + std::to_string(g.dilation[d]) +
           "), more than the padded input size " + std::to_string(padded) + " of " + xo.name);
    }
    g.out[d] = (padded - extent) / g.stride[d] + 1;
  }
}

// ConvTranspose output dims and the crops of the full transposed output (see ConvGeometry).
void conv_transpose_output(const ConvAttrs& a, const ConvOperand& xo, ConvGeometry& g) {
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
           " elements along spatial dim " + std::to_string(d) + " for input " + xo.name + " " +
           xo.tensor.shape().to_string() + " (pads " + std::to_string(g.pad_begin[d]) + ", " +
           std::to_string(g.pad_end[d]) + ")");
    }
    g.pad_end[d] -= output_padding[d];
  }
}

}  // namespace

ConvGeometry resolve_conv_geometry(const ConvAttrs& a, const ConvOperand& x, const ConvOperand& w) {
  ConvGeometry g = common_geometry(a, x, w);
  if (a.transpose) {
    conv_transpose_output(a, x, g);
  } else {
    conv_output(a, x, w, g);
  }
  return g;
}

Shape conv_output_shape(const ConvGeometry& g) {
  Shape out{g.N, g.M};
  for (int64_t d : g.out) out.push_back(d);
  return out;
}

// ---------------------------------------------------------------------------------------------
// oneDNN

DnnlConvDims dnnl_conv_dims(const ConvGeometry& g) {
  const size_t nd = g.rank();
  DnnlConvDims d;
  d.strides.assign(g.stride.begin(), g.stride.end());
  d.dilates.resize(nd);
  d.pad_l.resize(nd);
  d.pad_r.resize(nd);
  d.dst_dims = g.out;
  d.dst_offset.assign(nd, 0);
  for (size_t i = 0; i < nd; ++i) {
    d.dilates[i] = g.dilation[i] - 1;
    d.pad_l[i] = std::max<int64_t>(g.pad_begin[i], 0);
    d.pad_r[i] = std::max<int64_t>(g.pad_end[i], 0);
    d.dst_offset[i] = d.pad_l[i] - g.pad_begin[i];
    d.dst_dims[i] -= d.dst_offset[i] + (d.pad_r[i] - g.pad_end[i]);
    d.embed = d.embed || d.dst_dims[i] != g.out[i];
    d.empty = d.empty || d.dst_dims[i] <= 0;
  }
  return d;
}

dnnl::memory::dims dims_of(int64_t a, int64_t b, const std::vector<int64_t>& rest) {
  dnnl::memory::dims d{a, b};
  d.insert(d.end(), rest.begin(), rest.end());
  return d;
}

dnnl::memory::desc conv_weights_desc(const ConvGeometry& g, bool transpose) {
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

void copy_conv_block(const ConvGeometry& g, const DnnlConvDims& d, const float* from, float* to,
                     bool into_y) {
  const size_t nd = g.rank();
  const int64_t block_size = dims_product(d.dst_dims), out_size = g.out_size();
  if (block_size <= 0) return;
  const int64_t row = d.dst_dims[nd - 1];
  std::vector<int64_t> out_stride(nd, 1), idx(nd, 0);
  for (size_t i = nd; i-- > 1;) out_stride[i - 1] = out_stride[i] * g.out[i];
  for (int64_t c = 0; c < g.N * g.M; ++c) {
    const float* src = from + c * (into_y ? block_size : out_size);
    float* dst = to + c * (into_y ? out_size : block_size);
    std::fill(idx.begin(), idx.end(), 0);
    for (int64_t line = 0; line < block_size / row; ++line) {
      int64_t offset = 0;
      for (size_t i = 0; i < nd; ++i) offset += (idx[i] + d.dst_offset[i]) * out_stride[i];
      const int64_t block_offset = line * row;
      if (into_y) {
        std::copy(src + block_offset, src + block_offset + row, dst + offset);
      } else {
        std::copy(src + offset, src + offset + row, dst + block_offset);
      }
      for (size_t i = nd - 1; i-- > 0;) {
        if (++idx[i] < d.dst_dims[i]) break;
        idx[i] = 0;
      }
    }
  }
}

std::optional<TapCrop> crop_unreached_taps(const ConvGeometry& g) {
  TapCrop crop{g, std::vector<int64_t>(g.rank(), 0)};
  bool cropped = false;
  for (size_t i = 0; i < g.rank(); ++i) {
    const int64_t k = g.kernel[i], s = g.stride[i], d = g.dilation[i], p = g.pad_begin[i];
    // Tap t reaches the input when some output o in [0, out) has o * s in [p - t d, p - t d + in).
    const auto reached = [&](int64_t t) {
      const int64_t lo = p - t * d, hi = lo + g.in[i] - 1;
      const int64_t o = lo <= 0 ? 0 : (lo + s - 1) / s;  // the first output at or after lo
      return o < g.out[i] && o * s <= hi;
    };
    int64_t first = 0, end = k;
    while (first < k && !reached(first)) ++first;
    if (first == k) return std::nullopt;  // no tap reaches the input
    while (!reached(end - 1)) --end;
    const int64_t pad_begin = p - first * d, pad_end = g.pad_end[i] - (k - end) * d;
    if (pad_begin < 0 || pad_end < 0) return std::nullopt;
    cropped = cropped || first > 0 || end < k;
    crop.first[i] = first;
    crop.geometry.kernel[i] = end - first;
    crop.geometry.pad_begin[i] = pad_begin;
    crop.geometry.pad_end[i] = pad_end;
  }
  if (!cropped) return std::nullopt;
  return crop;
}

namespace {

// The offsets in one [kernel...] block of W of the taps `crop` keeps, in the cropped block's
// row-major order.
std::vector<int64_t> kept_tap_offsets(const ConvGeometry& g, const TapCrop& crop) {
  const ConvGeometry& c = crop.geometry;
  const size_t nd = g.rank();
  std::vector<int64_t> offsets(static_cast<size_t>(c.kernel_size()));
  std::vector<int64_t> idx(nd, 0);
  for (int64_t& offset : offsets) {
    offset = 0;
    for (size_t i = 0; i < nd; ++i) offset = offset * g.kernel[i] + crop.first[i] + idx[i];
    for (size_t i = nd; i-- > 0;) {
      if (++idx[i] < c.kernel[i]) break;
      idx[i] = 0;
    }
  }
  return offsets;
}

// f(full, cropped) for each [kernel...] block of W, in parallel: `full` its first element's
// index in W, `cropped` in the cropped W, offsets = kept_tap_offsets.
template <class F>
void for_each_weight_block(const ConvGeometry& g, const std::vector<int64_t>& offsets, F f) {
  const int64_t k = g.kernel_size(), kept = static_cast<int64_t>(offsets.size());
  parallel_for(g.M * (g.C / g.G), std::max<int64_t>(1, kParallelGrain / k), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) f(b * k, b * kept);
  });
}

}  // namespace

Shape TapCrop::weights_shape() const {
  Shape shape{geometry.M, geometry.C / geometry.G};
  for (int64_t k : geometry.kernel) shape.push_back(k);
  return shape;
}

void gather_taps(const ConvGeometry& g, const TapCrop& crop, const float* w, float* wc) {
  const std::vector<int64_t> offsets = kept_tap_offsets(g, crop);
  for_each_weight_block(g, offsets, [&](int64_t full, int64_t cropped) {
    for (size_t j = 0; j < offsets.size(); ++j) wc[cropped + static_cast<int64_t>(j)] = w[full + offsets[j]];
  });
}

Tensor gather_taps(const ConvGeometry& g, const TapCrop& crop, const float* w) {
  Tensor cropped(DataType::Float32, crop.weights_shape());
  gather_taps(g, crop, w, cropped.data<float>());
  return cropped;
}

Tensor kept_taps_description(const ConvGeometry& g, const TapCrop& crop) {
  const std::vector<int64_t> offsets = kept_tap_offsets(g, crop);
  Tensor t(DataType::Int64, Shape{static_cast<int64_t>(offsets.size()) + 1});
  int64_t* p = t.data<int64_t>();
  p[0] = g.kernel_size();
  std::copy(offsets.begin(), offsets.end(), p + 1);
  return t;
}

Tensor weight_taps(const ConvGeometry& g, const TapCrop& crop, const float* w, const Tensor* given) {
  if (given && given->defined() && given->dtype() == DataType::Float32 && given->shape() == crop.weights_shape()) {
    return *given;
  }
  return gather_taps(g, crop, w);
}

void scatter_taps(const ConvGeometry& g, const TapCrop& crop, const float* dwc, float* dw) {
  const std::vector<int64_t> offsets = kept_tap_offsets(g, crop);
  const int64_t k = g.kernel_size();
  for_each_weight_block(g, offsets, [&](int64_t full, int64_t cropped) {
    std::fill(dw + full, dw + full + k, 0.0f);
    for (size_t j = 0; j < offsets.size(); ++j) dw[full + offsets[j]] = dwc[cropped + static_cast<int64_t>(j)];
  });
}

namespace {

// A convolution or deconvolution primitive with its argument memories.
struct ConvEntry {
  bool use_reference = false;  // oneDNN has no implementation for these shapes
  dnnl::primitive primitive;
  du::Operand src, dst;  // in the layouts the primitive chose (blocked ones run faster)
  du::Scratchpad scratchpad;
  dnnl::memory user_weights, weights, bias;
  bool reorder_weights = false;  // the primitive wants another weights layout than ONNX's
  bool weights_in_scratch = false;  // `weights` lives in thread_scratch memory for one run
  dnnl::reorder weights_reorder;
  // Constant weights (an initializer no run replaces) already reordered into `weights`: their
  // data, so later runs skip the reorder (at batch 1 it costs more than the convolution).
  const float* weights_reordered_from = nullptr;
  // Constant weights in the form a path runs them (ConvKernel::run_weights: cropped to the taps
  // that reach the input, and/or with the channel dim last), made on the first run from the
  // data at `kept_from`.
  Tensor kept_weights;
  const float* kept_from = nullptr;
  std::unordered_map<int, dnnl::memory> args;  // the memories above by role
  // ConvTranspose with negative crops: oneDNN fills only the dst_dims block of y.
  DnnlConvDims dims;
  std::vector<float> dst_buffer;
  // The channel block (16 or 8) when the primitive writes the blocked layout of
  // blocked_channels_f32 into dst's own buffer, else 0.
  int64_t dst_channel_block = 0;
};

// A dense channels-last descriptor ([N, C, D...] dims stored as N, D..., C).
dnnl::memory::desc channels_last_f32(const dnnl::memory::dims& dims) {
  dnnl::memory::dims strides(dims.size());
  int64_t stride = dims[1];
  for (size_t d = dims.size(); d-- > 2;) {
    strides[d] = stride;
    stride *= dims[d];
  }
  strides[1] = 1;
  strides[0] = stride;
  return du::strided_f32(dims, strides);
}

// blocked_channels_f32 (conv_geometry.h): a descriptor blocked by channels the way oneDNN's direct
// convolutions write fastest on this CPU (nChw16c with AVX-512, nChw8c with AVX2), or format any
// elsewhere. A Conv whose output
// is read as a plain NCHW tensor asks for it instead of leaving the choice to oneDNN, which
// picks channels-last (brgconv) for inference on AVX-512: reordering a channels-last output to
// NCHW costs several times the blocked one (Fashion-MNIST CNN conv1, 128x32x28x28 on two
// Xeon cores: convolution + reorder 0.6 + 1.5 ms channels-last, 0.4 + 0.5 ms blocked), except
// on small outputs (kSmallOutput).
// The channel block of that layout: 16, 8, or 0 for none.
int channel_block() {
  return du::has_avx512() ? 16 : du::has_isa(dnnl::cpu_isa::avx2) ? 8 : 0;
}

// The layout of a convolution's source or destination in oneDNN: ONNX's [N, C, D...], channels-last
// [N, D..., C], or blocked by channel_block() channels ([N, C / b, D..., b], blocked_channels_f32).
enum class ConvLayout { Plain, ChannelsLast, Blocked };

dnnl::memory::desc layout_f32(ConvLayout layout, const dnnl::memory::dims& dims) {
  switch (layout) {
    case ConvLayout::ChannelsLast:
      return channels_last_f32(dims);
    case ConvLayout::Blocked:
      return blocked_channels_f32(dims);
    case ConvLayout::Plain:
      break;
  }
  return du::plain_f32(dims);
}

// Up to this many output positions (N x output spatial size) oneDNN chooses the destination
// layout too: on small maps its own choice (channels-last, brgemm-based brgconv on AVX-512) runs
// several times faster than its direct convolution into the channel-blocked layout, which pays
// off only on larger outputs. bench/workloads.py's ResNet-18 at 32x32, batch 1, two AMD EPYC
// cores, alternating runs: 0.53-0.57 ms blocked everywhere, 0.39-0.41 with oneDNN's choice up
// to 64, 256, 1024 positions or everywhere alike; at batch 128 oneDNN's choice everywhere was
// 5-10 % slower; the layer-4 3x3 convolution on a 1x1 map (512 channels) alone: 25-30 us blocked,
// 7 us oneDNN's choice (bench/conv_peak.py). Not for 1x1 kernels (after crop_unreached_taps)
// on weights reordered at every run (a training step's): brgconv's weight layouts (Acdb48a,
// Acdb64a: output channels padded to 48 or 64) take oneDNN 2.6's slow generic reorder. ResNet-18
// at 32x32, batch 32, layer 4 (AMD EPYC Zen 4, 2 threads, fastest of 30 runs, weight reorder +
// convolution): 512 -> 512 on 1x1 maps 0.325 + 0.180 ms with oneDNN's choice, 0.031 + 0.276 blocked
// (jit_1x1); the 256 -> 512 stride-2 shortcut 0.076 + 0.085 against 0.008 + 0.078.
constexpr int64_t kSmallOutput = 64;

// The bytes of convolution output per chunk of images in ConvKernel::convolve_and_pool: the
// L2 cache of one core of the development machines (AMD EPYC, 1 MiB). The Fashion-MNIST CNN's
// conv1 (1 -> 32 channels, 5x5 on 28x28) with its Relu and 2x2 max pool at batch 128 took 5.6
// ms in one call against 2.8-3.2 in 16 calls of 8 images (0.8 MB of output each) and 2.8 in 4
// of 32 (AVX2 Zen 3, 2 threads).
constexpr int64_t kPooledChunkBytes = int64_t{1} << 20;

// Whether a convolution between channels-last tensors (ai.onnxtrain.ConvChannelsLast) runs
// faster as oneDNN's direct convolution in the channel-blocked layout, reordering its input and
// output, than as the brgemm convolution on the channels-last tensors themselves: on outputs of
// more than kSmallOutput positions whose input map is smaller than the kernel in some dim (most
// taps fall in the padding). ResNet-18 at 32x32, two AMD EPYC cores, oneDNN 2.6 (ms over 30
// runs, brgemm / blocked): batch 128, layer 3's 3x3 convolutions on 2x2 maps 63 / 37, layer 4's
// first (2x2 input) 47 / 28, layer 1 and 2 (8x8, 4x4) 27-35 / 37-42, layer 4's on 1x1 maps
// 25-28 / 26-28; at batch 1 (<= 64 positions everywhere) brgemm is 1.6-4x faster in every layer.
// The whole network at batch 128: 22.5-23.5 ms with brgemm everywhere, 19.8-20.7 with this rule.
bool blocked_for_channels_last(const ConvGeometry& g, const DnnlConvDims& d) {
  if (g.N * dims_product(d.dst_dims) <= kSmallOutput) return false;
  for (size_t k = 0; k < g.rank(); ++k) {
    if (g.in[k] < g.kernel[k]) return true;
  }
  return false;
}

// `dst_layout`: how y is written (channels-last or blocked for max_pool_channels_last to read,
// channels-last by ai.onnxtrain.ConvChannelsLast); `src_layout`: how x is read. A blocked
// destination on oneDNN's reference loops gives use_reference (the caller has another path).
// `weights_constant`: the reordered weights are kept between runs (ConvKernel::weights_constant_);
// otherwise they are reordered at every run into thread_scratch memory.
ConvEntry plan(const ConvGeometry& g, bool transpose, bool has_bias, bool weights_constant,
               ConvLayout dst_layout = ConvLayout::Plain, ConvLayout src_layout = ConvLayout::Plain) {
  using dnnl::memory;
  ConvEntry e;
  e.dims = dnnl_conv_dims(g);
  const DnnlConvDims& d = e.dims;
  if (d.empty) {
    e.use_reference = true;  // only outputs no input reaches
    return e;
  }
  const memory::desc src = layout_f32(src_layout, dims_of(g.N, g.C, g.in));
  const memory::desc dst = layout_f32(dst_layout, dims_of(g.N, g.M, d.dst_dims));
  const memory::desc any_src(src.dims(), memory::data_type::f32, memory::format_tag::any);
  const memory::desc any_dst = memory::desc(dst.dims(), memory::data_type::f32, memory::format_tag::any);
  memory::desc src_wanted = src, dst_wanted = dst;
  const memory::desc user_weights = conv_weights_desc(g, transpose);
  const memory::desc any_weights(user_weights.dims(), memory::data_type::f32,
                                 memory::format_tag::any);
  const memory::desc bias = has_bias ? du::plain_f32({g.M}) : memory::desc();
  const dnnl::engine& engine = du::cpu_engine();
  memory::desc weights;
  try {
    if (!transpose) {
      using P = dnnl::convolution_forward;
      const auto make_pd = [&](const memory::desc& dst_asked, const memory::desc& src_asked) {
        const P::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                           src_asked, any_weights, bias, dst_asked, d.strides, d.dilates, d.pad_l,
                           d.pad_r);
        return P::primitive_desc(desc, du::user_scratchpad(), engine);
      };
      const auto is_reference = [](const P::primitive_desc& p) {
        return std::string(p.impl_info_str()).starts_with("ref");
      };
      P::primitive_desc pd;
      if (src_layout == ConvLayout::ChannelsLast && blocked_for_channels_last(g, d)) {
        pd = make_pd(blocked_channels_f32(dst.dims()), any_src);  // src and dst reordered around it
      } else if (dst_layout == ConvLayout::Blocked) {
        pd = make_pd(dst, src_layout == ConvLayout::Blocked ? src : any_src);
        if (is_reference(pd)) {
          e.use_reference = true;
          return e;
        }
      } else if (dst_layout == ConvLayout::ChannelsLast) {
        pd = make_pd(dst, any_src);
        // oneDNN 2.6 without AVX-512 has no jit convolution writing channels-last from a source
        // left to it (format any): it takes its reference loops (ref:any), which ran the Fashion-MNIST
        // CNN's second convolution at batch 16 in ~4 s instead of ~2 ms on an AVX2 machine. Its jit
        // convolutions do read a channels-last source (reordered from x when x is channels-first).
        if (is_reference(pd)) {
          try {
            P::primitive_desc on_channels_last = make_pd(dst, channels_last_f32(src.dims()));
            if (!is_reference(on_channels_last)) pd = on_channels_last;
          } catch (const dnnl::error&) {  // keep the first choice
          }
        }
      } else if (g.N * dims_product(d.dst_dims) <= kSmallOutput && (weights_constant || g.kernel_size() > 1)) {
        pd = make_pd(any_dst, any_src);
      } else {
        try {
          pd = make_pd(blocked_channels_f32(dst.dims()), any_src);
        } catch (const dnnl::error&) {  // no blocked implementation: let oneDNN choose
        }
        // Only oneDNN's reference loops take the blocked layout: its own choice runs faster.
        if (!pd || is_reference(pd)) pd = make_pd(any_dst, any_src);
      }
      e.primitive = P(pd);
      e.scratchpad = du::Scratchpad(pd.scratchpad_desc());
      weights = pd.weights_desc();
      src_wanted = pd.src_desc();
      dst_wanted = pd.dst_desc();
    } else {
      using P = dnnl::deconvolution_forward;
      const P::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                         src, any_weights, bias, dst, d.strides, d.dilates, d.pad_l, d.pad_r);
      const P::primitive_desc pd(desc, du::user_scratchpad(), engine);
      e.primitive = P(pd);
      e.scratchpad = du::Scratchpad(pd.scratchpad_desc());
      weights = pd.weights_desc();
    }
  } catch (const dnnl::error&) {  // no implementation for these shapes: use the reference
    e.use_reference = true;
    return e;
  }
  du::checked("prepare convolution memories", [&] {
    e.src = du::Operand(src, src_wanted, true);
    e.user_weights = memory(user_weights, engine, nullptr);
    e.dst = du::Operand(dst, dst_wanted, false);
    if (has_bias) e.bias = memory(bias, engine, nullptr);
    e.reorder_weights = weights != user_weights;
    if (e.reorder_weights) {
      // In the primitive's layout: an owned buffer for constant weights, else placed per run.
      e.weights = weights_constant ? memory(weights, engine) : memory(weights, engine, nullptr);
      e.weights_in_scratch = !weights_constant;
      e.weights_reorder = dnnl::reorder(e.user_weights, e.weights);
    }
    e.args = {{DNNL_ARG_SRC, e.src.arg()},
              {DNNL_ARG_WEIGHTS, e.reorder_weights ? e.weights : e.user_weights},
              {DNNL_ARG_DST, e.dst.arg()}};
    if (has_bias) e.args[DNNL_ARG_BIAS] = e.bias;
    e.scratchpad.add_to(e.args);
  });
  if (d.embed) e.dst_buffer.resize(static_cast<size_t>(g.N * g.M * dims_product(d.dst_dims)));
  if (!transpose && dst_layout == ConvLayout::Plain && e.dst.arg().get_desc() == blocked_channels_f32(dst.dims())) {
    e.dst_channel_block = channel_block();
  }
  return e;
}

// Runs the convolution into y; with `reorder_dst` false a blocked result stays in e.dst's own
// buffer (e.dst.arg()) and y is not written.
// `weights_constant`: w holds the same values at every run (see ConvKernel::weights_constant_).
// `weights_ready`: the previous call on `e`, in this run and with no other use of the thread's
// scratch memory since, reordered the same w (chunks of one batch), so this one skips it.
void execute(ConvEntry& e, const ConvGeometry& g, const float* x, const float* w, const float* b,
             float* y, bool weights_constant, bool reorder_dst = true, bool weights_ready = false) {
  const bool embed = e.dims.embed;
  if (embed) conv_ref_detail::fill_bias(g.N, g.M, g.out_size(), b, y);
  dnnl::stream& stream = du::cpu_stream();
  du::checked("run a convolution", [&] {
    const size_t weights_bytes = e.weights_in_scratch ? du::scratch_size(e.weights.get_desc()) : 0;
    char* scratch = du::thread_scratch(e.src.scratch_bytes() + e.dst.scratch_bytes() + e.scratchpad.scratch_bytes() +
                                       weights_bytes);
    e.src.place(scratch);
    e.dst.place(scratch);  // a caller passing reorder_dst = false reads it before the next call
    e.scratchpad.place(scratch);
    if (weights_bytes) e.weights.set_data_handle(scratch);
    e.src.bind(x);
    e.user_weights.set_data_handle(const_cast<float*>(w));
    e.dst.bind(embed ? e.dst_buffer.data() : y);
    if (b) e.bias.set_data_handle(const_cast<float*>(b));
    if (e.reorder_weights && !weights_ready && !(weights_constant && e.weights_reordered_from == w)) {
      e.weights_reorder.execute(stream, e.user_weights, e.weights);
      e.weights_reordered_from = weights_constant ? w : nullptr;
    }
    e.src.reorder(stream);
    e.primitive.execute(stream, e.args);
    if (reorder_dst) e.dst.reorder(stream);
    stream.wait();
  });
  if (embed) copy_conv_block(g, e.dims, e.dst_buffer.data(), y, true);
}

// ---------------------------------------------------------------------------------------------

// What ai.onnxtrain.FusedConv (runtime/fusion.h) runs after the convolution: Relu, then MaxPool
// without Indices. Plain Conv and ConvTranspose have neither.
struct ConvEpilogue {
  bool relu = false;
  std::optional<PoolAttrs> pool;
  bool channels_last_y = false;  // with the pool: y [N, O..., M] (attribute channels_last = 1)
  // With the pool: x [N, C / b, D..., b] and y [N, M / b, O..., b] for b not 0 (attributes
  // x_channel_block and y_channel_block).
  int64_t x_channel_block = 0, y_channel_block = 0;
  // Without the pool: output 1 = the taps of W the convolution runs with (attribute weight_taps = 1;
  // ConvKernel::write_weight_taps).
  bool weight_taps = false;
};

bool is_half(DataType t) { return t == DataType::Float16 || t == DataType::BFloat16; }


class ConvKernel final : public Kernel {
 public:
  ConvKernel(const KernelInit& init, ConvAttrs attrs, ConvEpilogue epilogue = {}, bool channels_last = false)
      : attrs_(std::move(attrs)),
        epilogue_(std::move(epilogue)),
        weights_constant_(init.input_is_constant(1)),
        channels_last_(channels_last) {}

  void run(KernelContext& ctx) override {
    if (channels_last_) {
      run_channels_last(ctx);
      return;
    }
    const Tensor& x = ctx.input(0);
    const int64_t xb = epilogue_.x_channel_block;
    const ConvGeometry g =
        geometry(ctx, xb ? x.view(channels_merged_shape(x, ctx.input_name(0), ctx.input(1).rank() - 2, xb,
                                                        "x_channel_block"))
                         : x);
    Shape out = conv_output_shape(g);
    const PoolPlan* pool = nullptr;
    if (epilogue_.pool) {
      pool = &pool_plans_.get(*epilogue_.pool, out, "(the convolution's output)");
      const int64_t yb = epilogue_.y_channel_block;
      if (yb && g.M % yb != 0) {
        fail("input " + ctx.input_name(1) + " has " + std::to_string(g.M) +
             " output channels, which attribute y_channel_block = " + std::to_string(yb) + " does not divide");
      }
      out = Shape{g.N};
      if (!epilogue_.channels_last_y) out.push_back(yb ? g.M / yb : g.M);
      for (int64_t d : pool->out) out.push_back(d);
      if (epilogue_.channels_last_y) out.push_back(g.M);
      if (yb) out.push_back(yb);
    } else if (const int64_t yb = epilogue_.y_channel_block) {
      if (g.M % yb != 0) {
        fail("input " + ctx.input_name(1) + " has " + std::to_string(g.M) +
             " output channels, which attribute y_channel_block = " + std::to_string(yb) + " does not divide");
      }
      out = channel_blocked_shape(out, yb);
    }
    if (epilogue_.weight_taps) {
      write_weight_taps(ctx, g);
    } else if (ctx.has_output(1)) {  // the pool's routing mask (output 1)
      forward_with_mask(ctx, g, pool, x, out);
      return;
    }
    struct ForgetTaps {  // run_taps_ holds this run's output 1 only
      Tensor& taps;
      ~ForgetTaps() { taps = Tensor(); }
    } forget{run_taps_};
    if (is_half(x.dtype())) {  // through float32
      Tensor y(DataType::Float32, out);
      forward(ctx, g, pool, x, y, epilogue_.relu);
      ctx.set_output(0, y.cast(x.dtype()));
    } else {
      forward(ctx, g, pool, x, ctx.allocate_output(0, x.dtype(), out), epilogue_.relu);
    }
  }

 private:
  // Attribute weight_taps = 1: output 1 = the taps of W (input 1) that tap_crop keeps, which this
  // run's convolution runs with (run_taps_) and the node's ConvGrad reads as its input 3 instead of
  // gathering them again (runtime/fusion.h share_weight_taps): ResNet-18's layer-4 convolutions on
  // 1x1 maps keep 1 tap of 9, and each gather reads all 9.4 MB of a 512 x 512 x 3 x 3 W. An empty
  // float32 [0] where the run crops nothing (or runs other than float32 with at most 3 spatial dims).
  void write_weight_taps(KernelContext& ctx, const ConvGeometry& g) {
    const Tensor& w = ctx.input(1);
    std::optional<TapCrop> crop;
    if (ctx.input(0).dtype() == DataType::Float32 && w.dtype() == DataType::Float32 && g.rank() <= 3) crop = tap_crop(g);
    if (!crop || weights_constant_) {
      ctx.allocate_output(1, DataType::Float32, Shape{0});
      return;
    }
    run_taps_ = ctx.allocate_output(1, DataType::Float32, crop->weights_shape());
    gather_taps(g, *crop, w.data<float>(), run_taps_.data<float>());
  }

  // The geometry of the node's convolution of x [N, C, D...] (ctx's input 0, or its
  // channels-first or unblocked view) with input 1, after checking input 2 (the bias) against it.
  ConvGeometry geometry(KernelContext& ctx, const Tensor& x) const {
    const ConvGeometry g =
        resolve_conv_geometry(attrs_, {x, ctx.input_name(0)}, {ctx.input(1), ctx.input_name(1)});
    if (ctx.has_input(2)) {
      const Tensor& b = ctx.input(2);
      if (b.dtype() != x.dtype()) {
        fail("input " + ctx.input_name(2) + " is " + b.description() + ", expected " +
             std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(0));
      }
      if (!(b.shape() == Shape{g.M})) {
        fail("input " + ctx.input_name(2) + " has shape " + b.shape().to_string() + ", expected [" +
             std::to_string(g.M) + "] (one bias per output channel)");
      }
    }
    return g;
  }

  // y = the convolution of x (channels-first) and the epilogue, all in the layout of the
  // channels-first ops; y is float32 when x is float16 or bfloat16 (converted to it and back).
  void forward(KernelContext& ctx, const ConvGeometry& g, const PoolPlan* pool, const Tensor& x, Tensor& y,
               bool relu) {
    const std::string what = ctx.node().op_type + " input " + ctx.input_name(0);
    visit_dtype<FloatTypes>(x.dtype(), what, [&]<class T>() {
      const Tensor& w = ctx.input(1);
      const Tensor b = ctx.has_input(2) ? ctx.input(2) : Tensor();
      if constexpr (is_half_v<T>) {
        const auto f32 = [](const Tensor& t) {
          return t.defined() ? t.cast(DataType::Float32) : Tensor();
        };
        compute<float>(g, pool, f32(x), f32(w), f32(b), y, relu);
      } else {
        compute<T>(g, pool, x, w, b, y, relu);
      }
    });
  }

  // ai.onnxtrain.ConvChannelsLast: x [N, D..., C] -> y [N, O..., M] (the node's Conv on the
  // tensors permuted channels-first, then permuted back); with input 3, z, y = the convolution +
  // z (broadcast as Add), then the activation. float32 runs through oneDNN reading and writing
  // that layout; anything else through the channels-first path between two permutations.
  void run_channels_last(KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.rank() < 3) {
      fail("input " + ctx.input_name(0) + " has shape " + x.shape().to_string() +
           ", expected rank >= 3 ([N, spatial..., C], channels-last)");
    }
    // The geometry from x's shape read channels-first (a view for its shape only: the data stays).
    const ConvGeometry g = geometry(ctx, x.view(permuted_shape(x.shape(), channels_first_order(x.rank()))));
    const Shape out = conv_output_shape(g);
    const Shape conv_shape = permuted_shape(out, channels_last_order(out.size()));
    const bool has_sum = ctx.has_input(3);
    if (has_sum && ctx.input(3).dtype() != x.dtype()) {
      fail("input " + ctx.input_name(3) + " is " + ctx.input(3).description() + ", expected " +
           std::string(dtype_name(x.dtype())) + " like " + ctx.input_name(0) + " (it is added to the convolution)");
    }
    const Shape y_shape = has_sum ? broadcast_shapes(conv_shape, ctx.input(3).shape()) : conv_shape;
    Tensor& y = ctx.allocate_output(0, x.dtype(), y_shape);
    // The convolution's result: y itself, unless z broadcasts it to a larger shape.
    Tensor conv = y_shape == conv_shape ? y : Tensor(x.dtype(), conv_shape);
    const bool relu_now = epilogue_.relu && !has_sum;
    convolve_channels_last(ctx, g, x, conv, relu_now);
    if (has_sum && y.numel() > 0) add_then_activation(conv, ctx.input(3), y);
  }

  // conv [N, O..., M] = the convolution of x [N, D..., C] (then Relu when `relu`).
  void convolve_channels_last(KernelContext& ctx, const ConvGeometry& g, const Tensor& x, Tensor& conv, bool relu) {
    if (conv.numel() == 0) return;
    const Tensor& w = ctx.input(1);
    if (x.dtype() == DataType::Float32 && w.dtype() == DataType::Float32 && g.rank() <= 3 && x.numel() > 0 &&
        w.numel() > 0) {
      const bool has_bias = ctx.has_input(2);
      const std::optional<TapCrop> crop = tap_crop(g);
      const ConvGeometry& run_g = crop ? crop->geometry : g;
      const float* bias = has_bias ? ctx.input(2).data<float>() : nullptr;
      // W's taps under `taps`, each with its channels last, for a lowered path (`kind` keys its
      // entry, which only keeps that copy of constant weights).
      const auto taps_first = [&](const std::optional<TapCrop>& taps, int kind, Tensor& gathered) {
        ConvEntry& kept = cache_.get(du::CacheKey().add(x.shape()).add(w.shape()).add(has_bias).add(kind),
                                     [] { return ConvEntry(); });
        return run_weights(kept, g, taps, w, gathered, true);
      };
      Tensor gathered;
      if (!attrs_.transpose && weights_constant_ && g.N * g.out_size() <= kMaxStreamRows) {
        // Few output rows on constant weights: W's reached taps read once (conv_gemm.h
        // prefer_conv_stream_channels_last). Cropping the taps keeps the output rows, so other
        // geometries skip the crop at every run.
        const std::optional<TapCrop> reached = crop_unreached_taps(g);
        const ConvGeometry& stream_g = reached ? reached->geometry : g;
        if (prefer_conv_stream_channels_last(stream_g)) {
          conv_stream_forward_channels_last(stream_g, x.data<float>(), taps_first(reached, 4, gathered), bias,
                                            conv.data<float>(), relu);
          return;
        }
      }
      if (!attrs_.transpose && prefer_conv_gemm_channels_last(run_g)) {  // one matrix product over the batch (conv_gemm.h)
        conv_gemm_forward_channels_last(run_g, x.data<float>(), taps_first(crop, 3, gathered), bias, conv.data<float>(),
                                        relu);
        return;
      }
      if (convolve_in_layouts(g, crop, x, w, bias, conv, relu, ConvLayout::ChannelsLast, ConvLayout::ChannelsLast)) return;
    }
    const Tensor x_first = permuted(x, channels_first_order(x.rank()));
    Tensor conv_first(is_half(x.dtype()) ? DataType::Float32 : x.dtype(), conv_output_shape(g));
    forward(ctx, g, nullptr, x_first, conv_first, relu);
    const Tensor conv_last = permuted(conv_first, channels_last_order(conv_first.rank()));
    const Tensor cast = conv_last.dtype() == conv.dtype() ? conv_last : conv_last.cast(conv.dtype());
    std::memcpy(conv.raw_data(), cast.raw_data(), static_cast<size_t>(conv.numel()) * dtype_size(conv.dtype()));
  }

  // y = conv + z (broadcast as Add; y may be conv itself), then the activation. Sums in z's
  // type; float16 and bfloat16 through float32, as the Add op does.
  void add_then_activation(const Tensor& conv, const Tensor& z, Tensor& y) const {
    const bool relu = epilogue_.relu;
    if (y.dtype() == DataType::Float32 && conv.shape() == z.shape()) {  // the residual connection
      const float* a = conv.data<float>();  // may be y's own data
      const float* b = z.data<float>();
      float* out = y.data<float>();
      parallel_for(y.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const float v = a[i] + b[i];
          out[i] = relu ? ops::relu(v) : v;
        }
      });
      return;
    }
    visit_dtype<FloatTypes>(y.dtype(), "the sum of a convolution", [&]<class T>() {
      using C = std::conditional_t<is_half_v<T>, float, T>;  // the type the sum is made in
      const Broadcast<2> bc({&conv.shape(), &z.shape()});
      const T* a = conv.data<T>();
      const T* b = z.data<T>();
      T* out = y.data<T>();
      bc.for_each_run([&](int64_t o, const auto& in, int64_t len, const auto& step) {
        for (int64_t i = 0; i < len; ++i) {
          const C v = static_cast<C>(a[in[0] + i * step[0]]) + static_cast<C>(b[in[1] + i * step[1]]);
          out[o + i] = static_cast<T>(relu ? ops::relu(v) : v);
        }
      });
    });
  }

  // The permutations (Transpose's perm) that move the channel dim (1) of a rank-`rank` tensor
  // last, and back.
  static std::vector<int64_t> channels_last_order(size_t rank) {
    std::vector<int64_t> order{0};
    for (size_t d = 2; d < rank; ++d) order.push_back(static_cast<int64_t>(d));
    order.push_back(1);
    return order;
  }
  static std::vector<int64_t> channels_first_order(size_t rank) {
    std::vector<int64_t> order{0, static_cast<int64_t>(rank) - 1};
    for (size_t d = 1; d + 1 < rank; ++d) order.push_back(static_cast<int64_t>(d));
    return order;
  }

  // y = the convolution, then Relu when `relu`, then the pool (`pool` planned for the
  // convolution's output shape); x and y in the layouts of the epilogue's attributes.
  template <class T>
  void compute(const ConvGeometry& g, const PoolPlan* pool, const Tensor& x_in, const Tensor& w,
               const Tensor& b, Tensor& y, bool relu) {
    if (y.numel() == 0) return;
    const T* bias = b.defined() ? b.data<T>() : nullptr;
    if (!pool) {
      if (epilogue_.x_channel_block || epilogue_.y_channel_block) {
        convolve_blocked<T>(g, x_in, w, bias, y, relu);
        return;
      }
      if constexpr (std::is_same_v<T, float>) {
        if (relu && convolve_relu(g, x_in, w, bias, y.data<float>())) return;
      }
      convolve<T>(g, x_in, w, bias, y.data<T>());
      if (relu) relu_in_place<T>(y.data<T>(), y.numel());
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (g.rank() <= 3 && x_in.numel() > 0 && w.numel() > 0 && convolve_and_pool(g, *pool, x_in, w, bias, y, relu)) {
        return;
      }
    }
    const Tensor x = epilogue_.x_channel_block ? unblocked_channels(x_in, epilogue_.x_channel_block) : x_in;
    // The convolution's output lives for this run only (a block of the tensor block cache).
    Tensor conv_out(x.dtype(), conv_output_shape(g));
    convolve<T>(g, x, w, bias, conv_out.data<T>());
    if (!epilogue_.channels_last_y && !epilogue_.y_channel_block) {
      max_pool_forward(*pool, conv_out, y);
      if (relu) relu_in_place<T>(y.data<T>(), y.numel());
      return;
    }
    Shape plain{g.N, g.M};  // pooled channels-first, then permuted into y
    for (int64_t d : pool->out) plain.push_back(d);
    Tensor pooled(y.dtype(), plain);
    max_pool_forward(*pool, conv_out, pooled);
    if (relu) relu_in_place<T>(pooled.data<T>(), pooled.numel());
    if (epilogue_.y_channel_block) {
      copy_into_channel_blocks(pooled, y, epilogue_.y_channel_block);
    } else {
      copy_permuted(pooled, y, channels_last_order(plain.size()));
    }
  }

  // A pooled FusedConv with output 1: y (output 0, `y_shape`) = Relu(MaxPool(the convolution)),
  // and output 1 the routing bit mask of MaxPoolGrad with activation Relu over the convolution's
  // output, uint8 [N, M / b, O..., b / 8] with b = channel_block() (pool_plan.h
  // max_pool_relu_with_mask).
  // float32, 2x2 windows at stride 2. The convolution runs through oneDNN in chunks of images
  // whose output (blocked by b channels) fits kPooledChunkBytes, so the pool reads it from cache
  // and it is never stored whole; where oneDNN has no implementation, once over the batch.
  void forward_with_mask(KernelContext& ctx, const ConvGeometry& g, const PoolPlan* pool, const Tensor& x,
                         const Shape& y_shape) {
    const int64_t b = channel_block(), xb = epilogue_.x_channel_block, yb = epilogue_.y_channel_block;
    const Tensor& w = ctx.input(1);
    if (!pool || !epilogue_.relu || epilogue_.channels_last_y || attrs_.transpose || x.dtype() != DataType::Float32 ||
        w.dtype() != DataType::Float32 || g.rank() != 2 || b == 0 || g.M % b != 0 || (xb && xb != b) ||
        (yb && yb != b) || !pool->windows_2x2) {
      fail("output 1 (the routing mask) needs a float32 2-D convolution with activation Relu and a 2x2 pool at stride "
           "2, output channels dividing by " + std::to_string(b) + " and channel blocks of " + std::to_string(b));
    }
    const float* bias = ctx.has_input(2) ? ctx.input(2).data<float>() : nullptr;
    Tensor& y = ctx.allocate_output(0, DataType::Float32, y_shape);
    Shape mask_shape = channel_blocked_shape(conv_output_shape(g), b);
    mask_shape[mask_shape.size() - 1] = b / 8;  // one bit per element
    Tensor& mask = ctx.allocate_output(1, DataType::UInt8, mask_shape);
    if (y.numel() == 0 && mask.numel() == 0) return;
    const int64_t image_output = g.M * g.out_size();
    const int64_t chunk = std::clamp<int64_t>(kPooledChunkBytes / static_cast<int64_t>(sizeof(float)) /
                                                  std::max<int64_t>(1, image_output), 1, std::max<int64_t>(1, g.N));
    const int64_t x_image = x.numel() / std::max<int64_t>(1, g.N), y_image = y.numel() / std::max<int64_t>(1, g.N);
    const std::optional<TapCrop> crop = tap_crop(g);
    ConvGeometry gc = crop ? crop->geometry : g;
    gc.N = chunk;
    Tensor conv_out(DataType::Float32, conv_output_shape(gc));  // this run's only (the block cache)
    bool chunked = x.numel() > 0 && w.numel() > 0;
    Tensor gathered;
    const ConvEntry* previous = nullptr;  // the weights are reordered once per entry and run
    for (int64_t n0 = 0; chunked && n0 < g.N; n0 += chunk) {
      gc.N = std::min(chunk, g.N - n0);
      Shape chunk_shape = x.shape();
      chunk_shape[0] = gc.N;
      ConvEntry& e = cache_.get(du::CacheKey().add(chunk_shape).add(w.shape()).add(bias != nullptr).add(9), [&] {
        return plan(gc, false, bias != nullptr, weights_constant_, ConvLayout::Blocked,
                    xb ? ConvLayout::Blocked : ConvLayout::Plain);
      });
      if (e.use_reference || e.dims.embed) {
        chunked = false;  // every chunk plans alike: the first decides
        break;
      }
      execute(e, gc, x.data<float>() + n0 * x_image, run_weights(e, g, crop, w, gathered), bias, conv_out.data<float>(),
              weights_constant_, true, previous == &e);
      previous = &e;
      max_pool_relu_with_mask(*pool, gc.N * g.M / b, b, conv_out.data<float>(), y.data<float>() + n0 * y_image, yb != 0,
                              mask.data<uint8_t>() + n0 * image_output / 8);
    }
    if (chunked) return;
    // The whole batch: the convolution plain, then blocked for the pool.
    const Tensor x_plain = xb ? unblocked_channels(x, xb) : x;
    Tensor plain(DataType::Float32, conv_output_shape(g));
    Tensor blocked(DataType::Float32, channel_blocked_shape(plain.shape(), b));
    convolve<float>(g, x_plain, w, bias, plain.data<float>());
    copy_into_channel_blocks(plain, blocked, b);
    max_pool_relu_with_mask(*pool, g.N * g.M / b, b, blocked.data<float>(), y.data<float>(), yb != 0,
                            mask.data<uint8_t>());
  }

  // y = the float32 convolution of x through oneDNN (over the taps of `crop` when there is one)
  // reading x in `src_layout` and writing y in `dst_layout`, then Relu when `relu`. Returns false,
  // having written nothing, where oneDNN has no implementation for them.
  bool convolve_in_layouts(const ConvGeometry& g, const std::optional<TapCrop>& crop, const Tensor& x, const Tensor& w,
                           const float* bias, Tensor& y, bool relu, ConvLayout dst_layout, ConvLayout src_layout) {
    const ConvGeometry& run_g = crop ? crop->geometry : g;
    // Kinds 2 (channels-last) and 5 + layouts (blocked or plain), beside the others' 0, 1, 3, 4.
    const int kind = dst_layout == ConvLayout::ChannelsLast ? 2 : 5 + 2 * (dst_layout == ConvLayout::Blocked) +
                                                                  (src_layout == ConvLayout::Blocked);
    ConvEntry& e = cache_.get(du::CacheKey().add(x.shape()).add(w.shape()).add(bias != nullptr).add(kind), [&] {
      return plan(run_g, false, bias != nullptr, weights_constant_, dst_layout, src_layout);
    });
    if (e.use_reference || e.dims.embed) return false;
    Tensor gathered;
    execute(e, run_g, x.data<float>(), run_weights(e, g, crop, w, gathered), bias, y.data<float>(), weights_constant_);
    if (relu) relu_in_place<float>(y.data<float>(), y.numel());
    return true;
  }

  // y = the convolution (then Relu when `relu`) without a pool, x and y each plain or blocked by
  // channels (attributes x_channel_block / y_channel_block). float32 through oneDNN reads and writes
  // the blocked tensors as they are when the block is conv_channel_block(), so no reorder remains;
  // anything else runs the plain path between permutations.
  template <class T>
  void convolve_blocked(const ConvGeometry& g, const Tensor& x, const Tensor& w, const T* bias, Tensor& y, bool relu) {
    const int64_t xb = epilogue_.x_channel_block, yb = epilogue_.y_channel_block, block = channel_block();
    if constexpr (std::is_same_v<T, float>) {
      if (g.rank() <= 3 && !attrs_.transpose && x.numel() > 0 && w.numel() > 0 && (!xb || xb == block) &&
          (!yb || yb == block)) {
        if (convolve_in_layouts(g, tap_crop(g), x, w, bias, y, relu, yb ? ConvLayout::Blocked : ConvLayout::Plain,
                                xb ? ConvLayout::Blocked : ConvLayout::Plain)) {
          return;
        }
      }
    }
    const Tensor x_plain = xb ? unblocked_channels(x, xb) : x;
    Tensor conv_out = yb ? Tensor(y.dtype(), conv_output_shape(g)) : y;
    convolve<T>(g, x_plain, w, bias, conv_out.data<T>());
    if (relu) relu_in_place<T>(conv_out.data<T>(), conv_out.numel());
    if (yb) copy_into_channel_blocks(conv_out, y, yb);
  }

  // y = the pool (then Relu when `relu`) of the convolution of float32 x through oneDNN, which
  // writes its output blocked by pooled_conv_channel_block() channels (read by
  // max_pool_channels_last as N * M / b images of b channels each, channels-last) or else
  // channels-last for max_pool_channels_last to read: no reorder to the plain layout, and Relu
  // costs nothing (it commutes with the maximum). The images go through in chunks whose
  // convolution output fits kPooledChunkBytes, so the pool reads it from cache rather than
  // memory. Returns false, having written nothing that counts, where oneDNN has no jit
  // implementation for the shapes and layouts.
  bool convolve_and_pool(const ConvGeometry& g, const PoolPlan& pool, const Tensor& x, const Tensor& w,
                         const float* bias, Tensor& y, bool relu) {
    const int64_t block = pooled_conv_channel_block();
    const int64_t xb = epilogue_.x_channel_block, yb = epilogue_.y_channel_block;
    const bool blocked = !epilogue_.channels_last_y && block != 0 && g.M % block == 0 && !attrs_.transpose;
    if ((xb && xb != block) || (yb && (!blocked || yb != block))) return false;
    const ConvLayout src_layout = xb ? ConvLayout::Blocked : ConvLayout::Plain;
    if (blocked && pooled_chunks(g, pool, x, w, bias, y, relu, ConvLayout::Blocked, src_layout)) return true;
    return !yb && pooled_chunks(g, pool, x, w, bias, y, relu, ConvLayout::ChannelsLast, src_layout);
  }

  // convolve_and_pool with oneDNN writing each chunk's convolution in `dst_layout` (Blocked or
  // ChannelsLast) from x in `src_layout`; false where that plan has no jit implementation.
  bool pooled_chunks(const ConvGeometry& g, const PoolPlan& pool, const Tensor& x, const Tensor& w,
                     const float* bias, Tensor& y, bool relu, ConvLayout dst_layout, ConvLayout src_layout) {
    const int64_t image_output = g.M * g.out_size();  // floats of one image's convolution output
    const int64_t chunk = std::clamp<int64_t>(kPooledChunkBytes / static_cast<int64_t>(sizeof(float)) /
                                                  std::max<int64_t>(1, image_output),
                                              1, g.N);
    const int64_t x_image = x.numel() / g.N, y_image = y.numel() / g.N;
    ConvGeometry gc = g;
    gc.N = chunk;
    Tensor conv_out(DataType::Float32, conv_output_shape(gc));  // this run's only (the block cache)
    for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
      gc.N = std::min(chunk, g.N - n0);
      Shape chunk_shape = x.shape();
      chunk_shape[0] = gc.N;
      const int kind = dst_layout == ConvLayout::Blocked ? 4 : 1;  // beside plain_entry's 0 and the chains' 2 and 3
      ConvEntry& e = cache_.get(du::CacheKey().add(chunk_shape).add(w.shape()).add(bias != nullptr).add(kind), [&] {
        return plan(gc, attrs_.transpose, bias != nullptr, weights_constant_, dst_layout, src_layout);
      });
      if (e.use_reference || e.dims.embed) return false;
      execute(e, gc, x.data<float>() + n0 * x_image, w.data<float>(), bias, conv_out.data<float>(), weights_constant_);
      float* yn = y.data<float>() + n0 * y_image;
      if (dst_layout == ConvLayout::Blocked) {  // images of `block` channels each
        const int64_t block = channel_block();
        max_pool_channels_last(pool, gc.N * g.M / block, block, relu, conv_out.data<float>(), yn,
                               epilogue_.y_channel_block != 0);
      } else {
        max_pool_channels_last(pool, gc.N, g.M, relu, conv_out.data<float>(), yn, epilogue_.channels_last_y);
      }
    }
    return true;
  }

  // y [N, M, O...] (plain) = the convolution of x with w, plus bias.
  template <class T>
  void convolve(const ConvGeometry& g, const Tensor& x, const Tensor& w, const T* bias, T* y) {
    if (x.numel() == 0 || w.numel() == 0) {  // no input reaches the output
      conv_ref_detail::fill_bias(g.N, g.M, g.out_size(), bias, y);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (convolve_lowered(g, x, w, bias, y, false)) return;
      if (g.rank() <= 3) {
        const std::optional<TapCrop> crop = tap_crop(g);
        const ConvGeometry& run_g = crop ? crop->geometry : g;
        ConvEntry& e = plain_entry(run_g, x, w, bias != nullptr);
        if (!e.use_reference) {
          Tensor gathered;
          execute(e, run_g, x.data<float>(), run_weights(e, g, crop, w, gathered), bias, y, weights_constant_);
          return;
        }
      }
    }
    if (attrs_.transpose) {
      conv_transpose_reference<T>(g, x.data<T>(), w.data<T>(), bias, y);
    } else {
      conv_reference<T>(g, x.data<T>(), w.data<T>(), bias, y);
    }
  }

  // y (plain) = Relu(the convolution) when oneDNN writes the channel-blocked layout of
  // blocked_channels_f32: one pass copies it into y applying Relu, instead of oneDNN's reorder and
  // a Relu pass (oneDNN 2.6's relu post-op would make NaN 0, where the Relu op keeps it).
  // Returns false, having done nothing, for any other layout or path.
  bool convolve_relu(const ConvGeometry& g, const Tensor& x, const Tensor& w, const float* bias, float* y) {
    if (g.rank() > 3 || attrs_.transpose || x.numel() == 0 || w.numel() == 0) return false;
    if (convolve_lowered(g, x, w, bias, y, true)) return true;
    const std::optional<TapCrop> crop = tap_crop(g);
    const ConvGeometry& run_g = crop ? crop->geometry : g;
    ConvEntry& e = plain_entry(run_g, x, w, bias != nullptr);
    const int64_t block = e.dst_channel_block;
    if (e.use_reference || e.dims.embed || block == 0) return false;
    Tensor gathered;
    execute(e, run_g, x.data<float>(), run_weights(e, g, crop, w, gathered), bias, y, weights_constant_, false);
    const auto* in = static_cast<const float*>(e.dst.arg().get_data_handle());
    const int64_t size = g.out_size(), blocks = (g.M + block - 1) / block;
    // Task (n, channel block): `block` channel planes, read interleaved, written one by one; a
    // whole block 8 positions by 8 channels at a time through registers (data_movement.h
    // copy_block_8x8, then Relu on the 64 values just written), so each source line is read
    // once instead of once per channel.
    parallel_for(g.N * blocks, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, size * block)),
                 [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = t / blocks, first = (t % blocks) * block, channels = std::min(block, g.M - first);
        const float* __restrict src = in + t * size * block;
        float* plane = y + (n * g.M + first) * size;  // channel c's plane at plane + c * size
        int64_t i = 0;
        if (channels == block && block % 8 == 0) {
          for (; i + 8 <= size; i += 8) {
            for (int64_t c0 = 0; c0 < block; c0 += 8) {
              float* dst = plane + c0 * size + i;
              detail::copy_block_8x8(reinterpret_cast<const uint32_t*>(src + i * block + c0), block,
                                     reinterpret_cast<uint32_t*>(dst), size);
              for (int64_t c = 0; c < 8; ++c) {
                for (int64_t k = 0; k < 8; ++k) dst[c * size + k] = relu(dst[c * size + k]);
              }
            }
          }
        }
        for (int64_t c = 0; c < channels; ++c) {
          float* __restrict dst = plane + c * size;
          for (int64_t p = i; p < size; ++p) dst[p] = relu(src[p * block + c]);
        }
      }
    });
    return true;
  }

  // y (plain) = the convolution (then Relu when `relu`) as one matrix product over the batch
  // (conv_gemm.h) when prefer_conv_gemm holds for weights fed at every run, over the taps that
  // reach the input (tap_crop); returns false, having done nothing, otherwise. float32, x and w
  // not empty.
  bool convolve_lowered(const ConvGeometry& g, const Tensor& x, const Tensor& w, const float* bias, float* y,
                        bool relu) {
    if (weights_constant_ || attrs_.transpose || g.rank() > 3) return false;
    const std::optional<TapCrop> crop = tap_crop(g);
    const ConvGeometry& run_g = crop ? crop->geometry : g;
    if (!prefer_conv_gemm(run_g)) return false;
    const Tensor cropped = crop ? weight_taps(g, *crop, w.data<float>(), &run_taps_) : Tensor();
    conv_gemm_forward(run_g, x.data<float>(), (crop ? cropped : w).data<float>(), bias, y, relu);
    return true;
  }

  // The crop the oneDNN paths run with (crop_unreached_taps): for weights fed at every run (a
  // training step's variables), and for constant ones on CPUs without AVX-512. With AVX-512 the
  // constant weights' copy in oneDNN's layout, made once, ran as fast uncropped (measured on
  // ResNet-18's layer 4 at batch 1: no change). oneDNN 2.6's AVX2 convolutions spend the time of
  // every tap on the 1x1 maps of that layer: four 512 -> 512 3x3 convolutions on [1, 512, 1, 1]
  // 0.60-0.73 ms against 0.12-0.13 as 1x1 ones (AMD EPYC Zen 3, 2 threads).
  std::optional<TapCrop> tap_crop(const ConvGeometry& g) const {
    if (attrs_.transpose || (weights_constant_ && du::has_avx512())) return std::nullopt;
    return crop_unreached_taps(g);
  }

  // The weights of float32 w [M, C/G, k...] that entry e runs with: w's taps under `crop` (all
  // without one), with the channel dim moved last ([M, k..., C/G]) when `channel_dim_last`. w
  // itself when neither applies; else a copy made into `gathered` for weights fed at every run,
  // and once into the entry for constant ones (whose copy in oneDNN's layout execute then makes
  // once too).
  const float* run_weights(ConvEntry& e, const ConvGeometry& g, const std::optional<TapCrop>& crop, const Tensor& w,
                           Tensor& gathered, bool channel_dim_last = false) const {
    if (!crop && !channel_dim_last) return w.data<float>();
    const auto make = [&] {
      const Tensor taps = crop ? weight_taps(g, *crop, w.data<float>(), &run_taps_) : w;
      return channel_dim_last ? permuted(taps, channels_last_order(taps.rank())) : taps;
    };
    if (!weights_constant_) {
      gathered = make();
      return gathered.data<float>();
    }
    if (e.kept_from != w.data<float>()) {
      e.kept_weights = make();
      e.kept_from = w.data<float>();
    }
    return e.kept_weights.data<float>();
  }

  // The plain-output entry for these shapes (made on first use): g is the geometry oneDNN runs
  // (tap_crop's), which the shapes of x and w determine.
  ConvEntry& plain_entry(const ConvGeometry& g, const Tensor& x, const Tensor& w, bool has_bias) {
    return cache_.get(du::CacheKey().add(x.shape()).add(w.shape()).add(has_bias).add(0),
                      [&] { return plan(g, attrs_.transpose, has_bias, weights_constant_); });
  }

  ConvAttrs attrs_;
  ConvEpilogue epilogue_;
  // The weights are an initializer no run replaces (not also a graph input, which a feed may
  // override), so their data is the same at every run: in an inference graph; not in a
  // training step, where they are variables fed from the session's state.
  const bool weights_constant_;
  const bool channels_last_;  // ai.onnxtrain.ConvChannelsLast
  Tensor run_taps_;            // during a run with attribute weight_taps: its output 1 where it crops
  du::PrimitiveCache<ConvEntry> cache_;
  PoolPlanCache pool_plans_;  // for the convolution's output shape
};

}  // namespace

int pooled_conv_channel_block() {
  return channel_block() == 8 ? 8 : 0;  // the block blocked_channels_f32 gives, on AVX2 alone
}

int conv_channel_block() { return channel_block(); }

dnnl::memory::desc blocked_channels_f32(const dnnl::memory::dims& dims) {
  using tag = dnnl::memory::format_tag;
  const int block = channel_block();
  tag t = tag::any;
  if (block == 16) t = dims.size() == 3 ? tag::aBc16b : dims.size() == 4 ? tag::aBcd16b : tag::aBcde16b;
  if (block == 8) t = dims.size() == 3 ? tag::aBc8b : dims.size() == 4 ? tag::aBcd8b : tag::aBcde8b;
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, t);
}

int64_t parse_channel_block(const KernelInit& init, const char* name) {
  const int64_t block = init.attr_int(name, 0);
  if (block < 0) throw Error(std::string("attribute '") + name + "' is " + std::to_string(block) + ", expected >= 0");
  return block;
}

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

std::unique_ptr<Kernel> make_conv(const KernelInit& init) {
  return std::make_unique<ConvKernel>(init, parse_conv_attrs(init, false));
}

std::unique_ptr<Kernel> make_conv_transpose(const KernelInit& init) {
  return std::make_unique<ConvKernel>(init, parse_conv_attrs(init, true));
}

namespace {
// The `activation` attribute of the internal convolutions: true for "Relu", false when absent.
bool relu_activation(const KernelInit& init) {
  const std::string activation = init.attr_string("activation", "");
  if (!activation.empty() && activation != "Relu") {
    throw Error("attribute 'activation' is '" + activation + "', expected Relu or none");
  }
  return activation == "Relu";
}
}  // namespace

std::unique_ptr<Kernel> make_conv_channels_last(const KernelInit& init) {
  ConvEpilogue epilogue;
  epilogue.relu = relu_activation(init);
  return std::make_unique<ConvKernel>(init, parse_conv_attrs(init, false), std::move(epilogue), true);
}

std::unique_ptr<Kernel> make_fused_conv(const KernelInit& init) {
  ConvEpilogue epilogue;
  epilogue.relu = relu_activation(init);
  if (init.has_attr("pool_kernel_shape")) {  // MaxPool's attributes, named pool_<name>
    ir::Node pool_node;
    pool_node.name = init.node().name;
    pool_node.op_type = "MaxPool";
    constexpr std::string_view kPrefix = "pool_";
    for (const ir::Attribute& attr : init.node().attributes) {
      if (!attr.name.starts_with(kPrefix)) continue;
      pool_node.attributes.push_back(attr);
      pool_node.attributes.back().name = attr.name.substr(kPrefix.size());
    }
    epilogue.pool = parse_pool_attrs(KernelInit(init.graph(), pool_node, init.opset()), true);
    epilogue.channels_last_y = init.attr_int("channels_last", 0) != 0;
  }
  epilogue.x_channel_block = parse_channel_block(init, "x_channel_block");
  epilogue.y_channel_block = parse_channel_block(init, "y_channel_block");
  epilogue.weight_taps = init.attr_int("weight_taps", 0) != 0;
  if (epilogue.weight_taps && epilogue.pool) {
    throw Error("attributes 'weight_taps' and 'pool_kernel_shape' are both set; output 1 is either W's taps or the "
                "pool's routing mask");
  }
  if (epilogue.channels_last_y && epilogue.y_channel_block) {
    throw Error("attributes 'channels_last' and 'y_channel_block' are both set; Y has one layout");
  }
  return std::make_unique<ConvKernel>(init, parse_conv_attrs(init, false), std::move(epilogue));
}

}  // namespace onnxtrain::ops
