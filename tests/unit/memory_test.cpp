// Tensor memory: the runtime's arena (runtime/memory_plan.h) places blocks by liveness and
// never hands out bytes that are in use; a training step after the first asks the system for
// no tensor memory.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>

#include "core/memory.h"
#include "onnxtrain/io.h"
#include "onnxtrain/make_trainable.h"
#include "onnxtrain/training.h"
#include "runtime/memory_plan.h"
#include "test_util.h"

namespace onnxtrain::runtime {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // AddressSanitizer builds bypass the arena and the cache
#else
constexpr bool kSanitized = false;
#endif

const Shape kShape{256};  // 1 KiB of float32

// Three blocks over four steps: a [0, 1], b [1, 2], c [2, 3]; a and c may share bytes.
struct Run {
  Tensor a, b, c;
};
Run run_once(MemoryPlan& plan) {
  Run r;
  plan.begin_run();
  plan.set_step(0);
  r.a = plan.allocate(DataType::Float32, kShape);
  plan.set_step(1);
  r.b = plan.allocate(DataType::Float32, kShape);
  Tensor a_seen = r.a;
  r.a = Tensor();  // a dies after step 1
  a_seen = Tensor();
  plan.set_step(2);
  r.c = plan.allocate(DataType::Float32, kShape);
  r.b = Tensor();  // b dies after step 2
  plan.set_step(3);
  r.c = Tensor();  // c dies after step 3
  plan.end_run();
  return r;
}

TEST(MemoryPlan, BlocksWithDisjointLifetimesShareTheArena) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer build: no arena";
  MemoryPlan plan;
  run_once(plan);  // records
  EXPECT_EQ(plan.arena_bytes(), 2 * 1024u);  // a and c share; b overlaps both

  plan.begin_run();
  plan.set_step(0);
  Tensor a = plan.allocate(DataType::Float32, kShape);
  plan.set_step(1);
  Tensor b = plan.allocate(DataType::Float32, kShape);
  EXPECT_NE(a.raw_data(), b.raw_data());
  const void* a_bytes = a.raw_data();
  a = Tensor();
  plan.set_step(2);
  Tensor c = plan.allocate(DataType::Float32, kShape);
  EXPECT_EQ(c.raw_data(), a_bytes);
  plan.end_run();
}

TEST(MemoryPlan, NeverHandsOutBytesThatAreInUse) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer build: no arena";
  MemoryPlan plan;
  run_once(plan);
  plan.begin_run();
  plan.set_step(0);
  Tensor a = plan.allocate(DataType::Float32, kShape);
  a.data<float>()[0] = 42;
  plan.set_step(1);
  Tensor b = plan.allocate(DataType::Float32, kShape);
  plan.set_step(2);
  // Someone kept `a` alive past its recorded death: c must not take a's bytes.
  Tensor c = plan.allocate(DataType::Float32, kShape);
  c.data<float>()[0] = 7;
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_EQ(a.data<float>()[0], 42);
  plan.end_run();
  // A run that allocates another size from then on takes the heap for the rest of the run.
  a = b = c = Tensor();
  plan.begin_run();
  plan.set_step(0);
  Tensor big = plan.allocate(DataType::Float32, Shape{512});
  plan.set_step(1);
  Tensor next = plan.allocate(DataType::Float32, kShape);
  std::fill_n(big.data<float>(), 512, 1.0f);
  std::fill_n(next.data<float>(), 256, 2.0f);
  EXPECT_EQ(big.data<float>()[511], 1.0f);
  plan.end_run();
}

