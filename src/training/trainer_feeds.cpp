// The training loop's feeding (trainer_feeds.h).
#include "training/trainer_feeds.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/dispatch.h"
#include "core/finite.h"
#include "core/parallel.h"
#include "onnxtrain/error.h"

namespace onnxtrain::training::feeding {

namespace {

std::pair<std::string, std::string> split_pair(const std::string& s, const char* option) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw Error(std::string(option) + " '" + s + "': expected NAME=VALUE");
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

double parse_factor(const std::string& text) {
  try {
    const auto slash = text.find('/');
    if (slash == std::string::npos) return std::stod(text);
    return std::stod(text.substr(0, slash)) / std::stod(text.substr(slash + 1));
  } catch (const std::exception&) {
    throw Error("--scale: '" + text + "' is not a number or a fraction like 1/255");
  }
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Floating values fed to an integer input (labels from a CSV file) must be whole numbers.
void require_integral(const Tensor& rows, const Feed& f) {
  const std::vector<double> values = rows.to_double_vector();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != std::trunc(values[i])) {
      std::ostringstream value;
      value << values[i];
      throw Error("column '" + f.column + "' holds " + value.str() + " at element " + std::to_string(i) +
                  ", which is not a whole number, for input '" + f.input.name + "' " + f.input.type_string());
    }
  }
}

// Fails naming `what` and the first element that is NaN or Inf, if any.
void require_finite(const Tensor& t, const std::string& what) {
  if (!is_floating(t.dtype())) return;
  visit_dtype<FloatTypes>(t.dtype(), what, [&]<class T>() {
    const T* p = t.data<T>();
    const int64_t count = t.numel();
    if (all_finite(p, 0, count)) return;  // one vectorized pass; else find the first bad element below
    for (int64_t i = 0; i < count; ++i) {
      const auto v = static_cast<compute_t<T>>(p[i]);
      if (!std::isfinite(v)) throw Error(what + " holds " + (std::isnan(v) ? "NaN" : "Inf") + " at element " + std::to_string(i));
    }
  });
}

// The largest finite value of floating type `to`.
double largest_finite(DataType to) {
  switch (to) {
    case DataType::Float16: return 65504.0;
    case DataType::BFloat16: return 3.3895313892515355e38;
    case DataType::Float32: return static_cast<double>(std::numeric_limits<float>::max());
    default: return std::numeric_limits<double>::max();
  }
}

// Whether every value of an integer column of type `from`, scaled by `scale` and converted to
// floating type `to`, is finite: the largest magnitude `from` holds, scaled, stays under half of
// `to`'s largest finite value (the half leaves room for rounding). Then no converted value can be
// NaN or Inf, and the check for them is left out (uint8 images scaled by 1/255 into float32).
bool converts_finite(DataType from, DataType to, double scale) {
  if (!is_integral(from) || !std::isfinite(scale)) return false;
  double largest = 0;
  visit_dtype<IntTypes>(from, "column", [&]<class From>() {
    largest = std::max(-static_cast<double>(std::numeric_limits<From>::min()),
                       static_cast<double>(std::numeric_limits<From>::max()));
  });
  return largest * std::abs(scale) < largest_finite(to) / 2;
}

// The column's rows converted to the input's type and per-sample shape. With `check_finite`, a
// floating input is checked for NaN and Inf (Error naming the input and the first such element),
// each thread checking the values it has just converted while they are in its cache.
Tensor convert_column(const Tensor& rows, const Feed& f, bool check_finite) {
  const runtime::ValueInfo& in = f.input;
  const DataType to = in.dtype == DataType::Undefined ? rows.dtype() : in.dtype;
  Tensor t = rows;
  if (is_floating(to)) {
    // One pass, split between the threads the steps run on (the batch is converted between two
    // steps, while they would wait): each value goes through double, is scaled, and lands in the
    // input's type.
    t = Tensor(to, rows.shape());
    const int64_t count = rows.numel();
    const bool check = check_finite && !converts_finite(rows.dtype(), to, f.scale);
    std::atomic<bool> non_finite{false};
    visit_dtype<AllTypes>(rows.dtype(), "column '" + f.column + "'", [&]<class From>() {
      visit_dtype<FloatTypes>(to, "input '" + in.name + "'", [&]<class To>() {
        const From* src = rows.data<From>();
        To* dst = t.data<To>();
        const double scale = f.scale;
        std::atomic<bool>* flag = &non_finite;
        parallel_for(count, kParallelGrain, [=](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) dst[i] = convert<To>(convert<double>(src[i]) * scale);
          if (check && !all_finite(dst, begin, end)) flag->store(true, std::memory_order_relaxed);
        });
      });
    });
    if (non_finite.load()) require_finite(t, "input '" + in.name + "'");
  } else if (rows.dtype() != to) {
    if (is_floating(rows.dtype())) require_integral(rows, f);
    t = rows.cast(to);
  }
  if (!in.rank_known) return t;
  const int64_t batch = t.dim(0);
  const int64_t per_sample = batch ? t.numel() / batch : 0;
  Shape target;
  int64_t known = 1, unknown = -1;
  for (size_t d = 0; d < in.dims.size(); ++d) {
    int64_t dim = in.dims[d];
    if (d == 0) dim = batch;
    else if (dim < 0) unknown = static_cast<int64_t>(d);
    if (d > 0 && dim >= 0) known *= dim;
    target.push_back(dim < 0 ? 1 : dim);
  }
  if (unknown >= 0 && known > 0) target[static_cast<size_t>(unknown)] = per_sample / known;
  if (target.numel() != t.numel()) {
    throw Error("column '" + f.column + "' has samples of shape " + Shape(std::vector<int64_t>(
                    t.shape().begin() + 1, t.shape().end())).to_string() + ", which do not fit input '" + in.name + "' " +
                in.type_string());
  }
  return t.view(target);
}

}  // namespace

