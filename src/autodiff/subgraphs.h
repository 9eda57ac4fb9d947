// Graph rewrites for nodes with subgraph attributes (If, Loop), used by the autodiff engine:
// the values a node's subgraphs read from the enclosing graph (its implicit inputs), renaming
// those reads, dropping nodes a graph's outputs do not need, and unrolling a Loop whose trip
// count is known when the graph is planned (ONNX operator doc "Loop").
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace onnxtrain::autodiff {

// The enclosing-graph values that `node`'s subgraph attributes read, sorted by name.
std::vector<std::string> implicit_inputs(const onnx::NodeProto& node);

// Every value `node` reads: its named inputs, then its implicit inputs.
std::vector<std::string> node_reads(const onnx::NodeProto& node);

// Node indices of `graph` in an order where the producers of every value a node reads come
// first (the node list of a valid ONNX graph already is, but a graph being rewritten may not
// be). A cycle does not stop it; the planner reports cycles.
std::vector<int> topological_order(const onnx::GraphProto& graph);

// Renames the reads of enclosing-scope values in `graph` and its own subgraphs (node inputs and
// graph outputs); names the graph defines itself hide the outer ones and are left alone.
void rename_enclosing_reads(onnx::GraphProto& graph, const std::unordered_map<std::string, std::string>& renames);

// The same for the subgraph attributes of `node`.
void rename_implicit_inputs(onnx::NodeProto& node, const std::unordered_map<std::string, std::string>& renames);

// A copy of `node` that reads renames[v] for each value v it reads (inputs and implicit inputs)
// that `renames` holds, its outputs renamed to fresh(output), which `renames` records.
onnx::NodeProto copy_node(const onnx::NodeProto& node, std::unordered_map<std::string, std::string>& renames,
                          const std::function<std::string(const std::string&)>& fresh);

// Whether `graph` defines `name` (as an input, initializer or node output).
bool defines(const onnx::GraphProto& graph, const std::string& name);

// The value of `name` when `graph` defines it as a constant known when the graph is planned:
// an initializer that is no graph input (an initializer of an input is only its default), or
// the output of a Constant node (value, value_int or value_ints); nullopt otherwise.
std::optional<onnx::TensorProto> constant_in(const onnx::GraphProto& graph, const std::string& name);

// Drops the nodes and initializers of `graph` that its outputs do not need.
void prune_to_outputs(onnx::GraphProto& graph);

// What unroll_loop needs from the graph the Loop lives in.
struct LoopScope {
  std::function<std::string(const std::string&)> fresh;  // a new unique name from a hint
  // The value of a name known when the graph is planned (an initializer that is no graph
  // input, a Constant node's output, in this graph or an enclosing one), or nullopt.
  std::function<std::optional<onnx::TensorProto>(const std::string&)> constant;
  int opset = 1;      // of ai.onnx, for the form of Unsqueeze
  std::string where;  // the graph and Gradient node, for errors
  // The dims of a value known when the graph is planned (-1 for each unknown dim), or nullopt
  // (unroll_scan reads the length of the scan axis from them).
  std::function<std::optional<std::vector<int64_t>>(const std::string&)> static_dims;
};

// The nodes that compute the outputs of `loop` (described as `label` in errors) without a
// Loop: M copies of its body with fresh names, the loop-carried values chained from one copy
// to the next, the iteration number and the condition as Constant nodes, each scan output
// stacked from the copies by Unsqueeze and Concat along a new first axis (a Constant of shape
// [0] for zero iterations, as the Loop kernel gives), the final loop-carried values by
// Identity. Requires M to be a constant and the loop to end by M alone: the outer condition
// omitted or constant, the body's condition output constant or its condition input passed
// through. Throws Error naming the node and the reason otherwise.
std::vector<onnx::NodeProto> unroll_loop(const onnx::NodeProto& loop, const std::string& label, const LoopScope& scope);

// The nodes that compute the outputs of a Scan (version 9 and later; ONNX operator doc "Scan")
// without a Scan: one copy of its body per position along the scan axis, which must be known
// when the graph is planned (a static dim of the first scan input); each copy reads the slice
// of every scan input at its position (Gather along the input's axis, from the back for
// direction 1) and the states the copy before it made; each scan output is the copies' slices
// stacked along its axis (Unsqueeze and Concat; in reverse for direction 1), the final states
// by Identity. Throws Error naming the node and the reason for a Scan-8 (batched), an unknown
// or zero scan length.
std::vector<onnx::NodeProto> unroll_scan(const onnx::NodeProto& scan, const std::string& label, const LoopScope& scope);

}  // namespace onnxtrain::autodiff
