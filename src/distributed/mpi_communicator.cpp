// world() on MPI: MPI_COMM_WORLD of the processes mpirun started (docs/distributed.md).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "distributed/rank_report.h"
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

// The thread that sums the gradient buckets across ranks, as Horovod's background thread does:
// the main thread packs a bucket and hands it over, then goes on with the backward pass while
// this thread runs the bucket's blocking MPI_Allreduce (Open MPI's tuned algorithms, which
// progress without being polled) on its own duplicate of MPI_COMM_WORLD, so it never mixes
// with the main thread's collectives. Needs MPI_THREAD_MULTIPLE.
// After an MPI_MAX allreduce of {n, -n} over the ranks: an Error unless every rank had n.
void require_same_count(const int64_t range[2], int64_t n, int rank) {
  if (range[0] == -range[1]) return;
  throw Error("distributed: the ranks reduce different numbers of elements (rank " + std::to_string(rank) + ": " +
              std::to_string(n) + ", largest " + std::to_string(range[0]) + ", smallest " + std::to_string(-range[1]) +
              ")");
}

class BucketThread {
 public:
  struct Job {
    std::vector<double>* buffer = nullptr;  // summed in place
    bool done = false;
    std::string error;  // set when it failed
  };
  BucketThread(MPI_Comm world, int rank) : rank_(rank) {
    MPI_Comm_dup(world, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    thread_ = std::thread([this] { loop(); });
  }
  ~BucketThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
    MPI_Comm_free(&comm_);
  }
  void submit(Job& job) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(&job);
    }
    changed_.notify_all();
  }
  bool done(const Job& job) {
    std::lock_guard lock(mutex_);
    return job.done;
  }
  // Waits for `job` at most `seconds` (0: forever); false when the time ran out.
  bool wait(Job& job, double seconds) {
    std::unique_lock lock(mutex_);
    if (seconds <= 0) {
      changed_.wait(lock, [&] { return job.done; });
      return true;
    }
    return changed_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return job.done; });
  }

 private:
  void loop() {
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        job = queue_.front();
        queue_.pop_front();
      }
      std::string error;
      try {
        run(*job->buffer);
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::lock_guard lock(mutex_);
        job->error = std::move(error);
        job->done = true;
      }
      changed_.notify_all();
    }
  }
  // Checks that every rank sums as many elements (a cheap stand-in for equal shapes), then sums.
  void run(std::vector<double>& buffer) {
    const auto n = static_cast<int64_t>(buffer.size());
    int64_t range[2] = {n, -n};
    check(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT64_T, MPI_MAX, comm_), "the check of the gradients' sizes");
    require_same_count(range, n, rank_);
    for (size_t begin = 0; begin < buffer.size(); begin += INT_MAX) {
      const int count = static_cast<int>(std::min<size_t>(INT_MAX, buffer.size() - begin));
      check(MPI_Allreduce(MPI_IN_PLACE, buffer.data() + begin, count, MPI_DOUBLE, MPI_SUM, comm_),
            "the allreduce of the gradients");
    }
  }

  int rank_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job*> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      owner_ = true;
    } else {
      MPI_Query_thread(&provided);  // initialized by the host program (mpi4py asks for MULTIPLE)
    }
    // Errors come back as codes (turned into onnxtrain::Error) instead of aborting here.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Without MPI_THREAD_MULTIPLE the buckets are summed by the main thread, after the backward
    // pass (no overlap).
    if (provided == MPI_THREAD_MULTIPLE && size_ > 1) buckets_ = std::make_unique<BucketThread>(MPI_COMM_WORLD, rank_);
  }
  ~MpiCommunicator() override {
    buckets_.reset();  // its duplicate communicator is freed before MPI_Finalize
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t bytes_reduced() const override { return bytes_; }
  double seconds_in_collectives() const override { return seconds_; }

  std::unique_ptr<WeightedMean> begin_weighted_mean(double weight) override;
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case an implementation does
  }

  void sum(std::span<double> data, const std::string& what) override {
    // In chunks of at most INT_MAX elements (MPI counts are int).
    for (size_t begin = 0; begin < data.size(); begin += INT_MAX) {
      const int count = static_cast<int>(std::min<size_t>(INT_MAX, data.size() - begin));
      MPI_Request request;
      check(MPI_Iallreduce(MPI_IN_PLACE, data.data() + begin, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request),
            what.c_str());
      wait(request, what);
    }
    bytes_ += data.size() * sizeof(double);
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
    require_same_count(range, n, rank_);
  }

 public:  // for MpiWeightedMean
  // Completes `request`, giving up after timeout_ seconds: then no other rank has reached the
  // collective (one is stuck in a kernel, stopped, or dead without mpirun noticing yet), and
  // this rank ends the run rather than wait forever. Polls: every test also moves the
  // collective on (Open MPI progresses nonblocking collectives inside MPI calls), so for the
  // first 100 ms it only yields the core between tests (a large allreduce needs many); after
  // that it sleeps up to 1 ms between tests, leaving the cores to the ranks still computing.
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
      if (timeout_ > 0 && waited > timeout_) time_out(what, waited);
      if (waited < 0.1) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(50));
      }
    }
  }

  // Reports that `what` waited `waited` seconds for the other ranks, and ends every rank.
  [[noreturn]] void time_out(const std::string& what, double waited) {
    std::ostringstream message;
    message << what << " waited " << static_cast<int64_t>(waited) << " s for the other ranks (--collective-timeout "
            << timeout_ << "): a rank is stuck or has died; ending every rank";
    print_rank_error(rank_, size_, message.str());
    MpiCommunicator::abort(1);  // qualified: a direct call, which the compiler sees never returns
  }

  int rank_ = 0, size_ = 1;
  bool owner_ = false;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
  double timeout_ = 600;
  std::unique_ptr<BucketThread> buckets_;  // null without MPI_THREAD_MULTIPLE or with 1 rank
};

