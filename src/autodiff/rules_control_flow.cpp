// Gradient rules of control-flow operators (see rules.cpp for the conventions).
//
// Loop has no rule: the engine unrolls a Loop on the path from xs to y into copies of its body
// when its trip count is a constant and nothing else ends it (autodiff/subgraphs.h), and the
// ordinary rules differentiate the copies; any other Loop there is an error.
#include <string>
#include <vector>

#include "autodiff/builder.h"
#include "onnxtrain/error.h"

namespace onnxtrain::autodiff {

namespace {

const onnx::GraphProto& branch(const Builder& b, const char* name) {
  const onnx::AttributeProto* a = b.attr(name);
  if (!a || !a->has_g()) throw Error("If has no graph attribute '" + std::string(name) + "'");
  return a->g();
}

// y = then_branch() if cond else else_branch(), both reading enclosing values v: dv is the
// backward pass of the branch cond picks, so an If on the same cond whose branches recompute
// their forward nodes and differentiate them (the engine's own backward_subgraph), each giving
// dv for every v that needs one (zeros where that branch does not read v).
void if_rule(Builder& b) {
  std::vector<std::string> output_gradients;
  for (int k = 0; k < b.num_outputs(); ++k) output_gradients.push_back(b.has_GO(k) ? b.GO(k) : "");
  std::vector<std::string> wrt;
  std::vector<int> which;
  for (int j = 0; j < static_cast<int>(b.implicit_inputs().size()); ++j) {
    if (!b.needs_implicit(j)) continue;
    wrt.push_back(b.implicit_inputs()[static_cast<size_t>(j)]);
    which.push_back(j);
  }
  const onnx::GraphProto then_grad = b.backward_subgraph(branch(b, "then_branch"), output_gradients, wrt, "then_branch");
  const onnx::GraphProto else_grad = b.backward_subgraph(branch(b, "else_branch"), output_gradients, wrt, "else_branch");
  const std::vector<std::string> grads = b.op_n("If", {b.I(0)}, static_cast<int>(wrt.size()),
                                                {attr_graph("then_branch", then_grad), attr_graph("else_branch", else_grad)});
  for (size_t n = 0; n < which.size(); ++n) b.set_implicit_GI(which[n], grads[n]);
}

}  // namespace

std::vector<Rule> control_flow_rules() {
  // clang-format off
  return {
    // domain, op, differentiable, unbroadcast, rule, derivation, enclosing_values
    {"", "If", 0, false, if_rule,
     "dv = If(cond, then: backward of then_branch, else: backward of else_branch) for each enclosing value v the "
     "branches read (branches recomputed; nested If and constant-count Loop inside work)", true},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
