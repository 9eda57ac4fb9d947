// Datasets for `onnxtrain train`: named columns of samples, read from common file formats.
//
// A Dataset is a set of columns, each a Tensor whose dim 0 indexes the samples (all columns
// have the same number of samples). load_dataset reads a train split and, where the format
// has one, a test split:
//   - a folder of IDX files in the MNIST layout: train-images-idx3-ubyte and
//     train-labels-idx1-ubyte (each optionally .gz), with t10k-* as the test split; columns
//     "image" (uint8 [N, rows, cols]) and "label" (uint8 [N]);
//   - a folder of .npy files: one column per file, named after it; a subfolder test/ of
//     .npy files is the test split;
//   - a .npz file: one column per array; arrays named "test/NAME" (or a file STEM_test.npz
//     beside it) form the test split;
//   - a .csv file: a header row of column names, then numeric rows; each column becomes a
//     float32 [N] tensor; a file STEM_test.csv beside it is the test split.
// Errors (onnxtrain::Error, naming the file): a missing file, a truncated or malformed file,
// columns of different lengths, an empty dataset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain::data {

struct Dataset {
  std::map<std::string, Tensor> columns;
  // Number of samples (dim 0 of every column).
  int64_t size() const;
  // The rows `indices` of every column, in that order.
  Dataset rows(const std::vector<int64_t>& indices) const;
};

struct Splits {
  Dataset train;
  std::optional<Dataset> test;
  std::string format;  // "idx", "npy", "npz" or "csv"
};

// Reads a dataset as the file comment describes; `spec` is the folder or file.
Splits load_dataset(const std::filesystem::path& spec);

// One IDX file (LeCun's MNIST format: magic 0x0000TTNN, big-endian int32 dims, data);
// element types uint8, int8, int16, int32, float32, float64; gzip-compressed when the name
// ends in .gz.
Tensor read_idx(const std::filesystem::path& path);

// A CSV file with a header row; every column float32 [N].
Dataset read_csv(const std::filesystem::path& path);

}  // namespace onnxtrain::data
