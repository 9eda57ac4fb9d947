// What a gradient rule sees: the forward node and a way to emit backward nodes.
//
// Vocabulary (as in ONNX Runtime's and PyTorch's gradient code):
//   I(i)   name of forward input i          O(i)   name of forward output i
//   GO(i)  gradient flowing into output i   (a tensor of zeros when none flows but another
//                                            output has one; check has_GO(i) to skip work)
//   needs(i)            whether the engine wants the gradient of input i
//   set_GI(i, name)     declares `name` as the gradient of input i
// For a node with subgraph attributes (If), the values of the enclosing graph its subgraphs
// read are its implicit inputs: implicit_inputs(), needs_implicit(j), set_implicit_GI(j, name),
// and backward_subgraph() differentiates a subgraph with the engine itself.
// A rule emits nodes with op()/op_n(); each returns fresh output names. The engine sums
// gradients of values used several times and, for rules marked `unbroadcast`, reduces a
// gradient back to its input's shape, so a rule never handles either.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/dtype.h"

namespace onnxtrain::autodiff {

// Attribute constructors for emitted nodes.
onnx::AttributeProto attr_int(const std::string& name, int64_t v);
onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& v);
onnx::AttributeProto attr_float(const std::string& name, float v);
onnx::AttributeProto attr_string(const std::string& name, const std::string& v);
onnx::AttributeProto attr_tensor(const std::string& name, const onnx::TensorProto& v);
onnx::AttributeProto attr_graph(const std::string& name, const onnx::GraphProto& v);

class Builder {
 public:
  virtual ~Builder() = default;

  // --- the forward node ---
  virtual const onnx::NodeProto& node() const = 0;
  int num_inputs() const { return node().input_size(); }
  int num_outputs() const { return node().output_size(); }
  bool has_input(int i) const { return i < num_inputs() && !node().input(i).empty(); }
  // Input or output i of the forward node; an Error when the node has fewer (a malformed model:
  // rules are written for the arity the op's schema gives).
  const std::string& I(int i) const;
  const std::string& O(int i) const;
  virtual std::string GO(int i) = 0;
  virtual bool has_GO(int i) const = 0;
  virtual bool needs(int i) const = 0;
  virtual void set_GI(int i, const std::string& gradient) = 0;
  // The model's opset for ai.onnx (rules emit the matching form of each op).
  virtual int opset() const = 0;
  // Element type of a value (Error when it cannot be inferred).
  virtual DataType dtype(const std::string& value) const = 0;
  // Rank of a value, or -1 when inference could not tell; require_rank throws instead.
  virtual int rank(const std::string& value) const = 0;
  int require_rank(const std::string& value) const;
  // The name of forward output i; when the forward node leaves that optional output unnamed
  // (Dropout's mask, SoftmaxCrossEntropyLoss's log_prob), names it so the rule can read it.
  virtual std::string output(int i) = 0;

  // Attributes of the forward node.
  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  float get_float(const std::string& name, float fallback) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;
  std::optional<std::vector<int64_t>> get_ints(const std::string& name) const;

  // --- subgraphs (rules marked `enclosing_values`) ---
  // The values of the enclosing graph that the node's subgraph attributes read, sorted by name.
  virtual const std::vector<std::string>& implicit_inputs() const = 0;
  virtual bool needs_implicit(int j) const = 0;
  virtual void set_implicit_GI(int j, const std::string& gradient) = 0;
  // A graph without inputs that recomputes `subgraph` (which takes none, like an If branch) and
  // outputs the gradients of `wrt`, values of the enclosing graph it reads, given
  // output_gradients[k] flowing into its output k ("" for none): zeros for a value it does not
  // depend on. Built by the engine, so nested If and Loop nodes are differentiated as anywhere
  // else. `label` names the subgraph in errors.
  virtual onnx::GraphProto backward_subgraph(const onnx::GraphProto& subgraph,
                                             const std::vector<std::string>& output_gradients,
                                             const std::vector<std::string>& wrt, const std::string& label) = 0;

  // --- emitting nodes ---
  // One node with one output; returns the output's fresh name.
  std::string op(const std::string& type, const std::vector<std::string>& inputs,
                 const std::vector<onnx::AttributeProto>& attrs = {}, const std::string& domain = "");
  // One node with n outputs; with `wanted`, outputs i where wanted[i] is false are left
  // unnamed (returned as "").
  virtual std::vector<std::string> op_n(const std::string& type, const std::vector<std::string>& inputs,
                                        int n, const std::vector<onnx::AttributeProto>& attrs = {},
                                        const std::string& domain = "", const std::vector<bool>& wanted = {}) = 0;
  // A scalar constant of the element type of `like`.
  std::string scalar(double value, const std::string& like);
  // A 1-D int64 constant.
  std::string ints(const std::vector<int64_t>& values);

  // --- opset-aware forms ---
  std::string reduce_sum(const std::string& x, const std::vector<int64_t>& axes, bool keepdims);
  std::string unsqueeze(const std::string& x, const std::vector<int64_t>& axes);
  // Zeros and ones shaped and typed like `like`.
  std::string zeros_like(const std::string& like);
  std::string ones_like(const std::string& like);
  std::string filled_like(const std::string& like, double value);
  // The engine's inverse of broadcasting: sums `gradient` down to the shape of `like`.
  std::string sum_to_shape_of(const std::string& gradient, const std::string& like);
};

// A gradient rule: emits the gradients of the inputs the engine needs.
using RuleFn = void (*)(Builder&);

struct Rule {
  const char* domain;  // "" for ai.onnx
  const char* op_type;
  // Inputs that carry gradients, as a bit mask (bit i = input i). 0: the op is declared
  // non-differentiable (piecewise constant or integer-valued): its inputs get no gradient.
  uint32_t differentiable;
  // The op broadcasts its inputs (numpy rules): the engine sums each input's gradient back to
  // the input's shape.
  bool unbroadcast;
  RuleFn build;  // nullptr when differentiable == 0 and !enclosing_values
  const char* note;  // the derivation, for docs/gradients.md
  // The values the node's subgraphs read from the enclosing graph (Builder::implicit_inputs)
  // carry gradients too (If).
  bool enclosing_values = false;
};

// Every input i.
inline constexpr uint32_t kAllInputs = 0xffffffffu;
constexpr uint32_t inputs_mask(std::initializer_list<int> inputs) {
  uint32_t m = 0;
  for (int i : inputs) m |= 1u << i;
  return m;
}

// The rule table (rules*.cpp); find_rule returns nullptr for an op without one.
const Rule* find_rule(const std::string& domain, const std::string& op_type);
std::vector<const Rule*> all_rules();

}  // namespace onnxtrain::autodiff
