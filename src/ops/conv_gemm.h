// Convolutions with small output maps as one matrix product over the whole batch (im2col
// lowering; the Conv formulas are in conv.cpp's header, the gradients in conv_grad.cpp's).
//
// For Conv (not ConvTranspose) with group 1, float32, x [N, C, D...], w [M, C, k...] and
// y [N, M, O...], let rows = N * O1 * ... * On (one row per output position of every image) and
// K = C * k1 * ... * kn (one column per input channel and kernel tap, in W's own order). Then
//   P [rows, K]        the patches: P[(n, o), (c, t)] = x[n, c, o * stride - pad_begin +
//                      t * dilation], 0 where that reads padding
//   forward:           Y [rows, M] = P W^T, with W read as stored ([M, K], ONNX's layout);
//                      y[n, m, o] = Y[(n, o), m] + b[m]
//   backward data:     dP [rows, K] = dY W with dY[(n, o), m] = dy[n, m, o];
//                      dx[n, c, i] = the sum of dP over every (o, t) whose patch read i
//   backward weights:  dW [M, K] = dY^T P, written straight into dw's ONNX layout
// Each product is one oneDNN sgemm over the whole batch. oneDNN 2.6's convolution primitives
// work image by image and spatial row by spatial row, which on maps of a few positions leaves
// their register blocks mostly empty (on AVX2, a 3x3 convolution of 256 channels on 2x2 maps at
// batch 32: 1.95 / 1.37 / 4.22 ms forward / backward data / backward weights with its reorders,
// 1.30 / 1.31 / 1.59 ms here); and they read the weights in blocked layouts, reordered from and
// to ONNX's at every run when the weights change at every run (a training step's variables).
// Values equal the convolution's up to the order of the sums.
#pragma once

#include <cstdint>

#include "ops/conv_ref.h"

namespace onnxtrain::ops {

// Whether conv.cpp and conv_grad.cpp run a Conv of geometry g (after crop_unreached_taps) on
// weights that change at every run through the functions below instead of oneDNN's primitives:
// group 1, at most 4 output positions per image (ResNet-18's last two stages at 32x32 input),
// on a CPU without AVX-512. Measured on an AVX2 machine (AMD EPYC, Zen 3, 2 cores, oneDNN 2.6;
// docs/performance-history.md, "An AVX2 machine"): faster over the three directions at every ResNet-18
// shape with 4 or fewer output positions, slower from 16 on (4x4 maps). With AVX-512 oneDNN runs
// its brgemm convolutions, measured at the sgemm peak at these shapes on such a machine; there
// nothing changes.
bool prefer_conv_gemm(const ConvGeometry& g);

// Whether conv.cpp runs an ai.onnxtrain.ConvChannelsLast of geometry g (after
// crop_unreached_taps) through conv_gemm_forward_channels_last instead of oneDNN's primitive:
// group 1, at most 16 output positions per image, at least 4 images, on a CPU without AVX-512.
// There the weights are constant (an inference chain), their copy taps-first made once, and
// oneDNN reads its own layout of them without reorders, so the measure differs from
// prefer_conv_gemm's: ResNet-18 at 32x32 on the AVX2 machine, per convolution at batch 128, 2x2
// and 1x1 maps (layers 3 and 4) 4.9-8.7 -> 1.2-5.7 ms and 4x4 maps (layer 2) 7.6-7.8 -> 5.0-5.5
// ms, 8x8 maps (layer 1) 7.2-7.4 -> 7.8-9.8 ms (slower, excluded); the network's convolutions
// 10-28 % faster from batch 4 on, within noise at batch 2 and 10-20 % slower at batch 1, where
// the product's packing of W at every run costs more than oneDNN's convolution of 1 to 16 rows.
bool prefer_conv_gemm_channels_last(const ConvGeometry& g);

// Whether conv.cpp runs an ai.onnxtrain.ConvChannelsLast of geometry g (after
// crop_unreached_taps) on constant weights through conv_stream_forward_channels_last: group 1, at
// most kMaxStreamRows output positions over the whole batch (N * O1 * ... * On) and at least
// 64 Ki weights (256 KiB), on any CPU. There the convolution's cost is reading W once, which
// oneDNN's convolutions did at 25-35 GB/s on an Intel Xeon VM (2 vCPUs, AVX-512) where a plain
// read of 8-45 MB streams at 56: ResNet-18 at 32x32 and batch 1 (ONNXTRAIN_PROFILE, 2000 runs),
// layer 4's 512 -> 512 convolutions on 1x1 maps 28-32 us each against 45-57, layer 3's 256 -> 256
// on 2x2 maps 65-69 against 72-80; the whole run 0.653-0.690 ms against 0.671-0.734 (five
// alternating pairs of 1500 runs, medians). Three rows of W a group instead of two (fewer reads
// of the patches): layer 3's 64-67 -> 54-57 us, the run 0.622-0.650 against 0.655-0.669 ms (four
// alternating pairs).
inline constexpr int64_t kMaxStreamRows = 4;
bool prefer_conv_stream_channels_last(const ConvGeometry& g);

// y [N, O..., M] = Conv(x, w) + b (b [M], or null), then Relu when `relu` (NaN kept), for
// channels-last x [N, D..., C] and w_taps_first [M, k..., C], the rows = N * O1 * ... * On <=
// kMaxStreamRows patches of P (as conv_gemm_forward_channels_last gathers them) against each row
// of W in turn: W is read once, front to back, its rows split between the threads in groups,
// each row dotted with every patch (L-lane partial sums over K, the lanes added pairwise, then
// the K % L rest in order: the same sums at every thread count). L is vmath::lanes()
// (core/vector_math.h): 8 lanes and groups of three rows (AVX2's 16 registers), or, where the
// CPU runs AVX-512, 16 lanes and groups of six rows (conv_stream_avx512.cpp, 32 registers): on
// the Intel Xeon VM (2 vCPUs, 2026-12-02; onnxtrain-bench-infer --lanes, ONNXTRAIN_PROFILE, two
// alternating pairs of 5000 runs of two such convolutions in a row, weights warm) 256 -> 256 on
// 2x2 maps 39-40 -> 36-38 us, 512 -> 512 on 1x1 maps 10.2-11.1 -> 8.1-8.7 us; inside ResNet-18
// at batch 1, whose 45 MB of weights come from memory, the same within noise (layer 3's
// 48-51 us at either width: there the reads bound it).
// Same conditions as conv_gemm_forward.
void conv_stream_forward_channels_last(const ConvGeometry& g, const float* x, const float* w_taps_first,
                                       const float* b, float* y, bool relu);

// y [N, M, O...] = Conv(x, w) + b (b [M], or null for none), then Relu when `relu` (NaN kept):
// the forward product above. float32, group 1, any number of spatial dims; every extent > 0.
// This and the functions below throw Error when oneDNN's sgemm fails (du::checked); the
// scratch is the calling thread's (du::thread_scratch).
void conv_gemm_forward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                       bool relu);

