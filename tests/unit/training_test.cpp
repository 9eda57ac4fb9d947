// TrainingSession against hand-built models: a linear regression whose algorithm computes the
// mean-squared-error gradient with plain ONNX ops and updates with Sub, compared with the same
// gradient descent in float64; initialization graphs; two TrainingInfoProtos; validation.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <cmath>
#include <functional>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/training.h"
#include "test_util.h"

namespace onnxtrain::training {
namespace {

using onnxtrain::testing::error_of;

namespace fs = std::filesystem;

// --- model building helpers ---

void value(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name,
           int elem_type, std::vector<int64_t> dims, bool symbolic_batch = false) {
  auto* v = list->Add();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  auto* shape = t->mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i == 0 && symbolic_batch) shape->add_dim()->set_dim_param("N");
    else shape->add_dim()->set_dim_value(dims[i]);
  }
}

onnx::NodeProto* node(onnx::GraphProto& g, const std::string& op, std::vector<std::string> in,
                      std::vector<std::string> out) {
  auto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(op + "_" + out[0]);
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

void int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void initializer(onnx::GraphProto& g, const std::string& name, const Tensor& t) {
  io::tensor_to_proto(t, name, *g.add_initializer());
}

void bind(google::protobuf::RepeatedPtrField<onnx::StringStringEntryProto>* list, const std::string& key,
          const std::string& v) {
  auto* e = list->Add();
  e->set_key(key);
  e->set_value(v);
}

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

const std::vector<float> kW0 = {0.5f, -0.25f, 0.1f};
constexpr float kB0 = 0.2f;
constexpr float kLr = 0.1f;

// Y = X·W + B with X [N,3]; the algorithm: loss = mean((Y - Y_true)²), dY = 2/N (Y - Y_true),
// dW = Xᵀ·dY, dB = sum(dY), W -= lr·dW, B -= lr·dB, T += 1.
onnx::ModelProto linear_regression() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto& g = *m.mutable_graph();
  g.set_name("linear");
  value(g.mutable_input(), "X", kFloat, {4, 3}, true);
  initializer(g, "W", Tensor::from_vector<float>({3, 1}, kW0));
  initializer(g, "B", Tensor::from_vector<float>({1}, {kB0}));
  node(g, "MatMul", {"X", "W"}, {"XW"});
  node(g, "Add", {"XW", "B"}, {"Y"});
  value(g.mutable_output(), "Y", kFloat, {4, 1}, true);

  auto* info = m.add_training_info();
  auto& a = *info->mutable_algorithm();
  a.set_name("sgd");
  value(a.mutable_input(), "Y_true", kFloat, {4, 1}, true);
  initializer(a, "lr", Tensor::scalar<float>(kLr));
  initializer(a, "two", Tensor::scalar<float>(2.0f));
  initializer(a, "T", Tensor::scalar<int64_t>(0));
  initializer(a, "one", Tensor::scalar<int64_t>(1));
  node(a, "Sub", {"Y", "Y_true"}, {"diff"});
  node(a, "Mul", {"diff", "diff"}, {"sq"});
  int_attr(node(a, "ReduceMean", {"sq"}, {"loss"}), "keepdims", 0);
  node(a, "Shape", {"X"}, {"x_shape"});
  int_attr(node(a, "Gather", {"x_shape", "zero_index"}, {"n_int"}), "axis", 0);
  initializer(a, "zero_index", Tensor::scalar<int64_t>(0));
  int_attr(node(a, "Cast", {"n_int"}, {"n"}), "to", kFloat);
  node(a, "Div", {"two", "n"}, {"scale"});
  node(a, "Mul", {"diff", "scale"}, {"dY"});
  node(a, "Transpose", {"X"}, {"Xt"});
  node(a, "MatMul", {"Xt", "dY"}, {"dW"});
  int_attr(node(a, "ReduceSum", {"dY"}, {"dB"}), "keepdims", 0);  // all axes: a scalar
  node(a, "Mul", {"lr", "dW"}, {"step_W"});
  node(a, "Sub", {"W", "step_W"}, {"W_new"});
  node(a, "Mul", {"lr", "dB"}, {"step_B"});
  node(a, "Sub", {"B", "step_B"}, {"B_new"});
  node(a, "Add", {"T", "one"}, {"T_new"});
  value(a.mutable_output(), "loss", kFloat, {});
  value(a.mutable_output(), "W_new", kFloat, {3, 1});
  value(a.mutable_output(), "B_new", kFloat, {1});
  value(a.mutable_output(), "T_new", kInt64, {});
  bind(info->mutable_update_binding(), "W", "W_new");
  bind(info->mutable_update_binding(), "B", "B_new");
  bind(info->mutable_update_binding(), "T", "T_new");
  return m;
}

