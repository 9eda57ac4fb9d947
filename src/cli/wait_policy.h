// libgomp's wait policy for the `onnxtrain` command and the Python package, chosen before
// libgomp is loaded (it reads GOMP_SPINCOUNT once, at load): how long a thread that finished its
// part of a parallel region spins (pause instructions) before it sleeps, from who chooses the
// thread count (docs/performance.md, "Shared cores").
#pragma once

namespace onnxtrain::cli {

// Where the thread count follows the load (runtime/cpu_load.h: no --threads, no
// OMP_NUM_THREADS), threads spin long: the count drops to one thread as soon as another process
// keeps a CPU busy, so no thread spins for a descheduled partner, and on an idle machine waking a
// thread that slept costs tens of microseconds (47 us on the 2-core Firecracker VM of
// 2026-11-30, where the short spin below, 10 us of 10 ns pauses, trained the Fashion-MNIST MLP
// at 320.7 steps/s and this one at 378.0). 30000 pauses are 0.3 ms there, 0.74 ms at Zen 4's 25 ns.
inline constexpr int kSpinFollowingLoad = 30000;
// Where the count is fixed (--threads N > 0, OMP_NUM_THREADS), threads spin briefly: a fixed
// count may meet a busy CPU, where a long spin waits for a descheduled partner (2 threads
// with one other busy process, the same VM: 171.1 steps/s at this spin, 55.8 at 30000, 192.7 on
// 1 thread).
inline constexpr int kSpinFixedCount = 1000;

// True when the command line `argv` (argv[0] the program) fixes the thread count: a
// `--threads N` or `--threads=N` with N a positive number, or `omp_num_threads` (the
// environment's OMP_NUM_THREADS, null when unset) set. The flag's value is not validated here
// (the subcommand's parser does that); anything but a positive integer counts as not fixing it.
bool fixes_thread_count(int argc, const char* const* argv, const char* omp_num_threads);

// The GOMP_SPINCOUNT for that command line: kSpinFixedCount or kSpinFollowingLoad.
int openmp_spin_count(int argc, const char* const* argv, const char* omp_num_threads);

}  // namespace onnxtrain::cli
