// Graph rewrites that make a graph cheaper to run without changing any result.
//
// They run on the GraphProto a session plans (after the Gradient expansion), never on the
// model a user saves: a model written by onnxtrain holds only standard ONNX ops.
#pragma once

#include <map>
#include <string>
#include <unordered_map>

namespace onnx {
class GraphProto;
class TypeProto;
}

namespace onnxtrain::runtime {

// Replaces each ai.onnx.preview.training.Adam node whose gradient and state inputs are Div
// nodes by scalars and whose state outputs are read only by Mul nodes by scalars — the
// pattern `onnxtrain make-trainable` emits to give Adam PyTorch's epsilon placement — with one
// ai.onnxtrain.ScaledAdam node (ops/optimizers.cpp), which does the six element-wise passes
// per tensor in one (multiplying by reciprocals where the Div nodes divide, so values may
// differ in the last bit). Fuses only when every tensor of the node
// has the same pattern with the same five scalars, each Div output and Adam state output has
// no other reader (and is neither a graph output nor read by a subgraph), and each scalar is
// provably of one element (an initializer, Constant or graph input of one element, or
// element-wise math on such values). When every X input is, in turn, the product of a tensor
// and one common scalar read by the Adam node alone (AdamW's decayed parameter p (1 - lr wd),
// which make-trainable writes for --optimizer adamw), those Mul nodes go too: the node reads
// the tensors as X and the scalar as a sixth input S_X (attribute x_scaled = 1), multiplying
// X by it in the same pass, exactly as the Mul did. Returns the number of Adam nodes fused.
int fuse_scaled_adam(onnx::GraphProto& graph);

// Replaces each Conv -> [Relu ->] MaxPool chain whose intermediate values have no other reader
// (and are neither graph outputs nor read by a subgraph), and whose MaxPool has no Indices
// output, with one ai.onnxtrain.FusedConv node (ops/conv.cpp): the Conv's inputs and
// attributes, activation = "Relu" when there is one, the MaxPool's attributes renamed
// pool_<name>, the MaxPool's output. Results are the three ops' (the convolution may run in
// another oneDNN layout, so values may differ in the last bits). The node keeps the Conv's name.
// Inference graphs match; in a training graph the backward pass reads the Relu's output, so
// only fuse_conv_relu applies there. Returns the number of chains fused.
int fuse_conv_pool(onnx::GraphProto& graph);

// Replaces each Conv -> Relu whose Conv output has no other reader (and is neither a graph output
// nor read by a subgraph) with one ai.onnxtrain.FusedConv node with activation = "Relu" writing
// the Relu's output: for float32 the pass that copies oneDNN's channel-blocked result into the
// plain tensor applies Relu, so neither the convolution's own output nor a Relu pass remains.
// Run after fuse_conv_pool, which takes whole Conv -> Relu -> MaxPool chains. Returns the number
// of pairs fused.
int fuse_conv_relu(onnx::GraphProto& graph);

// Replaces each Gemm -> Relu whose Gemm output has no other reader (and is neither a graph output
// nor read by a subgraph) with one ai.onnxtrain.FusedGemm node (ops/matmul.cpp: Gemm's inputs
// and attributes, activation = "Relu") writing the Relu's output: oneDNN's matmul applies Relu
// in its epilogue where it runs the product (float32), the other paths in the same kernel. In a
// training graph the backward pass reads the Relu's output (ReluGrad), so it applies there too:
// the MLP's hidden layers. Likewise each ai.onnxtrain.ReluGrad(Y, dX) whose dX is such a Gemm's
// output (the backward pass's input gradient of the layer above) becomes a FusedGemm with
// activation = "ReluGrad" and Y as input 3 (C as "" when absent), applying the mask
// dX where Y > 0, else 0 in the same kernel. Run after fuse_matrix_products (whose Gemm folds
// look for Gemm nodes). Results equal the two ops' (Relu keeps NaN). Returns the number of pairs
// fused.
int fuse_gemm_relu(onnx::GraphProto& graph);

// Runs chains of convolutions in the channels-last layout ([N, D..., C], what oneDNN's
// brgemm-based convolutions read and write on AVX-512) instead of converting every convolution's
// input and output between NCHW and that layout: each Conv, and each ai.onnxtrain.FusedConv
// without a pool, whose weights are a float32 constant of rank 3 to 5 (initializer that is not a
// graph input, or Constant node) becomes an ai.onnxtrain.ConvChannelsLast (ops/conv.cpp) reading
// and writing channels-last tensors; so does each element-wise op (Relu, Add, Mul, Clip, ... see
// layout_free in fusion.cpp) whose operands are all channels-last of one rank or one-element
// constants of no higher rank. A FusedConv with a pool (ResNet's stem: Conv -> Relu -> MaxPool)
// and such weights starts a chain: it keeps reading its input as it is and writes its output
// channels-last (attribute channels_last = 1), so the chain after it needs no Transpose at its
// entry. A Transpose makes a convolution's channels-last input where no
// converted node does, and one makes the original (channels-first) value for any reader that
// is not converted, a graph output or a subgraph. Only groups of converted nodes (connected
// through the values they pass) with at least two convolutions are rewritten. Results are the
// original ops' (the convolutions may sum in another order, so values may differ in the last
// bits). Run after fuse_conv_pool and fuse_conv_relu. Returns the number of convolutions
// converted.
int use_channels_last(onnx::GraphProto& graph);

// Passes the output of each pooled ai.onnxtrain.FusedConv (a Conv with its MaxPool, from
// fuse_conv_pool) whose weights are a float32 constant and whose output channels divide by
// b = ops::pooled_conv_channel_block() (conv_geometry.h; 8 on AVX2 without AVX-512, else the pass
// does nothing) to the pooled FusedConvs reading it (all its readers, each as X only; not a graph
// output nor read by a subgraph) blocked by b channels, [N, M / b, O..., b]: the writer gets
// attribute y_channel_block = b, the readers x_channel_block = b (ops/conv.cpp). oneDNN's AVX2
// convolutions read and write that layout themselves: the Fashion-MNIST CNN's conv1 -> conv2
// passes no reorder. Results are the ops' own. Run after use_channels_last. Returns the number
// of writers.
int block_pooled_conv_pairs(onnx::GraphProto& graph);

// Passes the tensors between a training graph's 2-D convolutions, max pools and their gradients
// blocked by b = ops::conv_channel_block() = 16 channels (conv_geometry.h; CPUs with AVX-512 only:
// without it, convolutions of small maps run as matrix products on plain tensors, conv_gemm.h, and
// the pass does nothing), [N, C / b, H, W, b], the layout oneDNN's direct convolutions
// read and write themselves, instead of reordering them from and to the plain tensors at every
// convolution and gradient. A value goes blocked when it is written by
//   - a Conv or an ai.onnxtrain.FusedConv without a pool (group 1, weights a float32 rank-4
//     initializer: M from their dims): it becomes a FusedConv with y_channel_block = b;
//   - a MaxPool without Indices of a blocked value: it becomes ai.onnxtrain.MaxPoolChannelBlocked
//     (ops/pool.cpp) with y_channel_block = b;
//   - an ai.onnxtrain.MaxPoolGrad whose X is blocked (x_channel_block = b: X and dX);
//   - an ai.onnxtrain.ConvGrad as its dX (dx_channel_block = b, W a float32 rank-4 initializer);
//   - a BatchNormalization in training mode (opset 14+) as its Y: it becomes
//     ai.onnxtrain.BatchNormalizationChannelBlocked with channel_block = b (ops/normalization.cpp);
//   - an ai.onnxtrain.BatchNormalizationGrad as its dX (channel_block = b: dY, X and dX);
//   - an element-wise Relu, ai.onnxtrain.ReluGrad, Add, Sum or Identity (unchanged: the same
//     arithmetic in either layout, broadcasting over the batch and the spatial dims included);
//   - an ai.onnxtrain.SumToShape whose target is the Shape of a blocked value (the gradient of an
//     Add: the same reduction, to the blocked shape),
// its channels divide by b, it is neither a graph output nor read by a subgraph, and each of its
// readers reads it only as a convolution's X (x_channel_block = b, C dividing by b), a MaxPool's X
// (MaxPoolChannelBlocked with x_channel_block = b), a MaxPoolGrad's dY or X, a ConvGrad's dY or
// X (dy_channel_block / x_channel_block = b), a BatchNormalization's X, its gradient's dY or X, an
// element-wise node's input, a SumToShape's data, or a Shape read only by such SumToShapes. A
// MaxPoolGrad's X and dX are blocked together or not at all, and its dY only with them; a
// BatchNormalization's X and Y, its gradient's dY, X and dX, an element-wise node's inputs and
// output, and a SumToShape's data and output likewise all together or none (so a residual
// network's activations and their gradients pass blocked from convolution to convolution). Every
// other value stays plain; the kernels read and write both layouts. A blocked convolution's Relu then moves past the pools reading its output when
// only they and MaxPoolGrads with activation Relu read it (MaxPool(Relu(c)) = Relu(MaxPool(c));
// the MaxPoolGrads' mask X > 0 picks the same maximum in c), and where that is one pool of 2x2
// windows at stride 2 without padding, the convolution takes it in: a pooled FusedConv writing
// the pool's output and, as output 1, the uint8 mask of where its gradient goes (ops/pool_plan.h
// max_pool_relu_with_mask), which the MaxPoolGrads read instead of c (routing_mask = 1), so c is
// made in cache-sized chunks and never stored. The Fashion-MNIST CNN's training step passes its
// convolutions' inputs, outputs and gradients this way, from conv1 to conv2's pooled output (which
// Flatten reads plain); ResNet-18's reorders no activation between its convolutions (77 a step
// before, 1.4 ms).
// Results are the ops' own (oneDNN may sum in another order, so values may differ in the last
// bits). Run on training graphs after fuse_max_pool_relu_grad. Returns the number of values
// blocked.
int block_convolution_tensors(onnx::GraphProto& graph);

// Replaces each ai.onnxtrain.ConvChannelsLast without an activation whose output is read only by
// an Add (either operand; not a graph output nor read by a subgraph) — a residual connection —
// with one ConvChannelsLast taking the Add's other operand as input 3, z, and writing the Add's
// output: the sum is made in the pass after the convolution instead of by a second kernel.
// When the Add's output is read only by a Relu, the Relu goes in too (activation = "Relu",
// applied after the sum) and the node writes the Relu's output. The node takes the Add's place
// in the graph (z is ready there). Results are the ops' own. Run after use_channels_last.
// Returns the number of Adds fused.
int fuse_conv_add(onnx::GraphProto& graph);

// Folds each inference-mode BatchNormalization (one output; ai.onnx opset 7 or later; spatial)
// whose input is a Conv output read by nothing else into the Conv: W' = W s and B' = (B - mean)
// s + bias per output channel, s = scale / sqrt(var + epsilon) (computed in float64, stored in
// W's type), for constant W, B and BatchNormalization inputs (initializers that are not graph
// inputs, or Constant nodes) of float32 or float64. The Conv then writes the BatchNormalization's
// output from new initializers; W's initializer goes when nothing else reads it. Run before
// fuse_conv_pool / fuse_conv_relu, so Conv -> BatchNormalization -> Relu becomes one FusedConv.
// Results equal the two ops' up to rounding. Returns the number of pairs folded.
int fold_batch_norm_into_conv(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// Replaces each MatMul(A, B) -> Add(., C) (C on either side) — a linear layer with bias as
// exporters write it when A is not 2-D (BERT's projections of [batch, sequence, hidden]) — with
// one ai.onnxtrain.MatMulAdd(A, B, C) node (ops/matmul.cpp) writing the Add's output, so the bias
// costs no pass of its own. It applies where the MatMul output is read by the Add and otherwise
// only by Shape nodes (which then read the Add's output: the shapes are equal), is neither a
// graph output nor read by a subgraph, C is float32 of rank 1 and B float32 of rank 2, each a
// constant (an initializer that is not a graph input, or a Constant node) or a value whose
// element type and rank the graph states (a graph input, value_info). A B made by a Transpose
// of such a rank-2 value (perm [1, 0]: the training graph's W^T of a PyTorch Linear, whose W
// changes every step) is read in place with attribute transB = 1, and the Transpose goes when
// nothing else reads it. The kernel checks that C has N elements or one, as Add's broadcasting
// would. Results are the two ops' (the sum may round differently in the last bit). Returns the
// number of pairs fused.
int fuse_matmul_add(onnx::GraphProto& graph);

// Replaces each Transpose of a rank-2 value (perm [1, 0]) whose readers are Gemm nodes reading
// it as A or B (not C), besides Shape nodes, and which is neither a graph output nor read by a
// subgraph: each Gemm reads the Transpose's input with its transA / transB flipped (the same
// product), and each Shape node reads Gather(Shape(x), [1, 0]) as fuse_permuted_matmul does. The
// training graph of a PyTorch Linear keeps W^T = Transpose(W) for the input gradient dY (W^T)^T
// (a Gemm with transB = 1) and the weight gradient's shape once fuse_matmul_add reads W in place:
// with this, nothing copies W. And a Transpose (perm [1, 0], not a graph output) of a Gemm's
// product without C, read directly or through an ai.onnxtrain.SumToShape, each of those values
// read by the next alone: the Gemm writes the transposed product itself, (A' B')^T = B'^T A'^T
// (operands swapped, transA = !transB, transB = !transA), and the SumToShape's target is
// permuted by a Gather (the weight gradient of that W^T, dW = Transpose(SumToShape(X^T dY))).
// Results are the Gemm's. Run after fuse_matmul_add. Returns the number of Transpose nodes
// removed.
int fuse_transpose_gemm(onnx::GraphProto& graph);

// Replaces each Transpose that swaps only the last two dims of a MatMul operand (perm
// [0, ..., r-1, r-2], r >= 2) and whose output the MatMul alone reads (not a graph output nor
// read by a subgraph) by attribute transA / transB = 1 of an ai.onnxtrain.MatMulTransposed node
// (ops/matmul.cpp) that reads the Transpose's input: float32 operands are read in place through
// sgemm's and oneDNN's strides instead of being copied first (the gradient of a batched MatMul,
// dA = dY B^T and dB = A^T dY, writes two such Transposes; attention's Q K^T one). Results are
// MatMul's. Run after fuse_matmul_add. Returns the number of Transpose nodes removed.
int fuse_transpose_matmul(onnx::GraphProto& graph);

// Replaces each Transpose with a stated perm of rank >= 3 whose every reader is a MatMul or an
// ai.onnxtrain.MatMulTransposed reading it as an operand (not a graph output nor read by a
// subgraph) by attribute perm_a / perm_b of ai.onnxtrain.MatMulPermuted nodes (ops/matmul.cpp)
// that read the Transpose's input: float32 operands are read in place through oneDNN's strides
// (attention's head split: Q, K and V as [batch, sequence, heads, head size] read as [batch,
// heads, ...]) instead of being copied first. A MatMulTransposed's transA / transB on such an
// operand composes with the perm (its last two entries swapped); one on an operand no such
// Transpose makes keeps the Transposes it reads. First, a Mul of a Transpose's output (read by
// it alone) by a one-element constant of no higher rank moves ahead of the Transpose (the
// scaling of Q and K by d^-1/4 the BERT export writes after the split), and Shape nodes reading
// a Transpose whose other readers are such products read Gather(Shape(x), perm) instead: the
// same values; repeated until nothing changes (a moved Mul hands its Shape readers, in a training
// graph those of its gradient, to the Transpose). Results are MatMul's. Run after
// fuse_transpose_matmul. Returns the number of Transpose nodes removed.
int fuse_permuted_matmul(onnx::GraphProto& graph);

// Replaces each Transpose with a stated perm of rank >= 3 (not a graph output nor read by a
// subgraph) of the output of a MatMul, or of an ai.onnxtrain.MatMulPermuted without perm_y, that
// the Transpose alone reads besides Shape nodes (and that is neither a graph output nor read by a
// subgraph) by attribute perm_y of that product, now a MatMulPermuted writing the Transpose's
// output: float32 products of operands of one rank write each element where the Transpose would
// put it, through oneDNN's destination strides (attention's head merge, [batch, heads, sequence,
// head size] written as [batch, sequence, heads, head size], and in a training graph the
// gradients of the head split), instead of a product and a copy. Each Shape node reads
// Gather(Shape(y), inverse perm) instead: the same values. Results are the two ops'. Run after
// fuse_permuted_matmul. Returns the number of Transpose nodes removed.
int permute_product_outputs(onnx::GraphProto& graph);

// The rewrites of matrix products, in the order they depend on: fuse_matmul_add,
// fuse_transpose_gemm, fuse_transpose_matmul, fuse_permuted_matmul, then
// permute_product_outputs. Sessions call this after the Gradient expansion and constant folding.
void fuse_matrix_products(onnx::GraphProto& graph);


// Replaces each ai.onnxtrain.ReluGrad(Y, dY) whose dY is the output of an
// ai.onnxtrain.MaxPoolGrad(dP, Y) over the same Y, read by nothing else — the backward pass of
// Relu -> MaxPool — by that MaxPoolGrad with attribute activation = "Relu" writing the
// ReluGrad's output (ops/pool_grad.cpp): one pass over the pooled tensor's gradient instead of
// two. Results are the two ops'. Returns the number of pairs fused.
int fuse_max_pool_relu_grad(onnx::GraphProto& graph);

// Replaces each Gelu of the erf form (ai.onnxtrain.Gelu, or ONNX Gelu-20 with approximate
// "none") of an ai.onnxtrain.MatMulAdd's output read by nothing else — a transformer's first
// feed-forward layer in an inference graph (in training, GeluGrad reads that output too) — by the
// MatMulAdd with attribute activation = "Gelu" writing the Gelu's output (ops/matmul.cpp: on
// constant weights inside oneDNN's primitive). Results may differ in the last bits (oneDNN's erf).
// Run after fuse_matrix_products. Returns the number of Gelus removed.
int fuse_matmul_add_gelu(onnx::GraphProto& graph);

// Replaces each ai.onnxtrain.SumToShape(t, shape) whose t is the output of an
// ai.onnxtrain.GeluGrad(dY, X) — the gradient of a bias added before a Gelu, as a transformer's
// feed-forward layer writes it — by that GeluGrad with shape as its input 2 and the SumToShape's
// output as its output 1 (ops/activation.cpp), which sums dX to the bias's shape while it makes
// it instead of reading it back: the same values. One SumToShape per GeluGrad (the first in the
// node order). Returns the number of SumToShapes removed.
int fuse_gelu_bias_grad(onnx::GraphProto& graph);

// Replaces each ai.onnxtrain.LayerNormalizationGrad whose dY is the output of an ONNX Sum read by
// nothing else (not a graph output, not read by a subgraph) — the Sum the Gradient expansion writes
// where LayerNormalization's output has several readers, such as a transformer's residual branch
// and the next layer's projections — by that LayerNormalizationGrad reading the Sum's first input
// as dY and the others as its inputs 5 and on (ops/normalization.cpp run_layer_norm_grad), which
// sums them row by row as Sum does: the same values, without writing the summed tensor and reading
// it back. The terms must have X's shape (the expansion's terms of one gradient do); the kernel
// names the input that does not. Returns the number of Sums removed.
int fuse_layer_norm_grad_sum(onnx::GraphProto& graph);

// Hands an ai.onnxtrain.LayerNormalizationGrad the gradient of a bias added before the
// normalization, as the Gradient expansion writes it for a transformer's dense layer before its
// residual Add and LayerNormalization: SumToShape(SumToShape(dX, A), B), the inner one the Add's
// gradient for the dense output (A its shape: dX itself at run time) and B a bias's shape (Shape
// of a value the graph states to be of rank 1, or a constant [n] or [1, ..., 1, n]). The outer
// SumToShape goes; the LayerNormalizationGrad gets attribute dx_sum = 1, A and B as inputs 5 and 6
// (any further terms of dY after them) and the outer SumToShape's output as its output 3
// (ops/normalization.cpp), which sums dX to B while it makes it instead of reading it back: the
// same values. The inner SumToShape stays for its other readers. One per node (the first in the
// node order). Run after fuse_layer_norm_grad_sum. BERT's step: 8 SumToShapes of [4096, 256]
// fewer, 3.4-3.6 ms of SumToShape a step against 5.8-6.0, LayerNormalizationGrad about the same
// (three alternating pairs). Returns the number of SumToShapes removed.
int fuse_layer_norm_bias_grad(onnx::GraphProto& graph);

// Replaces each ONNX LayerNormalization whose X is the output of an ONNX Add (two inputs, no
// legacy broadcast attributes) — the residual Add before a transformer's normalization — by one
// ai.onnxtrain.AddLayerNormalization(A, B, Scale[, Bias]) node with the normalization's
// attributes, writing Y, Mean, InvStdDev and, where anything else reads it, the Add's output as
// output 3 (ops/normalization.cpp run_add_layer_norm): where A and B have one shape, each row of
// the sum is made and normalized while in cache, instead of the sum being written by one pass and
// read back by the next; an inference graph's sum, which the normalization alone reads, is not
// written at all. In a training graph the backward pass reads the sum as
// LayerNormalizationGrad's X; its readers must come after the normalization in the node order
// (the fused node takes the normalization's place), and it is neither a graph output nor read by
// a subgraph. Results are the two ops' to the bit. BERT's training step has 9 such pairs (the
// embeddings' and two a layer): 6.0-6.7 ms of AddLayerNormalization a step against 7.0-7.7 of
// their Adds and LayerNormalizations, the step 0.5-6 ms faster in three alternating pairs
// (`ONNXTRAIN_PROFILE`, 25 minus 5 steps); its inference at batch 32 82.7-90.3 ms against
// 84.5-95.2 (three alternating pairs), at batch 1 the same within noise. Returns the number of
// Adds removed.
int fuse_add_layer_norm(onnx::GraphProto& graph);

// The rewrites of products and gradient nodes that Session and TrainingSession both run after
// the Gradient expansion, constant folding and the convolution rewrites, in this order:
// fuse_matrix_products, fuse_matmul_add_gelu, fuse_gemm_relu, fuse_max_pool_relu_grad,
// fuse_layer_norm_grad_sum, fuse_layer_norm_bias_grad, fuse_gelu_bias_grad, fuse_add_layer_norm.
// Each session runs its own passes around it.
void fuse_products_and_gradients(onnx::GraphProto& graph);

// Replaces each Dropout (ai.onnx opset 12 or later) whose ratio is a constant 0 (an initializer
// that is not a graph input, or a Constant node, of one element) and whose mask output is absent
// or unread (not a graph output, not read by any node or subgraph) with an Identity of its data:
// the ONNX Dropout doc's output is data / (1 - ratio) times a mask that keeps every element when
// ratio is 0, so data itself, in training mode as in inference. Exporters write such nodes for
// modules built with dropout 0 (PyTorch skips the op then, too). Run before the Gradient
// expansion: the backward pass then gets dx = dy, not a Where over a mask of all true and a Mul
// by 1 / (1 - ratio). Returns the number of nodes replaced.
int drop_zero_dropout(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// Replaces each Gather of a Transpose's output by a constant scalar index (a 0-D int32 / int64
// constant: an initializer that is not a graph input, or a Constant node) with the Gather of the
// Transpose's input on the axis the Transpose moved there, where the Transpose's output has that
// Gather as its only reader, is neither a graph output nor read by a subgraph nor named by an
// attribute, the Transpose states its perm, and the dims left after the Gather keep their order
// (so no Transpose is needed after it): Gather(Transpose(x, perm), i, axis a) is Gather(x, i, axis
// perm[a]) then. PyTorch exports `y[:, -1]` of a batch-first LSTM's output so (a [1, 0, 2]
// Transpose of the whole sequence, then the last step): the step is read where the LSTM wrote it
// instead of after a copy of every step. Values equal. Returns the number of Transposes removed.
int gather_before_transpose(onnx::GraphProto& graph);

// Where a Gather with constant indices (a scalar or 1-D, int64 or int32, in range, at most half
// the positions of a static axis), or a Slice of one axis with step 1 and constant bounds (x[:, 0]
// written as Slice then Squeeze), of a floating-point tensor reads the output of ops that compute
// each position along that axis from the same position of their inputs, those ops compute only
// the gathered positions: a Gather of the same indices moves to each input that is needed whole
// elsewhere, and the Gather itself then picks from the rows. The ops it passes (rowwise_inputs in
// gather_rows.cpp): element-wise ops with broadcasting, LayerNormalization, Softmax over another
// axis, MatMul along A's rows or a batch axis, Transpose, Reshape where each position stays one
// slab of elements (by shape inference's dims), and attention along its queries (the MatMul-Softmax-MatMul
// exporters write, which fuse_attention then fuses with fewer queries than keys, ai.onnx Attention
// without a causal mask or a window, and fuse_attention's own), whose keys and values stay whole.
// A sequence classifier's pooler reads token 0 of the last encoder layer
// (BertForSequenceClassification: Gather(hidden, 0, axis 1)): that layer's query projection,
// attention, output projection, feed-forward and normalizations then run on one position of each
// sequence, and, run before the Gradient expansion, so do their backward passes (BERT's training
// step at docs/performance.md's shapes: 66.2 instead of 83.8 GFLOP, 14-20 % less time). A value is
// replaced by its rows only where every reader is in the rewrite, a Shape node (which then gets the
// whole shape back: the axis's size must be static) or the Gather, and where it is no graph output,
// read by no subgraph and named by no attribute (a Gradient node's xs, zs, y); only where some
// arithmetic moves. Opsets 13 and later. Results equal the graph's up to the products' rounding
// (fewer rows may take another oneDNN kernel). Returns the number of Gathers moved.
int gather_before_rowwise_ops(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// Replaces each Concat whose inputs are Slices of one tensor along the Concat's axis (constant
// bounds, step 1, each Slice read by the Concat alone, no graph output, subgraph value or
// attribute-named value among them) that together take every position of that static axis once,
// in any order, with Gather(tensor, the positions in the Concat's order, axis). PyTorch exports
// every nn.LSTM and nn.GRU so: its gate order (i, f, g, o) becomes ONNX's (i, o, f, c) by three
// Slices and a Concat of each weight and bias, run at every training step on trainable weights,
// whose backward pass is then three zero-filled SliceGrads and their Sum; a Gather's is one
// GatherGrad. Values equal, any element type. Opsets 10 and later. Throws nothing: bounds that are
// not constants, an axis out of range or a shape inference cannot state leave the Concat as it is
// (its kernels then name any error at run time). Returns the number of Concats replaced.
int concat_of_slices_to_gather(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// The rewrites that must see the forward ops before the Gradient expansion (so that the backward
// pass is built from the fused ops): concat_of_slices_to_gather, fuse_gelu, drop_zero_dropout,
// gather_before_rowwise_ops (whose shape checks need the standard ops' types, one shape inference
// for them all), then fuse_attention. Sessions call this on every graph they plan, before expand_gradients where there
// is one.
void fuse_before_expansion(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// Replaces each chain Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5) (operands of
// Add and Mul in either order), the erf formula of GELU that exporters write below opset 20
// (torch.nn.GELU, Hugging Face's gelu), with one ai.onnxtrain.Gelu node (ops/activation.cpp, the
// ai.onnx Gelu-20 kernel, approximate "none") writing the last Mul's output. Fuses only when each
// intermediate value has one reader, is neither a graph output nor read by a subgraph nor named
// by an attribute (a Gradient node's xs, zs or y), and the three constants are exactly sqrt 2 (in
// the value's float type), 1 and 0.5 (initializers or Constant nodes of one element). Run before
// the Gradient expansion, it also gives the backward pass one ai.onnxtrain.GeluGrad, which keeps
// only x, instead of the chain's rules (which keep three of its values). Results may differ in
// the last bits. The Gelu output gets a value_info with the type shape inference gives the
// chain's output under `opsets` (the Gradient expansion needs the ranks downstream). Returns the
// number of chains fused.
int fuse_gelu(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);

// Replaces each scaled dot-product attention as exporters write it (PyTorch's
// scaled_dot_product_attention and Hugging Face's eager attention, opsets before 23):
//   Q' = Transpose(q, [0, 2, 1, 3]),  K' = Transpose(k, [0, 2, 3, 1]) (or Transpose(Transpose(k,
//   [0, 2, 1, 3]), [0, 1, 3, 2])),  V' = Transpose(v, [0, 2, 1, 3]),
//   S = MatMul(Q' [* c_q], K' [* c_k]) [* c or / c] [+ mask],  P = Softmax(S, last axis),
//   [P = Where(IsNaN(P), 0, P): PyTorch's export with a boolean mask],
//   Y = MatMul(P [-> Identity ...], V')
// with q, k, v float32 [batch, sequence, heads, head size] (the head split's Reshape outputs)
// and c_q, c_k, c one-element constants or Identity, Cast, Sqrt, Reciprocal, Mul and Div of them
// (the export's Cast(Sqrt(1 / sqrt(head size))) on Q and on K), by one ai.onnxtrain.Attention(q,
// k, v[, mask]) writing Y (ops/attention.cpp: the Attention-23 kernel with attributes scale = c_q
// c_k c, input_layout = "BSHD", graph_semantics = 1, nan_to_zero = 1 with the Where, version =
// 23; attention.h), or, where Y's only reader is the head merge's Transpose(Y, [0, 2, 1, 3]),
// writing that Transpose's output itself (attribute output_layout = "BSHD"; the Transpose goes,
// and the gradient reads dY in that layout). Its gradient is
// one ai.onnxtrain.AttentionGrad (which recomputes P) instead of the pattern's rules: the
// scores and P are made and used per (batch, head) in cache, never stored, and no head split's
// Transpose copies anything. Fuses only when Softmax is the MatMul's sole reader chain, every
// node of the pattern and every node only they feed (the Shape nodes exporters hang on the
// Transposes and products, and what those feed; at most 64) can go: none of their values is a
// graph output, read by a subgraph, named by an attribute (a Gradient node's xs, zs or y) or read
// by a node that stays; and shape inference gives q, k, v float32 of rank 4 with one batch dim
// (the same value or name) and the mask float32 of rank 1 to 4. The mask is added as by Add, and
// a row it disallows entirely gives NaN as Softmax does, or zeros after the Where; the gradient
// treats those zeros as constants, as PyTorch's attention does (the op-by-op gradient, through
// SoftmaxGrad of the NaN row, is NaN wherever that row reaches). Otherwise results may differ in
// the last bits (the scale is applied once, to Q K^T). Y gets a value_info with the type shape
// inference gives it under `opsets`. Returns the number of attentions fused.
int fuse_attention(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets);
// The types ONNX 1.23's shape inference gives the graph's values under `opsets`, with the
// initializers' (best effort: what it cannot infer is absent). For rewrites that put internal
// ops, which have no ONNX schema, where shape inference must still see the types.
std::map<std::string, onnx::TypeProto> inferred_types(const onnx::GraphProto& graph,
                                                      const std::unordered_map<std::string, int>& opsets);

// Gives each ai.onnxtrain.Attention node (fuse_attention's; one output, no softcap) whose
// ai.onnxtrain.AttentionGrad nodes (later in the graph) read the same inputs with the same
// attributes, and no past or present gradients, the softmax P of its forward pass, instead of
// letting the gradient nodes make it again from Q K^T: the forward node writes P [batch, heads,
// queries, keys] as its qk_matmul_output (attribute qk_matmul_output_mode = 3, output 3), which
// each such gradient node takes as input 10 (ops/attention_grad.cpp). Results are unchanged (the
// same P); P is held from the forward pass to the backward pass (as the unfused graph held it)
// instead of being made twice. Run on training graphs. Returns the number of forward nodes
// rewritten.
int share_attention_probabilities(onnx::GraphProto& graph);
// Gives each RNN, GRU or LSTM node whose gradient node (ai.onnxtrain.RNNGrad / GRUGrad /
// LSTMGrad, later in the graph) reads the same inputs with the same attributes the gates and
// states of its forward pass, instead of letting the gradient node run the recurrence again:
// the forward node becomes ai.onnxtrain.RNNTraining / GRUTraining / LSTMTraining (ops/rnn.cpp)
// with the gradient node's attributes and one more output, the trace, which every such
// gradient node takes as its last input. Results are unchanged (the same recurrence on the same
// inputs); the trace is held from the forward pass to the backward pass instead of being made
// twice. Returns the number of forward nodes rewritten.
int share_rnn_trace(onnx::GraphProto& graph);

// Gives each convolution of a training graph (Conv, or ai.onnxtrain.FusedConv without a pool)
// whose weights are not an initializer and whose ai.onnxtrain.ConvGrad reads the same X and W
// with the same kernel_shape, strides, pads, dilations, auto_pad and group the taps of W that
// both run with: the convolution becomes a FusedConv with attribute weight_taps = 1 and a second
// output, W's taps where conv_geometry.h crop_unreached_taps crops them (an empty tensor
// otherwise), which each such ConvGrad takes as input 3 instead of gathering them again (ops/conv.cpp).
// Results are unchanged (the same taps); W is read once a step for them instead of twice.
// Run on training graphs after block_convolution_tensors. Returns the number of convolutions
// rewritten.
int share_weight_taps(onnx::GraphProto& graph);

// Hands an ai.onnx.preview.training.Momentum node the gradients of convolution weights as their
// ai.onnxtrain.ConvGrad makes them over the taps that reach the input (conv_geometry.h
// crop_unreached_taps), instead of scattered into W's shape with zeros at the others: each
// gradient G that a ConvGrad writes as its dW and only the Momentum node reads (directly or
// through Identity nodes each reading it alone, the Gradient op's outputs, which are removed and
// the Momentum node reads dW itself) gets attribute dw_taps = 1 on its ConvGrad, which then
// writes dW cropped where its run crops, with the description of the kept taps as output 3 (an
// empty tensor where it does not crop); the Momentum node gets attribute gradient_taps = 1 and,
// after its inputs, one input per tensor, that description ("" for the other tensors). The update
// is the same to the bit (ops/optimizers.cpp makes the zeros in cache); ResNet-18's four layer-4
// convolutions at 32x32 keep 1 or 4 taps of 9, and their dW, 9.4 MB each, are neither written
// whole nor read whole. Run on training graphs after share_weight_taps. Returns the number of
// gradients handed over this way.
int crop_momentum_gradients(onnx::GraphProto& graph);

// Hands an Adam node (ai.onnx.preview.training.Adam, or ai.onnxtrain.ScaledAdam) the gradient
// of an embedding as the rows its Gather's output gradient has: each gradient G that an
// ai.onnxtrain.GatherGrad along axis 0 makes and only the Adam node reads (directly or through
// Identity nodes each reading it alone, the Gradient op's outputs) goes with them, and the Adam
// node reads GatherGrad's dY as G, gets attribute gradient_rows = 1 and, after its state inputs
// (before ScaledAdam's scalars), one input per tensor: the Gather's indices ("" for the other
// tensors). The update is the same to the bit (ops/optimizers.cpp sums the rows in cache, in
// GatherGrad's order); BERT's [30522, 256] word embeddings' gradient (31 MB, for 4096 rows of dY
// at batch 32) is neither written nor read whole. Run on training graphs after fuse_scaled_adam.
// Returns the number of gradients handed over this way.
int fuse_gather_grad_adam(onnx::GraphProto& graph);

}  // namespace onnxtrain::runtime
