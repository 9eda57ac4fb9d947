// runtime::Profiler — per-node wall-clock times, switched on by the environment.
//
// ONNXTRAIN_PROFILE=1 makes every Plan time each kernel (std::chrono::steady_clock around
// Kernel::run) and, at process exit, print to stderr the total milliseconds per op type and
// the 15 most expensive nodes, with run counts; ONNXTRAIN_PROFILE=N with N > 1 lists the N most
// expensive nodes instead. Off (the default), a Plan checks one bool per
// step. Times are wall-clock on the calling thread and include the kernels' own parallelism.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace onnxtrain::runtime {

class Profiler {
 public:
  // The process-wide profiler; enabled() is fixed by ONNXTRAIN_PROFILE at first use.
  static Profiler& instance();
  bool enabled() const { return enabled_; }
  // Adds one run of node `node` (graph-qualified name) of type `op_type` lasting `ns`.
  void record(const std::string& op_type, const std::string& node, int64_t ns);
  ~Profiler();

 private:
  Profiler();
  struct Entry {
    int64_t ns = 0;
    int64_t runs = 0;
  };
  bool enabled_ = false;
  size_t nodes_listed_ = 15;
  std::mutex mutex_;
  std::unordered_map<std::string, Entry> by_op_;
  std::unordered_map<std::string, std::pair<std::string, Entry>> by_node_;  // node -> (op, times)
};

}  // namespace onnxtrain::runtime
