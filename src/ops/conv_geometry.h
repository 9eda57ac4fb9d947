// Conv and ConvTranspose attributes and shapes, shared by the forward ops (conv.cpp, where these
// functions are defined) and their gradients ConvGrad / ConvTransposeGrad (conv_grad.cpp), which
// receive the forward node's attributes verbatim and must resolve them exactly as it does.
//
// The formulas (ONNX operator docs "Conv", "ConvTranspose") are in conv.cpp's header comment.
#pragma once

#include <cstdint>
#include <dnnl.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ops/conv_ref.h"
#include "ops/kernel.h"
#include "ops/spatial_attrs.h"

namespace onnxtrain::ops {

struct ConvAttrs {
  bool transpose = false;  // ConvTranspose
  AutoPad auto_pad = AutoPad::NotSet;
  int64_t group = 1;
  std::optional<std::vector<int64_t>> kernel_shape, strides, dilations, pads;
  std::optional<std::vector<int64_t>> output_padding, output_shape;  // ConvTranspose
};

// Parses and checks the attributes of Conv (transpose = false) or ConvTranspose; throws Error.
ConvAttrs parse_conv_attrs(const KernelInit& init, bool transpose);

// Integer attribute `name` of the internal convolution ops, a channel block b (0, its default, for
// the plain layout; [N, C / b, D..., b] otherwise); throws Error when it is negative.
int64_t parse_channel_block(const KernelInit& init, const char* name);

// An input of a conv op: the tensor and its ONNX name for messages (ctx.input_name(i)).
struct ConvOperand {
  const Tensor& tensor;
  std::string name;
};

// The geometry of Y = Conv(X, W) or ConvTranspose(X, W): checks the ranks, channels and groups
// of X and W, W's dtype (that of X), kernel_shape and the per-dim attribute lists, and resolves
// the output dims and pads. Throws Error naming X or W.
ConvGeometry resolve_conv_geometry(const ConvAttrs& a, const ConvOperand& x, const ConvOperand& w);

// Y's shape [N, M, out...].
Shape conv_output_shape(const ConvGeometry& g);

// The channel block b in which a pooled ai.onnxtrain.FusedConv hands its output to the next
// pooled FusedConv (attributes y_channel_block / x_channel_block, runtime/fusion.h
// block_pooled_conv_pairs): the tensor [N, C / b, D..., b] (oneDNN's nChw8c for 2 spatial dims),
// which oneDNN 2.6's AVX2 direct convolutions read and write. 8 on a CPU with AVX2 and without
// AVX-512, else 0 (not used: unmeasured there). The Fashion-MNIST CNN's conv2 (32 -> 64 channels,
// 5x5 on 14x14) alone, 2 threads of an AMD EPYC Zen 3, medians of 60 alternating runs: 16.6-18.1
// ms nChw8c against 18.0-19.4 channels-last at batch 128, 2.64-2.89 against 2.87-3.14 at 20.
int pooled_conv_channel_block();

// The channel block b of the layout oneDNN's direct convolutions read and write fastest on this
// CPU: 16 with AVX-512 (nChw16c for 2 spatial dims), 8 with AVX2 alone (nChw8c), else 0. On
// AVX-512 a training graph passes the tensors between its convolutions, max pools and their
// gradients in it, [N, C / b, D..., b] (runtime/fusion.h block_convolution_tensors).
int conv_channel_block();

// The descriptor of a float32 tensor of `dims` ([N, C, D...]) blocked by conv_channel_block()
// channels (format_tag aBcd16b / aBcd8b for two spatial dims), or format any where it is 0.
dnnl::memory::desc blocked_channels_f32(const dnnl::memory::dims& dims);

// ---------------------------------------------------------------------------------------------
// oneDNN's view of a geometry (float32, plain layouts)

struct DnnlConvDims {
  dnnl::memory::dims strides, dilates, pad_l, pad_r;  // dilates = ONNX dilation - 1; pads >= 0
  // The block of Y [N, M, out...] that oneDNN computes: all of Y, except for a ConvTranspose
  // with negative crops, whose extra outputs no input reaches (they hold only the bias).
  std::vector<int64_t> dst_dims, dst_offset;
  bool embed = false;  // dst_dims differ from out
  bool empty = false;  // a dst dim is <= 0: no output is reached at all
};
DnnlConvDims dnnl_conv_dims(const ConvGeometry& g);

// {a, b, rest...}
dnnl::memory::dims dims_of(int64_t a, int64_t b, const std::vector<int64_t>& rest);

// W as oneDNN sees it: [M, C, k...] (ConvTranspose: [M, C, k...] over ONNX's [C, M, k...]), or
// [G, M/G, C/G, k...] with groups, with the strides of ONNX's dense W.
dnnl::memory::desc conv_weights_desc(const ConvGeometry& g, bool transpose);

// Copies between Y-shaped [N*M, out...] data and its block [N*M, dst_dims...] at dst_offset:
// block `from` into Y-shaped `to` when into_y, else Y-shaped `from` into block `to`.
void copy_conv_block(const ConvGeometry& g, const DnnlConvDims& d, const float* from, float* to,
                     bool into_y);

// ---------------------------------------------------------------------------------------------
// Kernel taps that read only padding
//
// Along a spatial dim, tap t of a Conv reads input position o * stride - pad_begin + t * dilation
// for the outputs o in [0, out). A tap for which no output lands inside [0, in) multiplies only
// padding: it adds nothing to Y or dX, and its weights' gradient is 0. On maps smaller than the
// kernel's reach most taps are such (a 3x3 kernel with pads 1 on a 1x1 map reads only its
// centre), and the convolution over the taps that remain is the same one with a smaller kernel:
// kernel t1 - t0, pad_begin - t0 * dilation, pad_end - (kernel - t1) * dilation, the same
// output. oneDNN skips padded taps in its arithmetic but not in the reorders of the weights to
// and from its layouts, which cost more than such a convolution itself (ResNet-18 at 32x32,
// batch 32, two cores, DNNL_VERBOSE: the three reorders of a layer-4 convolution's 512x512x3x3
// weights took 1.9 ms of a training step, its forward and backward primitives 1.3 ms). The
// Conv kernel crops for weights fed at every run, and constant ones without AVX-512; ConvGrad
// always (conv.cpp, conv_grad.cpp).

struct TapCrop {
  ConvGeometry geometry;       // the same convolution over taps [first, first + kernel) of each dim
  std::vector<int64_t> first;  // per spatial dim, the first tap that reaches the input

