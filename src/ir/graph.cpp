#include "ir/graph.h"

#include <onnx/onnx_pb.h>

#include <queue>
#include <utility>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::ir {

namespace fs = std::filesystem;

std::string TensorType::to_string() const {
  std::string s(dtype == DataType::Undefined ? "?" : std::string(dtype_name(dtype)));
  if (!dims) return s + "[...]";
  s += "[";
  for (size_t i = 0; i < dims->size(); ++i) {
    if (i) s += ",";
    const Dim& d = (*dims)[i];
    s += d.known() ? std::to_string(d.value) : (d.param.empty() ? "?" : d.param);
  }
  return s + "]";
}

ValueType value_type_from_proto(const onnx::TypeProto& type, const std::string& what) {
  switch (type.value_case()) {
    case onnx::TypeProto::VALUE_NOT_SET: return {};
    case onnx::TypeProto::kTensorType: {
      const DataType dtype = static_cast<DataType>(type.tensor_type().elem_type());
      return ValueType::tensor(is_supported(dtype) ? dtype : DataType::Undefined);
    }
    case onnx::TypeProto::kSequenceType:
      return ValueType::sequence(value_type_from_proto(type.sequence_type().elem_type(), what));
    case onnx::TypeProto::kOptionalType:
      return ValueType::optional(value_type_from_proto(type.optional_type().elem_type(), what));
    case onnx::TypeProto::kMapType:
      throw Error(what + " has a map type; onnxtrain runs tensors, sequences and optionals, not maps");
    case onnx::TypeProto::kSparseTensorType:
      throw Error(what + " has a sparse tensor type; onnxtrain runs dense tensors only");
    default:
      throw Error(what + " has a type onnxtrain does not know (TypeProto case " +
                  std::to_string(static_cast<int>(type.value_case())) + ")");
  }
}

TensorType tensor_type_from_proto(const onnx::TypeProto& type) {
  TensorType result;
  if (!type.has_tensor_type()) return result;
  const auto& tensor = type.tensor_type();
  const DataType dtype = static_cast<DataType>(tensor.elem_type());
  if (is_supported(dtype)) result.dtype = dtype;
  if (tensor.has_shape()) {
    std::vector<Dim> dims;
    for (const auto& d : tensor.shape().dim()) {
      Dim dim;
      if (d.has_dim_value() && d.dim_value() >= 0) dim.value = d.dim_value();
      if (d.has_dim_param()) dim.param = d.dim_param();
      dims.push_back(dim);
    }
    result.dims = std::move(dims);
  }
  return result;
}

const Attribute* Node::find_attribute(std::string_view attr_name) const {
  for (const auto& a : attributes) {
    if (a.name == attr_name) return &a;
  }
  return nullptr;
}

std::string Node::description() const {
  std::string op = domain.empty() || domain == "ai.onnx" ? op_type : domain + "." + op_type;
  return "node '" + name + "' (" + op + ")";
}

namespace {

Attribute attribute_from_proto(const onnx::AttributeProto& proto, const fs::path& base_dir,
                               const std::string& what) {
  Attribute a;
  a.name = proto.name();
  const std::string where = what + " attribute '" + proto.name() + "'";
  using P = onnx::AttributeProto;
  auto type = proto.type();
  if (type == P::UNDEFINED) {  // very old models leave `type` unset: infer it from the fields
    if (proto.has_f()) type = P::FLOAT;
    else if (proto.has_i()) type = P::INT;
    else if (proto.has_s()) type = P::STRING;
    else if (proto.has_t()) type = P::TENSOR;
    else if (proto.has_g()) type = P::GRAPH;
    else if (proto.floats_size()) type = P::FLOATS;
    else if (proto.ints_size()) type = P::INTS;
    else if (proto.strings_size()) type = P::STRINGS;
    else if (proto.tensors_size()) type = P::TENSORS;
    else if (proto.graphs_size()) type = P::GRAPHS;
  }
  switch (type) {
    case P::FLOAT: a.type = AttributeType::Float; a.f = proto.f(); break;
    case P::INT: a.type = AttributeType::Int; a.i = proto.i(); break;
    case P::STRING: a.type = AttributeType::String; a.s = proto.s(); break;
    case P::TENSOR:
      a.type = AttributeType::Tensor;
      a.t = io::tensor_from_proto(proto.t(), base_dir, where);
      break;
    case P::GRAPH:
      a.type = AttributeType::Graph;
      a.g = std::make_shared<onnx::GraphProto>(proto.g());
      break;
    case P::FLOATS:
      a.type = AttributeType::Floats;
      a.floats.assign(proto.floats().begin(), proto.floats().end());
      break;
    case P::INTS:
      a.type = AttributeType::Ints;
      a.ints.assign(proto.ints().begin(), proto.ints().end());
      break;
    case P::STRINGS:
      a.type = AttributeType::Strings;
      a.strings.assign(proto.strings().begin(), proto.strings().end());
      break;
    case P::TENSORS:
      a.type = AttributeType::Tensors;
      for (const auto& t : proto.tensors()) a.tensors.push_back(io::tensor_from_proto(t, base_dir, where));
      break;
    case P::GRAPHS:
      a.type = AttributeType::Graphs;
      for (const auto& g : proto.graphs()) a.graphs.push_back(std::make_shared<onnx::GraphProto>(g));
      break;
    case P::TYPE_PROTO:
      a.type = AttributeType::TypeProto;
      a.value_type = value_type_from_proto(proto.tp(), where);
      break;
    default: a.type = AttributeType::Other; break;  // sparse tensors, lists of type protos
  }
  return a;
}

}  // namespace

