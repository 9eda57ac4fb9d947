// ir::Graph — the in-memory form of an ONNX GraphProto that planning and autodiff work on.
//
// Values (tensors) and nodes live in vectors and refer to each other by index. Names are the
// ONNX names; every value is produced once (SSA). Graph::from_proto checks what the ONNX IR
// requires of a graph's structure (IR.md "Graphs"): names unique, every node input defined by a
// graph input, an initializer, an earlier-or-later node output or (in subgraphs) the outer
// scope; no cycles. Subgraph attributes (If/Loop/Scan bodies) are kept as GraphProtos; the
// values they read from the enclosing graph are recorded as the node's implicit inputs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnx {
class GraphProto;
class TypeProto;
}  // namespace onnx

namespace onnxtrain::ir {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr ValueId kNoValue = -1;  // an omitted optional input or output ("" in ONNX)

// The static type of a value, as declared by graph inputs/outputs/value_info (may be partial).
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string param;   // symbolic name ("N", "batch") when declared
  bool known() const { return value >= 0; }
};
struct TensorType {
  DataType dtype = DataType::Undefined;  // Undefined when not declared or not a tensor
  std::optional<std::vector<Dim>> dims;  // nullopt when the rank is unknown
  std::string to_string() const;         // "float32[N,3,224,224]"
};

enum class AttributeType { Undefined, Float, Int, String, Tensor, Graph, Floats, Ints, Strings,
                           Tensors, Graphs, TypeProto, Other };

struct Attribute {
  std::string name;
  AttributeType type = AttributeType::Undefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<const onnx::GraphProto> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<const onnx::GraphProto>> graphs;
  ValueType value_type;  // a TYPE_PROTO attribute (Optional's `type`)
};

struct Value {
  std::string name;
  TensorType type;  // a tensor's declared element type and dims (dtype Undefined otherwise)
  // The declared kind of value: tensor(dtype), sequence(...) or optional(...); tensor with an
  // Undefined dtype where the model does not say.
  ValueType value_type;
  NodeId producer = -1;  // -1: graph input, initializer or outer-scope value
  bool is_graph_input = false;
  bool is_initializer = false;
  bool is_outer_scope = false;  // defined by an enclosing graph (subgraphs only)
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" for ai.onnx
  std::vector<ValueId> inputs;   // kNoValue for omitted optional inputs
  std::vector<ValueId> outputs;  // kNoValue for omitted optional outputs
  std::vector<Attribute> attributes;
  std::vector<ValueId> implicit_inputs;  // enclosing-graph values read by subgraph attributes

  const Attribute* find_attribute(std::string_view attr_name) const;
  // "node 'conv1' (Conv)"; nodes without a name are described by their first output.
  std::string description() const;
};

class Graph {
 public:
  // Builds and validates a graph. `source` names the file or graph in errors (e.g. the model
  // path). Initializers with external data are read relative to `base_dir`. `outer_scope`
  // lists names visible from an enclosing graph (for subgraphs; empty for a main graph).
  // Throws Error for: duplicate value names, a node input that is not defined, an
  // initializer that cannot be read, a cycle.
  static Graph from_proto(const onnx::GraphProto& proto, const std::string& source,
                          const std::filesystem::path& base_dir,
                          const std::unordered_set<std::string>& outer_scope = {});

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }
  // Where initializers stored as external data are read from.
  const std::filesystem::path& base_dir() const { return base_dir_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Value& value(ValueId id) const { return values_[static_cast<size_t>(id)]; }
  const Node& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  // Initializer values, by value id (graph inputs that have an initializer are included:
  // for IR < 4 models the initializer is the input's default).
  const std::unordered_map<ValueId, Tensor>& initializers() const { return initializers_; }
  // kNoValue when absent.
  ValueId find(std::string_view value_name) const;
  // Node ids in an order where every node comes after the producers of its inputs, stable
  // with respect to the order in the proto, except that a Shape or Size node runs as soon as its
  // input exists: a backward pass reads the shapes of many forward values (an Add's gradient
  // sums to the shape of each input), and a Shape node left in the backward part of the graph
  // keeps the whole forward tensor alive until then, where its few int64 values are all that is
  // needed (BERT encoder training: 260 MiB of the 656 MiB the memory plan held at its peak).
  const std::vector<NodeId>& topological_order() const { return order_; }
  std::string description() const;  // "graph 'main' of model.onnx"

 private:
  ValueId intern(const std::string& value_name);
  void sort_topologically();

  std::string name_;
  std::string source_;
  std::filesystem::path base_dir_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::unordered_map<ValueId, Tensor> initializers_;
  std::unordered_map<std::string, ValueId> by_name_;
  std::vector<NodeId> order_;
};

// Adds to `free` the names `graph` reads but does not define (recursively through its own
// subgraphs): the values a subgraph takes from its enclosing scopes.
void collect_free_names(const onnx::GraphProto& graph, std::unordered_set<std::string>& free);

// Reads a TypeProto (tensor types only; other types give an Undefined dtype).
TensorType tensor_type_from_proto(const onnx::TypeProto& type);
// Reads a TypeProto as a ValueType (tensor, sequence, optional). Throws Error naming `what`
// for map and sparse tensor types, which onnxtrain does not run; an absent type is a tensor
// of Undefined element type.
ValueType value_type_from_proto(const onnx::TypeProto& type, const std::string& what);

}  // namespace onnxtrain::ir
