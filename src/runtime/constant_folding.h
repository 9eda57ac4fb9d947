// Constant folding: evaluates, when a graph is planned, the nodes whose every input is already
// known — the shape arithmetic exporters such as torch.onnx.export emit without
// do_constant_folding (Constant -> Unsqueeze -> Concat, Cast of a constant, ...) and the
// scalar constants of gradient rules — so no run repeats them.
//
// Like the fusions (runtime/fusion.h), it rewrites the GraphProto a session plans, never the
// model a user saves.
#pragma once

#include <filesystem>

#include "runtime/graph_runner.h"

namespace onnx {
class GraphProto;
}

namespace onnxtrain::runtime {

// Replaces each node of `graph` (not of its subgraphs) whose inputs are all known — outputs of
// Constant nodes or of nodes folded before it, and initializers that are not graph inputs
// (an initializer that is also an input is only a default a run may replace) — by one Constant
// node per output, holding what the node's kernel computes (the model's `opsets`; external data
// resolved against `base_dir`). Not folded: nodes outside the ai.onnx domain, random ops
// (RandomNormal, RandomUniform, their -Like forms, Bernoulli, Multinomial, Dropout), nodes with
// subgraph attributes, nodes with an output of more than 4096 elements (a folded value is kept
// for the session's lifetime) unless their outputs hold no more elements than what is left of
// their inputs that only foldable nodes read — initializers and folded values, which the graph
// then drops, each shared first come first served among its readers (an exporter's Transpose of
// a weight, or the three Slice nodes of a weight and the Concat that reorder an LSTM's gates:
// memory stays the same, the run stops repeating them) — and nodes whose kernel fails (the run
// reports the error with its usual context). Also not folded: a linear layer's W^T as exporters
// write it, Transpose (perm [1, 0]) of a float32 rank-2 constant read by one MatMul or Gemm as
// its B while that product's A is not known: the product reads W in place (runtime/fusion.h
// fuse_matmul_add, fuse_transpose_matmul, fuse_transpose_gemm), where a folded W^T would be a
// second copy of the weights next to the one the product keeps in its own layout
// (ops/matmul.cpp ConstantWeightsProduct). Initializers and Constant nodes whose every reader
// was folded leave the graph. Returns the number of nodes folded.
int fold_constants(onnx::GraphProto& graph, const OpsetMap& opsets, const std::filesystem::path& base_dir);

}  // namespace onnxtrain::runtime
