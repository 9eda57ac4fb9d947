// ops/store_choice.h: the trials that choose between streaming and ordinary stores for the
// optimizers' passes, on simulated training loops whose step time depends on the store kind of
// the optimizer's run and of the run before it (a run reads what the previous one wrote).
#include <algorithm>
#include <chrono>
#include <vector>

#include <gtest/gtest.h>

#include "ops/store_choice.h"

namespace onnxtrain::ops {
namespace {

using Clock = StoreChoice::Clock;

// Milliseconds from one optimizer run's start to the next: its own pass, which depends on how the
// previous run wrote its inputs, plus the rest of the step, which reads the weights it wrote.
struct Costs {
  double pass[2][2];  // [streaming now][streaming before]
  double rest[2];     // [streaming now]
  double period(bool now, bool before) const { return pass[now][before] + rest[now]; }
};

// Runs `runs` steps of a loop with `bytes` written per run; returns each run's store kind. A run
// with index in `slow` takes `extra_ms` longer (another process holding the core).
std::vector<bool> simulate(StoreChoice& choice, const Costs& costs, int runs, int64_t bytes = 8 << 20,
                           const std::vector<int>& slow = {}, double extra_ms = 0) {
  std::vector<bool> kinds;
  Clock::time_point t{};
  bool before = true;
  for (int run = 0; run < runs; ++run) {
    const bool now = choice.start(bytes, t);
    kinds.push_back(now);
    double ms = costs.period(now, before);
    if (std::find(slow.begin(), slow.end(), run) != slow.end()) ms += extra_ms;
    t += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    before = now;
  }
  return kinds;
}

// The MLP on the Intel VM of 2026-12-02 in outline: ordinary stores make the steady step faster
// (1.56 against 1.80 ms), but an ordinary run after a streaming one reads its inputs from memory
// (0.55 ms) and a streaming run after an ordinary one finds them in cache (0.30): timed run by run
// in strict alternation, streaming would look faster (1.65 against 1.75 ms).
const Costs kOrdinaryFaster{{{0.36, 0.55}, {0.30, 0.45}}, {1.20, 1.35}};

TEST(StoreChoice, WarmsUpStreamingThenChoosesTheFasterSteadyState) {
  StoreChoice choice;
  const std::vector<bool> kinds = simulate(choice, kOrdinaryFaster, StoreChoice::kChoosingRuns + 50);
  for (int run = 0; run < StoreChoice::kWarmup; ++run) EXPECT_TRUE(kinds[run]) << "warm-up run " << run;
  int streaming_trials = 0, ordinary_trials = 0;
  for (int run = StoreChoice::kWarmup; run < StoreChoice::kChoosingRuns; ++run) {
    (kinds[run] ? streaming_trials : ordinary_trials)++;
  }
  EXPECT_EQ(streaming_trials, 2 * StoreChoice::kTrials);
  EXPECT_EQ(ordinary_trials, 2 * StoreChoice::kTrials);
  for (int run = StoreChoice::kChoosingRuns; run < static_cast<int>(kinds.size()); ++run) {
    EXPECT_FALSE(kinds[run]) << "run " << run << " streams; ordinary stores make the faster steps";
  }
}

TEST(StoreChoice, EachWayTriedInPairs) {
  // A trial's timed run follows a run of its own kind, so it reads state written its own way.
  StoreChoice choice;
  const std::vector<bool> kinds = simulate(choice, kOrdinaryFaster, StoreChoice::kChoosingRuns);
  for (int run = StoreChoice::kWarmup; run + 1 < StoreChoice::kChoosingRuns; run += 2) {
    EXPECT_EQ(kinds[run], kinds[run + 1]) << "runs " << run << " and " << run + 1;
  }
}

TEST(StoreChoice, ChoosesStreamingWhereItIsFaster) {
  // Ordinary stores evicting what the rest of the step needs: streaming faster in every state.
  const Costs streaming_faster{{{0.90, 0.90}, {0.50, 0.50}}, {1.10, 1.00}};
  StoreChoice choice;
  const std::vector<bool> kinds = simulate(choice, streaming_faster, StoreChoice::kChoosingRuns + 20);
  for (int run = StoreChoice::kChoosingRuns; run < static_cast<int>(kinds.size()); ++run) {
    EXPECT_TRUE(kinds[run]) << "run " << run;
  }
}

TEST(StoreChoice, SlowRunsOfABusyMachineDoNotDecide) {
  // Every trial run but the last two of each way delayed by 5 ms: the fastest period of each way
  // decides.
  StoreChoice choice;
  std::vector<int> slow;
  for (int run = StoreChoice::kWarmup; run < StoreChoice::kChoosingRuns - 4; ++run) slow.push_back(run);
  const std::vector<bool> kinds =
      simulate(choice, kOrdinaryFaster, StoreChoice::kChoosingRuns + 10, 8 << 20, slow, 5.0);
  for (int run = StoreChoice::kChoosingRuns; run < static_cast<int>(kinds.size()); ++run) {
    EXPECT_FALSE(kinds[run]) << "run " << run;
  }
}

TEST(StoreChoice, LargePassesAlwaysStream) {
  // At kAlwaysStream bytes and above there are no trials, even where ordinary stores would win.
  StoreChoice choice;
  const std::vector<bool> kinds = simulate(choice, kOrdinaryFaster, 100, StoreChoice::kAlwaysStream);
  for (int run = 0; run < 100; ++run) EXPECT_TRUE(kinds[run]) << "run " << run;
}

}  // namespace
}  // namespace onnxtrain::ops
