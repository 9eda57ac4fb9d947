// Values of sequence and optional type in protobuf form: onnx-data.proto's SequenceProto and
// OptionalProto (what ONNX's backend test data stores for such inputs and outputs), beside the
// TensorProto of tensor_proto.cpp.
#include <onnx/onnx-data.pb.h>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::io {

namespace fs = std::filesystem;

namespace {

Value from_sequence(const onnx::SequenceProto& proto, const ValueType& type, const fs::path& base_dir,
                    const std::string& what);
Value from_optional(const onnx::OptionalProto& proto, const ValueType& type, const fs::path& base_dir,
                    const std::string& what);

// The declared element type, or the one the proto's first element shows when undeclared.
ValueType element_type(const ValueType& type) {
  return type.kind() == ValueType::Kind::Tensor ? ValueType() : type.element();
}

Value from_sequence(const onnx::SequenceProto& proto, const ValueType& type, const fs::path& base_dir,
                    const std::string& what) {
  ValueType element = element_type(type);
  std::vector<Value> elements;
  switch (proto.elem_type()) {
    case onnx::SequenceProto::TENSOR:
    case onnx::SequenceProto::UNDEFINED:
      for (int i = 0; i < proto.tensor_values_size(); ++i) {
        elements.emplace_back(tensor_from_proto(proto.tensor_values(i), base_dir, what + " element " + std::to_string(i)));
      }
      if (element.is_tensor() && element.dtype() == DataType::Undefined && !elements.empty()) {
        element = ValueType::tensor(elements[0].tensor().dtype());
      }
      break;
    case onnx::SequenceProto::SEQUENCE:
      for (int i = 0; i < proto.sequence_values_size(); ++i) {
        elements.push_back(from_sequence(proto.sequence_values(i), element, base_dir, what + " element " + std::to_string(i)));
      }
      break;
    case onnx::SequenceProto::OPTIONAL:
      for (int i = 0; i < proto.optional_values_size(); ++i) {
        elements.push_back(from_optional(proto.optional_values(i), element, base_dir, what + " element " + std::to_string(i)));
      }
      break;
    default:
      throw Error(what + ": a sequence of maps or sparse tensors (SequenceProto elem_type " +
                  std::to_string(proto.elem_type()) + "), which onnxtrain does not run");
  }
  return Value::sequence(element, std::move(elements));
}

Value from_optional(const onnx::OptionalProto& proto, const ValueType& type, const fs::path& base_dir,
                    const std::string& what) {
  const ValueType element = element_type(type);
  switch (proto.elem_type()) {
    case onnx::OptionalProto::TENSOR:
      if (!proto.has_tensor_value()) return Value::none(element);
      return Value::optional(element.is_tensor() && element.dtype() == DataType::Undefined
                                 ? ValueType::tensor(static_cast<DataType>(proto.tensor_value().data_type()))
                                 : element,
                             tensor_from_proto(proto.tensor_value(), base_dir, what));
    case onnx::OptionalProto::SEQUENCE:
      if (!proto.has_sequence_value()) return Value::none(element);
      return Value::optional(element, from_sequence(proto.sequence_value(), element, base_dir, what));
    case onnx::OptionalProto::UNDEFINED: return Value::none(element);
    default:
      throw Error(what + ": an optional map, sparse tensor or optional (OptionalProto elem_type " +
                  std::to_string(proto.elem_type()) + "), which onnxtrain does not run");
  }
}

void to_sequence(const Value& value, const std::string& name, onnx::SequenceProto& proto);
void to_optional(const Value& value, const std::string& name, onnx::OptionalProto& proto);

void to_sequence(const Value& value, const std::string& name, onnx::SequenceProto& proto) {
  if (!name.empty()) proto.set_name(name);
  const ValueType element = value.type().element();
  switch (element.kind()) {
    case ValueType::Kind::Tensor:
      proto.set_elem_type(onnx::SequenceProto::TENSOR);
      for (const Value& e : value.elements()) tensor_to_proto(e.tensor(), "", *proto.add_tensor_values());
      break;
    case ValueType::Kind::Sequence:
      proto.set_elem_type(onnx::SequenceProto::SEQUENCE);
      for (const Value& e : value.elements()) to_sequence(e, "", *proto.add_sequence_values());
      break;
    case ValueType::Kind::Optional:
      proto.set_elem_type(onnx::SequenceProto::OPTIONAL);
      for (const Value& e : value.elements()) to_optional(e, "", *proto.add_optional_values());
      break;
  }
}

void to_optional(const Value& value, const std::string& name, onnx::OptionalProto& proto) {
  if (!name.empty()) proto.set_name(name);
  const ValueType element = value.type().element();
  switch (element.kind()) {
    case ValueType::Kind::Tensor:
      proto.set_elem_type(onnx::OptionalProto::TENSOR);
      if (value.has_element()) tensor_to_proto(value.element().tensor(), "", *proto.mutable_tensor_value());
      break;
    case ValueType::Kind::Sequence:
      proto.set_elem_type(onnx::OptionalProto::SEQUENCE);
      if (value.has_element()) to_sequence(value.element(), "", *proto.mutable_sequence_value());
      break;
    case ValueType::Kind::Optional:
      proto.set_elem_type(onnx::OptionalProto::OPTIONAL);
      if (value.has_element()) to_optional(value.element(), "", *proto.mutable_optional_value());
      break;
  }
}

}  // namespace

std::pair<std::string, Value> read_value_pb(const fs::path& path, const ValueType& type) {
  if (type.is_tensor()) return read_tensor_pb(path);
  const std::string bytes = read_file(path);
  if (type.kind() == ValueType::Kind::Sequence) {
    onnx::SequenceProto proto;
    if (!proto.ParseFromString(bytes)) throw Error(path.string() + ": not a valid serialized SequenceProto");
    return {proto.name(), from_sequence(proto, type, path.parent_path(), path.string())};
  }
  onnx::OptionalProto proto;
  if (!proto.ParseFromString(bytes)) throw Error(path.string() + ": not a valid serialized OptionalProto");
  return {proto.name(), from_optional(proto, type, path.parent_path(), path.string())};
}

void write_value_pb(const Value& value, const std::string& name, const fs::path& path) {
  if (value.is_tensor()) return write_tensor_pb(value.tensor(), name, path);
  if (value.is_sequence()) {
    onnx::SequenceProto proto;
    to_sequence(value, name, proto);
    return write_file_atomic(path, proto.SerializeAsString());
  }
  onnx::OptionalProto proto;
  to_optional(value, name, proto);
  write_file_atomic(path, proto.SerializeAsString());
}

}  // namespace onnxtrain::io
