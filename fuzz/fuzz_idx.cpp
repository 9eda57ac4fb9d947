// Fuzz harness: IDX files (MNIST's format) through data::read_idx (dataset.h), read from an
// in-memory file. read_idx inflates a file whose name ends in .gz, so an input that starts
// with gzip's magic bytes (1f 8b) is read through a link to that file whose name ends in .gz.
#include <cstdlib>
#include <filesystem>

#include "harness.h"
#include "onnxtrain/dataset.h"

namespace {

// onnxtrain-fuzz/fd-N.gz -> /proc/self/fd/N (harness.h's shared folder): the memfd of whichever
// process opens it, under a name that ends in .gz.
std::filesystem::path gzip_link(const onnxtrain::fuzz::MemFile& file) {
  const std::string fd = std::to_string(file.fd());
  const auto link = onnxtrain::fuzz::shared_folder("fd-" + fd + ".gz");
  std::error_code ec;
  std::filesystem::create_symlink("/proc/self/fd/" + fd, link, ec);  // or there already
  if (std::filesystem::read_symlink(link, ec) != "/proc/self/fd/" + fd) {
    std::fprintf(stderr, "fuzz_idx: %s is not a link to /proc/self/fd/%s\n", link.c_str(), fd.c_str());
    std::abort();
  }
  return link;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static onnxtrain::fuzz::MemFile file;
  static const std::filesystem::path gzip = gzip_link(file);
  const auto path = file.write(data, size);
  const bool gzipped = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  onnxtrain::fuzz::expect_error_or_success([&] {
    onnxtrain::fuzz::check_tensor(onnxtrain::data::read_idx(gzipped ? gzip : path));
  });
  return 0;
}
