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
#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

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

// A folder that the harnesses share, made once: temp_directory_path()/onnxtrain-fuzz. What they
// keep there is named so that every process can use it (nothing per process to clean up after
// a crash): an empty folder, and links to in-memory files by descriptor (/proc/self/fd/N).
inline std::filesystem::path shared_folder(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / "onnxtrain-fuzz" / name;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  return path;
}

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

// Where check_tensor stores what it read, so the reads are not optimized away.
inline volatile unsigned checksum = 0;

// Aborts unless a tensor a reader returned holds all its elements: a shape whose element count
// overflows no int64 at any dim (Shape::numel() multiplies the dims in order, so a product
// overflowing before a zero dim is undefined behaviour there), a byte size (that count times the
// element size) that overflows no int64, and that many bytes (or strings) readable behind
// raw_data() (every one is read, so ASan reports storage that is too short).
inline void check_tensor(const Tensor& t) {
  if (!t.defined()) return;
  int64_t elements = 1, bytes = 0;
  bool fits = true;
  for (const int64_t d : t.shape()) fits = fits && d >= 0 && !__builtin_mul_overflow(elements, d, &elements);
  if (!fits || __builtin_mul_overflow(elements, static_cast<int64_t>(dtype_size(t.dtype())), &bytes)) {
    std::fprintf(stderr, "check_tensor: a reader returned the shape %s\n", t.shape().to_string().c_str());
    std::abort();
  }
  unsigned sum = 0;
  if (t.dtype() == DataType::String) {
    const auto* strings = t.data<std::string>();
    for (int64_t i = 0; i < t.numel(); ++i) sum += static_cast<unsigned>(strings[i].size());
  } else {
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (int64_t i = 0; i < bytes; ++i) sum += p[i];
  }
  checksum = sum;
}

inline void check_value(const Value& v) {
  if (v.is_tensor()) check_tensor(v.tensor());
  if (v.is_sequence()) {
    for (const Value& e : v.elements()) check_value(e);
  }
  if (v.is_optional() && v.has_element()) check_value(v.element());
}

}  // namespace onnxtrain::fuzz
