// What every Communicator offers on top of its collectives (include/onnxtrain/distributed.h).
#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"

namespace onnxtrain::distributed {

void Communicator::weighted_mean(runtime::NamedTensors& values, double weight) {
  std::unique_ptr<WeightedMean> mean = begin_weighted_mean(weight);
  std::vector<std::pair<std::string, const Tensor*>> bucket;
  for (const auto& [name, t] : values) bucket.emplace_back(name, &t);
  mean->start(bucket);
  values = mean->finish();
}

void broadcast(Communicator& communicator, Tensor& t, int root, const std::string& name) {
  if (t.dtype() == DataType::String) throw Error("distributed: cannot broadcast '" + name + "': strings are not supported");
  // The root's element count first: a rank whose tensor differs must not receive into it.
  double count = static_cast<double>(t.numel());
  communicator.broadcast_bytes(&count, sizeof count, root, "the broadcast of '" + name + "'");
  if (count != static_cast<double>(t.numel())) {
    throw Error("distributed: '" + name + "' has " + std::to_string(t.numel()) + " elements on rank " +
                std::to_string(communicator.rank()) + " but " + std::to_string(static_cast<int64_t>(count)) +
                " on rank " + std::to_string(root));
  }
  communicator.broadcast_bytes(t.raw_data(), t.numel() * dtype_size(t.dtype()), root, "the broadcast of '" + name + "'");
}

}  // namespace onnxtrain::distributed
