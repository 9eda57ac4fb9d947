// make_trainable and export_inference on a hand-built classifier: the program validates and
// trains, the options that shape it (clipping, init, custom loss, freeze) do what they say,
// and every bad option is a clear Error. Numerical parity with PyTorch for each loss,
// optimizer and schedule is tests/parity/make_trainable_parity.py.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "runtime/fusion.h"
#include "test_util.h"

namespace onnxtrain::training {
namespace {

using testing::typed_value;

// logits [N, 3] = x [N, 4] . W [4, 3] + b [3], plus an integer initializer the loss never sees.
onnx::ModelProto classifier(int opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  auto& g = *m.mutable_graph();
  g.set_name("classifier");
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, 4});
  std::vector<float> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(static_cast<int>(i % 5) - 2);
  io::tensor_to_proto(Tensor::from_vector<float>({4, 3}, w), "W", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<float>({3}, {0.1f, 0.0f, -0.1f}), "b", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<int64_t>({1}, {3}), "unused_shape", *g.add_initializer());
  auto* mm = g.add_node();
  mm->set_op_type("MatMul");
  mm->add_input("x");
  mm->add_input("W");
  mm->add_output("xw");
  auto* add = g.add_node();
  add->set_op_type("Add");
  add->add_input("xw");
  add->add_input("b");
  add->add_output("logits");
  typed_value(g.add_output(), "logits", onnx::TensorProto::FLOAT, {-1, 3});
  return m;
}

runtime::NamedTensors batch() {
  std::vector<float> x(24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  return {{"x", Tensor::from_vector<float>({6, 4}, x)},
          {"label", Tensor::from_vector<int64_t>({6}, {0, 1, 2, 0, 1, 2})}};
}

std::string error_of(const onnx::ModelProto& model, const MakeTrainableOptions& options) {
  try {
    make_trainable(model, options, "m.onnx");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MakeTrainable, DefaultProgramValidatesAndTrains) {
  const onnx::ModelProto model = make_trainable(classifier(), {});
  EXPECT_NO_THROW(validate_training_info(model, "m.onnx"));
  TrainingSession session(model);
  session.initialize();
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    const double loss = session.step(batch()).at("onnxtrain.loss").to_double_vector()[0];
    if (s == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first * 0.9);
  // The integer initializer is not a variable.
  EXPECT_FALSE(session.state().contains("unused_shape"));
  EXPECT_TRUE(session.state().contains("W"));
}

// Models of any opset the runtime serves: below 13 they are upgraded with ONNX's version
// converter, newer ones keep their opset (the program's ops at that opset).
TEST(MakeTrainable, OldAndNewOpsetsTrain) {
  for (int opset : {7, 9, 12, 13, 18, 21, 28}) {
    const onnx::ModelProto model = make_trainable(classifier(opset), {});
    int imported = 0;
    for (const auto& o : model.opset_import()) {
      if (o.domain().empty()) imported = static_cast<int>(o.version());
    }
    EXPECT_EQ(imported, std::max(opset, 13)) << "opset " << opset;
    TrainingSession session(model);
    session.initialize();
    double first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
      const double loss = session.step(batch()).at("onnxtrain.loss").to_double_vector()[0];
      if (s == 0) first = loss;
      last = loss;
    }
    EXPECT_LT(last, first * 0.9) << "opset " << opset;
  }
}

// y [1, 3] = x * W (float64), loss = mean((y - label)^2), dL/dW = 2/3 (x W - label) x: two
// steps of Adam must be PyTorch's float64 Adam to the last bits. The Adam op's betas are float
// attributes, and float(0.9) moves float64 weights off PyTorch's, so with betas 0.9 and 0.999
// a float64 program writes the update with plain ops and the double betas (this test once
// took float(0.9) and float(0.999) as the reference).
TEST(MakeTrainable, Float64AdamIsPyTorchAdam) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto& g = *m.mutable_graph();
  g.set_name("scale");
  typed_value(g.add_input(), "x", onnx::TensorProto::DOUBLE, {1, 3});
  const std::vector<double> w0{0.5, -1.25, 2.0}, x{1.5, 0.75, -2.0}, label{0.25, 1.0, -1.5};
  io::tensor_to_proto(Tensor::from_vector<double>({3}, w0), "W", *g.add_initializer());
  auto* mul = g.add_node();
  mul->set_op_type("Mul");
  mul->add_input("x");
  mul->add_input("W");
  mul->add_output("y");
  typed_value(g.add_output(), "y", onnx::TensorProto::DOUBLE, {1, 3});
  MakeTrainableOptions options;
  options.loss = Loss::Mse;
  options.optimizer = Optimizer::Adam;
  options.lr = 0.25;
  TrainingSession session(make_trainable(m, options));
  const runtime::NamedTensors feeds{{"x", Tensor::from_vector<double>({1, 3}, x)},
                                    {"label", Tensor::from_vector<double>({1, 3}, label)}};
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<double> w = w0, mom(3, 0.0), var(3, 0.0);
  for (int t = 1; t <= 2; ++t) {
    session.step(feeds);
    for (int i = 0; i < 3; ++i) {
      const double grad = 2.0 / 3.0 * (x[i] * w[i] - label[i]) * x[i];
      mom[i] = b1 * mom[i] + (1 - b1) * grad;
      var[i] = b2 * var[i] + (1 - b2) * grad * grad;
      w[i] -= 0.25 * (mom[i] / (1 - std::pow(b1, t))) / (std::sqrt(var[i] / (1 - std::pow(b2, t))) + eps);
    }
    const std::vector<double> got = session.state().at("W").to_double_vector();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], w[i], 1e-13 * std::abs(w[i])) << "step " << t << ", W[" << i << "]";
  }
}