// The buckets of one step: each packed into a float64 buffer (weight * value, then the weight)
// and summed across ranks by the communicator's BucketThread while the backward pass goes on
// (or, without one, by the main thread in finish()).
class MpiWeightedMean : public WeightedMean {
 public:
  MpiWeightedMean(MpiCommunicator& communicator, double weight) : c_(communicator), weight_(weight) {}
  // A step that ends before finish() (an error in the backward pass; the run is then ended)
  // may leave buckets the thread still sums into: those are leaked, not freed under it.
  ~MpiWeightedMean() override {
    for (auto& bucket : buckets_) {
      if (c_.buckets_ && !c_.buckets_->done(bucket->job)) (void)bucket.release();
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
        const size_t n = static_cast<size_t>(t->numel()), at = bucket.buffer.size();
        bucket.buffer.resize(at + n);  // within the reserved size: no reallocation
        double* out = bucket.buffer.data() + at;
        // A weight of 0 (a rank without rows) adds nothing, even where its values are not finite.
        if (weight_ == 0) std::fill(out, out + n, 0.0);
        else for (size_t i = 0; i < n; ++i) out[i] = weight_ * static_cast<double>(data[i]);
      };
      if (t->dtype() == DataType::Float32) pack(t->data<float>());
      else pack(t->data<double>());
      bucket.layout.push_back({name, t->dtype(), t->shape()});
    }
    bucket.buffer.push_back(weight_);
    bucket.job.buffer = &bucket.buffer;
    if (c_.buckets_) {
      c_.bytes_ += bucket.buffer.size() * sizeof(double);
      c_.buckets_->submit(bucket.job);
    }
  }

  runtime::NamedTensors finish() override {
    runtime::NamedTensors averaged;
    for (auto& bucket : buckets_) {
      if (c_.buckets_) {
        const auto start = std::chrono::steady_clock::now();
        if (!c_.buckets_->wait(bucket->job, c_.timeout_)) c_.time_out(kWhat, c_.timeout_);
        c_.seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!bucket->job.error.empty()) throw Error(bucket->job.error);
      } else {  // sum() counts its bytes and seconds
        c_.check_same_count(static_cast<int64_t>(bucket->buffer.size()));
        c_.sum(bucket->buffer, kWhat);
      }
      const double total = bucket->buffer.back();
      if (!(total > 0)) throw Error("distributed: the ranks' sample counts sum to " + std::to_string(total));
      size_t k = 0;
      for (const auto& [name, dtype, shape] : bucket->layout) {
        Tensor mean(dtype, shape);
        auto unpack = [&]<class T>(T* data) {
          const size_t n = static_cast<size_t>(mean.numel());
          const double* in = bucket->buffer.data() + k;
          for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(in[i] / total);
          k += n;
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
    std::vector<double> buffer;  // never resized once submitted: the thread sums into it
    BucketThread::Job job;
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


}  // namespace onnxtrain::distributed