// The data: Y_true = X·[1, 2, -1] + 0.5.
Tensor x_data() { return Tensor::from_vector<float>({4, 3}, {1, 0, 2, 0, 1, 1, 3, 1, 0, -1, 2, 1}); }
Tensor y_data() {
  const std::vector<float> x = {1, 0, 2, 0, 1, 1, 3, 1, 0, -1, 2, 1};
  std::vector<float> y(4);
  for (int i = 0; i < 4; ++i) y[i] = x[i * 3] * 1 + x[i * 3 + 1] * 2 + x[i * 3 + 2] * -1 + 0.5f;
  return Tensor::from_vector<float>({4, 1}, y);
}

// The same gradient descent in float64: returns the losses of `steps` steps.
std::vector<double> reference_losses(int steps, std::vector<double>& w, double& b) {
  const auto x = x_data().to_double_vector();
  const auto y = y_data().to_double_vector();
  w.assign(kW0.begin(), kW0.end());
  b = kB0;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> d(4);
    double loss = 0;
    for (int i = 0; i < 4; ++i) {
      d[i] = x[i * 3] * w[0] + x[i * 3 + 1] * w[1] + x[i * 3 + 2] * w[2] + b - y[i];
      loss += d[i] * d[i] / 4;
    }
    losses.push_back(loss);
    std::vector<double> dw(3, 0.0);
    double db = 0;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) dw[j] += x[i * 3 + j] * d[i] * 0.5;
      db += d[i] * 0.5;
    }
    for (int j = 0; j < 3; ++j) w[j] -= static_cast<double>(kLr) * dw[j];
    b -= static_cast<double>(kLr) * db;
  }
  return losses;
}

runtime::NamedTensors feeds() { return {{"X", x_data()}, {"Y_true", y_data()}}; }

// --- tests ---

TEST(TrainingSession, LinearRegressionMatchesFloat64GradientDescent) {
  TrainingSession session(linear_regression(), {}, {}, "linear.onnx");
  std::vector<double> w;
  double b;
  const auto expected = reference_losses(20, w, b);
  for (int s = 0; s < 20; ++s) {
    const auto out = session.step(feeds());
    EXPECT_NEAR(out.at("loss").to_double_vector()[0], expected[static_cast<size_t>(s)], 1e-5 * (1 + expected[static_cast<size_t>(s)]));
  }
  EXPECT_LT(expected.back(), expected.front() * 0.1);  // the loss really falls
  const auto got_w = session.state().at("W").to_double_vector();
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(got_w[static_cast<size_t>(j)], w[static_cast<size_t>(j)], 1e-5);
  EXPECT_NEAR(session.state().at("B").to_double_vector()[0], b, 1e-5);
  EXPECT_EQ(session.state().at("T").to_int64_vector("T")[0], 20);
  // The inference graph sees the trained weights; constants are not variables.
  EXPECT_EQ(session.state().count("lr"), 0u);
  const auto y = session.infer({{"X", x_data()}}).at("Y").to_double_vector();
  EXPECT_NEAR(y[0], x_data().to_double_vector()[0] * w[0] + x_data().to_double_vector()[2] * w[2] + b, 1e-4);
}

// The step's memory plan is made by the first step and reused by the next ones of the same
// shapes; the variables are not in it.
TEST(TrainingSession, StepArenaIsThePlansOfTheFirstStep) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer build: no arena (runtime/memory_plan.cpp)";
#endif
  TrainingSession session(linear_regression(), {}, {}, "linear.onnx");
  EXPECT_EQ(session.step_arena_bytes(), 0u);
  session.step(feeds());
  const size_t bytes = session.step_arena_bytes();
  EXPECT_GT(bytes, 0u);
  session.step(feeds());
  EXPECT_EQ(session.step_arena_bytes(), bytes);
}

