// The training loop on batches a caller provides (training::BatchSource): the same weights as
// the path dataset, positional columns, unknown lengths, the step/evaluation hooks and early
// stops, the stop poll with exact resume, and the errors of bad batches.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <csignal>
#include <filesystem>
#include <sstream>

#include "onnxtrain/dataset.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/trainer.h"
#include "onnxtrain/training.h"
#include "trainer_fixture.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using testing::Fixture;
using testing::weights;

// Batches held in memory, the same every epoch, counting how the loop uses them.
class VectorSource : public training::BatchSource {
 public:
  explicit VectorSource(std::vector<training::Batch> batches, bool known_length = true, bool positional = false)
      : batches_(std::move(batches)), known_length_(known_length), positional_(positional) {}
  training::SourceInfo info() override {
    training::SourceInfo info;
    info.name = "the vector";
    for (const auto& [name, t] : batches_.at(0)) info.columns.push_back(name);
    if (known_length_) info.batches = static_cast<int64_t>(batches_.size());
    info.positional = positional_;
    return info;
  }
  void start_epoch(int epoch, int64_t skip) override {
    starts.emplace_back(epoch, skip);
    next_ = static_cast<size_t>(skip);
  }
  std::optional<training::Batch> next() override {
    if (next_ == interrupt_at) {
      interrupt_at = SIZE_MAX;
      interrupted = true;
      return std::nullopt;
    }
    if (next_ >= batches_.size()) return std::nullopt;
    return batches_[next_++];
  }
  std::vector<std::pair<int, int64_t>> starts;  // (epoch, skip) of every start_epoch
  size_t interrupt_at = SIZE_MAX;               // next() reports an interrupt at this batch once
  bool interrupted = false;

 private:
  std::vector<training::Batch> batches_;
  bool known_length_, positional_;
  size_t next_ = 0;
};

// The fixture's dataset in order, in batches of 5 (the last of 2), named as in the folder or
// by position ("0" for x, "1" for label: the step inputs' order).
std::vector<training::Batch> batches_of(const fs::path& folder, bool positional = false) {
  const data::Dataset d = data::load_dataset(folder).train;
  std::vector<training::Batch> out;
  for (int64_t begin = 0; begin < d.size(); begin += 5) {
    std::vector<int64_t> idx;
    for (int64_t i = begin; i < std::min<int64_t>(d.size(), begin + 5); ++i) idx.push_back(i);
    training::Batch b = d.rows(idx).columns;
    if (positional) b = {{"0", b.at("x")}, {"1", b.at("label")}};
    out.push_back(std::move(b));
  }
  return out;
}

training::TrainOptions unshuffled(const Fixture& f, const std::string& out) {
  auto o = f.options(out);
  o.shuffle = false;
  return o;
}

TEST(TrainSource, CallerBatchesTrainAsThePathDatasetDoes) {
  Fixture f;
  training::train(unshuffled(f, "path.onnx"), std::cout);
  VectorSource named(batches_of(f.data));
  VectorSource test(batches_of(f.data / "test"));
  const auto result = training::train(unshuffled(f, "named.onnx"), named, &test, {}, std::cout);
  EXPECT_EQ(result.steps, 9);
  EXPECT_EQ(weights(f.dir.path() / "named.onnx"), weights(f.dir.path() / "path.onnx"));
  EXPECT_EQ(named.starts, (std::vector<std::pair<int, int64_t>>{{0, 0}, {1, 0}, {2, 0}}));
  ASSERT_TRUE(result.test_accuracy.has_value());
  // Tuples: the i-th step input reads column "i"; without a known length the loop reads each
  // epoch to its end.
  VectorSource positional(batches_of(f.data, true), false, true);
  VectorSource positional_test(batches_of(f.data / "test", true), false, true);
  const auto by_position = training::train(unshuffled(f, "positional.onnx"), positional, &positional_test, {}, std::cout);
  EXPECT_EQ(by_position.steps, 9);
  EXPECT_EQ(weights(f.dir.path() / "positional.onnx"), weights(f.dir.path() / "path.onnx"));
  EXPECT_EQ(by_position.test_loss, result.test_loss);
}

