// The thread-safety contract of session.h and training.h (issue 19): one inference Session run
// from several threads at once, and two TrainingSessions stepping side by side, give exactly
// what the same calls give one after the other. Built into the release tests, and under
// ThreadSanitizer by the `tsan` preset (scripts/test), where any data race fails the run.
//
// Kernels run on one OpenMP thread (threads = 1): the races looked for are between the
// caller's threads, and libgomp is not instrumented for ThreadSanitizer.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "onnxtrain/make_trainable.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_node;
using testing::attr;
using testing::typed_value;

Tensor random_f32(const Shape& shape, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = u(rng);
  return Tensor::from_vector<float>(shape, v);
}

void add_initializer(onnx::GraphProto& g, const std::string& name, const Tensor& t) {
  onnx::TensorProto* p = g.add_initializer();
  p->set_name(name);
  p->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_raw_data(t.raw_data(), t.nbytes());
}

// x[N, 1, 8, 8] -> Conv 4x3x3 (pads 1) -> Relu -> Flatten -> MatMul [256, 10] -> Add b ->
// "logits"[N, 10]; and an If on the batch's first element choosing Softmax or Identity, so
// that a subgraph's runner is exercised too ("probs").
onnx::ModelProto cnn() {
  onnx::ModelProto model = testing::empty_model("cnn");
  onnx::GraphProto& g = *model.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {-1, 1, 8, 8});
  add_initializer(g, "w", random_f32({4, 1, 3, 3}, 1, 0.5f));
  add_initializer(g, "fc", random_f32({256, 10}, 2, 0.1f));
  add_initializer(g, "b", random_f32({10}, 3, 0.1f));
  add_node(g, "Conv", {"x", "w"}, {"conv"})->add_attribute()->CopyFrom(attr("pads", std::vector<int64_t>{1, 1, 1, 1}));
  add_node(g, "Relu", {"conv"}, {"relu"});
  add_node(g, "Flatten", {"relu"}, {"flat"});
  add_node(g, "MatMul", {"flat", "fc"}, {"mm"});
  add_node(g, "Add", {"mm", "b"}, {"logits"});
  typed_value(g.add_output(), "logits", onnx::TensorProto::FLOAT, {-1, 10});
  return model;
}

onnx::ModelProto cnn_with_if() {
  onnx::ModelProto model = cnn();
  onnx::GraphProto& g = *model.mutable_graph();
  add_initializer(g, "zero", Tensor::from_vector<float>(Shape{}, {0.0f}));
  add_node(g, "ReduceSum", {"logits"}, {"total"})->add_attribute()->CopyFrom(attr("keepdims", int64_t{0}));
  add_node(g, "Greater", {"total", "zero"}, {"positive"});
  onnx::GraphProto then_branch, else_branch;
  then_branch.set_name("softmax");
  add_node(then_branch, "Softmax", {"logits"}, {"p_then"});
  typed_value(then_branch.add_output(), "p_then", onnx::TensorProto::FLOAT, {});
  else_branch.set_name("identity");
  add_node(else_branch, "Identity", {"logits"}, {"p_else"});
  typed_value(else_branch.add_output(), "p_else", onnx::TensorProto::FLOAT, {});
  onnx::NodeProto* branch = add_node(g, "If", {"positive"}, {"probs"});
  testing::graph_attr(branch, "then_branch", then_branch);
  testing::graph_attr(branch, "else_branch", else_branch);
  typed_value(g.add_output(), "probs", onnx::TensorProto::FLOAT, {});
  return model;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Concurrency, OneInferenceSessionFromSeveralThreads) {
  runtime::SessionOptions options;
  options.threads = 1;
  runtime::Session session(cnn_with_if(), options);
  // Batches of three sizes (three plans), several inputs of each: calls of one signature
  // contend for its plan; calls of different ones plan at the same time.
  std::vector<Tensor> inputs;
  for (int i = 0; i < 9; ++i) inputs.push_back(random_f32({1 + i % 3 * 7, 1, 8, 8}, 100 + i, 1.0f));
  std::vector<runtime::NamedTensors> want;
  for (const Tensor& x : inputs) want.push_back(runtime::Session(cnn_with_if(), options).run({{"x", x}}));

  constexpr int kThreads = 4, kCalls = 30;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int c = 0; c < kCalls; ++c) {
          const size_t k = static_cast<size_t>(t * 5 + c) % inputs.size();
          const runtime::NamedTensors got = session.run({{"x", inputs[k]}});
          for (const char* name : {"logits", "probs"}) {
            if (!same_bits(got.at(name), want[k].at(name))) {
              failures[static_cast<size_t>(t)] = "thread " + std::to_string(t) + ", call " + std::to_string(c) + ": '" +
                                                 name + "' differs from the single-threaded run";
              return;
            }
          }
        }
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  // Bad feeds from several threads at once are errors, as from one.
  std::vector<std::thread> bad;
  std::vector<std::string> messages(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    bad.emplace_back([&, t] {
      messages[static_cast<size_t>(t)] = testing::error_of([&] { session.run({{"x", random_f32({2, 3}, 7, 1.0f)}}); });
    });
  }
  for (std::thread& t : bad) t.join();
  for (const std::string& m : messages) EXPECT_NE(m.find("input 'x' expects rank 4"), std::string::npos) << m;
}

