// make_trainable — writes the standard training program into an inference model, as
// ModelProto.training_info (one TrainingInfoProto), so that any TrainingInfoProto runtime can
// train it; export_inference goes back to a plain inference model. docs/make-trainable.md maps
// every loss, optimizer and schedule to its ONNX nodes and to its PyTorch equivalent.
//
// The algorithm graph: loss (reading a model output and a new label input) -> Gradient (xs =
// the trainable initializers, y = the loss) -> optional global-norm clipping -> learning rate
// from the iteration counter (the schedule) -> optimizer update; outputs the loss and the
// learning rate. update_binding writes back the parameters, the optimizer state, the counter
// and BatchNormalization running statistics. The initialization graph resets the optimizer
// state and the counter and, with an `init` other than Keep, re-draws the weights.
#pragma once

#include <cstdint>
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
// Optimizers: Sgd (plain ONNX ops), Momentum and Nesterov (ai.onnx.preview.training Momentum),
// Adagrad, Adam, AdamW (Adam with norm_coefficient_post). PyTorch: torch.optim.SGD (momentum,
// nesterov), Adagrad, Adam, AdamW.
enum class Optimizer { Sgd, Momentum, Nesterov, Adagrad, Adam, AdamW };
// Learning-rate schedules over the 0-based step t (PyTorch's scheduler in parentheses):
//   Constant     lr
//   Step         lr gamma^floor(t / step_size)                 (StepLR)
//   Exponential  lr gamma^t                                    (ExponentialLR)
//   Cosine       lr (1 + cos(pi min(t, total) / total)) / 2    (CosineAnnealingLR, eta_min 0)
//   Linear       lr max(0, 1 - t / total)                      (LinearLR 1 -> 0 over total)
// warmup_steps > 0 multiplies by min(1, (t + 1) / warmup_steps) (a LambdaLR of that factor).
enum class Schedule { Constant, Step, Exponential, Cosine, Linear };
// Weight re-initialization in the initialization graph: Keep leaves the exported weights;
// Xavier (Glorot uniform), He (Kaiming normal, fan_in) and Normal (mean 0, init_std) draw
// tensors of rank >= 2 and set rank-1 tensors (biases) to zero.
enum class Init { Keep, Xavier, He, Normal };

struct MakeTrainableOptions {
  Loss loss = Loss::CrossEntropy;
  Reduction reduction = Reduction::Mean;
  std::string output;        // the model output the loss reads; empty: the only output
  std::string label;         // the label input's name; empty: "label"
  std::string loss_graph;    // a custom loss: path of a model whose inputs are named after model
                             // outputs and labels and whose single output is the scalar loss
  Optimizer optimizer = Optimizer::Sgd;
  double lr = 0.01;
  double momentum = 0.9;     // Momentum, Nesterov
  double beta1 = 0.9, beta2 = 0.999;  // Adam, AdamW
  std::optional<double> eps;  // default: 1e-8 (Adam, AdamW), 1e-10 (Adagrad)
  double weight_decay = 0;   // L2 (norm_coefficient); decoupled for AdamW (norm_coefficient_post)
  Schedule schedule = Schedule::Constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;   // Cosine, Linear
  int64_t step_size = 0;     // Step
  double gamma = 0.1;        // Step, Exponential
  std::optional<double> grad_clip_norm;
  std::vector<std::string> freeze;  // regexes (ECMAScript, full match) of initializers to keep fixed
  std::vector<std::string> train;   // if not empty: only initializers matching one of these
  Init init = Init::Keep;
  double init_std = 0.01;    // Normal
  bool replace = false;      // replace an existing training_info instead of failing
};

// The model with training_info added. Throws Error for: a model that already has training_info
// (unless replace), an output that does not exist or is ambiguous, a loss that does not fit
// the output's type, a freeze/train regex that matches no initializer, nothing left to train,
// a name the program needs that the model already uses.
onnx::ModelProto make_trainable(const onnx::ModelProto& model, const MakeTrainableOptions& options,
                                const std::string& source = "model");

// The inference model: training_info dropped (with the ai.onnx.preview.training import if
// nothing else uses it); ModelProto.graph kept with its current initializers.
onnx::ModelProto export_inference(const onnx::ModelProto& model);

}  // namespace onnxtrain::training
