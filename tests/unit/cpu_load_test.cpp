// The load readings, the thread count that follows from them (runtime/cpu_load.h) and the
// sessions' and the training loop's use of it. Run with no other test at the same time
// (tests/CMakeLists.txt).
#include "runtime/cpu_load.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "onnxtrain/session.h"
#include "onnxtrain/trainer.h"
#include "test_util.h"
#include "trainer_fixture.h"

namespace onnxtrain::cpu_load {
namespace {

using namespace std::chrono_literals;
using Clock = ThreadGovernor::Clock;

TEST(CpuLoad, ThreadsForLeavesOtherProcessesTheirCpus) {
  EXPECT_EQ(threads_for(2, 2, 0), 2);
  EXPECT_EQ(threads_for(2, 2, 1), 1);
  EXPECT_EQ(threads_for(4, 64, 10), 4);  // a cpuset of 4 on a machine with CPUs to spare
  EXPECT_EQ(threads_for(8, 8, 3), 5);
  EXPECT_EQ(threads_for(8, 8, 7), 1);
  EXPECT_EQ(threads_for(1, 8, 0), 1);
  // No CPU left: one thread, so that no thread spins for a partner another process holds;
  // but a cpuset narrower than the machine keeps its CPUs (the reading does not describe them).
  EXPECT_EQ(threads_for(2, 2, 2), 1);
  EXPECT_EQ(threads_for(2, 2, 5), 1);
  EXPECT_EQ(threads_for(8, 8, 8), 1);
  EXPECT_EQ(threads_for(4, 64, 64), 4);
}

// Readings from a list, then its last value; counts the calls.
struct Readings {
  std::vector<std::optional<int>> values;
  size_t calls = 0;
  ThreadGovernor::Reader reader() {
    return [this]() -> std::optional<int> { return values[std::min(calls++, values.size() - 1)]; };
  }
};

ThreadGovernor::Config config(int usable, int online) {
  ThreadGovernor::Config c;
  c.usable = usable;
  c.online = online;
  c.window = 4;
  c.first_gap = Clock::duration::zero();
  return c;
}

TEST(CpuLoad, GovernorStartsFromTheLeastOfItsFirstReadings) {
  Readings busy{{1, 1, 1, 1}};
  EXPECT_EQ(ThreadGovernor(config(2, 2), busy.reader()).threads(), 1);
  EXPECT_EQ(busy.calls, 4U);
  Readings once{{1, 1, 0, 1}};  // a process busy for a moment is not a busy CPU
  EXPECT_EQ(ThreadGovernor(config(2, 2), once.reader()).threads(), 2);
  Readings unreadable{{std::nullopt}};
  EXPECT_EQ(ThreadGovernor(config(2, 2), unreadable.reader()).threads(), 2);
  Readings one_cpu{{3}};
  EXPECT_EQ(ThreadGovernor(config(1, 4), one_cpu.reader()).threads(), 1);
  EXPECT_EQ(one_cpu.calls, 0U);  // nothing to choose
}

TEST(CpuLoad, GovernorChangesAfterAWindowOfAgreeingReadings) {
  // 4 readings at the start, then one per update at least `interval` apart.
  Readings r{{0, 0, 0, 0, /*updates:*/ 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0}};
  const auto c = config(2, 2);
  ThreadGovernor g(c, r.reader());
  EXPECT_EQ(g.threads(), 2);
  Clock::time_point t = Clock::now();
  std::vector<int> counts;
  for (int i = 0; i < 11; ++i) {
    t += c.interval;
    counts.push_back(g.update(t));
    EXPECT_EQ(g.update(t + c.interval / 2), counts.back());  // no reading before the interval
  }
  EXPECT_EQ(r.calls, 4U + 11U);
  // 1 1 0 1: no change; 1 1 1 1 (updates 4-7): 1 thread; 0 0 0 0 (8-11): 2 again.
  EXPECT_EQ(counts, (std::vector<int>{2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 2}));
  EXPECT_EQ(g.busy(), 0);
}

TEST(CpuLoad, GovernorKeepsItsCountWhenReadingsFail) {
  Readings r{{1, 1, 1, 1, std::nullopt}};
  ThreadGovernor g(config(2, 2), r.reader());
  EXPECT_EQ(g.threads(), 1);
  Clock::time_point t = Clock::now();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(g.update(t += 1s), 1);
}

TEST(CpuLoad, CpuCountsArePositive) {
  EXPECT_GE(online_cpus(), 1);
  EXPECT_GE(usable_cpus(), 1);
  EXPECT_LE(usable_cpus(), online_cpus());
}

// The least of `n` readings 2 ms apart.
int least_reading(int n) {
  int least = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const std::optional<int> reading = runnable_elsewhere();
    EXPECT_TRUE(reading.has_value());
    if (reading) least = std::min(least, *reading);
    std::this_thread::sleep_for(2ms);
  }
  return least;
}

// `n` child processes that spin until the object goes.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t child = ::fork();
      if (child == 0) {
        for (;;) asm volatile("" ::: "memory");
      }
      if (child > 0) children_.push_back(child);
    }
    std::this_thread::sleep_for(20ms);
  }
  ~Spinners() {
    for (pid_t child : children_) ::kill(child, SIGKILL);
    for (pid_t child : children_) ::waitpid(child, nullptr, 0);
  }
  size_t size() const { return children_.size(); }

 private:
  std::vector<pid_t> children_;
};

