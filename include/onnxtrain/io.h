// Reading and writing models and tensors.
//
// Models: ONNX ModelProto files (.onnx), with external data (onnx.proto "External Tensor
// Data": `location` relative to the model's folder, `offset`, `length`). Tensors: NumPy
// .npy (format 1.0-3.0, C order, little-endian) and .npz archives, and serialized
// TensorProto (.pb) files as used by the ONNX backend test data.
//
// Every function throws onnxtrain::Error naming the file (and tensor) on bad input: a missing
// or unreadable file, truncated or invalid content, an unsupported element type. Every writer
// goes through write_file_atomic: the target is either its old contents or its complete new
// ones, whatever happens (kill -9, power loss, a full disk, a file-size limit), and temporary
// files do not accumulate.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnx {
class ModelProto;
class TensorProto;
}  // namespace onnx

namespace onnxtrain::io {

// Serialized protobuf messages are limited to 2 GiB; larger models keep tensors in external
// data files.
inline constexpr uint64_t kMaxProtoBytes = (uint64_t{1} << 31) - 1;

// Loads a model. Checks: the file exists and is at most kMaxProtoBytes (checked before
// reading: a larger file costs no memory), parses as a ModelProto with messages nested at most
// 100 deep (protobuf's recursion limit: about 30 levels of subgraphs), has a graph and an
// ir_version. Tensors stored as external data are not read here: they stay references,
// resolved against the model's folder when a tensor is made from them (tensor_from_proto).
onnx::ModelProto load_model(const std::filesystem::path& path);
// Parses a model from memory; `source` names it in errors.
onnx::ModelProto parse_model(const std::string& bytes, const std::string& source);

struct SaveOptions {
  // Tensors stored as external data in `model` are read from this folder (usually the folder
  // the model was loaded from) and written inline or to the new external data file.
  std::filesystem::path source_dir;
  // When the serialized model would exceed this many bytes, initializers of at least
  // `external_min_bytes` are moved to "<file name>.data" beside the model. The default is the
  // protobuf limit; tests lower it.
  uint64_t external_threshold = kMaxProtoBytes;
  uint64_t external_min_bytes = 1024;
};
// Replaces every tensor of `model` stored as external data (in the graph, the training_info
// graphs and their subgraphs) by its data, read from `base_dir` (the model's folder), so that
// the model no longer depends on that folder (the ONNX checker of an in-memory model, for one,
// looks for external data in the current folder).
void inline_external_data(onnx::ModelProto& model, const std::filesystem::path& base_dir);
// Writes a model atomically (see the file comment), serializing it straight into the file
// (taken by value: move a model in to avoid a copy). Throws Error naming `path` when the
// folder is not writable or the disk is full; the previous file, if any, is left intact.
void save_model(onnx::ModelProto model, const std::filesystem::path& path,
                const SaveOptions& options = {});
// Sets the data of every initializer of the main graph and of the training_info algorithm
// graphs that `values` names to that tensor (tensor_to_proto: its dtype and shape replace the
// initializer's); other initializers are left as they are.
void set_initializers(onnx::ModelProto& model, const std::map<std::string, Tensor>& values);
// save_model of `model` with the initializers that `values` names (in the main graph and in the
// training_info algorithm graphs) holding those tensors, written from the tensors' memory
// straight into the file instead of being copied into the proto first: saving or checkpointing
// a training session needs no second copy of its variables (ResNet-18 with momentum: 134 MB).
// The file parses to the same ModelProto as save_model of the filled-in model (its fields may
// come in another order, which protobuf readers accept). Falls back to filling in a copy when
// the model needs external data (over `options.external_threshold`) or holds external data
// references, or a value is a string or packed (4-bit) tensor. Errors as save_model.
// (taken by value: move a model in to avoid a copy of what it holds besides the values).
void save_model_with_values(onnx::ModelProto model, const std::map<std::string, Tensor>& values,
                            const std::filesystem::path& path, const SaveOptions& options = {});

// TensorProto <-> Tensor. `base_dir` resolves external data; `what` names the tensor in errors.
// Paths in external data must be relative and stay inside base_dir.
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::filesystem::path& base_dir,
                         const std::string& what);
