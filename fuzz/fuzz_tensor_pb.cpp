// Fuzz harness: serialized TensorProto / SequenceProto / OptionalProto (.pb) files through
// io::read_tensor_pb and io::read_value_pb (io.h), read from an in-memory file. A .pb file does
// not say which message it holds, so each input is read as a tensor, as a sequence of float32
// tensors and as an optional sequence of int64 tensors.
#include "harness.h"
#include "onnxtrain/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using onnxtrain::DataType;
  using onnxtrain::ValueType;
  static onnxtrain::fuzz::MemFile file;
  static const ValueType sequence = ValueType::sequence(ValueType::tensor(DataType::Float32));
  static const ValueType optional =
      ValueType::optional(ValueType::sequence(ValueType::tensor(DataType::Int64)));
  const auto path = file.write(data, size);
  using onnxtrain::fuzz::check_tensor, onnxtrain::fuzz::check_value;
  onnxtrain::fuzz::expect_error_or_success([&] { check_tensor(onnxtrain::io::read_tensor_pb(path).second); });
  onnxtrain::fuzz::expect_error_or_success([&] { check_value(onnxtrain::io::read_value_pb(path, sequence).second); });
  onnxtrain::fuzz::expect_error_or_success([&] { check_value(onnxtrain::io::read_value_pb(path, optional).second); });
  return 0;
}
