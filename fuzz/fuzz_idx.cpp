// Fuzz harness: IDX files (MNIST's format) through data::read_idx (dataset.h), read from an
// in-memory file. read_idx inflates a file whose name ends in .gz, so an input that starts
// with gzip's magic bytes (1f 8b) is read through a link named "input.gz" to that file.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "harness.h"
#include "onnxtrain/dataset.h"

namespace {

// A folder of its own holding input.gz -> /proc/PID/fd/N; removed at exit.
struct GzipLink {
  std::filesystem::path folder, link;
  explicit GzipLink(const onnxtrain::fuzz::MemFile& file) {
    folder = std::filesystem::temp_directory_path() / ("onnxtrain-fuzz-idx-" + std::to_string(getpid()));
    std::filesystem::create_directories(folder);
    link = folder / "input.gz";
    std::filesystem::remove(link);
    std::filesystem::create_symlink("/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(file.fd()), link);
  }
  ~GzipLink() {
    std::error_code ec;
    std::filesystem::remove_all(folder, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static onnxtrain::fuzz::MemFile file;
  static GzipLink gzip(file);
  const auto path = file.write(data, size);
  const bool gzipped = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  onnxtrain::fuzz::expect_error_or_success([&] {
    onnxtrain::fuzz::check_tensor(onnxtrain::data::read_idx(gzipped ? gzip.link : path));
  });
  return 0;
}
