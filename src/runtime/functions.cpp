#include "runtime/functions.h"

#include <onnx/defs/schema.h>
#include <onnx/inliner/inliner.h>
#include <onnx/onnx_pb.h>

#include <map>

#include "onnxtrain/error.h"
#include "ops/registry.h"

namespace onnxtrain::runtime {

namespace {

std::string domain_key(const std::string& domain) { return domain == "ai.onnx" ? "" : domain; }

std::map<std::string, int> opsets_of(const onnx::ModelProto& model) {
  std::map<std::string, int> opsets;
  for (const auto& o : model.opset_import()) opsets[domain_key(o.domain())] = static_cast<int>(o.version());
  return opsets;
}

// Ops of ONNX's schemas that are defined as functions and that onnxtrain has no kernel for at
// the model's opset.
class ExpandableOps final : public onnx::inliner::FunctionIdSet {
 public:
  explicit ExpandableOps(std::map<std::string, int> opsets) : opsets_(std::move(opsets)) {}

  bool Contains(const std::string& domain, const std::string& name) const override {
    const auto it = opsets_.find(domain_key(domain));
    if (it == opsets_.end()) return false;
    const std::string d = domain_key(domain);
    if (ops::find_kernel(d, name, it->second)) return false;
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(name, it->second, d);
    return schema && (schema->HasFunction() || schema->HasContextDependentFunction());
  }

 private:
  std::map<std::string, int> opsets_;
};

// Whether `graph` calls a local function or an expandable op (in its own nodes only, or also
// in its subgraphs).
bool calls_any(const onnx::GraphProto& graph, const onnx::ModelProto& model, const ExpandableOps& expandable,
               bool in_subgraphs = true) {
  for (const auto& node : graph.node()) {
    for (const auto& f : model.functions()) {
      if (f.domain() == node.domain() && f.name() == node.op_type()) return true;
    }
    if (expandable.Contains(node.domain(), node.op_type())) return true;
    if (!in_subgraphs) continue;
    for (const auto& a : node.attribute()) {
      if (a.has_g() && calls_any(a.g(), model, expandable)) return true;
      for (const auto& g : a.graphs()) {
        if (calls_any(g, model, expandable)) return true;
      }
    }
  }
  return false;
}

// Adds to every call of a local function the attributes it leaves out that the function
// declares with a default (FunctionProto.attribute_proto): ONNX's inliner substitutes only the
// attributes a call gives.
void add_default_attributes(onnx::GraphProto& graph, const onnx::ModelProto& model);

void add_defaults(google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, const onnx::ModelProto& model) {
  for (auto& node : nodes) {
    for (const auto& f : model.functions()) {
      if (f.domain() != node.domain() || f.name() != node.op_type() || f.overload() != node.overload()) continue;
      for (const auto& a : f.attribute_proto()) {
        bool given = false;
        for (const auto& b : node.attribute()) given |= b.name() == a.name();
        if (!given) *node.add_attribute() = a;
      }
    }
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g()) add_default_attributes(*a.mutable_g(), model);
      for (auto& g : *a.mutable_graphs()) add_default_attributes(g, model);
    }
  }
}

void add_default_attributes(onnx::GraphProto& graph, const onnx::ModelProto& model) {
  add_defaults(*graph.mutable_node(), model);
}

}  // namespace

bool has_functions_to_inline(const onnx::GraphProto& graph, const onnx::ModelProto& model) {
  return calls_any(graph, model, ExpandableOps(opsets_of(model)));
}

onnx::GraphProto inline_functions(const onnx::GraphProto& graph, const onnx::ModelProto& model,
                                  const std::string& source) {
  onnx::ModelProto holder;
  holder.set_ir_version(model.ir_version());
  *holder.mutable_opset_import() = model.opset_import();
  *holder.mutable_functions() = model.functions();
  *holder.mutable_graph() = graph;
  const ExpandableOps expandable(opsets_of(model));
  try {
    if (holder.functions_size() > 0) {
      add_default_attributes(*holder.mutable_graph(), holder);
      for (auto& f : *holder.mutable_functions()) add_defaults(*f.mutable_node(), holder);
    }
    onnx::inliner::InlineLocalFunctions(holder, /*convert_version=*/false);
    // A function body may itself use function ops without kernels: expand until none is left.
    // ONNX's inliner expands the call sites of the graph's own nodes; subgraphs follow below.
    for (int round = 0; calls_any(holder.graph(), holder, expandable, false); ++round) {
      if (round == 16) throw Error("function ops are still left after 16 rounds of inlining (a recursive definition?)");
      onnx::inliner::InlineSelectedFunctions(holder, expandable, nullptr);
    }
  } catch (const Error& e) {
    throw e.with_context(source);
  } catch (const std::exception& e) {
    throw Error(source + ": inlining its functions failed: " + e.what());
  }
  for (auto& node : *holder.mutable_graph()->mutable_node()) {
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g() && calls_any(a.g(), holder, expandable)) *a.mutable_g() = inline_functions(a.g(), model, source);
      for (auto& g : *a.mutable_graphs()) {
        if (calls_any(g, holder, expandable)) g = inline_functions(g, model, source);
      }
    }
  }
  return std::move(*holder.mutable_graph());
}

}  // namespace onnxtrain::runtime
