// world() on MPI: MPI_COMM_WORLD of the processes mpirun started (docs/distributed.md).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"

namespace onnxtrain::distributed {

namespace {

// Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH's and PMIx launchers PMI_SIZE / PMIX_RANK.
bool started_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(std::string("MPI: ") + what + " failed: " + std::string(text, length));
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init(nullptr, nullptr);
      owner_ = true;
    }
    // Errors come back as codes (turned into onnxtrain::Error) instead of aborting here.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t bytes_reduced() const override { return bytes_; }
  double seconds_in_collectives() const override { return seconds_; }

  std::unique_ptr<WeightedMean> begin_weighted_mean(double weight) override;
  // Starts the MPI_Iallreduce (sum) of `data` in chunks of at most INT_MAX elements, adding
  // their requests to `requests`.
  void start_sum(std::span<double> data, std::vector<MPI_Request>& requests, const std::string& what) {
    for (size_t begin = 0; begin < data.size(); begin += INT_MAX) {
      const int count = static_cast<int>(std::min<size_t>(INT_MAX, data.size() - begin));
      MPI_Request request;
      check(MPI_Iallreduce(MPI_IN_PLACE, data.data() + begin, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request),
            what.c_str());
      requests.push_back(request);
    }
    bytes_ += data.size() * sizeof(double);
  }
  // Tests `request` once, without waiting.
  bool test(MPI_Request& request, const std::string& what) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what.c_str());
    return done != 0;
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case an implementation does
  }

  double broadcast(double value) override {
    broadcast_bytes(&value, sizeof value, 0, "the broadcast of rank 0's value");
    return value;
  }

  void sum(std::span<double> data, const std::string& what) override {
    std::vector<MPI_Request> requests;
    start_sum(data, requests, what);
    for (MPI_Request& request : requests) wait(request, what);
  }

  void broadcast_bytes(void* data, size_t bytes, int root, const std::string& what) override {
    for (size_t begin = 0; begin < bytes; begin += INT_MAX) {
      const int count = static_cast<int>(std::min<size_t>(INT_MAX, bytes - begin));
      MPI_Request request;
      check(MPI_Ibcast(static_cast<char*>(data) + begin, count, MPI_BYTE, root, MPI_COMM_WORLD, &request), what.c_str());
      wait(request, what);
    }
    if (rank_ == root) bytes_ += bytes;
  }

  void set_timeout(double seconds) override { timeout_ = seconds; }

  // Every rank must reduce the same number of elements (a cheap stand-in for equal shapes).
  void check_same_count(int64_t n) {
    int64_t range[2] = {n, -n};
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, range, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &request), "MPI_Iallreduce");
    wait(request, "the check of the gradients' sizes");
    if (range[0] != -range[1]) {
      throw Error("distributed: the ranks reduce different numbers of elements (rank " + std::to_string(rank_) +
                  ": " + std::to_string(n) + ", largest " + std::to_string(range[0]) + ", smallest " +
                  std::to_string(-range[1]) + ")");
    }
  }

 public:  // for MpiWeightedMean
  // Completes `request`, giving up after timeout_ seconds: then no other rank has reached the
  // collective (one is stuck in a kernel, stopped, or dead without mpirun noticing yet), and
  // this rank ends the run rather than wait forever. Polls, sleeping up to 1 ms between tests
  // once the first millisecond has passed, so a waiting rank leaves the cores to the others.
  void wait(MPI_Request& request, const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    std::chrono::microseconds pause(0);
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what.c_str());
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (done) {
        seconds_ += waited;
        return;
      }
      if (timeout_ > 0 && waited > timeout_) {
        std::cerr << "error: rank " << rank_ << " of " << size_ << ": " << what << " waited " << static_cast<int64_t>(waited)
                  << " s for the other ranks (--collective-timeout " << timeout_
                  << "): a rank is stuck or has died; ending every rank" << std::endl;
        abort(1);
      }
      if (waited > 1e-3) {
        std::this_thread::sleep_for(pause);
        pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(50));
      }
    }
  }

  int rank_ = 0, size_ = 1;
  bool owner_ = false;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
  double timeout_ = 600;
};

