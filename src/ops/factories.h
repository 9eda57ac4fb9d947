// Kernel factories, one block per op-family file. The registry table (registry.cpp) maps
// (domain, op type, opset range) to these. A factory reads the node's attributes once and
// returns the kernel; factories serving several ops switch on init.op_type(), and factories
// serving several opsets on init.opset().
#pragma once

#include "ops/kernel.h"

namespace onnxtrain::ops {

// elementwise_unary.cpp: one-input math and activations.
std::unique_ptr<Kernel> make_unary(const KernelInit& init);       // Neg, Abs, Sqrt, ..., Not, IsNaN
std::unique_ptr<Kernel> make_activation(const KernelInit& init);  // LeakyRelu, Elu, ..., IsInf
std::unique_ptr<Kernel> make_clip(const KernelInit& init);
std::unique_ptr<Kernel> make_identity(const KernelInit& init);

// elementwise_binary.cpp: numpy-broadcast binary and variadic ops.
std::unique_ptr<Kernel> make_binary(const KernelInit& init);    // Add ... PRelu, comparisons, logic
std::unique_ptr<Kernel> make_variadic(const KernelInit& init);  // Min, Max, Sum, Mean
std::unique_ptr<Kernel> make_where(const KernelInit& init);

// matmul.cpp
std::unique_ptr<Kernel> make_matmul(const KernelInit& init);
std::unique_ptr<Kernel> make_gemm(const KernelInit& init);
std::unique_ptr<Kernel> make_fused_gemm(const KernelInit& init);  // ai.onnxtrain.FusedGemm: Gemm -> Relu (matmul.cpp)
std::unique_ptr<Kernel> make_einsum(const KernelInit& init);
std::unique_ptr<Kernel> make_resize(const KernelInit& init);  // resize.cpp
std::unique_ptr<Kernel> make_if(const KernelInit& init);    // runtime/control_flow.cpp
// sequence.cpp: SequenceEmpty ... SplitToSequence, Optional, OptionalHasElement, OptionalGetElement
std::unique_ptr<Kernel> make_sequence_op(const KernelInit& init);
// string_ops.cpp: StringNormalizer, StringConcat, StringSplit, RegexFullMatch
std::unique_ptr<Kernel> make_string_op(const KernelInit& init);
std::unique_ptr<Kernel> make_loop(const KernelInit& init);  // runtime/control_flow.cpp
std::unique_ptr<Kernel> make_scan(const KernelInit& init);  // runtime/control_flow.cpp
std::unique_ptr<Kernel> make_sequence_map(const KernelInit& init);  // runtime/control_flow.cpp

// conv.cpp
std::unique_ptr<Kernel> make_conv(const KernelInit& init);
std::unique_ptr<Kernel> make_conv_transpose(const KernelInit& init);
std::unique_ptr<Kernel> make_fused_conv(const KernelInit& init);  // ai.onnxtrain.FusedConv
std::unique_ptr<Kernel> make_conv_channels_last(const KernelInit& init);  // ai.onnxtrain.ConvChannelsLast
std::unique_ptr<Kernel> make_matmul_add(const KernelInit& init);  // ai.onnxtrain.MatMulAdd (matmul.cpp)
std::unique_ptr<Kernel> make_matmul_transposed(const KernelInit& init);  // ai.onnxtrain.MatMulTransposed (matmul.cpp)
std::unique_ptr<Kernel> make_matmul_permuted(const KernelInit& init);  // ai.onnxtrain.MatMulPermuted (matmul.cpp)
std::unique_ptr<Kernel> make_relu_grad(const KernelInit& init);   // ai.onnxtrain.ReluGrad

// pool.cpp
std::unique_ptr<Kernel> make_pool(const KernelInit& init);         // MaxPool, AveragePool
std::unique_ptr<Kernel> make_max_pool_channel_blocked(const KernelInit& init);  // ai.onnxtrain.MaxPoolChannelBlocked
std::unique_ptr<Kernel> make_global_pool(const KernelInit& init);  // GlobalAveragePool, GlobalMaxPool

// normalization.cpp
std::unique_ptr<Kernel> make_batch_norm(const KernelInit& init);
// ai.onnxtrain.BatchNormalizationChannelBlocked: training mode on X blocked by channel_block channels
std::unique_ptr<Kernel> make_batch_norm_channel_blocked(const KernelInit& init);
std::unique_ptr<Kernel> make_instance_norm(const KernelInit& init);
std::unique_ptr<Kernel> make_layer_norm(const KernelInit& init);
// ai.onnxtrain.AddLayerNormalization: an Add and the LayerNormalization of its sum (runtime/fusion.h fuse_add_layer_norm)
std::unique_ptr<Kernel> make_add_layer_norm(const KernelInit& init);
std::unique_ptr<Kernel> make_dropout(const KernelInit& init);

// sync_batch_norm.cpp, batch_norm_grad.cpp: ai.onnxtrain.SyncBatchNormalization and its Grad (train --sync-batch-norm)
std::unique_ptr<Kernel> make_sync_batch_norm(const KernelInit& init);
std::unique_ptr<Kernel> make_sync_batch_norm_grad(const KernelInit& init);
// ai.onnxtrain.BatchNormalizationGrad: BatchNormalization's training-mode gradient (one process;
// dY, X and dX blocked by attribute channel_block channels when it is set)
std::unique_ptr<Kernel> make_batch_norm_grad(const KernelInit& init);

// softmax.cpp
std::unique_ptr<Kernel> make_softmax(const KernelInit& init);  // Softmax, LogSoftmax, Hardmax
std::unique_ptr<Kernel> make_softmax_grad(const KernelInit& init);  // ai.onnxtrain.SoftmaxGrad, LogSoftmaxGrad

// reduce.cpp
std::unique_ptr<Kernel> make_reduce(const KernelInit& init);      // Reduce*
std::unique_ptr<Kernel> make_arg_reduce(const KernelInit& init);  // ArgMax, ArgMin
std::unique_ptr<Kernel> make_cumsum(const KernelInit& init);
std::unique_ptr<Kernel> make_topk(const KernelInit& init);

// rnn.cpp: the recurrent layers.
std::unique_ptr<Kernel> make_rnn(const KernelInit& init);  // RNN, GRU, LSTM; ai.onnxtrain.*Training

// loss.cpp
std::unique_ptr<Kernel> make_softmax_cross_entropy_loss(const KernelInit& init);
std::unique_ptr<Kernel> make_nll_loss(const KernelInit& init);

// shape_ops.cpp: ops that move or view data without arithmetic.
std::unique_ptr<Kernel> make_reshape(const KernelInit& init);
std::unique_ptr<Kernel> make_flatten(const KernelInit& init);
std::unique_ptr<Kernel> make_squeeze(const KernelInit& init);
std::unique_ptr<Kernel> make_unsqueeze(const KernelInit& init);
std::unique_ptr<Kernel> make_transpose(const KernelInit& init);
std::unique_ptr<Kernel> make_concat(const KernelInit& init);
std::unique_ptr<Kernel> make_split(const KernelInit& init);
std::unique_ptr<Kernel> make_expand(const KernelInit& init);
std::unique_ptr<Kernel> make_tile(const KernelInit& init);
std::unique_ptr<Kernel> make_pad(const KernelInit& init);
std::unique_ptr<Kernel> make_shape(const KernelInit& init);
std::unique_ptr<Kernel> make_size(const KernelInit& init);
std::unique_ptr<Kernel> make_depth_to_space(const KernelInit& init);
std::unique_ptr<Kernel> make_space_to_depth(const KernelInit& init);

// indexing.cpp
std::unique_ptr<Kernel> make_slice(const KernelInit& init);
std::unique_ptr<Kernel> make_slice_grad(const KernelInit& init);  // ai.onnxtrain.SliceGrad
std::unique_ptr<Kernel> make_gather(const KernelInit& init);
std::unique_ptr<Kernel> make_gather_elements(const KernelInit& init);
std::unique_ptr<Kernel> make_gather_nd(const KernelInit& init);
std::unique_ptr<Kernel> make_scatter_elements(const KernelInit& init);
std::unique_ptr<Kernel> make_scatter_nd(const KernelInit& init);
std::unique_ptr<Kernel> make_one_hot(const KernelInit& init);
std::unique_ptr<Kernel> make_trilu(const KernelInit& init);

// generators.cpp: ops that make tensors from attributes or shapes.
std::unique_ptr<Kernel> make_constant(const KernelInit& init);
std::unique_ptr<Kernel> make_constant_of_shape(const KernelInit& init);
std::unique_ptr<Kernel> make_range(const KernelInit& init);
std::unique_ptr<Kernel> make_eye_like(const KernelInit& init);

// random.cpp: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike; Bernoulli.
std::unique_ptr<Kernel> make_random(const KernelInit& init);
std::unique_ptr<Kernel> make_bernoulli(const KernelInit& init);

// optimizers.cpp: ai.onnx.preview.training optimizers.
std::unique_ptr<Kernel> make_adagrad(const KernelInit& init);
std::unique_ptr<Kernel> make_momentum(const KernelInit& init);
std::unique_ptr<Kernel> make_adam(const KernelInit& init);
std::unique_ptr<Kernel> make_scaled_adam(const KernelInit& init);

// signal.cpp: Fourier transforms; windows.cpp: window functions and the mel filter bank.
std::unique_ptr<Kernel> make_dft(const KernelInit& init);
std::unique_ptr<Kernel> make_stft(const KernelInit& init);
std::unique_ptr<Kernel> make_window(const KernelInit& init);  // HannWindow, HammingWindow, BlackmanWindow
std::unique_ptr<Kernel> make_mel_weight_matrix(const KernelInit& init);
// bitwise.cpp
std::unique_ptr<Kernel> make_bitwise(const KernelInit& init);  // BitwiseAnd, BitwiseOr, BitwiseXor, BitShift
std::unique_ptr<Kernel> make_bitwise_not(const KernelInit& init);
// selection.cpp; nms.cpp
std::unique_ptr<Kernel> make_unique_op(const KernelInit& init);  // Unique
std::unique_ptr<Kernel> make_nonzero(const KernelInit& init);
std::unique_ptr<Kernel> make_compress(const KernelInit& init);
std::unique_ptr<Kernel> make_reverse_sequence(const KernelInit& init);
std::unique_ptr<Kernel> make_tensor_scatter(const KernelInit& init);
std::unique_ptr<Kernel> make_non_max_suppression(const KernelInit& init);
// linalg.cpp; cumprod.cpp
std::unique_ptr<Kernel> make_det(const KernelInit& init);
std::unique_ptr<Kernel> make_cumprod(const KernelInit& init);
// ai.onnxtrain backward ops of these families: DFTGrad (signal.cpp), DetGrad (linalg.cpp).
std::unique_ptr<Kernel> make_dft_grad(const KernelInit& init);
std::unique_ptr<Kernel> make_det_grad(const KernelInit& init);

// --- internal ops of the ai.onnxtrain domain, emitted by gradient rules (src/autodiff) ---
// gradient_ops.cpp: SumToShape (inverse of broadcasting), GatherGrad, GatherElementsGrad,
// GatherNDGrad (scatter-add of an output gradient into zeros shaped like the data).
std::unique_ptr<Kernel> make_sum_to_shape(const KernelInit& init);
std::unique_ptr<Kernel> make_gather_grad(const KernelInit& init);  // GatherGrad, GatherElementsGrad, GatherNDGrad
// conv_grad.cpp: ConvGrad and ConvTransposeGrad (dX, dW, dB of Conv / ConvTranspose).
std::unique_ptr<Kernel> make_conv_grad(const KernelInit& init);
// pool_grad.cpp: MaxPoolGrad, AveragePoolGrad (dX of MaxPool / AveragePool).
std::unique_ptr<Kernel> make_pool_grad(const KernelInit& init);
// rnn_grad.cpp: RNNGrad, GRUGrad, LSTMGrad (gradients of RNN / GRU / LSTM, backpropagation
// through time).
std::unique_ptr<Kernel> make_rnn_grad(const KernelInit& init);

// --- casts (cast.cpp) and quantization (quantize.cpp, quantize_matmul.cpp, quantize_conv.cpp) ---
std::unique_ptr<Kernel> make_cast(const KernelInit& init);       // Cast-1 .. Cast-28
std::unique_ptr<Kernel> make_cast_like(const KernelInit& init);  // CastLike-15 .. CastLike-25
std::unique_ptr<Kernel> make_bitcast(const KernelInit& init);    // BitCast-26
std::unique_ptr<Kernel> make_quantize_linear(const KernelInit& init);
std::unique_ptr<Kernel> make_dequantize_linear(const KernelInit& init);
std::unique_ptr<Kernel> make_dynamic_quantize_linear(const KernelInit& init);
std::unique_ptr<Kernel> make_matmul_integer(const KernelInit& init);    // MatMulInteger
std::unique_ptr<Kernel> make_qlinear_matmul(const KernelInit& init);    // QLinearMatMul
std::unique_ptr<Kernel> make_conv_integer(const KernelInit& init);      // ConvInteger
std::unique_ptr<Kernel> make_qlinear_conv(const KernelInit& init);      // QLinearConv
// --- vision and neural-network ops, with their ai.onnxtrain backward ops ---
std::unique_ptr<Kernel> make_lrn(const KernelInit& init);           // lrn.cpp: LRN, LRNGrad
std::unique_ptr<Kernel> make_lp(const KernelInit& init);            // lp.cpp: LpPool, LpPoolGrad, LpNormalization,
                                                                     //   MeanVarianceNormalization
std::unique_ptr<Kernel> make_grid_sample(const KernelInit& init);   // grid_sample.cpp: GridSample, GridSampleGrad,
                                                                     //   AffineGrid, AffineGridGrad
std::unique_ptr<Kernel> make_roi_align(const KernelInit& init);     // roi_align.cpp: RoiAlign, RoiAlignGrad
std::unique_ptr<Kernel> make_max_unpool(const KernelInit& init);    // unpool.cpp: MaxUnpool, MaxUnpoolGrad
std::unique_ptr<Kernel> make_deform_conv(const KernelInit& init);   // deform_conv.cpp: DeformConv, DeformConvGrad
std::unique_ptr<Kernel> make_vision(const KernelInit& init);        // vision.cpp: Col2Im, Col2ImGrad, CenterCropPad,
                                                                     //   Upsample
// --- transformer ops ---
// attention.cpp: Attention-23/24/25; attention_grad.cpp: ai.onnxtrain.AttentionGrad.
std::unique_ptr<Kernel> make_attention(const KernelInit& init);
std::unique_ptr<Kernel> make_attention_grad(const KernelInit& init);
// transformer_norm.cpp: RMSNormalization, GroupNormalization, RotaryEmbedding and the backward
// ops RMSNormalizationGrad, GroupNormalizationGrad.
std::unique_ptr<Kernel> make_rms_norm(const KernelInit& init);
std::unique_ptr<Kernel> make_group_norm(const KernelInit& init);
std::unique_ptr<Kernel> make_rotary_embedding(const KernelInit& init);
// normalization.cpp: ai.onnxtrain.LayerNormalizationGrad.
std::unique_ptr<Kernel> make_layer_norm_grad(const KernelInit& init);
// activation.cpp: Gelu, Swish, Mish and GeluGrad, SwishGrad, MishGrad; SwiGLU and SwiGLUGrad.
std::unique_ptr<Kernel> make_transformer_activation(const KernelInit& init);
std::unique_ptr<Kernel> make_swiglu(const KernelInit& init);
// linear_attention.cpp: LinearAttention, CausalConvWithState.
std::unique_ptr<Kernel> make_linear_attention(const KernelInit& init);
std::unique_ptr<Kernel> make_causal_conv_with_state(const KernelInit& init);
// linear_attention_grad.cpp: ai.onnxtrain.CausalConvWithStateGrad, LinearAttentionGrad.
std::unique_ptr<Kernel> make_causal_conv_with_state_grad(const KernelInit& init);
std::unique_ptr<Kernel> make_linear_attention_grad(const KernelInit& init);
// image_decoder.cpp, tfidf.cpp
std::unique_ptr<Kernel> make_image_decoder(const KernelInit& init);
std::unique_ptr<Kernel> make_tfidf_vectorizer(const KernelInit& init);

}  // namespace onnxtrain::ops