TEST(CpuLoad, RunnableElsewhereCountsAnotherProcessThatSpins) {
  Spinners spinner(1);
  ASSERT_EQ(spinner.size(), 1U);
  EXPECT_GE(least_reading(10), 1);
}

TEST(CpuLoad, RunnableElsewhereLeavesOutThisProcessOwnThreads) {
  // Six threads of this process spin; counted as another process's, no reading of 10 would be
  // below 6. (Other tests running at the same time could only add to the readings.)
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < 6; ++i) {
    spinners.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  std::this_thread::sleep_for(20ms);
  const int least = least_reading(10);
  stop = true;
  for (auto& t : spinners) t.join();
  EXPECT_LT(least, 6);
}

// The steps' thread counts in a metrics file.
std::vector<int> step_threads(const std::filesystem::path& metrics) {
  std::vector<int> threads;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["type"] == "step") threads.push_back(record["threads"].get<int>());
  }
  return threads;
}

// Without a thread count the loop leaves other processes the CPUs they keep busy: with a
// spinning process on every CPU but one it trains on 1 thread, says so, records it in every
// step's metrics, and leaves the calling thread's OpenMP count as it found it. A count of the
// caller's holds whatever the load.
TEST(CpuLoad, TrainingLeavesBusyCpusToTheirProcesses) {
  if (usable_cpus() < 2 || usable_cpus() != online_cpus() || std::getenv("OMP_NUM_THREADS")) {
    GTEST_SKIP() << "needs every CPU of the machine usable, 2 or more, and no OMP_NUM_THREADS";
  }
  // ctest runs no other test beside this one (RUN_SERIAL); a process outside it would add to
  // the spinners below.
  if (const int busy = least_reading(10); busy > 0) GTEST_SKIP() << busy << " runnable threads of other processes already";
  testing::Fixture f;
  auto o = f.options("trained.onnx");
  o.metrics = f.dir.path() / "metrics.jsonl";
  o.quiet = false;
  auto fixed = f.options("fixed.onnx");
  fixed.threads = 2;
  fixed.metrics = f.dir.path() / "fixed.jsonl";
  const int before = omp_get_max_threads();
  std::ostringstream log;
  {
    Spinners spinners(online_cpus() - 1);
    ASSERT_EQ(static_cast<int>(spinners.size()), online_cpus() - 1);
    EXPECT_EQ(training::train(o, log).steps, 9);
    training::train(fixed, log);
  }
  EXPECT_EQ(omp_get_max_threads(), before);
  EXPECT_NE(log.str().find("threads: 1 (other processes keep " + std::to_string(online_cpus() - 1) + " of "),
            std::string::npos)
      << log.str();
  EXPECT_EQ(step_threads(o.metrics), std::vector<int>(9, 1));
  EXPECT_EQ(step_threads(fixed.metrics), std::vector<int>(9, 2));
}

TEST(CpuLoad, ThreadScopeSetsTheCountAndRestoresTheCallers) {
  const int before = omp_get_max_threads();
  {
    const ThreadScope scope(before + 1);
    EXPECT_EQ(omp_get_max_threads(), before + 1);
  }
  EXPECT_EQ(omp_get_max_threads(), before);
  {
    const ThreadScope none(std::nullopt);
    EXPECT_EQ(omp_get_max_threads(), before);
  }
  EXPECT_EQ(omp_get_max_threads(), before);
}

// An inference session without a thread count follows the load too: with a spinning process on
// every CPU but one, its runs make the process's count 1 (the runs take it, and the caller's
// OpenMP count is as it was after each); a count of the caller's is set for good, as
// SessionOptions::threads says, whatever the load.
TEST(CpuLoad, SessionRunsLeaveBusyCpusToTheirProcesses) {
  if (usable_cpus() < 2 || usable_cpus() != online_cpus() || std::getenv("OMP_NUM_THREADS")) {
    GTEST_SKIP() << "needs every CPU of the machine usable, 2 or more, and no OMP_NUM_THREADS";
  }
  if (const int busy = least_reading(10); busy > 0) GTEST_SKIP() << busy << " runnable threads of other processes already";
  const Tensor x = testing::f32({4}, {-1.0f, 2.0f, -3.0f, 4.0f});
  const onnx::ModelProto model = testing::node_model({"Relu"}, {x});
  runtime::Session session(model);
  runtime::SessionOptions two;
  two.threads = 2;
  runtime::Session fixed(model, two);
  const int before = omp_get_max_threads();
  {
    Spinners spinners(online_cpus() - 1);
    ASSERT_EQ(static_cast<int>(spinners.size()), online_cpus() - 1);
    const auto out = session.run({{"in0", x}});
    testing::expect_close(out.at("out0"), testing::f32({4}, {0.0f, 2.0f, 0.0f, 4.0f}));
    EXPECT_EQ(omp_get_max_threads(), before);
    const std::optional<Followed> followed = followed_threads();  // no new reading within 250 ms
    ASSERT_TRUE(followed.has_value());
    EXPECT_EQ(followed->threads, 1);
    EXPECT_EQ(followed->busy, online_cpus() - 1);
    fixed.run({{"in0", x}});
    EXPECT_EQ(omp_get_max_threads(), 2);
  }
  omp_set_num_threads(before);
}

}  // namespace
}  // namespace onnxtrain::cpu_load