TEST(MakeTrainable, GradientClippingBoundsTheUpdate) {
  MakeTrainableOptions options;
  options.lr = 1.0;
  options.grad_clip_norm = 0.01;
  TrainingSession session(make_trainable(classifier(), options));
  const auto w0 = session.state().at("W").to_double_vector();
  const auto b0 = session.state().at("b").to_double_vector();
  session.step(batch());
  double norm2 = 0;
  const auto w1 = session.state().at("W").to_double_vector();
  const auto b1 = session.state().at("b").to_double_vector();
  for (size_t i = 0; i < w0.size(); ++i) norm2 += (w1[i] - w0[i]) * (w1[i] - w0[i]);
  for (size_t i = 0; i < b0.size(); ++i) norm2 += (b1[i] - b0[i]) * (b1[i] - b0[i]);
  EXPECT_NEAR(std::sqrt(norm2), 0.01, 1e-4);  // lr 1: the step is the clipped gradient
}

TEST(MakeTrainable, InitRedrawsWeightsAndZeroesBiases) {
  MakeTrainableOptions options;
  options.init = Init::Xavier;
  TrainingSession session(make_trainable(classifier(), options), {.seed = 5});
  const auto w0 = session.state().at("W").to_double_vector();
  session.initialize();
  const auto w1 = session.state().at("W").to_double_vector();
  const double bound = std::sqrt(6.0 / (4 + 3));  // Glorot: sqrt(6 / (fan_in + fan_out))
  EXPECT_NE(w0, w1);
  for (double v : w1) EXPECT_LE(std::abs(v), bound);
  EXPECT_EQ(session.state().at("b").to_double_vector(), (std::vector<double>{0, 0, 0}));
}