TEST(TrainingSession, InitializationResetsVariablesAndTheCounter) {
  onnx::ModelProto m = linear_regression();
  auto* info = m.mutable_training_info(0);
  auto& init = *info->mutable_initialization();
  init.set_name("reset");
  initializer(init, "w_zero", Tensor::zeros(DataType::Float32, {3, 1}));
  initializer(init, "t_zero", Tensor::scalar<int64_t>(0));
  node(init, "Identity", {"w_zero"}, {"W_init"});
  node(init, "Identity", {"t_zero"}, {"T_init"});
  value(init.mutable_output(), "W_init", kFloat, {3, 1});
  value(init.mutable_output(), "T_init", kInt64, {});
  bind(info->mutable_initialization_binding(), "W", "W_init");
  bind(info->mutable_initialization_binding(), "T", "T_init");
  TrainingSession session(m);
  session.step(feeds());
  session.step(feeds());
  EXPECT_EQ(session.state().at("T").to_int64_vector("T")[0], 2);
  session.initialize();
  EXPECT_EQ(session.state().at("T").to_int64_vector("T")[0], 0);
  EXPECT_EQ(session.state().at("W").to_double_vector(), (std::vector<double>{0, 0, 0}));
  EXPECT_NE(session.state().at("B").to_double_vector()[0], static_cast<double>(kB0));  // not bound: kept
}

TEST(TrainingSession, RunsTrainingInfoEntriesInOrder) {
  // Entry 0 doubles V; entry 1 adds 1 to V. In order, one step maps V to 2V + 1.
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto& g = *m.mutable_graph();
  g.set_name("g");
  initializer(g, "V", Tensor::scalar<float>(3.0f));
  node(g, "Identity", {"V"}, {"out"});
  value(g.mutable_output(), "out", kFloat, {});
  auto* first = m.add_training_info();
  node(*first->mutable_algorithm(), "Add", {"V", "V"}, {"doubled"});
  value(first->mutable_algorithm()->mutable_output(), "doubled", kFloat, {});
  bind(first->mutable_update_binding(), "V", "doubled");
  auto* second = m.add_training_info();
  initializer(*second->mutable_algorithm(), "one", Tensor::scalar<float>(1.0f));
  node(*second->mutable_algorithm(), "Add", {"V", "one"}, {"plus_one"});
  value(second->mutable_algorithm()->mutable_output(), "plus_one", kFloat, {});
  bind(second->mutable_update_binding(), "V", "plus_one");
  // Keys must be unique across update_bindings: this model is invalid as written...
  EXPECT_NE(error_of([&] { TrainingSession s(m); }).find("bound more than once"), std::string::npos);
  // ...so the second entry updates another variable, U, from the new V.
  initializer(g, "U", Tensor::scalar<float>(0.0f));
  second->mutable_update_binding(0)->set_key("U");
  TrainingSession session(m);
  session.step({});
  EXPECT_EQ(session.state().at("V").to_double_vector()[0], 6.0);
  EXPECT_EQ(session.state().at("U").to_double_vector()[0], 7.0);  // saw V = 6
  session.step(1, {});  // only the second algorithm
  EXPECT_EQ(session.state().at("V").to_double_vector()[0], 6.0);
  EXPECT_EQ(session.state().at("U").to_double_vector()[0], 7.0);
  EXPECT_THROW(session.step(2, {}), Error);
}

