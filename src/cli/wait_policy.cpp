#include "cli/wait_policy.h"

#include <charconv>
#include <string_view>

namespace onnxtrain::cli {

namespace {

bool positive_integer(std::string_view text) {
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value > 0;
}

}  // namespace

bool fixes_thread_count(int argc, const char* const* argv, const char* omp_num_threads) {
  if (omp_num_threads != nullptr) return true;
  constexpr std::string_view kFlag = "--threads";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;  // what follows is operands, not flags
    if (arg == kFlag) {
      if (i + 1 < argc && positive_integer(argv[i + 1])) return true;
    } else if (arg.starts_with(kFlag) && arg[kFlag.size()] == '=') {
      if (positive_integer(arg.substr(kFlag.size() + 1))) return true;
    }
  }
  return false;
}

int openmp_spin_count(int argc, const char* const* argv, const char* omp_num_threads) {
  return fixes_thread_count(argc, argv, omp_num_threads) ? kSpinFixedCount : kSpinFollowingLoad;
}

}  // namespace onnxtrain::cli