// The initialization graph fills each optimizer state (and, with --init, each bias) with a
// ConstantOfShape of its dims: its initializers are int64 shapes, never a tensor of the state's
// size, and the states it makes have the parameters' shapes and the initial value.
TEST(MakeTrainable, InitializationGraphHoldsShapesNotStates) {
  for (Optimizer optimizer : {Optimizer::Adam, Optimizer::Adagrad}) {
    MakeTrainableOptions options;
    options.optimizer = optimizer;
    options.init = Init::Xavier;
    options.initial_accumulator_value = 0.25;
    const onnx::ModelProto model = make_trainable(classifier(), options);
    const onnx::GraphProto& init = model.training_info(0).initialization();
    for (const auto& t : init.initializer()) {  // shapes of rank-2 and rank-1 tensors, the step counter
      EXPECT_EQ(t.data_type(), onnx::TensorProto::INT64) << t.name();
      EXPECT_LE(t.dims_size(), 1) << t.name();
      EXPECT_LE(t.dims_size() == 0 ? 1 : t.dims(0), 2) << t.name();
    }
    int fills = 0;
    for (const auto& node : init.node()) fills += node.op_type() == "ConstantOfShape";
    const int states = optimizer == Optimizer::Adam ? 4 : 2;  // m and v, or the sum, of W and b
    EXPECT_EQ(fills, states + 1) << "and b's zeros";
    TrainingSession session(model);
    session.initialize();
    const std::string prefix = optimizer == Optimizer::Adam ? "onnxtrain.adam_v." : "onnxtrain.adagrad_sum.";
    const double initial = optimizer == Optimizer::Adam ? 0 : 0.25;
    const Tensor& state_w = session.state().at(prefix + "W");
    EXPECT_EQ(state_w.shape(), (Shape{4, 3}));
    EXPECT_EQ(state_w.to_double_vector(), std::vector<double>(12, initial));
    EXPECT_EQ(session.state().at(prefix + "b").to_double_vector(), std::vector<double>(3, initial));
    EXPECT_EQ(session.state().at("b").to_double_vector(), (std::vector<double>{0, 0, 0}));
  }
}

TEST(MakeTrainable, FreezeAndTrainSelectVariables) {
  MakeTrainableOptions options;
  options.freeze = {"b"};
  const onnx::ModelProto model = make_trainable(classifier(), options);
  TrainingSession session(model);
  const Tensor b0 = session.state().contains("b") ? session.state().at("b") : Tensor();
  EXPECT_FALSE(b0.defined());  // a frozen initializer is a constant, not a variable
  options.freeze.clear();
  options.train = {"W"};
  TrainingSession only_w(make_trainable(classifier(), options));
  EXPECT_TRUE(only_w.state().contains("W"));
  EXPECT_FALSE(only_w.state().contains("b"));
}