TEST(TrainingSession, FailedStepsChangeNoVariable) {
  TrainingSession session(linear_regression(), {}, {}, "linear.onnx");
  session.step(feeds());
  const auto before = session.state();
  auto unchanged = [&] {
    for (const auto& [name, t] : before) EXPECT_EQ(session.state().at(name).to_double_vector(), t.to_double_vector()) << name;
  };
  std::string e = error_of([&] { session.step({{"X", x_data()}}); });
  EXPECT_NE(e.find("missing feed for input 'Y_true'"), std::string::npos) << e;
  unchanged();
  e = error_of([&] { session.step({{"X", Tensor::zeros(DataType::Float32, {4, 2})}, {"Y_true", y_data()}}); });
  EXPECT_NE(e.find("'X'"), std::string::npos) << e;
  unchanged();
  Tensor bad_y = y_data().clone();
  bad_y.data<float>()[0] = std::nanf("");
  e = error_of([&] { session.step({{"X", x_data()}, {"Y_true", bad_y}}); });
  EXPECT_NE(e.find("NaN"), std::string::npos) << e;
  unchanged();
  e = error_of([&] { session.step({{"X", x_data()}, {"Y_true", y_data()}, {"extra", y_data()}}); });
  EXPECT_NE(e.find("'extra' is not an input"), std::string::npos) << e;
  unchanged();
  // With the guard off, the NaN step goes through.
  TrainingSession unguarded(linear_regression(), {.nan_guard = false});
  unguarded.step({{"X", x_data()}, {"Y_true", bad_y}});
  EXPECT_TRUE(std::isnan(unguarded.state().at("W").to_double_vector()[0]));
}

// The NaN guard splits a large bound value between threads: an Inf in its last element, which
// only the last chunk sees, must still reject the step.
TEST(TrainingSession, NaNGuardSeesEveryElementOfALargeValue) {
  const int64_t n = 200003;
  std::vector<float> v(static_cast<size_t>(n), 1.0f);
  v.back() = 1e38f;
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto& g = *m.mutable_graph();
  g.set_name("g");
  initializer(g, "V", Tensor::from_vector<float>({n}, v));
  node(g, "Identity", {"V"}, {"out"});
  value(g.mutable_output(), "out", kFloat, {n});
  auto* info = m.add_training_info();
  auto& a = *info->mutable_algorithm();
  value(a.mutable_input(), "s", kFloat, {});
  node(a, "Mul", {"V", "s"}, {"scaled"});
  value(a.mutable_output(), "scaled", kFloat, {n});
  bind(info->mutable_update_binding(), "V", "scaled");
  TrainingSession session(m);
  session.step({{"s", Tensor::scalar<float>(2.0f)}});  // 2e38 is still finite
  EXPECT_EQ(session.state().at("V").to_double_vector().back(), double{2e38f});
  const std::string e = error_of([&] { session.step({{"s", Tensor::scalar<float>(2.0f)}}); });  // 4e38: Inf
  EXPECT_NE(e.find("NaN or Inf"), std::string::npos) << e;
  EXPECT_EQ(session.state().at("V").to_double_vector().front(), 2.0);  // unchanged
}

