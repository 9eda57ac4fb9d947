// The `onnxtrain` executable. (The Python console script calls cli::main directly;
// python/onnxtrain/__init__.py sets the same OpenMP policy for it.)
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

#include "cli/app.h"
#include "cli/wait_policy.h"

namespace {

// libgomp reads its wait policy from the environment when it is loaded, before main. By
// default its threads spin for a long while at the end of every parallel region; when another
// process holds a core, a spinning thread waits for a descheduled one, and 2 threads ran up to
// 10x slower than 1 (docs/performance.md, "Shared cores"). So the command re-executes itself
// with a spin chosen by who chooses the thread count (cli/wait_policy.h): long where the count
// follows the load (the default, which drops to one thread when another process keeps a CPU
// busy), short where --threads or OMP_NUM_THREADS fixes it; unless the user chose a policy
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT set). The process and its environment are otherwise
// unchanged (mpirun's variables included); without /proc/self/exe it goes on with libgomp's
// default.
void choose_openmp_wait_policy(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  const int spin = onnxtrain::cli::openmp_spin_count(argc, argv, std::getenv("OMP_NUM_THREADS"));
  if (::setenv("GOMP_SPINCOUNT", std::to_string(spin).c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f, RLIMIT_FSIZE) sends SIGXFSZ, which by default kills the
  // process (signal(7)); ignored, the write fails with EFBIG and the command reports it naming
  // the file, exit 2, the old file intact (io::write_file_atomic). Kept across the exec below.
  std::signal(SIGXFSZ, SIG_IGN);
  choose_openmp_wait_policy(argc, argv);
  return onnxtrain::cli::main(argc, argv);
}
