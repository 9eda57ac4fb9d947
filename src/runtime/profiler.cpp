#include "runtime/profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

namespace onnxtrain::runtime {

Profiler& Profiler::instance() {
  static Profiler profiler;
  return profiler;
}

Profiler::Profiler() {
  const char* env = std::getenv("ONNXTRAIN_PROFILE");
  enabled_ = env && *env && std::string_view(env) != "0";
  if (enabled_) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end && *end == '\0' && n > 1) nodes_listed_ = static_cast<size_t>(n);
  }
}

void Profiler::record(const std::string& op_type, const std::string& node, int64_t ns) {
  std::lock_guard lock(mutex_);
  Entry& op = by_op_[op_type];
  op.ns += ns;
  ++op.runs;
  auto& [op_name, entry] = by_node_[node];
  op_name = op_type;
  entry.ns += ns;
  ++entry.runs;
}

Profiler::~Profiler() {
  if (!enabled_ || by_op_.empty()) return;
  int64_t total = 0;
  std::vector<std::pair<std::string, Entry>> ops(by_op_.begin(), by_op_.end());
  for (const auto& [name, e] : ops) total += e.ns;
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::fprintf(stderr, "onnxtrain profile: %.1f ms in kernels\n%-28s %10s %7s %10s\n", total / 1e6, "op type", "ms",
               "share", "runs");
  for (const auto& [name, e] : ops) {
    std::fprintf(stderr, "%-28s %10.1f %6.1f%% %10lld\n", name.c_str(), e.ns / 1e6, 100.0 * e.ns / std::max<int64_t>(total, 1),
                 static_cast<long long>(e.runs));
  }
  std::vector<std::pair<std::string, std::pair<std::string, Entry>>> nodes(by_node_.begin(), by_node_.end());
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& a, const auto& b) { return a.second.second.ns > b.second.second.ns; });
  std::fprintf(stderr, "most expensive nodes:\n");
  for (size_t i = 0; i < std::min(nodes_listed_, nodes.size()); ++i) {
    const auto& [node, rest] = nodes[i];
    std::fprintf(stderr, "  %10.1f ms %10lld runs  %s\n", rest.second.ns / 1e6,
                 static_cast<long long>(rest.second.runs), node.c_str());  // the label names the op
  }
}

}  // namespace onnxtrain::runtime