// An optimizer that checks its outputs for the NaN guard while writing them (stage() skips
// them): an Inf in one element of output `bad` alone — first element (scalar head), middle
// (vector loop), last (scalar tail), in float32 (AVX path) and float64 (generic path) — rejects
// the step and changes no variable; with the guard off the step goes through. `op` updates W
// with gradient G and the states named `states`; a gradient element of huge32 (float32) or
// huge64 (float64) makes state `bad_state` (W or one of `states`) Inf at learning rate `lr`.
void check_outputs_guarded(const std::string& op, const std::vector<std::string>& states,
                           const std::vector<onnx::AttributeProto>& attributes, float lr, const std::string& bad_state,
                           double huge32, double huge64) {
  const int64_t n = 100003;
  for (DataType t : {DataType::Float32, DataType::Float64}) {
    const double huge = t == DataType::Float32 ? huge32 : huge64;
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(13);
    auto* training = m.add_opset_import();
    training->set_domain("ai.onnx.preview.training");
    training->set_version(1);
    auto& g = *m.mutable_graph();
    g.set_name("g");
    std::vector<std::string> variables{"W"}, in{"R", "T", "W", "G"}, out{"W_new"};
    for (const std::string& s : states) {
      variables.push_back(s);
      in.push_back(s);
      out.push_back(s + "_new");
    }
    for (const std::string& name : variables) initializer(g, name, Tensor::zeros(t, {n}));
    node(g, "Identity", {"W"}, {"out"});
    value(g.mutable_output(), "out", static_cast<int>(t), {n});
    auto* info = m.add_training_info();
    auto& a = *info->mutable_algorithm();
    value(a.mutable_input(), "G", static_cast<int>(t), {n});
    initializer(a, "R", Tensor::scalar<float>(lr));
    initializer(a, "T", Tensor::scalar<int64_t>(0));
    auto* update = node(a, op, in, out);
    update->set_domain("ai.onnx.preview.training");
    for (const auto& attribute : attributes) *update->add_attribute() = attribute;
    for (const std::string& name : out) value(a.mutable_output(), name, static_cast<int>(t), {n});
    // Parenthesized: with std::string arguments, argument-dependent lookup would find std::bind.
    for (size_t k = 0; k < out.size(); ++k) (bind)(info->mutable_update_binding(), variables[k], out[k]);
    TrainingSession session(m);
    session.step({{"G", Tensor::from_vector<double>({n}, std::vector<double>(n, 1.0)).cast(t)}});
    const auto before = session.state();
    for (int64_t at : {int64_t{0}, n / 2 + 3, n - 1}) {
      SCOPED_TRACE(op + " " + std::string(dtype_name(t)) + " element " + std::to_string(at));
      std::vector<double> grad(static_cast<size_t>(n), 1.0);
      grad[static_cast<size_t>(at)] = huge;
      const Tensor bad = Tensor::from_vector<double>({n}, grad).cast(t);
      const std::string e = error_of([&] { session.step({{"G", bad}}); });
      EXPECT_NE(e.find("NaN or Inf"), std::string::npos) << e;
      EXPECT_NE(e.find(bad_state + "_new"), std::string::npos) << e;
      for (const auto& [name, value] : before) {
        EXPECT_EQ(session.state().at(name).to_double_vector(), value.to_double_vector()) << name;
      }
      TrainingSession unguarded(m, {.nan_guard = false});
      unguarded.step({{"G", bad}});
      EXPECT_TRUE(std::isinf(unguarded.state().at(bad_state).to_double_vector()[static_cast<size_t>(at)]));
    }
  }
}

// Adam: H_new = (1 - beta) G^2 overflows.
TEST(TrainingSession, AdamOutputsAreCheckedForTheNaNGuard) {
  check_outputs_guarded("Adam", {"V", "H"}, {}, 0.1f, "H", 1e30, 1e200);
}

// Momentum, standard and nesterov: V_new = G at T = 0 stays finite, X_new = X - R V_new (nesterov:
// X - R (G + alpha V_new)) overflows at R = 10.
TEST(TrainingSession, MomentumOutputsAreCheckedForTheNaNGuard) {
  for (const char* mode : {"standard", "nesterov"}) {
    const std::vector<onnx::AttributeProto> attributes{testing::attr("alpha", 0.9f), testing::attr("beta", 1.0f),
                                                       testing::attr("mode", std::string(mode)),
                                                       testing::attr("norm_coefficient", 0.0f)};
    check_outputs_guarded("Momentum", {"V"}, attributes, 10.0f, "W", 1e38, 1e308);
  }
}

TEST(TrainingSession, BindingsMustKeepTypeAndShape) {
  onnx::ModelProto m = linear_regression();
  // Bind W to dW's transpose: [1,3] instead of [3,1].
  auto& a = *m.mutable_training_info(0)->mutable_algorithm();
  node(a, "Transpose", {"W_new"}, {"W_wrong"});
  value(a.mutable_output(), "W_wrong", kFloat, {1, 3});
  m.mutable_training_info(0)->mutable_update_binding(0)->set_value("W_wrong");
  TrainingSession session(m);
  const std::string e = error_of([&] { session.step(feeds()); });
  EXPECT_NE(e.find("W <- W_wrong"), std::string::npos) << e;
  EXPECT_NE(e.find("float32[1,3]"), std::string::npos) << e;
  EXPECT_EQ(session.state().at("T").to_int64_vector("T")[0], 0);  // T's binding was not applied either
  EXPECT_THROW(session.set_state("W", Tensor::zeros(DataType::Float32, {3})), Error);
  EXPECT_THROW(session.set_state("lr", Tensor::scalar<float>(1)), Error);  // a constant
  session.set_state("W", Tensor::zeros(DataType::Float32, {3, 1}));
  EXPECT_EQ(session.state().at("W").to_double_vector(), (std::vector<double>{0, 0, 0}));
}

