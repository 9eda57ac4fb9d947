#include "training/cpu_load.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
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
  if (busy >= online) return usable;
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

}  // namespace onnxtrain::cpu_load
