// Data-parallel training across processes (docs/distributed.md).
//
// A Communicator joins the ranks of one run. Under `mpirun -np N`, world() gives the MPI
// communicator of the N processes (MPI_COMM_WORLD); the training loop (trainer.h) then gives
// each rank a disjoint contiguous share of every global batch and has TrainingSession average
// the values its algorithms compute up to their Gradient outputs across ranks, weighted by the
// ranks' sample counts (TrainingOptions::reduce).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "onnxtrain/session.h"

namespace onnxtrain::distributed {

// One step's averaging of values across ranks, in buckets (Communicator::begin_weighted_mean):
// each tensor becomes sum_r(weight_r * value_r) / sum_r(weight_r), computed in float64 and
// rounded once to the tensor's dtype. The buckets are started while the backward pass still
// runs, and a background thread sums them (MPI_Allreduce) meanwhile; every rank must start the
// same buckets (names, dtypes, shapes) in the same order (checked per bucket by element count:
// an Error names the ranks' counts). Floating dtypes only (float32, float64); others are an
// Error naming the tensor. A rank of weight 0 adds nothing (its values are not read, so they
// may be anything finite or not). A sum of weights of zero is an Error.
class WeightedMean {
 public:
  virtual ~WeightedMean() = default;
  // Starts the allreduce of `bucket` (its values are copied now; the tensors may change after).
  virtual void start(const std::vector<std::pair<std::string, const Tensor*>>& bucket) = 0;
  // Waits for every started bucket (with the communicator's timeout); the averages by name.
  virtual runtime::NamedTensors finish() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // 0-based
  virtual int size() const = 0;  // number of ranks
  // Starts one step's averaging, this rank's values weighted by `weight` (its sample count).
  virtual std::unique_ptr<WeightedMean> begin_weighted_mean(double weight) = 0;
  // In place, on every rank: data[i] becomes the sum over the ranks of their data[i]
  // (MPI_Allreduce, MPI_SUM). Every rank passes the same count. `what` names the collective in
  // errors and timeouts ("the allreduce of the gradients").
  virtual void sum(std::span<double> data, const std::string& what) = 0;
  // In place: every rank gets the `bytes` bytes of rank `root` (MPI_Bcast).
  virtual void broadcast_bytes(void* data, size_t bytes, int root, const std::string& what) = 0;
  // Seconds a collective waits for the other ranks before this rank reports that a rank is
  // stuck or dead and ends the run (abort(1)); 0 waits forever. Default 600 s (PyTorch's
  // default timeout of a NCCL process group is also 10 minutes).
  virtual void set_timeout(double seconds) = 0;
  // Ends every rank of the run at once (MPI_Abort) with exit status `code`.
  [[noreturn]] virtual void abort(int code) = 0;
  // Bytes this rank has sent to collectives so far (the reduced payload, float64).
  virtual uint64_t bytes_reduced() const = 0;
  // Seconds this rank has spent in collectives so far (waiting for the others included).
  virtual double seconds_in_collectives() const = 0;
};

// The communicator of the processes started together by mpirun (detected from Open MPI's or
// PMI's environment), or nullptr when this process was not started by mpirun or onnxtrain was
// built without MPI (the build option ONNXTRAIN_MPI). The first call initializes MPI; it is
// finalized at exit. Throws Error when started by mpirun with several ranks in a build
// without MPI (each process would otherwise train alone and write the same files).
std::shared_ptr<Communicator> world();

}  // namespace onnxtrain::distributed
