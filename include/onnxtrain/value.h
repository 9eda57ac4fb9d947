// Value: what flows along an edge of an ONNX graph — a tensor, a sequence of values or an
// optional value (ONNX IR.md, "Static types": tensor, sequence and optional types; onnxtrain
// does not run map or sparse tensor types).
//
// A Value is cheap to copy: a tensor shares its storage (Tensor), a sequence or optional shares
// its immutable elements. Sequence ops build new sequences instead of changing one in place, as
// the ONNX operators define them (SequenceInsert returns a new sequence).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

// The type of a Value: tensor(element type), sequence(T) or optional(T) (ONNX TypeProto's
// tensor_type, sequence_type and optional_type). A tensor type's dtype may be Undefined where
// a model does not say.
class ValueType {
 public:
  enum class Kind : uint8_t { Tensor, Sequence, Optional };

  ValueType() = default;  // tensor(undefined)
  static ValueType tensor(DataType dtype);
  static ValueType sequence(ValueType element);
  static ValueType optional(ValueType element);

  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  // The element type of a tensor type (Undefined for sequence and optional types).
  DataType dtype() const { return dtype_; }
  // The type of a sequence's elements or of an optional's element; a tensor type returns itself.
  const ValueType& element() const { return element_ ? *element_ : *this; }
  // "float32", "sequence(float32)", "optional(sequence(int64))"
  std::string to_string() const;
  friend bool operator==(const ValueType& a, const ValueType& b);

 private:
  Kind kind_ = Kind::Tensor;
  DataType dtype_ = DataType::Undefined;
  std::shared_ptr<const ValueType> element_;
};

class Value {
 public:
  // An undefined value: an absent optional input or output of a node.
  Value() = default;
  // A tensor value (undefined when the tensor is). Implicit, so that a Tensor goes wherever a
  // Value is expected.
  Value(Tensor tensor);  // NOLINT(google-explicit-constructor)
  // A sequence of `elements`, each of type `element_type` (checked: Error otherwise). An empty
  // sequence keeps its element type.
  static Value sequence(ValueType element_type, std::vector<Value> elements);
  // An optional value that holds `element` (of type `element_type`, checked).
  static Value optional(ValueType element_type, Value element);
  // An optional value without an element ("None").
  static Value none(ValueType element_type);

  bool defined() const { return kind_ != ValueType::Kind::Tensor || tensor_.defined(); }
  bool is_tensor() const { return kind_ == ValueType::Kind::Tensor; }
  bool is_sequence() const { return kind_ == ValueType::Kind::Sequence; }
  bool is_optional() const { return kind_ == ValueType::Kind::Optional; }
  ValueType::Kind kind() const { return kind_; }
  ValueType type() const;
  // The type of a sequence's elements or an optional's element (a tensor value: its own type).
  ValueType element_type() const { return element_type_ ? *element_type_ : type(); }

  // The tensor of a tensor value (an undefined Tensor for sequences and optionals).
  const Tensor& tensor() const { return tensor_; }
  Tensor& tensor() { return tensor_; }
  // A sequence's elements (empty for other kinds).
  const std::vector<Value>& elements() const;
  // An optional value: whether it holds an element, and the element (undefined when None).
  bool has_element() const { return is_optional() && !items_->empty(); }
  const Value& element() const;

  // "float32[2,3]", "sequence(float32) of 3: float32[2], ...", "optional(float32): None"
  std::string description() const;

 private:
  Tensor tensor_;
  ValueType::Kind kind_ = ValueType::Kind::Tensor;
  std::shared_ptr<const std::vector<Value>> items_;  // sequence elements; an optional's 0 or 1
  std::shared_ptr<const ValueType> element_type_;     // of sequences and optionals
};

// Whether `value` has type `type`; a tensor type with an Undefined dtype accepts any tensor.
bool has_type(const Value& value, const ValueType& type);

}  // namespace onnxtrain
