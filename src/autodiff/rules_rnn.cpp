// Gradient rules of the recurrent layers RNN, GRU and LSTM (see rules.cpp for the conventions).
// Each emits one backward op, ai.onnxtrain.RNNGrad / GRUGrad / LSTMGrad (src/ops/rnn_grad.cpp,
// backpropagation through time), which takes the forward node's attributes and inputs and the
// gradients flowing into Y, Y_h (and Y_c), and returns the gradients of X, W, R, B, initial_h
// (and initial_c, P). sequence_lens is not differentiable.
#include "autodiff/gradient.h"
#include "autodiff/rules_common.h"

namespace onnxtrain::autodiff {

namespace {

constexpr int kSequenceLens = 4;

void recurrent_rule(Builder& b) {
  const bool lstm = b.node().op_type() == "LSTM";
  const int forward_inputs = lstm ? 8 : 6, forward_outputs = lstm ? 3 : 2;
  std::vector<std::string> inputs;
  for (int i = 0; i < forward_inputs; ++i) inputs.push_back(b.has_input(i) ? b.I(i) : "");
  for (int k = 0; k < forward_outputs; ++k) {
    const bool flows = k < b.num_outputs() && !b.O(k).empty() && b.has_GO(k);
    inputs.push_back(flows ? b.GO(k) : "");
  }
  while (inputs.back().empty()) inputs.pop_back();
  // Output k is the gradient of forward input k, sequence_lens skipped.
  std::vector<int> input_of;
  std::vector<bool> wanted;
  for (int i = 0; i < forward_inputs; ++i) {
    if (i == kSequenceLens) continue;
    input_of.push_back(i);
    wanted.push_back(b.has_input(i) && b.needs(i));
  }
  // The backward op reads `layout` at any opset; before opset 14 the forward op ignores it.
  std::vector<onnx::AttributeProto> attrs;
  for (const auto& a : forward_attributes(b)) {
    if (a.name() != "layout" || b.opset() >= 14) attrs.push_back(a);
  }
  const auto grads = b.op_n(b.node().op_type() + "Grad", inputs, static_cast<int>(wanted.size()), attrs,
                            kInternalDomain, wanted);
  for (size_t k = 0; k < wanted.size(); ++k) {
    if (wanted[k]) b.set_GI(input_of[k], grads[k]);
  }
}

}  // namespace

std::vector<Rule> rnn_rules() {
  constexpr uint32_t kRnnInputs = inputs_mask({0, 1, 2, 3, 5});           // X W R B initial_h
  constexpr uint32_t kLstmInputs = inputs_mask({0, 1, 2, 3, 5, 6, 7});    // and initial_c, P
  // clang-format off
  return {
    {"", "RNN",  kRnnInputs,  false, recurrent_rule, "backpropagation through time by ai.onnxtrain.RNNGrad"},
    {"", "GRU",  kRnnInputs,  false, recurrent_rule, "backpropagation through time by ai.onnxtrain.GRUGrad"},
    {"", "LSTM", kLstmInputs, false, recurrent_rule, "backpropagation through time by ai.onnxtrain.LSTMGrad"},
    {kInternalDomain, "RNNGrad",  kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "GRUGrad",  kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
    {kInternalDomain, "LSTMGrad", kAllInputs, false, not_twice_differentiable, "not twice differentiable"},
  };
  // clang-format on
}

}  // namespace onnxtrain::autodiff
