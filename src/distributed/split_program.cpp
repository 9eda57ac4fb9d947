#include "distributed/split_program.h"

#include <map>

#include "autodiff/gradient.h"

namespace onnxtrain::distributed {

void add_reads(const onnx::NodeProto& node, std::set<std::string>& reads) {
  for (const auto& in : node.input()) {
    if (!in.empty()) reads.insert(in);
  }
  auto add_graph = [&](const onnx::GraphProto& g) {
    for (const auto& n : g.node()) add_reads(n, reads);
    for (const auto& out : g.output()) reads.insert(out.name());
  };
  for (const auto& attr : node.attribute()) {
    if (attr.has_g()) add_graph(attr.g());
    for (const auto& g : attr.graphs()) add_graph(g);
  }
}

namespace {

// What a graph knows of a value's type: its graph input, output or value_info entry, else
// the bare name.
onnx::ValueInfoProto info_of(const std::map<std::string, const onnx::ValueInfoProto*>& infos, const std::string& name) {
  const auto it = infos.find(name);
  if (it != infos.end()) return *it->second;
  onnx::ValueInfoProto info;
  info.set_name(name);
  return info;
}

// A graph of `nodes` with the inputs and initializers of `graph` that they read.
onnx::GraphProto part_of(const onnx::GraphProto& graph, const std::vector<const onnx::NodeProto*>& nodes,
                         const std::set<std::string>& reads, const std::string& suffix) {
  onnx::GraphProto part;
  part.set_name(graph.name() + suffix);
  for (const auto* n : nodes) *part.add_node() = *n;
  for (const auto& in : graph.input()) {
    if (reads.contains(in.name())) *part.add_input() = in;
  }
  for (const auto& t : graph.initializer()) {
    if (reads.contains(t.name())) *part.add_initializer() = t;
  }
  for (const auto& t : graph.sparse_initializer()) {
    if (reads.contains(t.values().name())) *part.add_sparse_initializer() = t;
  }
  *part.mutable_value_info() = graph.value_info();
  return part;
}

}  // namespace

std::map<std::string, std::string> gradient_parameters(const onnx::GraphProto& graph) {
  std::map<std::string, std::string> parameters;
  for (const auto& node : graph.node()) {
    if (node.op_type() != "Gradient" || node.domain() != autodiff::kTrainingDomain) continue;
    for (const auto& attr : node.attribute()) {
      if (attr.name() != "xs") continue;
      for (int i = 0; i < node.output_size() && i < attr.strings_size(); ++i) {
        if (!node.output(i).empty()) parameters[node.output(i)] = attr.strings(i);
      }
    }
  }
  return parameters;
}

SplitProgram split_at_gradients(const onnx::GraphProto& graph, const std::set<std::string>& gradients,
                                const std::set<std::string>& bound) {
  // A node is local when a Gradient output depends on one of its outputs: walk the nodes
  // backwards from the gradients.
  const int n = graph.node_size();
  std::vector<bool> local(n, false);
  std::set<std::string> needed = gradients;
  for (int i = n - 1; i >= 0; --i) {
    const auto& node = graph.node(i);
    for (const auto& out : node.output()) {
      if (!out.empty() && needed.contains(out)) local[i] = true;
    }
    if (local[i]) add_reads(node, needed);
  }
  std::vector<const onnx::NodeProto*> local_nodes, update_nodes;
  std::set<std::string> local_reads, update_reads;
  for (int i = 0; i < n; ++i) {
    (local[i] ? local_nodes : update_nodes).push_back(&graph.node(i));
    add_reads(graph.node(i), local[i] ? local_reads : update_reads);
  }
  std::map<std::string, const onnx::ValueInfoProto*> infos;
  for (const auto& v : graph.value_info()) infos[v.name()] = &v;
  for (const auto& v : graph.input()) infos[v.name()] = &v;
  std::set<std::string> outputs, scalars;
  for (const auto& v : graph.output()) {
    infos[v.name()] = &v;
    outputs.insert(v.name());
    const auto& type = v.type();
    if (type.has_tensor_type() && type.tensor_type().has_shape() && type.tensor_type().shape().dim_size() == 0) {
      scalars.insert(v.name());
    }
  }

  SplitProgram split;
  for (const auto* node : local_nodes) {
    for (const auto& out : node->output()) {
      if (!out.empty() && (gradients.contains(out) || update_reads.contains(out) || outputs.contains(out))) {
        split.cut.push_back(out);
        if (gradients.contains(out) || update_reads.contains(out) || bound.contains(out) || scalars.contains(out)) {
          split.reduced.insert(out);
        }
      }
    }
  }
  const std::set<std::string> cut(split.cut.begin(), split.cut.end());
  // The update part also passes through the graph outputs that no node writes.
  std::set<std::string> update_names = update_reads;
  for (const auto& name : outputs) {
    if (!cut.contains(name)) update_names.insert(name);
  }
  split.local = part_of(graph, local_nodes, local_reads, " (forward and backward)");
  split.update = part_of(graph, update_nodes, update_names, " (update)");
  for (const auto& name : split.cut) {
    *split.local.add_output() = info_of(infos, name);
    if (update_reads.contains(name)) *split.update.add_input() = info_of(infos, name);
  }
  for (const auto& v : graph.output()) {
    if (!cut.contains(v.name())) *split.update.add_output() = v;
  }
  return split;
}

}  // namespace onnxtrain::distributed
