// Tensor chunks read from a sequence, rewritten as tensor ops so that gradients flow through
// them: the autodiff engine has no gradients of sequence values, and the dynamo exporter of
// PyTorch 2.13 (torch.onnx.export(dynamo=True, optimize=False)) writes torch.split as
// SplitToSequence followed by SequenceAt at constant positions (GPT-2's query/key/value split).
#pragma once

#include <onnx/onnx_pb.h>

namespace onnxtrain::autodiff {

// Replaces each SequenceAt(S, p) node of `graph` (not of its subgraphs) whose S is the output
// of a SplitToSequence(x, split; axis, keepdims) node of `graph`, with p and split (when given)
// initializers or Constant nodes, by the tensor op that reads the same chunk of x
// (ONNX operator docs "SplitToSequence", "SequenceAt"; Slice clamps its ends, which gives the
// shorter last chunk):
//   split omitted: chunks of size 1, p in [-n, n): Gather(x, [p], axis) when keepdims = 1,
//     Gather(x, p, axis) (the axis dropped) when keepdims = 0;
//   split a scalar s: Slice(x, [p s], [(p + 1) s], [axis]) for p >= 0 (a negative p needs the
//     chunk count, unknown when the graph is planned: such a node is left alone);
//   split 1-D [s0, .., s(n-1)]: Slice(x, [s0 + .. + s(p-1)], [s0 + .. + sp], [axis]), p in [-n, n).
// The SequenceAt node's output name and node name are kept; a SplitToSequence node left
// without readers (nodes, subgraphs or graph outputs) is removed. Returns the number of
// SequenceAt nodes rewritten. Nodes it cannot rewrite (a computed position, a position out of
// range) stay, so the engine names them if a gradient must pass through them.
int slice_sequence_chunks(onnx::GraphProto& graph);

}  // namespace onnxtrain::autodiff