void collect_free_names(const onnx::GraphProto& g, std::unordered_set<std::string>& free) {
  std::unordered_set<std::string> defined;
  for (const auto& v : g.input()) defined.insert(v.name());
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) defined.insert(o);
  }
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.contains(name)) free.insert(name);
  };
  for (const auto& n : g.node()) {
    for (const auto& i : n.input()) use(i);
    for (const auto& a : n.attribute()) {
      std::unordered_set<std::string> inner;
      if (a.has_g()) collect_free_names(a.g(), inner);
      for (const auto& sub : a.graphs()) collect_free_names(sub, inner);
      for (const auto& name : inner) use(name);
    }
  }
  for (const auto& o : g.output()) use(o.name());
}

ValueId Graph::intern(const std::string& value_name) {
  auto [it, inserted] = by_name_.try_emplace(value_name, static_cast<ValueId>(values_.size()));
  if (inserted) {
    Value v;
    v.name = value_name;
    values_.push_back(std::move(v));
  }
  return it->second;
}

ValueId Graph::find(std::string_view value_name) const {
  auto it = by_name_.find(std::string(value_name));
  return it == by_name_.end() ? kNoValue : it->second;
}

std::string Graph::description() const {
  std::string g = "graph '" + name_ + "'";
  return source_.empty() ? g : source_ + ", " + g;
}

