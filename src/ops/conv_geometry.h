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

}  // namespace onnxtrain::ops
