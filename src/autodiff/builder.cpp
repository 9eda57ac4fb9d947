#include "autodiff/builder.h"

#include "autodiff/gradient.h"
#include "core/dispatch.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

onnx::AttributeProto attr_int(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}

onnx::AttributeProto attr_float(const std::string& name, float v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}

onnx::AttributeProto attr_string(const std::string& name, const std::string& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}

onnx::AttributeProto attr_tensor(const std::string& name, const onnx::TensorProto& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::TENSOR);
  *a.mutable_t() = v;
  return a;
}

namespace {

// A tensor of `dims` filled with `value` converted to `dtype`, as raw_data.
onnx::TensorProto filled_tensor(double value, DataType dtype, const std::vector<int64_t>& dims) {
  onnx::TensorProto t;
  t.set_data_type(static_cast<int32_t>(dtype));
  int64_t n = 1;
  for (int64_t d : dims) {
    t.add_dims(d);
    n *= d;
  }
  visit_dtype<AllTypes>(dtype, "gradient constant", [&]<class T>() {
    const T v = convert<T>(value);
    std::string bytes;
    for (int64_t i = 0; i < n; ++i) bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
    t.set_raw_data(bytes);
  });
  return t;
}

}  // namespace

const onnx::AttributeProto* Builder::attr(const std::string& name) const {
  for (const auto& a : node().attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

int64_t Builder::get_int(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}

float Builder::get_float(const std::string& name, float fallback) const {
  const auto* a = attr(name);
  return a ? a->f() : fallback;
}

std::string Builder::get_string(const std::string& name, const std::string& fallback) const {
  const auto* a = attr(name);
  return a ? a->s() : fallback;
}

std::optional<std::vector<int64_t>> Builder::get_ints(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) return std::nullopt;
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::string Builder::op(const std::string& type, const std::vector<std::string>& inputs,
                        const std::vector<onnx::AttributeProto>& attrs, const std::string& domain) {
  return op_n(type, inputs, 1, attrs, domain)[0];
}

std::string Builder::scalar(double value, const std::string& like) {
  return op("Constant", {}, {attr_tensor("value", filled_tensor(value, dtype(like), {}))});
}

std::string Builder::ints(const std::vector<int64_t>& values) {
  onnx::TensorProto t;
  t.set_data_type(onnx::TensorProto::INT64);
  t.add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t.add_int64_data(v);
  return op("Constant", {}, {attr_tensor("value", t)});
}

std::string Builder::reduce_sum(const std::string& x, const std::vector<int64_t>& axes, bool keepdims) {
  std::vector<onnx::AttributeProto> attrs{attr_int("keepdims", keepdims ? 1 : 0)};
  if (opset() >= 13) {
    if (axes.empty()) return op("ReduceSum", {x}, attrs);
    return op("ReduceSum", {x, ints(axes)}, attrs);
  }
  if (!axes.empty()) attrs.push_back(attr_ints("axes", axes));
  return op("ReduceSum", {x}, attrs);
}

std::string Builder::unsqueeze(const std::string& x, const std::vector<int64_t>& axes) {
  if (opset() >= 13) return op("Unsqueeze", {x, ints(axes)});
  return op("Unsqueeze", {x}, {attr_ints("axes", axes)});
}

std::string Builder::zeros_like(const std::string& like) {
  return op("ConstantOfShape", {op("Shape", {like})},
            {attr_tensor("value", filled_tensor(0.0, dtype(like), {1}))});
}

std::string Builder::ones_like(const std::string& like) {
  return op("ConstantOfShape", {op("Shape", {like})},
            {attr_tensor("value", filled_tensor(1.0, dtype(like), {1}))});
}

std::string Builder::sum_to_shape_of(const std::string& gradient, const std::string& like) {
  return op("SumToShape", {gradient, op("Shape", {like})}, {}, kInternalDomain);
}

}  // namespace onnxtrain::autodiff