// Blocks of 256 KiB and more are mapped during the recording run and unmapped when they die
// within it; the arena run then serves them from the arena. One that outlives the run (a graph
// output released after it) stays mapped for the escaping block of that size of a later run.
TEST(MemoryPlan, LargeRecordedBlocksAreMappedAndGivenBack) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer build: no arena";
  const Shape large{int64_t{1} << 17};  // 512 KiB of float32
  MemoryPlan plan;
  // A large float32 tensor of the plan at `step`, every element `value`.
  const auto filled = [&](int64_t step, float value) {
    plan.set_step(step);
    Tensor t = plan.allocate(DataType::Float32, large);
    std::fill_n(t.data<float>(), t.numel(), value);
    return t;
  };
  const uint64_t system = memory_stats().system_allocations.load();
  plan.begin_run();
  Tensor a = filled(0, 1.0f);
  Tensor b = filled(1, 2.0f);
  EXPECT_EQ(a.data<float>()[a.numel() - 1], 1.0f);
  a = Tensor();  // dies within the run: unmapped, placed in the arena
  Tensor escaped = filled(2, 3.0f);  // outlives the run
  b = Tensor();
  EXPECT_EQ(memory_stats().system_allocations.load() - system, 3u);
  plan.end_run();
  EXPECT_EQ(plan.arena_bytes(), 2 * large[0] * sizeof(float));  // a and b overlap at step 1
  EXPECT_EQ(escaped.data<float>()[0], 3.0f);
  const void* escaped_bytes = escaped.raw_data();
  escaped = Tensor();  // kept mapped for the escaping block of a later run

  const uint64_t before_runs = memory_stats().system_allocations.load();
  plan.begin_run();
  Tensor a2 = filled(0, 4.0f);
  Tensor b2 = filled(1, 5.0f);
  EXPECT_FALSE(a2.shares_storage_with(b2));
  EXPECT_EQ(a2.data<float>()[0], 4.0f);
  a2 = b2 = Tensor();
  Tensor escaped2 = filled(2, 6.0f);
  EXPECT_EQ(escaped2.raw_data(), escaped_bytes);  // the recording run's block, not new memory
  EXPECT_EQ(memory_stats().system_allocations.load(), before_runs);
  plan.end_run();

  // While escaped2 lives, the next run's escaping block takes other memory.
  plan.begin_run();
  a2 = filled(0, 7.0f);
  b2 = filled(1, 8.0f);
  a2 = b2 = Tensor();
  Tensor escaped3 = filled(2, 9.0f);
  EXPECT_FALSE(escaped3.shares_storage_with(escaped2));
  EXPECT_EQ(escaped2.data<float>()[escaped2.numel() - 1], 6.0f);
  plan.end_run();
  escaped2 = Tensor();  // back to the plan: the run after takes it again
  plan.begin_run();
  a2 = filled(0, 1.0f);
  b2 = filled(1, 1.0f);
  a2 = b2 = Tensor();
  EXPECT_EQ(filled(2, 1.0f).raw_data(), escaped_bytes);
  plan.end_run();
}

// An MLP of the given layer widths (Gemm, Relu between) with Adam, trained on one batch of 16:
// the tensor memory asked of the system (memory_stats().system_allocations) over ten steps after
// `warmup` steps.
uint64_t system_allocations_of_steps(std::vector<int64_t> widths, int warmup) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto& g = *model.mutable_graph();
  g.set_name("mlp");
  auto declare = [](onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  declare(g.add_input(), "x", {16, widths.front()});
  std::string h = "x";
  const size_t layers = widths.size() - 1;
  for (size_t l = 0; l < layers; ++l) {
    const std::string w = "w" + std::to_string(l), b = "b" + std::to_string(l);
    std::vector<float> wv(static_cast<size_t>(widths[l] * widths[l + 1]));
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.1f * std::sin(static_cast<float>(i + 1));
    io::tensor_to_proto(Tensor::from_vector<float>({widths[l], widths[l + 1]}, wv), w, *g.add_initializer());
    io::tensor_to_proto(Tensor::zeros(DataType::Float32, {widths[l + 1]}), b, *g.add_initializer());
    auto* gemm = g.add_node();
    gemm->set_op_type("Gemm");
    gemm->add_input(h);
    gemm->add_input(w);
    gemm->add_input(b);
    h = l + 1 == layers ? "logits" : "z" + std::to_string(l);
    gemm->add_output(h);
    if (l + 1 < layers) {
      auto* relu = g.add_node();
      relu->set_op_type("Relu");
      relu->add_input(h);
      h = "a" + std::to_string(l);
      relu->add_output(h);
    }
  }
  declare(g.add_output(), "logits", {16, widths.back()});
  training::MakeTrainableOptions options;
  options.optimizer = training::Optimizer::Adam;
  training::TrainingSession session(training::make_trainable(model, options));
  std::vector<float> x(static_cast<size_t>(16 * widths.front()));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<float>(i));
  std::vector<int64_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % widths.back());
  const NamedTensors batch{{"x", Tensor::from_vector<float>({16, widths.front()}, x)},
                           {"label", Tensor::from_vector<int64_t>({16}, labels)}};
  for (int s = 0; s < warmup; ++s) session.step(batch);
  const uint64_t system = memory_stats().system_allocations.load();
  const uint64_t storages = memory_stats().storage_allocations.load();
  double loss = 0;
  for (int s = 0; s < 10; ++s) loss = session.step(batch).at("onnxtrain.loss").to_double_vector()[0];
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(memory_stats().storage_allocations.load() - storages, 10u * 20u);  // tensors were made
  return memory_stats().system_allocations.load() - system;
}

TEST(MemoryPlan, ATrainingStepAfterTheFirstAllocatesNoTensorMemory) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer build: the block cache is off";
  EXPECT_EQ(system_allocations_of_steps({32, 64, 64, 10}, 1), 0u);
}

// Parameters of 256 KiB and more: the first step's new parameters and Adam state are mapped
// blocks (the recording run); the third step's outputs take them over once the second step has
// replaced them, instead of new memory (whose page faults cost the BERT encoder's third step
// ~30 ms in AdamW alone).
TEST(MemoryPlan, LargeParametersTakeNoNewMemoryAfterTheFirstStep) {
  if (kSanitized) GTEST_SKIP() << "AddressSanitizer build: the block cache is off";
  EXPECT_EQ(system_allocations_of_steps({512, 256, 10}, 1), 0u);  // w0: 512 KiB
}

}  // namespace
}  // namespace onnxtrain::runtime
