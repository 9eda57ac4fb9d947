#include "distributed/shard_optimizer.h"

#include <algorithm>
#include <optional>

#include "autodiff/gradient.h"
#include "distributed/split_program.h"
#include "onnxtrain/error.h"

namespace onnxtrain::distributed {

namespace {

// A multi-tensor optimizer of ai.onnx.preview.training: after R and T, `inputs` groups of n
// tensors each (X, G, then the state: V and H for Adam, V for Momentum, H for Adagrad) and
// `outputs` groups of n (X_new and the new state). The ONNX spec computes each tensor's
// update from its own group members only.
struct Layout {
  int inputs = 0, outputs = 0;
};

std::optional<Layout> layout_of(const onnx::NodeProto& node) {
  if (node.domain() != autodiff::kTrainingDomain) return std::nullopt;
  if (node.op_type() == "Adam") return Layout{4, 3};
  if (node.op_type() == "Momentum" || node.op_type() == "Adagrad") return Layout{3, 2};
  return std::nullopt;
}

// The number of tensors a multi-tensor optimizer node updates, or 0 when its inputs and
// outputs do not follow the layout (such a node is kept whole).
int tensors_of(const onnx::NodeProto& node, const Layout& layout) {
  const int n = (node.input_size() - 2) / layout.inputs;
  if (n < 1 || node.input_size() != 2 + layout.inputs * n || node.output_size() != layout.outputs * n) return 0;
  return n;
}

// `node` (of n tensors) restricted to the tensors `kept`, in their order.
onnx::NodeProto restricted(const onnx::NodeProto& node, const Layout& layout, int n, const std::vector<int>& kept) {
  onnx::NodeProto part = node;
  part.clear_input();
  part.clear_output();
  part.add_input(node.input(0));
  part.add_input(node.input(1));
  for (int group = 0; group < layout.inputs; ++group) {
    for (int i : kept) part.add_input(node.input(2 + group * n + i));
  }
  for (int group = 0; group < layout.outputs; ++group) {
    for (int i : kept) part.add_output(node.output(group * n + i));
  }
  return part;
}

// A node of the rewritten graph: a whole node, or the part of optimizer node `origin` for
// tensor `tensor`.
struct Item {
  onnx::NodeProto node;
  int origin = -1, tensor = -1;
};

struct Origin {
  const onnx::NodeProto* node;
  Layout layout;
  int n;
};

// The nodes of `graph` with each multi-tensor optimizer node split into one node per tensor.
std::vector<Item> split_optimizers(const onnx::GraphProto& graph, std::vector<Origin>& origins) {
  std::vector<Item> items;
  for (const auto& node : graph.node()) {
    const std::optional<Layout> layout = layout_of(node);
    const int n = layout ? tensors_of(node, *layout) : 0;
    if (n == 0) {
      items.push_back({node});
      continue;
    }
    origins.push_back({&node, *layout, n});
    for (int i = 0; i < n; ++i) {
      items.push_back({restricted(node, *layout, n, {i}), static_cast<int>(origins.size()) - 1, i});
    }
  }
  return items;
}

// The parameter each value belongs to: a parameter and its gradient belong to it; a node's
// outputs belong to the one parameter its inputs belong to (none when they belong to none or
// to several: such values, like a learning rate or a global gradient norm, every rank computes).
std::map<std::string, std::string> parameter_of_values(const std::vector<Item>& items,
                                                       const std::vector<std::string>& parameters,
                                                       const std::map<std::string, std::string>& gradients) {
  std::map<std::string, std::string> tag;
  for (const auto& p : parameters) tag[p] = p;
  for (const auto& [gradient, p] : gradients) {
    if (tag.contains(p)) tag[gradient] = p;
  }
  for (const Item& item : items) {
    std::set<std::string> reads, found;
    add_reads(item.node, reads);
    for (const auto& r : reads) {
      const auto it = tag.find(r);
      if (it != tag.end()) found.insert(it->second);
    }
    if (found.size() != 1) continue;
    for (const auto& out : item.node.output()) {
      if (!out.empty()) tag[out] = *found.begin();
    }
  }
  return tag;
}

// Keeps the items an output in `needed` depends on (walking backwards).
std::vector<bool> needed_items(const std::vector<Item>& items, std::set<std::string> needed) {
  std::vector<bool> keep(items.size(), false);
  for (size_t i = items.size(); i-- > 0;) {
    for (const auto& out : items[i].node.output()) {
      if (!out.empty() && needed.contains(out)) keep[i] = true;
    }
    if (keep[i]) add_reads(items[i].node, needed);
  }
  return keep;
}

}  // namespace

std::map<std::string, int> partition_parameters(const std::map<std::string, size_t>& bytes, int ranks) {
  std::vector<std::pair<std::string, size_t>> order(bytes.begin(), bytes.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<size_t> load(static_cast<size_t>(ranks), 0);
  std::map<std::string, int> owner;
  for (const auto& [name, size] : order) {
    const auto least = std::min_element(load.begin(), load.end());
    *least += size;
    owner[name] = static_cast<int>(least - load.begin());
  }
  return owner;
}

OptimizerShards shard_update(onnx::GraphProto& update, const std::map<std::string, std::string>& bindings,
                             const std::map<std::string, std::string>& gradients,
                             const std::map<std::string, size_t>& bytes, int rank, int ranks, const std::string& label) {
  std::set<std::string> outputs, parameter_set;
  for (const auto& out : update.output()) outputs.insert(out.name());
  for (const auto& [gradient, p] : gradients) parameter_set.insert(p);
  OptimizerShards shards;
  shards.rank = rank;
  std::map<std::string, size_t> parameter_bytes;
  for (const auto& [key, value] : bindings) {
    if (outputs.contains(value) && parameter_set.contains(key)) {
      shards.parameters.push_back(key);
      parameter_bytes[key] = bytes.contains(key) ? bytes.at(key) : 0;
    }
  }
  shards.owner = partition_parameters(parameter_bytes, ranks);

  std::vector<Origin> origins;
  std::vector<Item> items = split_optimizers(update, origins);
  const std::map<std::string, std::string> tag = parameter_of_values(items, shards.parameters, gradients);
  std::set<std::string> needed = outputs;
  for (const auto& [key, value] : bindings) {
    if (!outputs.contains(value)) continue;
    const auto it = tag.find(value);
    if (!shards.owner.contains(key) && it != tag.end()) shards.owner[key] = shards.owner.at(it->second);
    const auto owner = shards.owner.find(key);
    if (owner == shards.owner.end() || owner->second == rank) continue;
    needed.erase(value);
    if (!parameter_set.contains(key)) shards.dropped.insert(key);
  }
  const std::vector<bool> keep = needed_items(items, needed);

  // The kept parts of each optimizer node become one node again, where its first part is.
  std::vector<std::vector<int>> kept_tensors(origins.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (keep[i] && items[i].origin >= 0) kept_tensors[static_cast<size_t>(items[i].origin)].push_back(items[i].tensor);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  std::set<std::string> reads;
  std::vector<bool> placed(origins.size(), false);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!keep[i]) continue;
    const int o = items[i].origin;
    if (o >= 0 && placed[static_cast<size_t>(o)]) continue;
    onnx::NodeProto node = items[i].node;
    if (o >= 0) {
      const Origin& origin = origins[static_cast<size_t>(o)];
      node = restricted(*origin.node, origin.layout, origin.n, kept_tensors[static_cast<size_t>(o)]);
      placed[static_cast<size_t>(o)] = true;
    }
    std::set<std::string> node_reads;
    add_reads(node, node_reads);
    for (const auto& name : node_reads) {
      if (!shards.dropped.contains(name)) continue;
      throw Error(label + ": --shard-optimizer-state: node '" + node.name() + "' (" + node.op_type() + ") reads '" + name +
                  "', optimizer state of a parameter rank " + std::to_string(shards.owner.at(name)) +
                  " owns; an update that reads the state of several parameters cannot be sharded by whole tensor");
    }
    reads.insert(node_reads.begin(), node_reads.end());
    *nodes.Add() = std::move(node);
  }
  update.mutable_node()->Swap(&nodes);

  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept_outputs, kept_inputs;
  for (auto& out : *update.mutable_output()) {
    if (needed.contains(out.name())) {
      reads.insert(out.name());
      kept_outputs.Add()->Swap(&out);
    }
  }
  for (auto& in : *update.mutable_input()) {
    if (reads.contains(in.name())) kept_inputs.Add()->Swap(&in);
  }
  update.mutable_output()->Swap(&kept_outputs);
  update.mutable_input()->Swap(&kept_inputs);
  return shards;
}

void drop_outputs(onnx::GraphProto& graph, const std::set<std::string>& outputs) {
  std::set<std::string> needed;
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept_outputs;
  for (auto& out : *graph.mutable_output()) {
    if (outputs.contains(out.name())) continue;
    needed.insert(out.name());
    kept_outputs.Add()->Swap(&out);
  }
  graph.mutable_output()->Swap(&kept_outputs);
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept_nodes;
  for (int i = graph.node_size(); i-- > 0;) {
    bool keep = false;
    for (const auto& out : graph.node(i).output()) keep = keep || (!out.empty() && needed.contains(out));
    if (keep) add_reads(graph.node(i), needed);
  }
  for (auto& node : *graph.mutable_node()) {
    bool keep = false;
    for (const auto& out : node.output()) keep = keep || (!out.empty() && needed.contains(out));
    if (keep) kept_nodes.Add()->Swap(&node);
  }
  graph.mutable_node()->Swap(&kept_nodes);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept_initializers;
  for (auto& t : *graph.mutable_initializer()) {
    if (needed.contains(t.name())) kept_initializers.Add()->Swap(&t);
  }
  graph.mutable_initializer()->Swap(&kept_initializers);
}

}  // namespace onnxtrain::distributed
