// make_trainable — writes the standard training program into an inference model, as
// ModelProto.training_info (one TrainingInfoProto), so that any TrainingInfoProto runtime can
// train it; export_inference goes back to a plain inference model. docs/make-trainable.md maps
// every loss, optimizer and schedule to its ONNX nodes and to its PyTorch equivalent.
//
// The algorithm graph: loss (reading a model output and a new label input) -> Gradient (xs =
// the trainable initializers, y = the loss) -> optional global-norm clipping -> learning rate
// of each parameter group from the iteration counter (the schedule) -> optimizer update;
// outputs the loss and the learning rates. update_binding writes back the parameters, the
// optimizer state, the counter and BatchNormalization running statistics. The initialization
// graph resets the optimizer state and the counter and, with an `init` other than Keep,
// re-draws the weights. Optimizers, parameter groups and schedules are PyTorch's (torch.optim,
// torch.optim.lr_scheduler): a float64 program trains as PyTorch does in float64
// (tests/parity/optimizer_parity.py: 20 steps, rtol 1e-6).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace onnx {
class ModelProto;
}

namespace onnxtrain::training {

// Losses (the PyTorch equivalent in parentheses):
//   CrossEntropy  SoftmaxCrossEntropyLoss on logits [N, C, ...], int64 labels [N, ...]
//                 (nn.CrossEntropyLoss)
//   Nll           NegativeLogLikelihoodLoss on log-probabilities (nn.NLLLoss)
//   Mse           mean/sum of (y - label)^2 (nn.MSELoss)
//   L1            mean/sum of |y - label| (nn.L1Loss)
//   BceWithLogits mean/sum of max(y, 0) - y label + log(1 + e^-|y|) (nn.BCEWithLogitsLoss)
enum class Loss { CrossEntropy, Nll, Mse, L1, BceWithLogits };
enum class Reduction { Mean, Sum };

// Optimizers: one for the whole model, as a torch.optim optimizer, with its hyperparameters
// set per parameter group (ParamGroup):
//   Sgd, Momentum, Nesterov  torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov).
//                            The three differ only in the defaults of the groups: momentum is
//                            MakeTrainableOptions::momentum for Momentum and Nesterov and 0 for
//                            Sgd; nesterov is true for Nesterov. A group's own values win.
//   Adagrad                  torch.optim.Adagrad(lr, lr_decay, weight_decay,
//                            initial_accumulator_value, eps)
//   Adam                     torch.optim.Adam(lr, betas=(beta1, beta2), eps, weight_decay): L2
//   AdamW                    torch.optim.AdamW(...): decoupled decay, p (1 - lr_t wd) before the
//                            update, with the learning rate of the step (also under a schedule)
// ONNX nodes: the ai.onnx.preview.training ops Momentum, Adagrad and Adam, one node per group,
// wherever their float attributes hold the group's hyperparameters exactly: always for float32
// parameters; for float64 parameters only when every such hyperparameter is a float32 value
// (0.5, 0.25, ...), because a float32-rounded 0.9 moves float64 weights 1e-6 to 5e-5 (relative)
// off PyTorch's within 20 steps. Otherwise, and for every group whose momentum or beta1 changes
// each step (OneCycleLR's cycle_momentum), the group's update is written with standard ai.onnx
// ops (Mul, Add, Sqrt, Div, ...) in the parameters' type, following PyTorch's formulas. Plain
// SGD (momentum 0) is always Mul and Sub. docs/make-trainable.md has the exact graphs.
enum class Optimizer { Sgd, Momentum, Nesterov, Adagrad, Adam, AdamW };

// Learning-rate schedules. Step t (0-based: t steps done before it) of a parameter group whose
// base learning rate is lr (ParamGroup::lr, else MakeTrainableOptions::lr) uses what PyTorch's
// scheduler sets after t calls of scheduler.step() (torch.optim.lr_scheduler in parentheses;
// fields of LrScheduler in the formulas):
//   Constant         lr factor while t < total_iters, then lr  (ConstantLR; factor 1, the
//                    default, is no schedule)
//   Step             lr gamma^floor(t / step_size)  (StepLR)
//   MultiStep        lr gamma^(number of milestones <= t)  (MultiStepLR)
//   Exponential      lr gamma^t  (ExponentialLR)
//   Cosine           eta_min + (lr - eta_min) (1 + cos(pi min(t, total_steps) / total_steps)) / 2:
//                    CosineAnnealingLR(T_max=total_steps, eta_min) until total_steps, then held
//                    at eta_min (`--lr-schedule cosine`)
//   CosineAnnealing  eta_min + (lr - eta_min) (1 + cos(pi t / T_max)) / 2 for every t
//                    (CosineAnnealingLR: like PyTorch's it rises again after T_max, period 2 T_max)
//   Linear           lr (start_factor + (end_factor - start_factor) min(t, total_iters) / total_iters)
//                    (LinearLR)
//   Polynomial       lr (1 - min(t, total_iters) / total_iters)^power  (PolynomialLR)
//   OneCycle         OneCycleLR(max_lr, total_steps, pct_start, anneal_strategy, cycle_momentum,
//                    base_momentum, max_momentum, div_factor, final_div_factor, three_phase):
//                    the group's lr is replaced by max_lr / div_factor, annealed to max_lr until
//                    step pct_start total_steps - 1, then to max_lr / div_factor / final_div_factor
//                    at step total_steps - 1 (three_phase: back to max_lr / div_factor at step
//                    2 pct_start total_steps - 2 first); anneal_strategy "cos" or "linear". With
//                    cycle_momentum, SGD's momentum (of every group, also one whose momentum
//                    was 0) or Adam's beta1 is annealed the opposite way between max_momentum
//                    and base_momentum. PyTorch raises after step total_steps; the program
//                    holds the values of step total_steps.
//   Sequential       schedulers[0] until milestones[0], then schedulers[k] from milestones[k-1]
//                    on, run from its own step 0 (SequentialLR): e.g. a LinearLR warm-up, then
//                    CosineAnnealingLR. Its schedulers are neither Sequential nor OneCycle.
// The schedule is computed in float64 from the iteration counter, whatever the parameters'
// type, and cast to it (float32: one rounding of PyTorch's float64 value).
enum class Schedule { Constant, Step, Exponential, Cosine, Linear, MultiStep, CosineAnnealing, Polynomial, OneCycle, Sequential };

// Weight re-initialization in the initialization graph: Keep leaves the exported weights;
// Xavier (Glorot uniform), He (Kaiming normal, fan_in) and Normal (mean 0, init_std) draw
// tensors of rank >= 2 and set rank-1 tensors (biases) to zero.
enum class Init { Keep, Xavier, He, Normal };

// A learning-rate scheduler and its arguments, named as torch.optim.lr_scheduler names them.
// Steps and iterations count optimizer steps. Only the fields of `schedule` are read; a field
// it needs that is left at 0 (step_size, total_iters, T_max, total_steps) is an Error naming it.
struct LrScheduler {
  Schedule schedule = Schedule::Constant;
  int64_t step_size = 0;            // Step: steps between decays
  double gamma = 0.1;               // Step, MultiStep, Exponential: the decay factor
  std::vector<int64_t> milestones;  // MultiStep: the steps at which lr is multiplied by gamma
                                    // (a step listed n times: gamma^n). Sequential: the steps at
                                    // which schedulers[1], [2], ... start (increasing, > 0)
  double factor = 1.0;              // Constant: the factor before total_iters (PyTorch's
                                    // default is 1/3; 1 here, so that the default is no schedule)
  int64_t total_iters = 0;          // Constant, Linear, Polynomial: steps until the last factor
  double start_factor = 1.0;        // Linear: factor of step 0 (PyTorch's default: 1/3)
  double end_factor = 0.0;          // Linear: factor from step total_iters on (PyTorch's: 1)
  double power = 1.0;               // Polynomial
  int64_t T_max = 0;                // CosineAnnealing: steps of the half period
  double eta_min = 0.0;             // Cosine, CosineAnnealing: the lowest learning rate
  int64_t total_steps = 0;          // OneCycle: the cycle's steps; Cosine: the decay's steps
  std::optional<double> max_lr;     // OneCycle: the peak learning rate (ParamGroup::max_lr per group)
  double pct_start = 0.3;           // OneCycle: fraction of total_steps spent rising
  std::string anneal_strategy = "cos";  // OneCycle: "cos" or "linear"
  double div_factor = 25.0;         // OneCycle: initial lr = max_lr / div_factor
  double final_div_factor = 1e4;    // OneCycle: final lr = initial lr / final_div_factor
  bool three_phase = false;         // OneCycle: rise, fall to the initial lr, then to the final lr
  bool cycle_momentum = true;       // OneCycle: anneal SGD's momentum or Adam's beta1 (PyTorch's
                                    // default, on); an Error with Adagrad, which has neither
  double base_momentum = 0.85;      // OneCycle: momentum at the peak learning rate
  double max_momentum = 0.95;       // OneCycle: momentum at the initial and final learning rates
  std::vector<LrScheduler> schedulers;  // Sequential: the schedulers, one more than milestones
};

// A parameter group, as an entry of a torch.optim optimizer's param_groups: the parameters it
// names and the hyperparameters it sets; an unset one takes MakeTrainableOptions' value (and
// for max_lr, base_momentum, max_momentum the scheduler's). Parameters named by no group form
// one more group with the top-level values. Errors: a name or pattern that matches no
// trainable initializer (one a --freeze/--train excludes counts as trainable and stays fixed),
// a parameter in two groups, a hyperparameter the optimizer does not have or out of PyTorch's
// range (e.g. beta1 with Sgd, a negative lr, nesterov with momentum 0 or dampening != 0).
struct ParamGroup {
  std::vector<std::string> params;    // exact initializer names
  std::vector<std::string> patterns;  // regexes (ECMAScript, full match) of initializer names
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> momentum, dampening;  // Sgd, Momentum, Nesterov
  std::optional<bool> nesterov;               // Sgd, Momentum, Nesterov
  std::optional<double> beta1, beta2;         // Adam, AdamW (PyTorch's betas)
  std::optional<double> eps;                  // Adagrad, Adam, AdamW
  std::optional<double> lr_decay;             // Adagrad
  std::optional<double> initial_accumulator_value;  // Adagrad: the group's sum starts here. PyTorch
                                                    // 2.13 starts every group at the constructor's
                                                    // value and ignores a group's own entry
  std::optional<double> max_lr, base_momentum, max_momentum;  // OneCycle
};

// The schedule is LrScheduler's fields, inherited: options.schedule, options.gamma, ...
struct MakeTrainableOptions : LrScheduler {
  Loss loss = Loss::CrossEntropy;
  Reduction reduction = Reduction::Mean;
  std::string output;        // the model output the loss reads; empty: the only output
  std::string label;         // the label input's name; empty: "label"
  std::string loss_graph;    // a custom loss: path of a model whose inputs are named after model
                             // outputs and labels and whose single output is the scalar loss
  Optimizer optimizer = Optimizer::Sgd;
  double lr = 0.01;          // the base learning rate
  double momentum = 0.9;     // Momentum, Nesterov (Sgd: 0)
  double dampening = 0;      // Sgd, Momentum: the gradient's weight in the buffer is 1 - dampening
  double beta1 = 0.9, beta2 = 0.999;  // Adam, AdamW
  std::optional<double> eps;  // default: 1e-8 (Adam, AdamW), 1e-10 (Adagrad)
  double weight_decay = 0;   // L2 added to the gradient; decoupled for AdamW (PyTorch's AdamW
                             // default is 0.01, 0 here)
  double lr_decay = 0;       // Adagrad: step t uses lr / (1 + t lr_decay)
  double initial_accumulator_value = 0;  // Adagrad: the sum of squares' initial value
  std::vector<ParamGroup> param_groups;
  int64_t warmup_steps = 0;  // > 0: the scheduled lr times min(1, (t + 1) / warmup_steps)
  std::optional<double> grad_clip_norm;
  std::vector<std::string> freeze;  // regexes (ECMAScript, full match) of initializers to keep fixed
  std::vector<std::string> train;   // if not empty: only initializers matching one of these
  Init init = Init::Keep;
  double init_std = 0.01;    // Normal
  bool replace = false;      // replace an existing training_info instead of failing
};

// The names `onnxtrain make-trainable` and Python's onnxtrain.make_trainable accept for each
// choice (docs/make-trainable.md): "cross_entropy", "mean", "adamw", "onecycle", ...
const std::map<std::string, Loss>& loss_names();
const std::map<std::string, Reduction>& reduction_names();
const std::map<std::string, Optimizer>& optimizer_names();
const std::map<std::string, Schedule>& schedule_names();
// Throws Error "OPTION: 'NAME' is not one of VALID".
[[noreturn]] void throw_choice_error(const std::string& option, const std::string& name, const std::string& valid);
// The choice called `name` among `names`; throws Error "OPTION: 'NAME' is not one of A, B, ...".
template <class T>
T choice_named(const std::map<std::string, T>& names, const std::string& name, const std::string& option) {
  const auto it = names.find(name);
  if (it != names.end()) return it->second;
  std::string valid;
  for (const auto& entry : names) valid += (valid.empty() ? "" : ", ") + entry.first;
  throw_choice_error(option, name, valid);
}
// ParamGroup's and LrScheduler's fields by their keys in the CLI's --param-group and
// --scheduler specs and in the Python package's param_group and scheduler dicts: PyTorch's
// argument names ("lr", "weight_decay", ..., "T_max", also spelled "t_max" as its flag is).
using ParamGroupNumber = std::optional<double> ParamGroup::*;
using SchedulerNumber = double LrScheduler::*;
using SchedulerInteger = int64_t LrScheduler::*;
const std::map<std::string, ParamGroupNumber>& param_group_numbers();
const std::map<std::string, SchedulerNumber>& scheduler_numbers();
const std::map<std::string, SchedulerInteger>& scheduler_integers();
// Sets options.init (and init_std) from "keep", "xavier", "he" or "normal:STD"; throws Error
// naming `option` for anything else.
void set_init(MakeTrainableOptions& options, const std::string& text, const std::string& option);

// The model with training_info added. Algorithm outputs: "onnxtrain.loss" (the parameters'
// type), "onnxtrain.lr" (float32: the learning rate of the first group, param_groups[0] or,
// without param_groups, the only one), with param_groups also "onnxtrain.param_groups.K.lr"
// (float64) for each K, then the new values of the variables. Throws Error for: a model that
// already has training_info (unless replace), an output that does not exist or is ambiguous, a
// loss that does not fit the output's type, a freeze/train regex that matches no initializer,
// nothing left to train, a name the program needs that the model already uses, and an invalid
// optimizer, parameter group or schedule option (named in the message).
onnx::ModelProto make_trainable(const onnx::ModelProto& model, const MakeTrainableOptions& options,
                                const std::string& source = "model");

// The inference model: training_info dropped (with the ai.onnx.preview.training import if
// nothing else uses it); ModelProto.graph kept with its current initializers.
onnx::ModelProto export_inference(const onnx::ModelProto& model);

}  // namespace onnxtrain::training
