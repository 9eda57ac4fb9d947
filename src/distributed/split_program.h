// The cut of a training algorithm for data-parallel training (docs/distributed.md).
//
// An algorithm graph whose Gradient nodes were expanded (autodiff/gradient.h) is cut in two:
// `local`, the nodes the Gradient outputs depend on (the forward and backward passes, run by
// each rank on its share of the batch), and `update`, every other node (the optimizer, the
// schedule, counters), which reads the cut values as graph inputs. `cut` lists the values
// `local` hands on: every Gradient output it computes, every value it computes that an
// `update` node reads, and every graph output it computes (the loss). Both graphs keep the
// graph inputs and initializers their nodes read; neither holds a node of the other.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace onnxtrain::distributed {

struct SplitProgram {
  onnx::GraphProto local;
  onnx::GraphProto update;
  std::vector<std::string> cut;  // in the order `local` writes them
  // The cut values to average across ranks: the Gradient outputs, the values `update` reads,
  // the `bound` values (update_binding: BatchNormalization's running statistics) and the graph
  // outputs declared as scalars (the loss). The others (per-sample graph outputs such as the
  // logits of a combined graph) stay each rank's own.
  std::set<std::string> reduced;
};

// Adds the names `node` reads to `reads`: its inputs and, for a node with subgraphs, every name
// read inside them (a superset of the enclosing-graph values they capture).
void add_reads(const onnx::NodeProto& node, std::set<std::string>& reads);

// The parameter each Gradient output is the gradient of: the non-empty output i of a Gradient
// node of `graph` (not of its subgraphs) -> the node's attribute xs[i]. Call it before the
// Gradient expansion, which keeps these output names.
std::map<std::string, std::string> gradient_parameters(const onnx::GraphProto& graph);

// Cuts `graph` (nodes in topological order, Gradient nodes expanded) at `gradients`.
SplitProgram split_at_gradients(const onnx::GraphProto& graph, const std::set<std::string>& gradients,
                                const std::set<std::string>& bound);

}  // namespace onnxtrain::distributed
