#include "autodiff/builder.h"

#include "autodiff/gradient.h"
#include "core/dispatch.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

[[noreturn]] void missing(const onnx::NodeProto& node, const char* what, int count, int i) {
  throw Error(node.op_type() + " node has " + std::to_string(count) + " " + what + (count == 1 ? "" : "s") +
              "; its gradient needs " + what + " " + std::to_string(i));
}

}  // namespace

const std::string& Builder::I(int i) const {
  if (i < 0 || i >= num_inputs()) missing(node(), "input", num_inputs(), i);
  return node().input(i);
}

const std::string& Builder::O(int i) const {
  if (i < 0 || i >= num_outputs()) missing(node(), "output", num_outputs(), i);
  return node().output(i);
}

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

onnx::AttributeProto attr_graph(const std::string& name, const onnx::GraphProto& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::GRAPH);
  *a.mutable_g() = v;
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

int Builder::require_rank(const std::string& value) const {
  const int r = rank(value);
  if (r < 0) {
    throw Error("the gradient of " + node().op_type() + " needs the rank of '" + value +
                "', which shape inference could not find (declare its shape in the graph's value_info)");
  }
  return r;
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

// ConstantOfShape from opset 9; before it, like * 0 + value (which turns inf and NaN
// elements of `like` into NaN: a limit of those old opsets).
std::string Builder::filled_like(const std::string& like, double value) {
  if (opset() >= 9) {
    return op("ConstantOfShape", {op("Shape", {like})}, {attr_tensor("value", filled_tensor(value, dtype(like), {1}))});
  }
  const std::vector<onnx::AttributeProto> broadcast{attr_int("broadcast", 1)};
  const std::string zeros = op("Mul", {like, scalar(0, like)}, opset() < 7 ? broadcast : std::vector<onnx::AttributeProto>{});
  return value == 0 ? zeros : op("Add", {zeros, scalar(value, like)}, opset() < 7 ? broadcast : std::vector<onnx::AttributeProto>{});
}

std::string Builder::zeros_like(const std::string& like) { return filled_like(like, 0.0); }
std::string Builder::ones_like(const std::string& like) { return filled_like(like, 1.0); }

std::string Builder::sum_to_shape_of(const std::string& gradient, const std::string& like) {
  return op("SumToShape", {gradient, op("Shape", {like})}, {}, kInternalDomain);
}

}  // namespace onnxtrain::autodiff