TEST(TrainSource, HooksSeeEveryStepAndEvaluationAndMayStopEarly) {
  Fixture f;
  VectorSource source(batches_of(f.data), false);
  VectorSource test(batches_of(f.data / "test"));
  std::vector<training::StepEvent> steps;
  std::vector<training::EvalEvent> evals;
  training::TrainHooks hooks;
  hooks.on_step = [&](const training::StepEvent& e) {
    steps.push_back(e);
    EXPECT_TRUE(e.outputs->contains("logits"));
    return e.step == 5;  // inside the second epoch
  };
  hooks.on_eval = [&](const training::EvalEvent& e) {
    evals.push_back(e);
    return false;
  };
  std::ostringstream log;
  auto o = unshuffled(f, "early.onnx");
  o.quiet = false;
  const auto result = training::train(o, source, &test, hooks, log);
  EXPECT_TRUE(result.stopped_early);
  EXPECT_EQ(result.signal, 0);
  EXPECT_EQ(result.steps, 5);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[3].epoch, 1);
  EXPECT_EQ(steps[3].batch, 0);
  EXPECT_EQ(steps[4].batch, 1);
  EXPECT_EQ(steps[4].total, 0);  // no known length, no max_steps: no total
  ASSERT_TRUE(steps[4].lr.has_value());
  EXPECT_FLOAT_EQ(static_cast<float>(*steps[4].lr), 0.1f);
  // The end of epoch 1, then the early stop's evaluation.
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_TRUE(evals[0].epoch_end);
  EXPECT_EQ(evals[0].step, 3);
  EXPECT_FALSE(evals[1].epoch_end);
  EXPECT_EQ(evals[1].step, 5);
  EXPECT_EQ(result.test_loss, evals[1].test_loss);
  EXPECT_TRUE(fs::exists(f.dir.path() / "early.onnx"));
  EXPECT_NE(log.str().find("eval  epoch 2  step 5  test loss"), std::string::npos) << log.str();
  // Progress without a known length: every 100 steps, without a total or an ETA.
  VectorSource long_source(batches_of(f.data), false);
  o.epochs = 34;
  o.output = f.dir.path() / "long.onnx";
  std::ostringstream long_log;
  training::train(o, long_source, nullptr, {}, long_log);
  EXPECT_NE(long_log.str().find("epoch 34/34  step 100  loss"), std::string::npos) << long_log.str();
  EXPECT_EQ(long_log.str().find("ETA"), std::string::npos) << long_log.str();
  // Epoch ends, with the checkpoint each wrote; an evaluation hook that stops ends the run
  // after that epoch.
  std::vector<training::EpochEvent> epochs;
  hooks.on_epoch_end = [&](const training::EpochEvent& e) {
    epochs.push_back(e);
    return false;
  };
  VectorSource again(batches_of(f.data));
  hooks.on_step = {};
  hooks.on_eval = [](const training::EvalEvent& e) { return e.epoch == 1; };
  const auto after_two = training::train(unshuffled(f, "two.onnx"), again, &test, hooks, std::cout);
  EXPECT_EQ(after_two.steps, 6);
  EXPECT_TRUE(after_two.stopped_early);
  ASSERT_EQ(epochs.size(), 2u);  // the second epoch ended too, before the stop took effect
  EXPECT_EQ(epochs[0].step, 3);
  EXPECT_EQ(epochs[1].epoch, 1);
  EXPECT_EQ(epochs[1].checkpoint, f.dir.path() / "two.ckpt.onnx");
  // An epoch-end hook that stops.
  hooks.on_eval = {};
  hooks.on_epoch_end = [](const training::EpochEvent& e) { return e.epoch == 0; };
  VectorSource third(batches_of(f.data));
  EXPECT_EQ(training::train(unshuffled(f, "one.onnx"), third, nullptr, hooks, std::cout).steps, 3);
}

TEST(TrainSource, AStopWritesACheckpointAndResumeSkipsTheBatchesDone) {
  Fixture f;
  VectorSource whole_source(batches_of(f.data));
  training::train(unshuffled(f, "whole.onnx"), whole_source, nullptr, {}, std::cout);

  VectorSource source(batches_of(f.data));
  int polls = 0;
  int64_t steps_seen = 0;
  training::TrainHooks hooks;
  hooks.on_step = [&](const training::StepEvent& e) {
    steps_seen = e.step;
    return false;
  };
  hooks.stop = [&] {
    ++polls;
    return steps_seen == 4 ? SIGINT : 0;
  };
  const auto stopped = training::train(unshuffled(f, "stopped.onnx"), source, nullptr, hooks, std::cout);
  EXPECT_EQ(stopped.signal, SIGINT);
  EXPECT_EQ(stopped.steps, 4);
  EXPECT_GE(polls, 4);
  EXPECT_FALSE(fs::exists(f.dir.path() / "stopped.onnx"));
  ASSERT_EQ(stopped.checkpoint, f.dir.path() / "stopped.ckpt.onnx");

  auto rest = unshuffled(f, "resumed.onnx");
  rest.resume = stopped.checkpoint;
  VectorSource resumed_source(batches_of(f.data));
  const auto resumed = training::train(rest, resumed_source, nullptr, {}, std::cout);
  EXPECT_EQ(resumed.steps, 9);
  EXPECT_EQ(resumed_source.starts.front(), (std::pair<int, int64_t>{1, 1}));  // epoch 2 from its batch 2
  EXPECT_EQ(weights(f.dir.path() / "resumed.onnx"), weights(f.dir.path() / "whole.onnx"));

  // A source interrupted while fetching batch 3 of epoch 1: the checkpoint resumes at it.
  VectorSource fetching(batches_of(f.data));
  fetching.interrupt_at = 2;
  hooks = {};
  hooks.stop = [&] { return fetching.interrupted ? SIGINT : 0; };
  const auto cut = training::train(unshuffled(f, "cut.onnx"), fetching, nullptr, hooks, std::cout);
  EXPECT_EQ(cut.signal, SIGINT);
  EXPECT_EQ(cut.steps, 2);
  bool at_batch_2 = false;
  const onnx::ModelProto checkpoint = io::load_model(cut.checkpoint);
  for (const auto& e : checkpoint.metadata_props()) at_batch_2 |= e.key() == "onnxtrain.batch" && e.value() == "2";
  EXPECT_TRUE(at_batch_2);
}

