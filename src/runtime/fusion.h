// Graph rewrites that make a graph cheaper to run without changing any result.
//
// They run on the GraphProto a session plans (after the Gradient expansion), never on the
// model a user saves: a model written by onnxtrain holds only standard ONNX ops.
#pragma once

namespace onnx {
class GraphProto;
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
// element-wise math on such values). Returns the number of Adam nodes fused.
int fuse_scaled_adam(onnx::GraphProto& graph);

}  // namespace onnxtrain::runtime