// y [N, O..., M] = Conv(x, w) + b, then Relu when `relu`, for channels-last x [N, D..., C]
// (ai.onnxtrain.ConvChannelsLast) and w_taps_first [M, k..., C] (W with its channel dim moved
// last): the forward product with P's columns in the order (t, c), whose [rows, M] result is y's
// layout. Same conditions as conv_gemm_forward.
void conv_gemm_forward_channels_last(const ConvGeometry& g, const float* x, const float* w_taps_first,
                                     const float* b, float* y, bool relu);

// Whether conv_grad.cpp computes dW alone (no dX wanted, as at a network's first layer) of
// geometry g (after crop_unreached_taps) through conv_gemm_weight_grad_per_image: group 1, one
// input channel, on a CPU without AVX-512. oneDNN 2.6's AVX2 backward-weights convolution pads
// the input channels to its block of 8 (verbose: src "p:blocked:aBcd8b"), so a 1-channel input
// costs 8 times its work. Measured alone (AMD EPYC Zen 3, 2 threads, three alternating rounds):
// the Fashion-MNIST CNN's conv1 (1 -> 32 channels, 5x5 on 28x28, batch 128) 14.9-18.5 -> 6.4-7.1
// ms; ResNet-18's RGB stem (3 -> 64, 7x7 stride 2 on 32x32, batch 32) 1.80-2.27 -> 2.45-2.64 ms,
// slower, so 3 channels keep oneDNN (2 were not measured).
bool prefer_weight_grad_per_image(const ConvGeometry& g);

// dw [M, C, k...] = the weight gradient of y = Conv(x, w) for dy [N, M, O...]: the sum over the
// images n of dY_n [M, O] P_n [O, K], dY_n being image n's block of dy as it is stored and P_n
// image n's rows of P. Each thread sums its share of the images with single-threaded sgemm on
// patches it gathers image by image (so they stay in cache), then the threads' sums are added.
// db [M] (when not null) = the bias gradient, dy summed over images and positions, from the same
// products: P_n gets a column of ones, so no second pass reads dy (the CNN's conv1 at batch 128
// reads 12.8 MB of it; a separate pass was 28-34 % of this function's time).
// Same conditions as conv_gemm_forward.
void conv_gemm_weight_grad_per_image(const ConvGeometry& g, const float* dy, const float* x, float* dw,
                                     float* db = nullptr);

// The gradients of y = Conv(x, w) for dy [N, M, O...]: dx [N, C, D...] (when not null) and
// dw [M, C, k...] (when not null), overwritten. The bias gradient is the caller's (a plain sum
// over dy). Same conditions as conv_gemm_forward.
void conv_gemm_backward(const ConvGeometry& g, const float* dy, const float* x, const float* w, float* dx,
                        float* dw);

}  // namespace onnxtrain::ops