// The buckets of one step: each packed into a float64 buffer (weight * value, then the weight)
// and summed by MPI_Iallreduce while the backward pass goes on.
class MpiWeightedMean : public WeightedMean {
 public:
  MpiWeightedMean(MpiCommunicator& communicator, double weight) : c_(communicator), weight_(weight) {}
  // A step that ends before finish() (an error in the backward pass; the run is then ended)
  // leaves collectives in flight that may still write into their buffers: those are leaked.
  ~MpiWeightedMean() override {
    for (auto& bucket : buckets_) {
      for (MPI_Request& request : bucket->requests) {
        if (request != MPI_REQUEST_NULL) {
          (void)bucket.release();
          break;
        }
      }
    }
  }

  void start(const std::vector<std::pair<std::string, const Tensor*>>& values) override {
    Bucket& bucket = *buckets_.emplace_back(std::make_unique<Bucket>());
    int64_t count = 1;
    for (const auto& [name, t] : values) {
      if (t->dtype() != DataType::Float32 && t->dtype() != DataType::Float64) {
        throw Error("distributed: '" + name + "' is " + t->description() +
                    "; only float32 and float64 values can be averaged across ranks");
      }
      count += t->numel();
    }
    bucket.buffer.reserve(static_cast<size_t>(count));
    for (const auto& [name, t] : values) {
      auto pack = [&]<class T>(const T* data) {
        // A weight of 0 (a rank without rows) adds nothing, even where its values are not finite.
        for (int64_t i = 0; i < t->numel(); ++i) {
          bucket.buffer.push_back(weight_ == 0 ? 0.0 : weight_ * static_cast<double>(data[i]));
        }
      };
      if (t->dtype() == DataType::Float32) pack(t->data<float>());
      else pack(t->data<double>());
      bucket.layout.push_back({name, t->dtype(), t->shape()});
    }
    bucket.buffer.push_back(weight_);
    c_.check_same_count(count);
    c_.start_sum(bucket.buffer, bucket.requests, kWhat);
  }

  void progress() override {
    for (auto& bucket : buckets_) {
      for (MPI_Request& request : bucket->requests) {
        if (request != MPI_REQUEST_NULL) c_.test(request, kWhat);
      }
    }
  }

  runtime::NamedTensors finish() override {
    runtime::NamedTensors averaged;
    for (auto& bucket : buckets_) {
      for (MPI_Request& request : bucket->requests) c_.wait(request, kWhat);
      const double total = bucket->buffer.back();
      if (!(total > 0)) throw Error("distributed: the ranks' sample counts sum to " + std::to_string(total));
      size_t k = 0;
      for (const auto& [name, dtype, shape] : bucket->layout) {
        Tensor mean(dtype, shape);
        auto unpack = [&]<class T>(T* data) {
          for (int64_t i = 0; i < mean.numel(); ++i) data[i] = static_cast<T>(bucket->buffer[k++] / total);
        };
        if (dtype == DataType::Float32) unpack(mean.data<float>());
        else unpack(mean.data<double>());
        averaged.emplace(name, std::move(mean));
      }
    }
    buckets_.clear();
    return averaged;
  }

 private:
  static constexpr const char* kWhat = "the allreduce of the gradients";
  struct Bucket {
    std::vector<double> buffer;  // never resized after start: MPI writes into it
    std::vector<MPI_Request> requests;
    std::vector<std::tuple<std::string, DataType, Shape>> layout;
  };
  MpiCommunicator& c_;
  double weight_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
};

std::unique_ptr<WeightedMean> MpiCommunicator::begin_weighted_mean(double weight) {
  return std::make_unique<MpiWeightedMean>(*this, weight);
}

}  // namespace

std::shared_ptr<Communicator> world() {
  static std::once_flag once;
  static std::shared_ptr<Communicator> communicator;
  std::call_once(once, [] {
    if (started_by_mpirun()) communicator = std::make_shared<MpiCommunicator>();
  });
  return communicator;
}

bool built_with_mpi() { return true; }

}  // namespace onnxtrain::distributed
