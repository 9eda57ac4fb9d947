// The Gradient operator (ai.onnx.preview.training v1), implemented as a graph transformation
// that runs before planning: every Gradient node is replaced by ordinary nodes that compute
// its outputs, so the backward pass runs on the same kernels, can be differentiated again and
// can be exported.
//
// Semantics (the op's doc in onnx/defs/training/defs.cc):
//   Gradient(xs..., zs...) -> (dy/dxs[0], ...), attributes xs, zs (optional), y.
//   - When the node's inputs are the tensors named by xs and zs, the forward values are reused.
//     Otherwise the part of the graph from xs+zs to y is cloned with the node's inputs put in
//     their place, and differentiated there.
//   - xs may name intermediate tensors; y need not be a scalar: the seed gradient is a tensor
//     of ones shaped like y (so the result is the gradient of sum(y)).
//   - An x that y does not depend on gets zeros shaped like x; an empty output name skips
//     that gradient.
//   - Control flow: paths from xs to y run through the values an If's branches or a Loop's body
//     read from the enclosing graph, as through node inputs. An If is differentiated by an If
//     on the same condition whose branches recompute the forward branch and its backward pass
//     (nested If nodes alike). A Loop on such a path is unrolled into copies of its body first,
//     which needs its trip count M to be an initializer or Constant and its condition to end
//     nothing early (the cond input omitted or a constant, the body's cond output a constant
//     or its cond input passed through); its outputs keep their values and names.
//   - Sequences: SequenceAt at a constant position of a SplitToSequence is first rewritten as
//     the Slice or Gather that reads the same chunk (autodiff/sequences.h); other sequence
//     values on a path from xs to y have no gradient.
//   - Errors (onnxtrain::Error): an operator without a gradient rule on a path from xs to y
//     (naming the op, the node and the path), an integer tensor in xs, a name in xs/zs/y that
//     the graph does not define, a node whose inputs do not match xs+zs, a Loop on a path
//     from xs to y that cannot be unrolled (naming the node and why: "the trip count is not
//     known when the graph is planned" or "the loop ends on a condition computed from data").
#pragma once

#include <string>
#include <unordered_map>

namespace onnx {
class GraphProto;
}

namespace onnxtrain::autodiff {

inline constexpr const char* kTrainingDomain = "ai.onnx.preview.training";
// Internal ops emitted by gradient rules where standard ONNX ops would be much slower.
inline constexpr const char* kInternalDomain = "ai.onnxtrain";

using OpsetMap = std::unordered_map<std::string, int>;

// True when a node of `graph` (not of its subgraphs) is a Gradient node.
bool has_gradient_nodes(const onnx::GraphProto& graph);

// Replaces every Gradient node of `graph` by its backward nodes, in place. `opsets` are the
// model's opset imports (rules emit the form of each op that the model's opset defines);
// `where` names the graph in error messages.
void expand_gradients(onnx::GraphProto& graph, const OpsetMap& opsets, const std::string& where);

}  // namespace onnxtrain::autodiff
