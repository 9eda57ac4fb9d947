// Fuzz harness: CSV datasets through data::read_csv (dataset.h), read from an in-memory file.
#include "harness.h"
#include "onnxtrain/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static onnxtrain::fuzz::MemFile file;
  const auto path = file.write(data, size);
  onnxtrain::fuzz::expect_error_or_success([&] {
    for (const auto& [name, column] : onnxtrain::data::read_csv(path).columns) onnxtrain::fuzz::check_tensor(column);
  });
  return 0;
}
