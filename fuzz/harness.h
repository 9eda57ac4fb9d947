// Shared pieces of the fuzz harnesses (fuzz/fuzz_*.cpp, docs/reliability.md "Fuzzing").
//
// A harness feeds one input to a reader and lets only onnxtrain::Error through silently:
// any other exception escapes LLVMFuzzerTestOneInput, which aborts the process (libFuzzer and
// the standalone driver then report the input as a crash), as do ASan and UBSan reports.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "onnxtrain/error.h"

namespace onnxtrain::fuzz {

// An in-memory file (memfd) that readers taking a path read through /proc/self/fd/N. One per
// process, rewritten for each input, so an execution costs no disk and leaves nothing behind.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("onnxtrain-fuzz", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { close(fd_); }

  // Replaces the contents by data[0, size); returns the path that opens them.
  std::filesystem::path write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path();
  }
  std::filesystem::path path() const { return "/proc/self/fd/" + std::to_string(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Runs `read` and swallows onnxtrain::Error, the readers' one way to reject bad input (printed
// when the environment sets ONNXTRAIN_FUZZ_VERBOSE, to see what a seed gets to).
template <typename Read>
void expect_error_or_success(Read&& read) {
  static const bool verbose = std::getenv("ONNXTRAIN_FUZZ_VERBOSE") != nullptr;
  try {
    read();
    if (verbose) std::fprintf(stderr, "  read\n");
  } catch (const Error& e) {
    if (verbose) std::fprintf(stderr, "  error: %s\n", e.what());
  }
}

}  // namespace onnxtrain::fuzz