  // The cropped W's shape, [M, C/G, cropped kernel...].
  Shape weights_shape() const;
};

// The crop of a Conv (not ConvTranspose) geometry to the outermost taps that reach the input,
// or nullopt when there is nothing to crop: every tap reaches the input, none does (the output
// is the bias alone), or the cropped padding would be negative (possible with dilation > 1).
// Taps between two that reach the input stay, reached or not.
std::optional<TapCrop> crop_unreached_taps(const ConvGeometry& g);

// The taps of float32 w [M, C/G, kernel...] that `crop` keeps: a new float32 tensor of
// crop.weights_shape().
Tensor gather_taps(const ConvGeometry& g, const TapCrop& crop, const float* w);
// The same into wc, crop.weights_shape().numel() floats.
void gather_taps(const ConvGeometry& g, const TapCrop& crop, const float* w, float* wc);

// W's taps under `crop` for a run of a training step: `given` when it is a float32 tensor of
// crop.weights_shape() (the forward node's output 1, attribute weight_taps: runtime/fusion.h
// share_weight_taps), which the convolution's ConvGrad reads instead of gathering them again;
// else gather_taps. `given` may be null.
Tensor weight_taps(const ConvGeometry& g, const TapCrop& crop, const float* w, const Tensor* given);

// The int64 description of the taps `crop` keeps, [1 + kept]: the kernel's tap count k (the
// product of g's kernel dims), then the offset within each block of k elements of W (one output
// and input channel's taps, row-major) of each kept tap, in the cropped W's row-major order. W's
// element b k + offsets[j] is then the cropped W's element b kept + j. ConvGrad with attribute
// dw_taps writes it as output 3 beside a cropped dW, for an optimizer that reads such a gradient
// (ops/optimizers.cpp, attribute gradient_taps).
Tensor kept_taps_description(const ConvGeometry& g, const TapCrop& crop);

// dw [M, C/G, kernel...] = dwc [M, C/G, cropped kernel...] at the taps `crop` keeps, 0 at the
// others (whose products were all with padding).
void scatter_taps(const ConvGeometry& g, const TapCrop& crop, const float* dwc, float* dw);

}  // namespace onnxtrain::ops
