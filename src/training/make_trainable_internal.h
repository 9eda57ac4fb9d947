// What the parts of make_trainable share: the graph writer, the trainable parameters, the
// resolved parameter groups, and the writers of the schedule (make_trainable_schedule.cpp) and
// of the optimizer update (make_trainable_optimizer.cpp).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "onnxtrain/make_trainable.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::training::detail {

inline constexpr const char* kPrefix = "onnxtrain.";

onnx::ValueInfoProto value_info(const std::string& name, int32_t elem_type, const std::vector<int64_t>& dims);

// A graph under construction.
class GraphWriter {
 public:
  explicit GraphWriter(onnx::GraphProto& g) : g_(g) {}

  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                   const std::vector<onnx::AttributeProto>& attrs = {}, const std::string& domain = "");
  void nodes(const std::string& op, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
             const std::vector<onnx::AttributeProto>& attrs = {}, const std::string& domain = "");
  // A scalar float32, float64 or int64 initializer.
  std::string scalar(const std::string& name, double value, int32_t elem_type = onnx::TensorProto::FLOAT);
  void initializer(const std::string& name, const Tensor& t);
  void output(const onnx::ValueInfoProto& v) { *g_.add_output() = v; }
  void input(const onnx::ValueInfoProto& v) { *g_.add_input() = v; }

 private:
  onnx::GraphProto& g_;
};

// The names the program takes: every one is new (a clash with the model is an Error).
class Names {
 public:
  Names(std::set<std::string> taken, std::string source) : taken_(std::move(taken)), source_(std::move(source)) {}
  // Takes `name` as is.
  std::string claim(const std::string& name);
  // Takes "onnxtrain." + suffix.
  std::string operator()(const std::string& suffix) { return claim(kPrefix + suffix); }
  const std::string& source() const { return source_; }

 private:
  std::set<std::string> taken_;
  std::string source_;
};

struct Param {
  std::string name;
  int32_t elem_type;
  std::vector<int64_t> dims;
};

// The lists one after another: the variadic inputs and outputs of the optimizer ops.
std::vector<std::string> joined(std::initializer_list<std::vector<std::string>> lists);

// A tensor of a parameter's type and shape filled with `value` (optimizer state).
Tensor filled_like(const Param& p, double value);

// One parameter group with every hyperparameter resolved (the group's own, else the top-level
// option). The optimizer family and whether it is AdamW are the options'.
struct Group {
  std::string label;            // "param_groups[K]" or "the parameters in no group", for messages
  std::string prefix;           // "param_groups.K." or "" (names of the group's scalar nodes)
  std::vector<size_t> members;  // indices into the trainable parameters, in graph order
  double lr = 0, weight_decay = 0, momentum = 0, dampening = 0, beta1 = 0, beta2 = 0, eps = 0, lr_decay = 0,
         initial_accumulator_value = 0;
  bool nesterov = false;
  std::optional<double> max_lr;
  double base_momentum = 0, max_momentum = 0;
};

enum class Family { Sgd, Adagrad, Adam };
Family family_of(Optimizer o);

// The groups of options.param_groups, in order, then (when it has members) the group of the
// parameters that no group names. `candidates` are every initializer training could update
// (before freeze/train), `trainable` those it does. Throws Error for the mistakes listed at
// ParamGroup and for hyperparameters out of PyTorch's ranges.
std::vector<Group> resolve_groups(const MakeTrainableOptions& options, const std::vector<Param>& trainable,
                                  const std::vector<Param>& candidates, const std::string& source);

// The schedule's values for each group at the step counter T (int64 scalar): float64 [G]
// vectors, G = groups.size(), in group order.
struct ScheduleValues {
  std::string lrs;      // the learning rates
  std::string momenta;  // OneCycle with cycle_momentum: SGD's momentum or Adam's beta1; else empty
};
// Throws Error for a schedule option that is missing or out of PyTorch's range, naming it.
ScheduleValues write_schedule(GraphWriter& alg, Names& names, const MakeTrainableOptions& options,
                              const std::vector<Group>& groups, const std::string& T);

// A variable of the optimizer: its initializer, the value that replaces it each step, the
// parameter it belongs to, its initial value and its kind.
struct State {
  std::string name, next;
  const Param* param;
  double initial;
  std::string kind;  // "momentum", "adagrad_sum", "adam_m" or "adam_v" (training_metadata.cpp
                     // maps it to PyTorch's state key)
};

// What the update writes for each group: per group its learning rate and (cycled) momentum as
// float64 scalars; per parameter its gradient. Returns the state variables it adds; the new
// value of params[i] is written to new_params[i].
struct UpdateInputs {
  const MakeTrainableOptions& options;
  const std::vector<Param>& params;
  const std::vector<std::string>& grads;
  const std::vector<std::string>& new_params;
  std::string T;                          // steps done, int64 scalar
  std::vector<std::string> lr;            // per group, float64 scalar
  std::vector<std::string> momentum;      // per group, float64 scalar, or empty when constant
};
std::vector<State> write_update(GraphWriter& alg, Names& names, const std::vector<Group>& groups,
                                const UpdateInputs& in);

}  // namespace onnxtrain::training::detail