TEST(TrainingSession, SaveLoadContinueEqualsUninterrupted) {
  const fs::path dir = fs::temp_directory_path() / ("onnxtrain-training-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  TrainingSession straight(linear_regression());
  for (int s = 0; s < 5; ++s) straight.step(feeds());
  TrainingSession first(linear_regression());
  for (int s = 0; s < 3; ++s) first.step(feeds());
  first.save(dir / "checkpoint.onnx");
  TrainingSession resumed(dir / "checkpoint.onnx");
  for (int s = 0; s < 2; ++s) resumed.step(feeds());
  for (const auto& [name, t] : straight.state()) {
    EXPECT_EQ(resumed.state().at(name).to_double_vector(), t.to_double_vector()) << name;  // bit-identical
  }
  // The saved file is still a valid inference model with the trained weights.
  const onnx::ModelProto saved = io::load_model(dir / "checkpoint.onnx");
  EXPECT_EQ(saved.training_info_size(), 1);
  EXPECT_FALSE(saved.training_info(0).has_initialization());  // saving adds no empty graph
  fs::remove_all(dir);
}

// Each validation rule with its own message.
TEST(Validation, RejectsEveryBindingRuleViolation) {
  auto expect_error = [](onnx::ModelProto m, const std::string& part) {
    const std::string e = error_of([&] { validate_training_info(m, "m.onnx"); });
    EXPECT_NE(e.find(part), std::string::npos) << "want '" << part << "', got: " << e;
    const std::string e2 = error_of([&] { TrainingSession s(m, {}, {}, "m.onnx"); });
    EXPECT_FALSE(e2.empty());
  };
  {
    onnx::ModelProto m = linear_regression();
    m.mutable_training_info(0)->mutable_update_binding(0)->set_key("nope");
    expect_error(m, "key 'nope' is not an initializer");
  }
  {
    onnx::ModelProto m = linear_regression();
    m.mutable_training_info(0)->mutable_update_binding(0)->set_value("dW");  // not a graph output
    expect_error(m, "value 'dW' (bound to 'W') is not an output");
  }
  {
    onnx::ModelProto m = linear_regression();
    bind(m.mutable_training_info(0)->mutable_update_binding(), "W", "W_new");
    expect_error(m, "bound more than once");
  }
  {
    onnx::ModelProto m = linear_regression();
    bind(m.mutable_training_info(0)->mutable_initialization_binding(), "W", "W_init");
    expect_error(m, "no initialization graph");
  }
  {
    onnx::ModelProto m = linear_regression();
    auto& init = *m.mutable_training_info(0)->mutable_initialization();
    value(init.mutable_input(), "seed", kFloat, {});
    node(init, "Identity", {"seed"}, {"W_init"});
    value(init.mutable_output(), "W_init", kFloat, {});
    expect_error(m, "initialization has input 'seed'");
  }
  {
    onnx::ModelProto m = linear_regression();
    auto& init = *m.mutable_training_info(0)->mutable_initialization();
    initializer(init, "z", Tensor::zeros(DataType::Float32, {3, 1}));
    node(init, "Identity", {"z"}, {"W_init"});
    value(init.mutable_output(), "W_init", kFloat, {3, 1});
    bind(m.mutable_training_info(0)->mutable_initialization_binding(), "W", "not_there");
    expect_error(m, "value 'not_there' (bound to 'W') is not an output of training_info[0].initialization");
  }
  {
    onnx::ModelProto m = linear_regression();  // an algorithm node produces an inference name
    node(*m.mutable_training_info(0)->mutable_algorithm(), "Identity", {"X"}, {"XW"});
    expect_error(m, "already produced");
  }
  {
    onnx::ModelProto m = linear_regression();  // an inference node reads an algorithm input
    node(*m.mutable_graph(), "Identity", {"Y_true"}, {"leak"});
    expect_error(m, "'Y_true'");
  }
  {
    onnx::ModelProto m = linear_regression();  // the checker: an op with a wrong attribute type
    auto* a = m.mutable_training_info(0)->mutable_algorithm()->mutable_node(0)->add_attribute();
    a->set_name("bogus");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(1);
    expect_error(m, "ONNX checker");
  }
}

}  // namespace
}  // namespace onnxtrain::training