// Fills `proto` (dims, data_type, raw_data, name) from `tensor`.
void tensor_to_proto(const Tensor& tensor, const std::string& name, onnx::TensorProto& proto);

// A serialized TensorProto file. read returns the tensor and its name (may be empty).
std::pair<std::string, Tensor> read_tensor_pb(const std::filesystem::path& path);
void write_tensor_pb(const Tensor& tensor, const std::string& name,
                     const std::filesystem::path& path);

// A serialized TensorProto, SequenceProto or OptionalProto file (onnx.proto, onnx-data.proto)
// holding a value of `type` (a .pb file does not say which message it holds: the graph's
// declared type of the input or output does). A tensor type reads a TensorProto. Returns the
// value and its name (may be empty). Maps and sparse tensors are rejected with an Error.
std::pair<std::string, Value> read_value_pb(const std::filesystem::path& path, const ValueType& type);
// Writes a TensorProto, SequenceProto or OptionalProto by the value's kind, atomically.
void write_value_pb(const Value& value, const std::string& name, const std::filesystem::path& path);

// NumPy files. Fortran-order arrays, big-endian data and object arrays are rejected.
Tensor read_npy(const std::filesystem::path& path);
Tensor parse_npy(const std::string& bytes, const std::string& source);
void write_npy(const Tensor& tensor, const std::filesystem::path& path);
std::string serialize_npy(const Tensor& tensor);
// Every array of an .npz archive (stored or deflated), in archive order, named without the
// ".npy" suffix.
std::vector<std::pair<std::string, Tensor>> read_npz(const std::filesystem::path& path);

// Reads a whole file; throws Error naming the path when it cannot.
std::string read_file(const std::filesystem::path& path);
// Opens `path` and calls read(fd) (for streaming readers); throws Error when it cannot open it.
void read_file(const std::filesystem::path& path, const std::function<void(int fd)>& read);
// Atomically replaces `path` with `bytes`. The steps:
//  1. removes the temporary files of `path` that killed writers left: entries of its folder
//     named "<filename>.tmp-<pid>-<n>" whose process no longer exists (kill(pid, 0) fails with
//     ESRCH). Those of live processes (a concurrent writer) and all other files are kept;
//  2. writes into an unnamed temporary file in the same folder (open(2) O_TMPFILE), which the
//     kernel frees if the process dies before step 4; where the filesystem has no O_TMPFILE
//     (EOPNOTSUPP, EISDIR, EINVAL) or /proc/self/fd is missing, into a named one,
//     "<filename>.tmp-<pid>-<n>", which step 1 of a later write of `path` removes;
//  3. fsyncs it;
//  4. links it as "<filename>.tmp-<pid>-<n>" (linkat AT_EMPTY_PATH, else /proc/self/fd/N),
//     renames that over `path` and fsyncs the folder.
// A process killed between 4's link and rename is the only way an unnamed write leaves a file.
// The file gets mode 0644 less the umask. Throws Error naming `path` and the failed step with
// errno's text ("...: writing 10 bytes failed: File too large"; EFBIG needs SIGXFSZ ignored,
// as the `onnxtrain` command and CPython do): the old file is then untouched, and the temporary
// file removed. Concurrent writers of one `path`: the last rename wins, each file whole.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);
// The same with the contents written by write(fd) into the temporary file (for streaming
// writers): it returns "" on success, else the failed action ("writing 10 bytes"), reported
// with errno; nothing is left behind on failure, nor when write throws.
void write_file_atomic(const std::filesystem::path& path, const std::function<std::string(int fd)>& write);

}  // namespace onnxtrain::io