std::vector<Feed> resolve(const TrainingSession& session, const SourceInfo& source, const TrainOptions& options) {
  const std::set<std::string> have(source.columns.begin(), source.columns.end());
  std::map<std::string, std::string> mapping;
  for (const auto& m : options.map) mapping.insert(split_pair(m, "--map"));
  std::map<std::string, double> scales;
  for (const auto& s : options.scale) {
    const auto [column, factor] = split_pair(s, "--scale");
    if (!have.contains(column)) throw Error("--scale: no column '" + column + "' in " + source.name);
    scales[column] = parse_factor(factor);
  }
  std::vector<Feed> feeds;
  const auto& step_inputs = session.step_inputs(0);
  for (size_t i = 0; i < step_inputs.size(); ++i) {
    const runtime::ValueInfo& in = step_inputs[i];
    std::string column;
    if (mapping.contains(in.name)) {
      column = mapping.at(in.name);
      mapping.erase(in.name);
    } else if (have.contains(in.name)) {
      column = in.name;
    } else if (source.idx) {
      column = is_floating(in.dtype) || in.dtype == DataType::Undefined ? "image" : "label";
    } else if (source.positional) {
      column = std::to_string(i);
    }
    if (column.empty() || !have.contains(column)) {
      throw Error("input '" + in.name + "' " + in.type_string() + " reads no column of " + source.name + " (columns: " +
                  joined(source.columns) + "); choose one with --map " + in.name + "=COLUMN");
    }
    if (source.batch_size > 0 && in.rank_known && !in.dims.empty() && in.dims[0] >= 0 && in.dims[0] != source.batch_size) {
      throw Error("input '" + in.name + "' has a fixed batch dim of " + std::to_string(in.dims[0]) + " but --batch-size is " +
                  std::to_string(source.batch_size));
    }
    const bool inference = std::any_of(session.inference_inputs().begin(), session.inference_inputs().end(),
                                       [&](const auto& v) { return v.name == in.name; });
    feeds.push_back({in, column, scales.contains(column) ? scales.at(column) : 1.0, inference});
  }
  for (const auto& [input, column] : mapping) throw Error("--map " + input + "=" + column + ": the model has no step input '" + input + "'");
  return feeds;
}

runtime::NamedTensors inputs(const Batch& batch, const std::vector<Feed>& feeds, const std::string& where,
                             bool check_finite, bool inference_only) {
  runtime::NamedTensors in;
  const Feed* first = nullptr;
  for (const auto& f : feeds) {
    if (inference_only && !f.inference) continue;
    const auto it = batch.find(f.column);
    if (it == batch.end()) throw Error(where + ": no column '" + f.column + "' (input '" + f.input.name + "' reads it)");
    const Tensor& rows = it->second;
    if (rows.rank() == 0) throw Error(where + ": column '" + f.column + "' is a scalar; a batch column has a batch dim first");
    if (!first) {
      first = &f;
    } else if (rows.dim(0) != batch.at(first->column).dim(0)) {
      throw Error(where + ": column '" + f.column + "' has " + std::to_string(rows.dim(0)) + " samples but '" + first->column +
                  "' has " + std::to_string(batch.at(first->column).dim(0)));
    }
    Tensor t;
    try {
      t = convert_column(rows, f, check_finite);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    in[f.input.name] = std::move(t);
  }
  return in;
}

void EvalSums::add(const Tensor& logits, const Tensor& labels) {
  const auto scores = logits.cast(DataType::Float64);
  const auto y = labels.to_int64_vector("labels");
  const int64_t b = scores.dim(0), c = scores.numel() / std::max<int64_t>(b, 1);
  const double* s = scores.data<double>();
  for (int64_t i = 0; i < b; ++i) {
    const double* row = s + i * c;
    const int64_t best = std::max_element(row, row + c) - row;
    const double m = row[best];
    double z = 0;
    for (int64_t k = 0; k < c; ++k) z += std::exp(row[k] - m);
    const int64_t label = y[static_cast<size_t>(i)];
    if (label < 0 || label >= c) throw Error("label " + std::to_string(label) + " is out of range for " + std::to_string(c) + " classes");
    loss += -(row[label] - m - std::log(z));
    correct += best == label;
    ++count;
  }
}

}  // namespace onnxtrain::training::feeding
