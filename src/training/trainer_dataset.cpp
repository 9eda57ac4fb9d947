// DatasetSource and the training loop on a dataset read from a path
// (include/onnxtrain/trainer.h).
#include <algorithm>
#include <random>

#include "onnxtrain/error.h"
#include "onnxtrain/trainer.h"
#include "training/trainer_feeds.h"

namespace onnxtrain::training {

DatasetSource::DatasetSource(data::Dataset dataset, std::string name, int64_t batch_size, bool shuffle, uint64_t seed,
                             bool drop_last, bool idx)
    : dataset_(std::move(dataset)), name_(std::move(name)), batch_size_(batch_size), shuffle_(shuffle),
      drop_last_(drop_last), idx_(idx), seed_(seed) {
  if (batch_size_ <= 0) throw Error("--batch-size must be positive");
}

SourceInfo DatasetSource::info() {
  const int64_t n = dataset_.size();
  SourceInfo info;
  info.name = name_;
  for (const auto& [column, t] : dataset_.columns) info.columns.push_back(column);
  info.batches = drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  info.batch_size = batch_size_;
  info.idx = idx_;
  info.optional = optional;
  return info;
}

void DatasetSource::start_epoch(int epoch, int64_t skip) {
  const int64_t n = dataset_.size();
  order_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order_[static_cast<size_t>(i)] = i;
  if (shuffle_) {
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  next_ = skip;
}

std::optional<Batch> DatasetSource::next() {
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t begin = next_ * batch_size_;
  const int64_t end = std::min(n, begin + batch_size_);
  if (begin >= n || (drop_last_ && end - begin < batch_size_)) return std::nullopt;
  ++next_;
  return dataset_.rows(std::vector<int64_t>(order_.begin() + begin, order_.begin() + end)).columns;
}

DatasetSource train_split_source(data::Dataset dataset, std::string name, const TrainOptions& options, bool idx) {
  const int64_t samples = dataset.size();
  DatasetSource source(std::move(dataset), std::move(name), options.batch_size, options.shuffle, options.seed,
                       options.drop_last, idx);
  if (source.info().batches == 0) {
    throw Error("--batch-size " + std::to_string(options.batch_size) + " with --drop-last leaves no batch of " +
                std::to_string(samples) + " samples");
  }
  return source;
}

DatasetSource test_split_source(data::Dataset dataset, std::string name, const TrainOptions& options, bool idx) {
  return DatasetSource(std::move(dataset), std::move(name), options.batch_size, false, options.seed, false, idx);
}

TrainResult train(const TrainOptions& options, std::ostream& log, const std::atomic<int>* stop) {
  if (options.batch_size <= 0) throw Error("--batch-size must be positive");
  if (options.epochs <= 0) throw Error("--epochs must be positive");
  check_outputs(options);
  data::Splits data = data::load_dataset(options.data);
  const bool idx = data.format == "idx";
  const std::string name = options.data.string();
  DatasetSource train_data = train_split_source(std::move(data.train), name, options, idx);
  std::optional<DatasetSource> test;
  if (data.test) {
    test.emplace(test_split_source(std::move(*data.test), name + " (test split)", options, idx));
    test->optional = true;
  }
  TrainHooks hooks;
  if (stop) hooks.stop = [stop] { return stop->load(); };
  return train(options, train_data, test ? &*test : nullptr, hooks, log);
}

}  // namespace onnxtrain::training
