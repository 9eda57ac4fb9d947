#include "onnxtrain/value.h"

#include "onnxtrain/error.h"

namespace onnxtrain {

ValueType ValueType::tensor(DataType dtype) {
  ValueType t;
  t.dtype_ = dtype;
  return t;
}

ValueType ValueType::sequence(ValueType element) {
  ValueType t;
  t.kind_ = Kind::Sequence;
  t.element_ = std::make_shared<const ValueType>(std::move(element));
  return t;
}

ValueType ValueType::optional(ValueType element) {
  ValueType t;
  t.kind_ = Kind::Optional;
  t.element_ = std::make_shared<const ValueType>(std::move(element));
  return t;
}

std::string ValueType::to_string() const {
  switch (kind_) {
    case Kind::Tensor: return dtype_ == DataType::Undefined ? "tensor" : std::string(dtype_name(dtype_));
    case Kind::Sequence: return "sequence(" + element().to_string() + ")";
    case Kind::Optional: return "optional(" + element().to_string() + ")";
  }
  return "?";
}

bool operator==(const ValueType& a, const ValueType& b) {
  if (a.kind_ != b.kind_) return false;
  if (a.kind_ == ValueType::Kind::Tensor) return a.dtype_ == b.dtype_;
  return a.element() == b.element();
}

Value::Value(Tensor tensor) : tensor_(std::move(tensor)) {}

namespace {
const std::vector<Value>& no_items() {
  static const std::vector<Value> empty;
  return empty;
}
}  // namespace

Value Value::sequence(ValueType element_type, std::vector<Value> elements) {
  for (size_t i = 0; i < elements.size(); ++i) {
    if (!has_type(elements[i], element_type)) {
      throw Error("a sequence of " + element_type.to_string() + " cannot hold element " + std::to_string(i) +
                  ", " + elements[i].description());
    }
  }
  Value v;
  v.kind_ = ValueType::Kind::Sequence;
  v.items_ = std::make_shared<const std::vector<Value>>(std::move(elements));
  v.element_type_ = std::make_shared<const ValueType>(std::move(element_type));
  return v;
}

Value Value::optional(ValueType element_type, Value element) {
  if (!element.defined() || !has_type(element, element_type)) {
    throw Error("an optional of " + element_type.to_string() + " cannot hold " +
                (element.defined() ? element.description() : std::string("an undefined value")));
  }
  Value v;
  v.kind_ = ValueType::Kind::Optional;
  v.items_ = std::make_shared<const std::vector<Value>>(std::vector<Value>{std::move(element)});
  v.element_type_ = std::make_shared<const ValueType>(std::move(element_type));
  return v;
}

Value Value::none(ValueType element_type) {
  Value v;
  v.kind_ = ValueType::Kind::Optional;
  v.items_ = std::make_shared<const std::vector<Value>>();
  v.element_type_ = std::make_shared<const ValueType>(std::move(element_type));
  return v;
}

ValueType Value::type() const {
  switch (kind_) {
    case ValueType::Kind::Tensor: return ValueType::tensor(tensor_.dtype());
    case ValueType::Kind::Sequence: return ValueType::sequence(*element_type_);
    case ValueType::Kind::Optional: return ValueType::optional(*element_type_);
  }
  return {};
}

const std::vector<Value>& Value::elements() const { return is_sequence() ? *items_ : no_items(); }

const Value& Value::element() const {
  static const Value undefined;
  return has_element() ? (*items_)[0] : undefined;
}

std::string Value::description() const {
  switch (kind_) {
    case ValueType::Kind::Tensor: return tensor_.defined() ? tensor_.description() : "undefined";
    case ValueType::Kind::Sequence: {
      std::string s = type().to_string() + " of " + std::to_string(items_->size());
      for (size_t i = 0; i < items_->size() && i < 3; ++i) s += (i ? ", " : ": ") + (*items_)[i].description();
      return s + (items_->size() > 3 ? ", ..." : "");
    }
    case ValueType::Kind::Optional:
      return type().to_string() + ": " + (has_element() ? element().description() : std::string("None"));
  }
  return "?";
}

bool has_type(const Value& value, const ValueType& type) {
  if (value.kind() != type.kind()) return false;
  switch (type.kind()) {
    case ValueType::Kind::Tensor:
      return type.dtype() == DataType::Undefined || value.tensor().dtype() == type.dtype();
    case ValueType::Kind::Sequence:
    case ValueType::Kind::Optional:
      return value.type().element() == type.element() || (type.element().is_tensor() &&
                                                           type.element().dtype() == DataType::Undefined);
  }
  return false;
}

}  // namespace onnxtrain