TEST(TrainSource, AModelInMemoryTrainsWithoutWritingFiles) {
  Fixture f;
  VectorSource source(batches_of(f.data));
  auto o = unshuffled(f, "unused.onnx");
  o.output.clear();
  o.model_proto = std::make_shared<onnx::ModelProto>(io::load_model(f.model));
  o.model = "in memory";
  const auto result = training::train(o, source, nullptr, {}, std::cout);
  EXPECT_EQ(result.steps, 9);
  EXPECT_TRUE(result.checkpoint.empty());
  ASSERT_TRUE(result.session);
  const auto logits = result.session->infer({{"x", batches_of(f.data)[0].at("x")}}).at("logits");
  EXPECT_EQ(logits.shape(), (Shape{5, 3}));
  for (const auto& e : fs::directory_iterator(f.dir.path())) {
    EXPECT_TRUE(e.path().filename() == "model.onnx" || e.path().filename() == "data") << e.path();
  }
  // The inference model alone: no scratch file stays beside it.
  o.export_inference = f.dir.path() / "inference.onnx";
  training::train(o, source, nullptr, {}, std::cout);
  EXPECT_EQ(io::load_model(o.export_inference).training_info_size(), 0);
  EXPECT_FALSE(fs::exists(f.dir.path() / "inference.onnx.training.onnx"));
  o.checkpoint_every = 2;
  EXPECT_THROW(training::train(o, source, nullptr, {}, std::cout), Error);
}

std::string error_of(training::BatchSource& source, training::BatchSource* eval, const training::TrainOptions& o) {
  try {
    training::train(o, source, eval, {}, std::cout);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TrainSource, BadBatchesAreClearErrors) {
  Fixture f;
  const auto o = unshuffled(f, "out.onnx");
  auto batches = batches_of(f.data);
  batches[1].erase("label");
  VectorSource missing(batches);
  EXPECT_NE(error_of(missing, nullptr, o).find("epoch 1, batch 2: no column 'label' (input 'label' reads it)"), std::string::npos);
  batches = batches_of(f.data);
  batches[1]["x"] = batches[2]["x"];  // 2 samples against 5 labels
  VectorSource uneven(batches);
  EXPECT_NE(error_of(uneven, nullptr, o).find("epoch 1, batch 2: column 'label' has 5 samples but 'x' has 2"), std::string::npos)
      << error_of(uneven, nullptr, o);
  batches = batches_of(f.data);
  batches[2]["label"] = Tensor::from_vector<float>({2}, {1, 0.5f});
  VectorSource fractional(batches);
  EXPECT_NE(error_of(fractional, nullptr, o).find("epoch 1, batch 3: column 'label' holds 0.5 at element 1, which is not a whole number"),
            std::string::npos) << error_of(fractional, nullptr, o);
  auto unlabeled = batches_of(f.data / "test");
  for (auto& b : unlabeled) b.erase("label");
  VectorSource train_source(batches_of(f.data)), test(unlabeled);
  EXPECT_NE(error_of(train_source, &test, o).find("the vector: cannot evaluate: no column 'label'"), std::string::npos);
  EXPECT_FALSE(fs::exists(f.dir.path() / "out.onnx"));
  EXPECT_FALSE(fs::exists(f.dir.path() / "out.ckpt.onnx"));
  // An epoch without batches (an iterator that cannot start again).
  class Once : public VectorSource {
   public:
    using VectorSource::VectorSource;
    void start_epoch(int epoch, int64_t skip) override { VectorSource::start_epoch(epoch, epoch == 0 ? skip : 3); }
  };
  Once exhausted(batches_of(f.data), false);
  EXPECT_NE(error_of(exhausted, nullptr, o).find("the vector: epoch 2 has no batches"), std::string::npos);
}

}  // namespace
}  // namespace onnxtrain
