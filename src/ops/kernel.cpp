#include "ops/kernel.h"

namespace onnxtrain::ops {

void fail(const std::string& message) { throw Error(message); }

int64_t int_scalar(const KernelContext& ctx, int i, const std::string& role) {
  const Tensor& t = ctx.input(i);
  if ((t.dtype() != DataType::Int64 && t.dtype() != DataType::Int32) || t.rank() > 1 || t.numel() != 1) {
    throw Error("input " + ctx.input_name(i) + " (" + role + ") must be an int32 or int64 scalar, got " +
                t.description());
  }
  return t.to_int64_vector(role)[0];
}

namespace {
const char* type_name(ir::AttributeType t) {
  switch (t) {
    case ir::AttributeType::Float: return "float";
    case ir::AttributeType::Int: return "int";
    case ir::AttributeType::String: return "string";
    case ir::AttributeType::Tensor: return "tensor";
    case ir::AttributeType::Graph: return "graph";
    case ir::AttributeType::Floats: return "floats";
    case ir::AttributeType::Ints: return "ints";
    case ir::AttributeType::Strings: return "strings";
    case ir::AttributeType::Tensors: return "tensors";
    case ir::AttributeType::Graphs: return "graphs";
    case ir::AttributeType::TypeProto: return "type";
    default: return "unsupported";
  }
}
}  // namespace

const ir::TensorType& KernelInit::input_type(int i) const {
  static const ir::TensorType unknown;
  if (!has_input(i)) return unknown;
  return graph_.value(node_.inputs[static_cast<size_t>(i)]).type;
}

bool KernelInit::input_is_constant(int i) const {
  if (!has_input(i)) return false;
  const ir::Value& v = graph_.value(node_.inputs[static_cast<size_t>(i)]);
  if (v.is_initializer) return !v.is_graph_input;
  if (v.producer < 0) return false;
  const ir::Node& producer = graph_.node(v.producer);
  return producer.op_type == "Constant" && producer.domain.empty();
}

const ir::Attribute& KernelInit::typed(std::string_view name, ir::AttributeType type) const {
  const ir::Attribute* a = node_.find_attribute(name);
  if (!a) throw Error("required attribute '" + std::string(name) + "' is missing");
  if (a->type != type) {
    throw Error("attribute '" + std::string(name) + "' has type " + type_name(a->type) +
                ", expected " + type_name(type));
  }
  return *a;
}

int64_t KernelInit::attr_int(std::string_view name, int64_t fallback) const {
  return has_attr(name) ? typed(name, ir::AttributeType::Int).i : fallback;
}

int64_t KernelInit::required_int(std::string_view name) const {
  return typed(name, ir::AttributeType::Int).i;
}

float KernelInit::attr_float(std::string_view name, float fallback) const {
  return has_attr(name) ? typed(name, ir::AttributeType::Float).f : fallback;
}

std::string KernelInit::attr_string(std::string_view name, const std::string& fallback) const {
  return has_attr(name) ? typed(name, ir::AttributeType::String).s : fallback;
}

std::vector<int64_t> KernelInit::attr_ints(std::string_view name, std::vector<int64_t> fallback) const {
  return has_attr(name) ? typed(name, ir::AttributeType::Ints).ints : fallback;
}

std::optional<std::vector<int64_t>> KernelInit::optional_ints(std::string_view name) const {
  if (!has_attr(name)) return std::nullopt;
  return typed(name, ir::AttributeType::Ints).ints;
}

std::vector<float> KernelInit::attr_floats(std::string_view name, std::vector<float> fallback) const {
  return has_attr(name) ? typed(name, ir::AttributeType::Floats).floats : fallback;
}

const Tensor* KernelInit::attr_tensor(std::string_view name) const {
  return has_attr(name) ? &typed(name, ir::AttributeType::Tensor).t : nullptr;
}

const Value& KernelContext::input_value(int i) const {
  if (!has_input(i)) throw Error("input " + std::to_string(i) + " is required but missing");
  const Value& v = values_[static_cast<size_t>(node_.inputs[static_cast<size_t>(i)])];
  if (!v.defined()) throw Error("input " + input_name(i) + " has no value");
  return v;
}

const Tensor& KernelContext::input(int i) const {
  const Value& v = input_value(i);
  if (!v.is_tensor()) {
    throw Error("input " + input_name(i) + " is a " + v.type().to_string() + " value, but " + node_.op_type +
                " takes a tensor there");
  }
  return v.tensor();
}

std::string KernelContext::input_name(int i) const {
  if (!has_input(i)) return "input " + std::to_string(i);
  return "'" + graph_.value(node_.inputs[static_cast<size_t>(i)]).name + "'";
}

std::string KernelContext::output_name(int i) const {
  if (!has_output(i)) return "output " + std::to_string(i);
  return "'" + graph_.value(node_.outputs[static_cast<size_t>(i)]).name + "'";
}

Tensor& KernelContext::allocate_output(int i, DataType dtype, const Shape& shape) {
  Tensor t = allocator_ ? allocator_->allocate(dtype, shape) : Tensor(dtype, shape);
  if (!has_output(i)) {
    scratch_.push_back(std::move(t));  // a deque: earlier references stay valid
    return scratch_.back();
  }
  Value& slot = values_[static_cast<size_t>(node_.outputs[static_cast<size_t>(i)])];
  slot = Value(std::move(t));
  return slot.tensor();
}

void KernelContext::set_output(int i, Tensor tensor) { set_output_value(i, Value(std::move(tensor))); }

void KernelContext::set_output_value(int i, Value value) {
  if (!has_output(i)) return;
  values_[static_cast<size_t>(node_.outputs[static_cast<size_t>(i)])] = std::move(value);
}

}  // namespace onnxtrain::ops