TEST(MakeTrainable, CustomLossGraph) {
  // loss = ReduceSum(logits * target): a model whose inputs are a model output and a label.
  onnx::ModelProto loss;
  loss.set_ir_version(8);
  loss.add_opset_import()->set_version(17);
  auto& g = *loss.mutable_graph();
  g.set_name("loss");
  typed_value(g.add_input(), "logits", onnx::TensorProto::FLOAT, {-1, 3});
  typed_value(g.add_input(), "target", onnx::TensorProto::FLOAT, {-1, 3});
  auto* mul = g.add_node();
  mul->set_op_type("Mul");
  mul->add_input("logits");
  mul->add_input("target");
  mul->add_output("prod");
  auto* sum = g.add_node();
  sum->set_op_type("ReduceSum");
  sum->add_input("prod");
  sum->add_output("value");
  auto* keep = sum->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  typed_value(g.add_output(), "value", onnx::TensorProto::FLOAT, {});
  const auto dir = std::filesystem::temp_directory_path() / ("onnxtrain_loss_graph_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  io::save_model(loss, dir / "loss.onnx");
  MakeTrainableOptions options;
  options.loss_graph = (dir / "loss.onnx").string();
  TrainingSession session(make_trainable(classifier(), options));
  auto feeds = batch();
  feeds.erase("label");
  feeds["target"] = Tensor::from_vector<float>({6, 3}, std::vector<float>(18, 1.0f));
  const auto out = session.step(feeds);
  EXPECT_TRUE(out.contains("onnxtrain.loss"));
  std::filesystem::remove_all(dir);
}

TEST(MakeTrainable, BadOptionsAreClearErrors) {
  const onnx::ModelProto model = classifier();
  MakeTrainableOptions o;
  o.output = "nope";
  EXPECT_NE(error_of(model, o).find("no output 'nope' (outputs: logits)"), std::string::npos);
  o = {};
  o.freeze = {"nothing.*"};
  EXPECT_NE(error_of(model, o).find("--freeze 'nothing.*' matches no initializer"), std::string::npos);
  o = {};
  o.train = {"unused_shape"};
  EXPECT_NE(error_of(model, o).find("--train 'unused_shape' matches no trainable initializer"), std::string::npos);
  o = {};
  o.freeze = {"W", "b"};
  EXPECT_NE(error_of(model, o).find("nothing to train"), std::string::npos);
  o = {};
  o.freeze = {"("};
  EXPECT_NE(error_of(model, o).find("not a valid regular expression"), std::string::npos);
  o = {};
  o.schedule = Schedule::Cosine;
  EXPECT_NE(error_of(model, o).find("--total-steps"), std::string::npos);
  // A label that the model already uses as a name.
  o = {};
  o.label = "W";
  EXPECT_NE(error_of(model, o).find("needs the name 'W'"), std::string::npos);
  // Cross-entropy needs class scores of rank >= 2.
  onnx::ModelProto flat = classifier();
  flat.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()->RemoveLast();
  EXPECT_NE(error_of(flat, {}).find("needs [N, C, ...] class scores"), std::string::npos);
  // Running it twice.
  const onnx::ModelProto trainable = make_trainable(model, {});
  EXPECT_NE(error_of(trainable, {}).find("already has training_info"), std::string::npos);
  o = {};
  o.replace = true;
  EXPECT_EQ(make_trainable(trainable, o).training_info_size(), 1);
}

TEST(ExportInference, KeepsTheTrainedWeightsAndDropsTheProgram) {
  TrainingSession session(make_trainable(classifier(), {}));
  for (int s = 0; s < 3; ++s) session.step(batch());
  const auto dir = std::filesystem::temp_directory_path() / ("onnxtrain_export_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  session.save(dir / "trained.onnx");
  const onnx::ModelProto exported = export_inference(io::load_model(dir / "trained.onnx"));
  EXPECT_EQ(exported.training_info_size(), 0);
  for (const auto& o : exported.opset_import()) EXPECT_NE(o.domain(), "ai.onnx.preview.training");
  runtime::Session inference(exported);
  const auto feeds = runtime::NamedTensors{{"x", batch().at("x")}};
  testing::expect_close(inference.run(feeds).at("logits"), session.infer(feeds).at("logits"), 0, 0);
  std::filesystem::remove_all(dir);
}

// The runtime runs make-trainable's Adam (Div nodes -> Adam -> Mul nodes, for PyTorch's epsilon
// placement) as one ai.onnxtrain.ScaledAdam node; training with and without the fusion agrees.
int count_ops(const onnx::GraphProto& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.node()) n += node.op_type() == op;
  return n;
}

TEST(Fusion, ScaledAdamReplacesTheDivAdamMulPattern) {
  for (Optimizer optimizer : {Optimizer::Adam, Optimizer::AdamW}) {
    MakeTrainableOptions options;
    options.optimizer = optimizer;
    options.weight_decay = 0.01;
    const onnx::ModelProto model = make_trainable(classifier(), options);
    onnx::GraphProto algorithm = model.training_info(0).algorithm();
    const int nodes = algorithm.node_size();
    ASSERT_EQ(count_ops(algorithm, "Adam"), 1);
    EXPECT_EQ(runtime::fuse_scaled_adam(algorithm), 1);
    EXPECT_EQ(count_ops(algorithm, "Adam"), 0);
    EXPECT_EQ(count_ops(algorithm, "ScaledAdam"), 1);
    // Two parameters: three Div nodes and two Mul nodes each are gone, and with AdamW the Mul
    // making each decayed parameter (ScaledAdam's S_X, attribute x_scaled).
    const bool adamw = optimizer == Optimizer::AdamW;
    EXPECT_EQ(algorithm.node_size(), nodes - 2 * (adamw ? 6 : 5));
    for (const auto& node : algorithm.node()) {
      if (node.op_type() != "ScaledAdam") continue;
      EXPECT_EQ(node.input_size(), 2 + 4 * 2 + (adamw ? 6 : 5));
      EXPECT_EQ(node.attribute_size() > 0 && node.attribute(node.attribute_size() - 1).name() == "x_scaled", adamw);
    }

    TrainingOptions fused, unfused;
    unfused.fuse = false;
    TrainingSession a(model, fused), b(model, unfused);
    for (int s = 0; s < 20; ++s) {
      testing::expect_close(a.step(batch()).at("onnxtrain.loss"), b.step(batch()).at("onnxtrain.loss"), 1e-6, 1e-7);
    }
    for (const auto& [name, value] : b.state()) testing::expect_close(a.state().at(name), value, 1e-5, 1e-7);
  }
}

TEST(Fusion, LeavesAdamAloneWhenAnIntermediateIsRead) {
  MakeTrainableOptions options;
  options.optimizer = Optimizer::Adam;
  onnx::GraphProto algorithm = make_trainable(classifier(), options).training_info(0).algorithm();
  // A scaled gradient that is also a graph output must stay computed.
  for (const auto& node : algorithm.node()) {
    if (node.op_type() == "Div" && node.output(0).find("adam.g_in") != std::string::npos) {
      algorithm.add_output()->set_name(node.output(0));
      break;
    }
  }
  EXPECT_EQ(runtime::fuse_scaled_adam(algorithm), 0);
  EXPECT_EQ(count_ops(algorithm, "Adam"), 1);
  // A divisor of unknown shape (a graph input without a type) might broadcast: no fusion.
  onnx::GraphProto unknown = make_trainable(classifier(), options).training_info(0).algorithm();
  for (auto& node : *unknown.mutable_node()) {
    if (node.op_type() == "Div" && node.output(0).find("adam.v_in") != std::string::npos) node.set_input(1, "divisor");
  }
  unknown.add_input()->set_name("divisor");
  EXPECT_EQ(runtime::fuse_scaled_adam(unknown), 0);
}

// A user found make-trainable writing a Conv -> LRN model (opset 13) that `onnxtrain check`
// rejected. The written model passes what check runs: the ONNX checker, validate_training_info
// and a TrainingSession that plans every graph (cli/commands.cpp); and it trains.
TEST(MakeTrainable, ConvLrnModelPassesCheck) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto& g = *m.mutable_graph();
  g.set_name("conv_lrn");
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, 1, 4, 4});
  std::vector<float> w(18);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * std::cos(static_cast<float>(i));
  io::tensor_to_proto(Tensor::from_vector<float>({2, 1, 3, 3}, w), "W", *g.add_initializer());
  io::tensor_to_proto(Tensor::from_vector<float>({2}, {0.1f, -0.1f}), "B", *g.add_initializer());
  auto* conv = g.add_node();
  conv->set_op_type("Conv");
  conv->add_input("x");
  conv->add_input("W");
  conv->add_input("B");
  conv->add_output("c");
  auto* lrn = g.add_node();
  lrn->set_op_type("LRN");
  lrn->add_input("c");
  lrn->add_output("y");
  *lrn->add_attribute() = testing::attr("size", int64_t{3});
  *lrn->add_attribute() = testing::attr("alpha", 0.5f);
  typed_value(g.add_output(), "y", onnx::TensorProto::FLOAT, {-1, 2, 2, 2});
  const onnx::ModelProto trainable = make_trainable(m, {});
  EXPECT_NO_THROW(onnx::checker::check_model(trainable));
  EXPECT_NO_THROW(validate_training_info(trainable, "m.onnx"));
  TrainingSession session(trainable);
  std::vector<float> x(48);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  const runtime::NamedTensors feeds{{"x", Tensor::from_vector<float>({3, 1, 4, 4}, x)},
                                    {"label", Tensor::from_vector<int64_t>({3, 2, 2}, {0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0})}};
  const double first = session.step(feeds).at("onnxtrain.loss").to_double_vector()[0];
  double last = first;
  for (int s = 0; s < 20; ++s) last = session.step(feeds).at("onnxtrain.loss").to_double_vector()[0];
  EXPECT_LT(last, first);
}

}  // namespace
}  // namespace onnxtrain::training
