// ops::StoreChoice — whether an optimizer's pass writes with streaming stores or ordinary ones,
// chosen by timing both ways inside the training loop (ops/optimizers.cpp: Momentum and Adam).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

namespace onnxtrain::ops {

// Whether the float32 passes of Momentum and Adam write their outputs with streaming
// (non-temporal) stores, which skip reading the cache lines they fill and leave the values in
// memory, or with ordinary ones, which leave them in cache for the next step's reads. The values
// are the same bits either way; which is faster depends on the machine: the Fashion-MNIST MLP's
// ScaledAdam (669 K parameters, 8 MB written per step) took 0.22 ms per step with streaming
// stores against 0.85-1.14 with ordinary ones on the AVX-512 VM of issue 7, and on the AVX2 VM of
// issue 18 1.28-1.35 against 0.84-1.07 ms (three 400-step profiles each; the whole step's kernels
// 10-17 % faster with ordinary stores, the products reading W from cache). So each kernel tries
// both ways after kWarmup runs and keeps the faster, timing the period from a run's start to the
// next run's start: in a training loop a whole step, so that what the stores leave in cache, or
// not, for the step's other kernels counts too (the fastest period of each way: a busy machine
// only slows runs down). Timing the kernel alone chose streaming stores for the MLP's ScaledAdam
// on the Zen 4 VM of 2026-11-29, while its training ran at 375.7-395.9 steps/s with ordinary
// stores against 364.6-402.0 with the choice (five alternating pairs of 300-step runs, ordinary
// faster in four).
//
// Each way runs twice in a row and only the second run is timed: it reads the weights and state
// the first wrote the same way, as every run does once the choice is made. Until 2026-12-02 the
// trials alternated run by run and timed every one, which charged each way for the other's
// stores (an ordinary-store run read what a streaming one had left in memory; a streaming one
// found its inputs in cache). On the Intel Xeon VM of 2026-12-02 (model 167) the MLP trained at
// 543-570 steps/s with streaming stores forced and 596-635 with ordinary ones (thirteen
// alternating pairs of 600-step runs), while the alternating trials timed both ways within 2 % of
// each other (2.07-2.12 ms) and chose streaming stores in two runs of six; the paired trials time
// them 6-18 % apart (streaming 2.16-2.45 ms, ordinary 2.02-2.16) and chose ordinary stores in
// fourteen runs of fourteen, then in eleven of thirteen more (the other two: a tie under
// ONNXTRAIN_PROFILE, and a slow minute in which streaming's best period was 3.6 % shorter).
// (Before the alternating trials of 20 warm-up runs and 10 of each way there were 2 and 3: the
// MLP's ScaledAdam chose streaming stores in two runs of two on the Intel VM of 2026-11-30,
// 0.44-0.45 ms a step where ordinary ones take 0.34-0.36.)
//
// A run writing kAlwaysStream bytes or more streams without trials: what it writes does not stay
// in cache until the next step reads it, and the trials, a few milliseconds apart in steps of
// hundreds, chose at random. On the Intel VM of 2026-11-30 (ONNXTRAIN_PROFILE, three runs of each
// way): BERT's ScaledAdam (11.2 M parameters, 134 MB written) 9.1-9.2 ms streaming against
// 9.4-13.1 ordinary and 9.6-13.3 as the trials chose; ResNet-18's Momentum (11.2 M, 89 MB)
// 6.5-6.6 against 10.6-10.8 (its whole step 35.1-35.7 against 38.9-39.8 ms); the CNN's
// ScaledAdam (40 MB) 2.5 against 3.7.
class StoreChoice {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int64_t kAlwaysStream = int64_t{32} << 20;
  static constexpr int kWarmup = 10;  // the first runs fault in the outputs' pages and settle
  static constexpr int kTrials = 6;   // timed runs of each way
  // Runs until the choice is made: the warm-up, then each way twice per trial.
  static constexpr int kChoosingRuns = kWarmup + 4 * kTrials;

  // Called as a run starts, with the bytes it writes; returns whether it writes with streaming
  // stores. Reads the clock only while the trials last.
  bool start(int64_t bytes_written) {
    const bool trying = bytes_written < kAlwaysStream && chosen_ < 0;
    return start(bytes_written, trying ? Clock::now() : Clock::time_point{});
  }

  // The same with the run's start given (tests simulate a training loop's clock); `now` is read
  // only while the trials last.
  bool start(int64_t bytes_written, Clock::time_point now) {
    if (bytes_written >= kAlwaysStream) return true;
    if (chosen_ >= 0) return chosen_ == 1;
    if (timed(runs_ - 1)) {  // the previous run was a timed trial: its period
      double& best = best_[streaming(runs_ - 1) ? 1 : 0];
      best = std::min(best, std::chrono::duration<double>(now - last_).count());
    }
    if (runs_ == kChoosingRuns) {
      chosen_ = best_[1] <= best_[0] ? 1 : 0;
      return chosen_ == 1;
    }
    last_ = now;
    return streaming(runs_++);
  }

 private:
  // The store kind of run `run` while still timing: streaming through the warm-up, then each way
  // in turn for two runs, the second of which is timed.
  static bool streaming(int run) { return run < kWarmup || ((run - kWarmup) / 2) % 2 == 0; }
  static bool timed(int run) { return run >= kWarmup && (run - kWarmup) % 2 == 1; }

  int runs_ = 0;
  int chosen_ = -1;  // 1: streaming stores, 0: ordinary ones, -1: still timing
  Clock::time_point last_;  // the previous run's start
  double best_[2] = {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
};

}  // namespace onnxtrain::ops
