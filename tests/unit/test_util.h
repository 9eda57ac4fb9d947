// Helpers for unit tests: build and run one-node models, compare tensors.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "onnxtrain/session.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::testing {

inline onnx::AttributeProto attr(const std::string& name, int64_t value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
  return a;
}
inline onnx::AttributeProto attr(const std::string& name, float value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(value);
  return a;
}
inline onnx::AttributeProto attr(const std::string& name, const std::string& value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(value);
  return a;
}
inline onnx::AttributeProto attr(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a.add_ints(v);
  return a;
}
inline onnx::AttributeProto attr(const std::string& name, const std::vector<float>& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::FLOATS);
  for (float v : values) a.add_floats(v);
  return a;
}
inline onnx::AttributeProto attr(const std::string& name, const std::vector<std::string>& values) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRINGS);
  for (const auto& v : values) a.add_strings(v);
  return a;
}

// Hand-built graphs: `v` declared as a tensor `name` of ONNX element type `elem` and `dims`
// (-1: the symbolic dim "N"; no dims: the shape left undeclared); a node appended to `g`; a
// graph attribute of `n`.
void typed_value(onnx::ValueInfoProto* v, const std::string& name, int elem, const std::vector<int64_t>& dims);
onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs);
void graph_attr(onnx::NodeProto* n, const std::string& name, const onnx::GraphProto& g);
// A Constant node appended to `g` whose `value` attribute holds `value`, output `name`.
void add_constant_node(onnx::GraphProto& g, const std::string& name, const Tensor& value);
// The nodes of `g` (not of its subgraphs) whose op_type is `op_type`, of any domain.
int count_op(const onnx::GraphProto& g, const std::string& op_type);
// An empty model (IR 8, ai.onnx opset 17) whose graph is named `graph_name`.
onnx::ModelProto empty_model(const std::string& graph_name);

struct NodeSpec {
  std::string op_type;
  std::string domain;  // "" for ai.onnx
  int opset = 17;
  std::vector<onnx::AttributeProto> attributes;
  int num_outputs = 1;
};

// A model with one node reading graph inputs "in0", "in1", ... (typed and shaped like
// `inputs`; an undefined tensor gives an omitted optional input) and producing "out0", ...
onnx::ModelProto node_model(const NodeSpec& spec, const std::vector<Tensor>& inputs);

// Runs node_model(spec, inputs) and returns its outputs in order.
std::vector<Tensor> run_node(const NodeSpec& spec, const std::vector<Tensor>& inputs);

// Tensors for tests: float32 and int64 of a shape (or 1-D from the values), and float32
// holding 0, 1, 2, ... in row-major order.
inline Tensor f32(const Shape& shape, const std::vector<float>& v) { return Tensor::from_vector<float>(shape, v); }
inline Tensor i64(const Shape& shape, const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>(shape, v); }
inline Tensor i64(const std::vector<int64_t>& v) { return i64(Shape{static_cast<int64_t>(v.size())}, v); }
Tensor iota(const Shape& shape);

// Runs a one-output ai.onnx node at `opset` and returns its output.
Tensor run1(const std::string& op, int opset, std::vector<onnx::AttributeProto> attrs, const std::vector<Tensor>& in);

// float64 values uniform in [-scale, scale), drawn by std::mt19937(seed).
Tensor random_f64(const Shape& shape, uint32_t seed, double scale = 1.0);

// d f / d x at the float64 tensor x by central differences, element by element:
// (f(x + eps e_j) - f(x - eps e_j)) / (2 eps).
Tensor central_differences(const std::function<double(const Tensor&)>& f, const Tensor& x, double eps = 1e-6);

// The message of the onnxtrain::Error that f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f);
// Whether f throws an onnxtrain::Error whose message contains `part`; a message without it,
// or no error, is also reported as a test failure naming what came instead.
bool throws_with(const std::function<void()>& f, const std::string& part);

// Element-wise comparison with |got - want| <= atol + rtol * |want|; shapes and dtypes equal.
void expect_close(const Tensor& got, const Tensor& want, double rtol = 1e-5, double atol = 1e-6);

}  // namespace onnxtrain::testing