TEST(Concurrency, TwoTrainingSessionsSideBySide) {
  training::MakeTrainableOptions make;
  make.optimizer = training::Optimizer::Adam;
  make.lr = 1e-3;
  const onnx::ModelProto trainable = training::make_trainable(cnn(), make);
  training::TrainingOptions options;
  options.threads = 1;
  const std::vector<runtime::ValueInfo> step_inputs = training::TrainingSession(trainable, options).step_inputs(0);
  std::string label;
  for (const auto& info : step_inputs) {
    if (info.name != "x") label = info.name;
  }
  ASSERT_FALSE(label.empty());
  // Session s trains on its own batches, seeded by s.
  auto batch = [&](int s, int step) {
    const Tensor x = random_f32({8, 1, 8, 8}, static_cast<uint32_t>(1000 * s + step), 1.0f);
    std::vector<int64_t> labels(8);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 3 + static_cast<size_t>(step + s)) % 10);
    return runtime::NamedTensors{{"x", x}, {label, Tensor::from_vector<int64_t>(Shape{8}, labels)}};
  };
  constexpr int kSteps = 20;
  // The step outputs (the loss), as float32 values in order.
  auto train = [&](int s, training::TrainingSession& session, std::vector<float>& losses) {
    for (int step = 0; step < kSteps; ++step) {
      for (const auto& [name, value] : session.step(batch(s, step))) {
        if (value.dtype() == DataType::Float32) losses.insert(losses.end(), value.data<float>(), value.data<float>() + value.numel());
      }
    }
  };
  // One after the other, then side by side: the same step outputs and state, bit for bit.
  std::vector<std::vector<float>> want_losses(2), got_losses(2);
  std::vector<runtime::NamedTensors> want_state;
  for (int s = 0; s < 2; ++s) {
    training::TrainingSession session(trainable, options);
    train(s, session, want_losses[static_cast<size_t>(s)]);
    want_state.push_back(session.state());
  }
  training::TrainingSession a(trainable, options), b(trainable, options);
  std::vector<std::string> failures(2);
  auto run = [&](int s, training::TrainingSession& session) {
    try {
      train(s, session, got_losses[static_cast<size_t>(s)]);
    } catch (const std::exception& e) {
      failures[static_cast<size_t>(s)] = e.what();
    }
  };
  std::thread ta(run, 0, std::ref(a)), tb(run, 1, std::ref(b));
  ta.join();
  tb.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
  EXPECT_FALSE(want_losses[0].empty());
  EXPECT_EQ(got_losses, want_losses);
  for (int s = 0; s < 2; ++s) {
    const runtime::NamedTensors& state = (s == 0 ? a : b).state();
    ASSERT_EQ(state.size(), want_state[static_cast<size_t>(s)].size());
    for (const auto& [name, value] : want_state[static_cast<size_t>(s)]) {
      EXPECT_TRUE(same_bits(state.at(name), value)) << "session " << s << ", variable '" << name << "'";
    }
  }
  // The two sessions trained on different batches: their weights differ.
  EXPECT_FALSE(same_bits(a.state().at("w"), b.state().at("w")));
}

}  // namespace
}  // namespace onnxtrain
