#include "test_util.h"

#include <cmath>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::testing {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool throws_with(const std::function<void()>& f, const std::string& part) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find(part) != std::string::npos) return true;
    ADD_FAILURE() << "message without '" << part << "': " << e.what();
    return false;
  }
  ADD_FAILURE() << "no error (expected one saying '" << part << "')";
  return false;
}

void typed_value(onnx::ValueInfoProto* v, const std::string& name, int elem, const std::vector<int64_t>& dims) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  for (int64_t d : dims) {
    if (d < 0) t->mutable_shape()->add_dim()->set_dim_param("N");
    else t->mutable_shape()->add_dim()->set_dim_value(d);
  }
}

onnx::NodeProto* add_node(onnx::GraphProto& g, const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs) {
  auto* n = g.add_node();
  n->set_op_type(op);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

void add_constant_node(onnx::GraphProto& g, const std::string& name, const Tensor& value) {
  auto* n = add_node(g, "Constant", {}, {name});
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  io::tensor_to_proto(value, name, *a->mutable_t());
}

int count_op(const onnx::GraphProto& g, const std::string& op_type) {
  int n = 0;
  for (const auto& node : g.node()) n += node.op_type() == op_type;
  return n;
}

void graph_attr(onnx::NodeProto* n, const std::string& name, const onnx::GraphProto& g) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  *a->mutable_g() = g;
}

onnx::ModelProto node_model(const NodeSpec& spec, const std::vector<Tensor>& inputs) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(spec.domain.empty() ? spec.opset : 17);
  if (!spec.domain.empty()) {
    auto* other = model.add_opset_import();
    other->set_domain(spec.domain);
    other->set_version(spec.opset);
  }
  auto* graph = model.mutable_graph();
  graph->set_name("test");
  auto* node = graph->add_node();
  node->set_op_type(spec.op_type);
  node->set_domain(spec.domain);
  node->set_name("node");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      node->add_input("");
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    node->add_input(name);
    auto* input = graph->add_input();
    input->set_name(name);
    auto* type = input->mutable_type()->mutable_tensor_type();
    type->set_elem_type(static_cast<int32_t>(inputs[i].dtype()));
    auto* shape = type->mutable_shape();
    for (int64_t d : inputs[i].shape()) shape->add_dim()->set_dim_value(d);
  }
  for (int i = 0; i < spec.num_outputs; ++i) {
    const std::string name = "out" + std::to_string(i);
    node->add_output(name);
    graph->add_output()->set_name(name);
  }
  for (const auto& a : spec.attributes) *node->add_attribute() = a;
  return model;
}

std::vector<Tensor> run_node(const NodeSpec& spec, const std::vector<Tensor>& inputs) {
  runtime::Session session(node_model(spec, inputs));
  runtime::NamedTensors feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined()) feeds["in" + std::to_string(i)] = inputs[i];
  }
  auto outputs = session.run(feeds);
  std::vector<Tensor> result;
  for (int i = 0; i < spec.num_outputs; ++i) result.push_back(outputs.at("out" + std::to_string(i)));
  return result;
}

onnx::ModelProto empty_model(const std::string& graph_name) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  m.mutable_graph()->set_name(graph_name);
  return m;
}

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return f32(shape, v);
}

Tensor random_f64(const Shape& shape, uint32_t seed, double scale) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (auto& x : v) x = dist(gen);
  return Tensor::from_vector<double>(shape, v);
}

Tensor central_differences(const std::function<double(const Tensor&)>& f, const Tensor& x, double eps) {
  Tensor shifted = x.clone();
  double* v = shifted.data<double>();
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (size_t j = 0; j < g.size(); ++j) {
    const double saved = v[j];
    v[j] = saved + eps;
    const double plus = f(shifted);
    v[j] = saved - eps;
    const double minus = f(shifted);
    v[j] = saved;
    g[j] = (plus - minus) / (2 * eps);
  }
  return Tensor::from_vector<double>(x.shape(), g);
}

Tensor run1(const std::string& op, int opset, std::vector<onnx::AttributeProto> attrs, const std::vector<Tensor>& in) {
  return run_node(NodeSpec{op, "", opset, std::move(attrs), 1}, in)[0];
}

void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol) {
  ASSERT_EQ(got.dtype(), want.dtype()) << got.description() << " vs " << want.description();
  ASSERT_EQ(got.shape(), want.shape()) << got.description() << " vs " << want.description();
  const auto g = got.to_double_vector();
  const auto w = want.to_double_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << "element " << i;
      continue;
    }
    if (std::isinf(w[i])) {
      EXPECT_EQ(g[i], w[i]) << "element " << i;
      continue;
    }
    EXPECT_LE(std::abs(g[i] - w[i]), atol + rtol * std::abs(w[i]))
        << "element " << i << ": got " << g[i] << ", want " << w[i];
  }
}

}  // namespace onnxtrain::testing
