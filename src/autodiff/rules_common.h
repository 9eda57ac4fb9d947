// Small node-emitting helpers shared by the rule files: arithmetic that works in every opset
// (before opset 7 a broadcasting binary op needs the attribute broadcast=1), selections, and
// what rules that emit ai.onnxtrain backward ops share.
#pragma once

#include <string>
#include <vector>

#include "autodiff/builder.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

inline std::string bin(Builder& b, const char* type, const std::string& x, const std::string& y) {
  if (b.opset() < 7) return b.op(type, {x, y}, {attr_int("broadcast", 1)});
  return b.op(type, {x, y});
}
inline std::string add(Builder& b, const std::string& x, const std::string& y) { return bin(b, "Add", x, y); }
inline std::string sub(Builder& b, const std::string& x, const std::string& y) { return bin(b, "Sub", x, y); }
inline std::string mul(Builder& b, const std::string& x, const std::string& y) { return bin(b, "Mul", x, y); }
inline std::string div(Builder& b, const std::string& x, const std::string& y) { return bin(b, "Div", x, y); }
inline std::string neg(Builder& b, const std::string& x) { return b.op("Neg", {x}); }
inline std::string cast_to(Builder& b, const std::string& x, DataType to) {
  return b.op("Cast", {x}, {attr_int("to", static_cast<int64_t>(to))});
}

// x where cond, 0 elsewhere (Where from opset 9, a cast mask before).
inline std::string where_or_zero(Builder& b, const std::string& cond, const std::string& x) {
  if (b.opset() >= 9) return b.op("Where", {cond, x, b.scalar(0, x)});
  return mul(b, x, cast_to(b, cond, b.dtype(x)));
}

// a where cond, c elsewhere.
inline std::string select(Builder& b, const std::string& cond, const std::string& a, const std::string& c) {
  if (b.opset() >= 9) return b.op("Where", {cond, a, c});
  const std::string m = cast_to(b, cond, b.dtype(a));
  return add(b, mul(b, a, m), mul(b, c, sub(b, b.scalar(1, a), m)));
}

// g broadcast to the shape of `like` (Expand from opset 8).
inline std::string expand_like(Builder& b, const std::string& g, const std::string& like) {
  if (b.opset() >= 8) return b.op("Expand", {g, b.op("Shape", {like})});
  return add(b, g, b.zeros_like(like));
}

// Number of elements of `x` as a scalar of `like`'s type.
inline std::string numel_as(Builder& b, const std::string& x, const std::string& like) {
  return cast_to(b, b.op("Size", {x}), b.dtype(like));
}

// The forward node's attributes, for a backward op of the ai.onnxtrain domain that takes them.
inline std::vector<onnx::AttributeProto> forward_attributes(Builder& b) {
  return {b.node().attribute().begin(), b.node().attribute().end()};
}

// The rule of a backward op <Op>Grad that has no gradient of its own.
inline void not_twice_differentiable(Builder& b) {
  const std::string& type = b.node().op_type();
  throw Error(type + " (the backward op of " + type.substr(0, type.size() - 4) +
              ") is not differentiable: second derivatives through convolution, pooling, Resize and the recurrent "
              "layers are not supported");
}

}  // namespace onnxtrain::autodiff
