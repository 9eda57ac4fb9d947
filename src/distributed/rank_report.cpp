#include "distributed/rank_report.h"

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace onnxtrain::distributed {

void print_rank_error(int rank, int ranks, const std::string& message) {
  const std::string line = "error: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ": " + message + "\n";
  std::fflush(stdout);
  std::fwrite(line.data(), 1, line.size(), stderr);  // stderr is unbuffered: one write
  std::fflush(stderr);
}

namespace {

// The value of `field` ("VmHWM") of /proc/self/status in MiB, or -1.
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream in(line.substr(field.size() + 1));
    double kib = -1;
    in >> kib;  // "VmHWM:	  123456 kB"
    return kib < 0 ? -1 : kib / 1024;
  }
  return -1;
}

size_t variables_bytes(const runtime::NamedTensors& state) {
  size_t bytes = 0;
  for (const auto& [name, value] : state) bytes += value.nbytes();
  return bytes;
}

}  // namespace

std::string memory_line(const runtime::NamedTensors& state, size_t step_arena_bytes) {
  const size_t bytes = variables_bytes(state);
  constexpr double kMiB = 1024.0 * 1024.0;
  std::ostringstream line;
  line << std::fixed << std::setprecision(1) << "memory: variables " << static_cast<double>(bytes) / kMiB
       << " MiB, step arena " << static_cast<double>(step_arena_bytes) / kMiB << " MiB";
  const double peak = status_mib("VmHWM");
  if (peak >= 0) line << ", peak RSS " << peak << " MiB";
  return line.str();
}

std::string rank_memory_line(int rank, int ranks, const runtime::NamedTensors& state, bool sharded) {
  const size_t bytes = variables_bytes(state);
  std::ostringstream line;
  line << "rank " << rank << " of " << ranks << ": holds " << bytes << " bytes of variables"
       << (sharded ? " (optimizer state sharded)" : "");
  const double rss = status_mib("VmRSS"), peak = status_mib("VmHWM");
  line << std::fixed << std::setprecision(1);
  if (rss >= 0) line << "; current RSS " << rss << " MiB";
  if (peak >= 0) line << ", peak RSS " << peak << " MiB";
  return line.str();
}

}  // namespace onnxtrain::distributed
