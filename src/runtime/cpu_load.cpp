#include "runtime/cpu_load.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"

namespace onnxtrain::cpu_load {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return online_cpus();
}

int online_cpus() { return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))); }

namespace {

// io::read_file, nullopt where it fails (a thread that ended: its folder is gone).
std::optional<std::string> read_text(const std::filesystem::path& path) {
  try {
    return io::read_file(path);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// "procs_running N" of /proc/stat (proc(5)).
std::optional<int> procs_running() {
  const std::optional<std::string> text = read_text("/proc/stat");
  if (!text) return std::nullopt;
  const std::string key = "\nprocs_running ";
  const size_t at = text->find(key);
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stoi(text->substr(at + key.size(), 16));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// This process's threads in state R: the field after the command name, which is in
// parentheses and may itself hold ')' (proc(5), /proc/pid/stat).
std::optional<int> own_runnable() {
  std::error_code ec;
  std::filesystem::directory_iterator task("/proc/self/task", ec);
  if (ec) return std::nullopt;
  int running = 0;
  // A thread that ends meanwhile has no file to read: skipped. No exceptions (increment(ec)).
  for (; !ec && task != std::filesystem::directory_iterator(); task.increment(ec)) {
    const std::optional<std::string> stat = read_text(task->path() / "stat");
    if (!stat) continue;
    const size_t close = stat->rfind(')');
    if (close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 2] == 'R') ++running;
  }
  if (ec) return std::nullopt;
  return running;
}

}  // namespace

std::optional<int> runnable_elsewhere() {
  const std::optional<int> all = procs_running();
  const std::optional<int> own = own_runnable();
  if (!all || !own) return std::nullopt;
  return std::max(0, *all - *own);
}

int threads_for(int usable, int online, int busy) {
  usable = std::max(usable, 1);
  // No CPU left: one thread where the reading covers this process's CPUs, `usable` where a
  // cpuset narrower than the machine may leave them free (the reading cannot tell).
  if (busy >= online) return usable < online ? usable : 1;
  return std::clamp(online - std::max(busy, 0), 1, usable);
}

ThreadGovernor::ThreadGovernor() : ThreadGovernor(Config{usable_cpus(), online_cpus()}, runnable_elsewhere) {}

ThreadGovernor::ThreadGovernor(Config config, Reader read) : config_(config), read_(std::move(read)) {
  threads_ = std::max(config_.usable, 1);
  last_ = Clock::now();
  if (config_.usable <= 1) return;
  std::optional<int> least;
  for (int i = 0; i < config_.first_readings; ++i) {
    if (i > 0 && config_.first_gap.count() > 0) std::this_thread::sleep_for(config_.first_gap);
    const std::optional<int> reading = read_();
    if (!reading) return;
    least = least ? std::min(*least, *reading) : *reading;
  }
  if (!least) return;
  busy_ = *least;
  threads_ = threads_for(config_.usable, config_.online, busy_);
}

int ThreadGovernor::update(Clock::time_point now) {
  if (config_.usable <= 1 || now - last_ < config_.interval) return threads_;
  last_ = now;
  const std::optional<int> reading = read_();
  if (!reading) return threads_;
  readings_.push_back(*reading);
  if (readings_.size() > config_.window) readings_.pop_front();
  if (readings_.size() < config_.window) return threads_;
  const int target = threads_for(config_.usable, config_.online, readings_.front());
  for (int r : readings_) {
    if (threads_for(config_.usable, config_.online, r) != target) return threads_;
  }
  if (target != threads_) {
    threads_ = target;
    busy_ = readings_.front();
  }
  return threads_;
}

namespace {

// The process's governor and the count it last gave (published for readers that find the
// mutex taken). `state` 0: not made yet, 1: following, 2: not following.
struct Process {
  std::mutex mutex;
  std::optional<ThreadGovernor> governor;
  std::atomic<int> state{0}, threads{1}, busy{0};
};

Process& process() {
  static Process p;
  return p;
}

std::optional<Followed> published(const Process& p) {
  if (p.state.load(std::memory_order_acquire) != 1) return std::nullopt;
  return Followed{p.threads.load(std::memory_order_relaxed), p.busy.load(std::memory_order_relaxed)};
}

}  // namespace

std::optional<Followed> followed_threads() {
  Process& p = process();
  const int state = p.state.load(std::memory_order_acquire);
  if (state == 2) return std::nullopt;
  std::unique_lock lock(p.mutex, std::defer_lock);
  if (state == 1) {
    if (!lock.try_lock()) return published(p);  // another thread is reading /proc
  } else {
    lock.lock();  // the first calls wait for the governor to be made
  }
  if (p.state.load(std::memory_order_relaxed) == 0) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    if ((omp && *omp) || usable_cpus() <= 1 || !runnable_elsewhere()) {
      p.state.store(2, std::memory_order_release);
      return std::nullopt;
    }
    p.governor.emplace();
  } else {
    p.governor->update(ThreadGovernor::Clock::now());
  }
  p.threads.store(p.governor->threads(), std::memory_order_relaxed);
  p.busy.store(p.governor->busy(), std::memory_order_relaxed);
  p.state.store(1, std::memory_order_release);
  return published(p);
}

std::string describe(const Followed& followed) {
  const int online = online_cpus();
  const std::string why = followed.busy == 0 ? "no other process keeps a CPU busy"
                          : followed.busy >= online
                              ? "other processes keep every CPU busy"
                              : "other processes keep " + std::to_string(followed.busy) + " of " +
                                    std::to_string(online) + " CPUs busy";
  return std::to_string(followed.threads) + " (" + why + ")";
}

ThreadScope::ThreadScope(std::optional<int> threads) {
  if (!threads) return;
  const int before = omp_get_max_threads();
  if (*threads == before) return;
  before_ = before;
  omp_set_num_threads(*threads);
}

ThreadScope::~ThreadScope() {
  if (before_ > 0) omp_set_num_threads(before_);
}

ThreadScope session_threads(int requested, bool follow) {
  if (requested > 0) {
    omp_set_num_threads(requested);
    return ThreadScope(std::nullopt);
  }
  // A count the caller set (omp_set_num_threads, or the training loop's) stays: only OpenMP's
  // default without OMP_NUM_THREADS, one thread per usable CPU, follows the load. The affinity
  // mask is read once: read at every run (and the count set even when it was the caller's
  // already), the Fashion-MNIST MLP's batch-1 inference took 22.1-22.6 us a run without a count
  // against 21.7-21.9 on 2 threads; this way 21.6-22.1 against 21.6-21.9 (three alternating pairs
  // of 5000 runs).
  static const int usable = usable_cpus();
  if (!follow || omp_get_max_threads() != usable) return ThreadScope(std::nullopt);
  const std::optional<Followed> followed = followed_threads();
  return ThreadScope(followed ? std::optional<int>(followed->threads) : std::nullopt);
}

}  // namespace onnxtrain::cpu_load