Graph Graph::from_proto(const onnx::GraphProto& proto, const std::string& source,
                        const fs::path& base_dir, const std::unordered_set<std::string>& outer_scope) {
  Graph g;
  g.name_ = proto.name();
  g.source_ = source;
  g.base_dir_ = base_dir;
  const std::string where = g.description();

  for (const auto& input : proto.input()) {
    if (input.name().empty()) throw Error(where + ": a graph input has an empty name");
    if (g.find(input.name()) != kNoValue) {
      throw Error(where + ": graph input '" + input.name() + "' is declared twice");
    }
    const ValueId id = g.intern(input.name());
    g.values_[id].is_graph_input = true;
    g.values_[id].type = tensor_type_from_proto(input.type());
    g.values_[id].value_type = value_type_from_proto(input.type(), where + ": graph input '" + input.name() + "'");
    g.inputs_.push_back(id);
  }
  if (proto.sparse_initializer_size() > 0) {
    throw Error(where + ": sparse initializers are not supported");
  }
  for (const auto& init : proto.initializer()) {
    if (init.name().empty()) throw Error(where + ": an initializer has an empty name");
    const ValueId id = g.intern(init.name());
    Value& v = g.values_[id];
    if (v.is_initializer) throw Error(where + ": initializer '" + init.name() + "' is declared twice");
    v.is_initializer = true;
    Tensor t = io::tensor_from_proto(init, base_dir, where + ": initializer");
    if (v.type.dtype == DataType::Undefined) {
      v.type.dtype = t.dtype();
      v.value_type = ValueType::tensor(t.dtype());
      std::vector<Dim> dims;
      for (int64_t d : t.shape()) {
        Dim dim;
        dim.value = d;
        dims.push_back(dim);
      }
      v.type.dims = std::move(dims);
    }
    g.initializers_.emplace(id, std::move(t));
  }

  g.nodes_.reserve(static_cast<size_t>(proto.node_size()));
  for (int n = 0; n < proto.node_size(); ++n) {
    const auto& np = proto.node(n);
    Node node;
    node.name = np.name().empty() ? "#" + std::to_string(n) : np.name();
    node.op_type = np.op_type();
    node.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    const std::string what = where + ", " + node.description();
    if (node.op_type.empty()) throw Error(what + ": op_type is empty");
    for (const auto& in : np.input()) node.inputs.push_back(in.empty() ? kNoValue : g.intern(in));
    for (const auto& out : np.output()) {
      if (out.empty()) {
        node.outputs.push_back(kNoValue);
        continue;
      }
      const ValueId id = g.intern(out);
      Value& v = g.values_[id];
      if (v.producer == n) throw Error(what + ": lists the output '" + out + "' twice");
      if (v.producer >= 0) {
        throw Error(what + ": output '" + out + "' is already produced by " +
                    g.nodes_[static_cast<size_t>(v.producer)].description() +
                    " (a graph must assign each name once)");
      }
      if (v.is_graph_input || v.is_initializer) {
        throw Error(what + ": output '" + out + "' has the name of a graph input or initializer");
      }
      v.producer = n;
      node.outputs.push_back(id);
    }
    std::unordered_set<std::string> free;
    for (const auto& attr : np.attribute()) {
      node.attributes.push_back(attribute_from_proto(attr, base_dir, what));
      if (attr.has_g()) collect_free_names(attr.g(), free);
      for (const auto& sub : attr.graphs()) collect_free_names(sub, free);
    }
    for (const auto& name : free) node.implicit_inputs.push_back(g.intern(name));
    g.nodes_.push_back(std::move(node));
  }

  for (const auto& output : proto.output()) {
    if (output.name().empty()) throw Error(where + ": a graph output has an empty name");
    const ValueId id = g.intern(output.name());
    g.values_[id].type = tensor_type_from_proto(output.type());
    g.values_[id].value_type = value_type_from_proto(output.type(), where + ": graph output '" + output.name() + "'");
    g.outputs_.push_back(id);
  }
  for (const auto& info : proto.value_info()) {
    const ValueId id = g.find(info.name());
    if (id != kNoValue && g.values_[id].type.dtype == DataType::Undefined &&
        g.values_[id].value_type == ValueType()) {
      g.values_[id].type = tensor_type_from_proto(info.type());
      g.values_[id].value_type = value_type_from_proto(info.type(), where + ": value_info '" + info.name() + "'");
    }
  }

  // Every name used must be defined somewhere.
  for (Value& v : g.values_) {
    if (v.producer >= 0 || v.is_graph_input || v.is_initializer) continue;
    if (outer_scope.contains(v.name)) {
      v.is_outer_scope = true;
      continue;
    }
    std::string user = "a graph output";
    const ValueId id = g.find(v.name);
    for (const Node& node : g.nodes_) {
      const bool reads = std::find(node.inputs.begin(), node.inputs.end(), id) != node.inputs.end() ||
                         std::find(node.implicit_inputs.begin(), node.implicit_inputs.end(), id) !=
                             node.implicit_inputs.end();
      if (reads) {
        user = node.description();
        break;
      }
    }
    throw Error(where + ": tensor '" + v.name + "' read by " + user +
                " is not defined (it is no graph input, initializer or node output)");
  }
  g.sort_topologically();
  return g;
}

void Graph::sort_topologically() {
  const size_t n = nodes_.size();
  std::vector<int> pending(n, 0);
  std::vector<std::vector<NodeId>> users(n);
  for (size_t i = 0; i < n; ++i) {
    auto count = [&](ValueId id) {
      if (id == kNoValue) return;
      const NodeId p = values_[static_cast<size_t>(id)].producer;
      if (p < 0) return;
      ++pending[i];
      users[static_cast<size_t>(p)].push_back(static_cast<NodeId>(i));
    };
    for (ValueId id : nodes_[i].inputs) count(id);
    for (ValueId id : nodes_[i].implicit_inputs) count(id);
  }
  // Ready nodes run in proto order, Shape and Size nodes first (see topological_order).
  using Ready = std::pair<bool, NodeId>;  // (not Shape or Size, id)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
  auto push = [&](NodeId id) {
    const Node& node = nodes_[static_cast<size_t>(id)];
    const bool shape = node.domain.empty() && (node.op_type == "Shape" || node.op_type == "Size");
    ready.push({!shape, id});
  };
  for (size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) push(static_cast<NodeId>(i));
  }
  order_.clear();
  order_.reserve(n);
  while (!ready.empty()) {
    const NodeId id = ready.top().second;
    ready.pop();
    order_.push_back(id);
    for (NodeId user : users[static_cast<size_t>(id)]) {
      if (--pending[static_cast<size_t>(user)] == 0) push(user);
    }
  }
  if (order_.size() != n) {
    for (size_t i = 0; i < n; ++i) {
      if (pending[i] > 0) {
        throw Error(description() + ": the graph has a cycle through " + nodes_[i].description());
      }
    }
  }
}

}  // namespace onnxtrain::ir
