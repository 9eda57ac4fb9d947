#include "distributed/sync_batch_norm.h"

#include <onnx/defs/schema.h>

#include <map>
#include <set>

#include "onnxtrain/error.h"
#include "ops/batch_norm_mode.h"
#include "runtime/fusion.h"

namespace onnxtrain::distributed {

namespace {

const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

int64_t int_attribute(const onnx::NodeProto& node, const std::string& name, int64_t fallback) {
  const onnx::AttributeProto* a = find_attribute(node, name);
  return a ? a->i() : fallback;
}

bool training_mode(const onnx::NodeProto& node, int opset) {
  bool extra_outputs = false;
  for (int i = 1; i < node.output_size(); ++i) extra_outputs = extra_outputs || !node.output(i).empty();
  return ops::batch_norm_training(opset, int_attribute(node, "is_test", 0), extra_outputs,
                                  int_attribute(node, "training_mode", 0));
}

}  // namespace

int use_sync_batch_norm(onnx::GraphProto& graph, const std::unordered_map<std::string, int>& opsets,
                        const std::string& label) {
  const auto onnx_opset = opsets.find("");
  const int opset = onnx_opset == opsets.end() ? 0 : onnx_opset->second;
  std::set<std::string> names, declared;
  for (const auto& v : graph.input()) names.insert(v.name());
  for (const auto& t : graph.initializer()) names.insert(t.name());
  for (const auto& n : graph.node()) names.insert(n.output().begin(), n.output().end());
  for (const auto* list : {&graph.output(), &graph.value_info()}) {
    for (const auto& v : *list) declared.insert(v.name());
  }
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int k = 1; names.contains(name); ++k) name = base + "_" + std::to_string(k);
    names.insert(name);
    return name;
  };
  std::map<std::string, onnx::TypeProto> types;
  int replaced = 0;
  for (auto& node : *graph.mutable_node()) {
    if (node.op_type() != "BatchNormalization" || !(node.domain().empty() || node.domain() == "ai.onnx") ||
        !training_mode(node, opset)) {
      continue;
    }
    const std::string what = label + ": BatchNormalization node '" + node.name() + "' (output '" + node.output(0) + "')";
    if (int_attribute(node, "spatial", 1) == 0) {
      throw Error(what + ": --sync-batch-norm: spatial = 0 (per-activation statistics) is not supported");
    }
    if (node.input_size() != 5) throw Error(what + ": expected 5 inputs, found " + std::to_string(node.input_size()));
    if (replaced == 0) types = runtime::inferred_types(graph, opsets);
    onnx::NodeProto sync;
    sync.set_name(node.name());
    sync.set_op_type("SyncBatchNormalization");
    sync.set_domain("ai.onnxtrain");
    *sync.mutable_input() = node.input();
    for (const char* a : {"epsilon", "momentum"}) {
      if (const onnx::AttributeProto* attr = find_attribute(node, a)) *sync.add_attribute() = *attr;
    }
    const int kept = opset >= 14 ? 3 : 5;  // opset 14+ has no saved statistics outputs
    for (int k = 0; k < 5; ++k) {
      const bool have = k < kept && k < node.output_size() && !node.output(k).empty();
      sync.add_output(have ? node.output(k) : k < 3 ? "" : fresh(node.output(0) + (k == 3 ? ".current_mean" : ".current_var")));
    }
    // Y typed like X, the statistics like input_mean.
    for (int k = 0; k < 5; ++k) {
      const auto type = types.find(node.input(k == 0 ? 0 : 3));
      if (sync.output(k).empty() || declared.contains(sync.output(k)) || type == types.end()) continue;
      auto* info = graph.add_value_info();
      info->set_name(sync.output(k));
      *info->mutable_type() = type->second;
      declared.insert(sync.output(k));
    }
    node = std::move(sync);
    ++replaced;
  }
  return replaced;
}

}  // namespace onnxtrain::distributed
