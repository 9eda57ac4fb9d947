// How many of the machine's CPUs other processes keep busy, read from Linux's /proc, and the
// thread count that follows: the default of runtime::Session, TrainingSession and the training
// loop (training/trainer.cpp), which would otherwise run one OpenMP thread per CPU and, on CPUs
// another process holds, wait for their own descheduled threads (docs/performance.md, "Shared
// cores": ResNet-18's batch-1 inference took 2.65 ms a run on 2 threads with one CPU busy,
// against 0.99 on 1 thread and 0.68 on 2 when idle).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <optional>
#include <string>

namespace onnxtrain::cpu_load {

// CPUs this process may run on (sched_getaffinity: taskset, mpirun's binding, a container's
// cpuset); at least 1.
int usable_cpus();

// CPUs online in the machine (sysconf(_SC_NPROCESSORS_ONLN)); at least 1.
int online_cpus();

// Runnable threads of other processes at this instant: /proc/stat's procs_running (the
// machine's threads that run or wait for a CPU) less this process's threads in state R
// (/proc/self/task/*/stat). nullopt where /proc cannot be read. The two files are not read at
// the same instant, so one reading may be off by a thread that started or stopped between them.
std::optional<int> runnable_elsewhere();

// Threads for a process that may use `usable` of the machine's `online` CPUs while `busy`
// threads of other processes are runnable: the CPUs they leave, at most `usable`, at least 1 (so
// 1 when they leave none); but `usable` when they leave none and `usable` < `online` (a cpuset
// narrower than the machine, whose own CPUs the machine-wide reading does not describe). With
// every CPU busy, 2 threads spinning as long as the default's wait policy has them
// (src/cli/wait_policy.h; libgomp's own default is longer) ran the Fashion-MNIST CNN's batch-1
// inference at 0.42 ms a run in one measurement and 3.67 ms in another, against 0.65-0.77 on 1
// thread, and trained as fast as 1 thread give or take the noise (docs/performance.md, "Shared
// cores"). Until 2026-11-30, with a short spin, this case took `usable` threads.
int threads_for(int usable, int online, int busy);

// A thread count that follows the load (the process's sessions share one: followed_threads),
// chosen from readings of runnable_elsewhere(): at the start from a few readings 2 ms apart
// (their least), then, called between runs or steps, from one reading at most every `interval`.
// It changes only when the last `window` readings all give the same thread count, so a process
// that is busy for a moment, or a reading off by one thread, changes nothing; a process busy
// throughout takes its CPU in about window x interval (2 s by default), and gives it back as long
// after it stops. Without /proc, or with one usable CPU, it keeps `usable`.
class ThreadGovernor {
 public:
  using Clock = std::chrono::steady_clock;
  using Reader = std::function<std::optional<int>()>;
  struct Config {
    int usable = 1, online = 1;
    Clock::duration interval = std::chrono::milliseconds(250);
    size_t window = 8;
    int first_readings = 4;                        // at the start, 2 ms apart
    Clock::duration first_gap = std::chrono::milliseconds(2);
  };
  // The machine's CPUs and /proc.
  ThreadGovernor();
  // For tests: any CPU counts and readings (first_gap 0 skips the waits).
  ThreadGovernor(Config config, Reader read);

  int threads() const { return threads_; }
  // Takes a reading when `interval` has passed since the last one; returns the thread count
  // to use from now on (threads()).
  int update(Clock::time_point now);
  // The other processes' runnable threads the count was last chosen for.
  int busy() const { return busy_; }

 private:
  Config config_;
  Reader read_;
  std::deque<int> readings_;
  Clock::time_point last_{};
  int threads_ = 1, busy_ = 0;
};

// The default thread count of the process's sessions: one ThreadGovernor for the whole process,
// made at the first call (its first readings take ~6 ms), updated by the calls after (a
// reading at most every 250 ms). `threads`, and the other processes' runnable threads it was
// chosen for. nullopt when the default does not follow the load: OMP_NUM_THREADS is set, the
// process may use one CPU only, or /proc cannot be read. Thread-safe: a call that finds another
// thread taking a reading returns the count as it stands.
struct Followed {
  int threads = 1;
  int busy = 0;
};
std::optional<Followed> followed_threads();

// "N (why)": a thread count and the load it follows, for logs ("1 (other processes keep 1 of 2
// CPUs busy)").
std::string describe(const Followed& followed);

// Sets the calling thread's OpenMP thread count (omp_set_num_threads) to `threads` for the
// scope's lifetime and restores the count it had after; does nothing for nullopt or the count
// the thread has already.
class ThreadScope {
 public:
  explicit ThreadScope(std::optional<int> threads);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int before_ = 0;  // 0: nothing to restore
};

// The scope a session's call runs in: `requested` threads (> 0: set for good, as
// SessionOptions::threads and TrainingOptions::threads document); else, when `follow` is true,
// the calling thread's OpenMP count is OpenMP's default (one per usable CPU, as at the first
// call: nobody called omp_set_num_threads on it) and followed_threads() gives a count, that count
// while the call runs; else nothing (the caller's count holds).
ThreadScope session_threads(int requested, bool follow = true);

}  // namespace onnxtrain::cpu_load
