// TfIdfVectorizer (ai.onnx 9, ONNX operator doc "TfIdfVectorizer"): X, int32 or int64 of shape
// [C] or [N, C], in; Y, float32 of shape [max(ngram_indexes) + 1] or [N, max(ngram_indexes) + 1],
// out: per row, how often each n-gram of the pool occurs, weighted by `mode`.
//
// The pool (pool_int64s) holds the 1-grams, then the 2-grams, ... : ngram_counts[i] is where
// the (i + 1)-grams start (a CSR row pointer: ngram_counts[0] is 0, the segments never shrink the
// pool, and an (i + 1)-gram segment holds a multiple of i + 1 items). The k-th n-gram of the
// pool, counted across all lengths, is reported at Y[ngram_indexes[k]].
// An n-gram of X with skip s (0 <= s <= max_skip_count) takes items i, i + s + 1, i + 2(s + 1),
// ... of a row (the doc's example: [94, 17, 36, 12, 28] with 2 skips gives the 2-grams [94, 12]
// and [17, 28]); n-grams of min_gram_length..max_gram_length items are counted for every skip,
// 1-grams once (they do not depend on the skip). Pool n-grams of other lengths count nothing.
// mode: "TF" gives the counts; "IDF" gives weights[k] where the k-th n-gram occurs (counts
// above 1 truncated to 1); "TFIDF" gives weights[k] * count. weights (default all 1) is indexed
// like the pool, as the doc says ("the i-th element in weights is the weight of the i-th n-gram
// in pool"; ONNX Runtime and the ONNX reference index it by output coordinate instead, which
// is the same when ngram_indexes is 0, 1, 2, ...). Pool n-grams sharing an output coordinate
// add up there; a repeated pool n-gram is counted for each of its entries.
// pool_strings (string X) is refused: this build's tensors hold no strings. Not differentiable
// (the doc's tags: X and Y non-differentiable).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

enum class Weighting { Tf, Idf, TfIdf };

// The pool's n-grams as a prefix tree over their items; a node lists the pool n-grams (by
// ordinal) that end there.
template <class Item>
class NgramTrie {
 public:
  NgramTrie() : nodes_(1) {}
  void insert(const Item* items, int64_t n, int32_t ordinal) {
    int32_t node = 0;
    for (int64_t i = 0; i < n; ++i) {
      auto& children = nodes_[static_cast<size_t>(node)].children;
      auto [it, added] = children.try_emplace(items[i], static_cast<int32_t>(nodes_.size()));
      node = it->second;
      if (added) nodes_.emplace_back();
    }
    nodes_[static_cast<size_t>(node)].ngrams.push_back(ordinal);
  }
  // The child of `node` along `item`, or -1.
  int32_t child(int32_t node, const Item& item) const {
    const auto& children = nodes_[static_cast<size_t>(node)].children;
    const auto it = children.find(item);
    return it == children.end() ? -1 : it->second;
  }
  const std::vector<int32_t>& ngrams(int32_t node) const { return nodes_[static_cast<size_t>(node)].ngrams; }

 private:
  struct Node {
    std::unordered_map<Item, int32_t> children;
    std::vector<int32_t> ngrams;
  };
  std::vector<Node> nodes_;
};

struct TfIdfAttrs {
  Weighting weighting = Weighting::Tf;
  int64_t min_gram_length = 1, max_gram_length = 1, max_skip_count = 0;
  std::vector<int64_t> ngram_indexes;
  std::vector<float> weights;  // one per pool n-gram
  int64_t output_size = 0;
  NgramTrie<int64_t> trie;
};

class TfIdfKernel final : public Kernel {
 public:
  explicit TfIdfKernel(TfIdfAttrs attrs) : a_(std::move(attrs)) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() != 1 && x.rank() != 2) {
      fail("input " + ctx.input_name(0) + " must be [C] or [N, C], got " + x.description());
    }
    const int64_t rows = x.rank() == 1 ? 1 : x.dim(0);
    const int64_t cols = x.dim(x.rank() - 1);
    const Shape out_shape = x.rank() == 1 ? Shape{a_.output_size} : Shape{rows, a_.output_size};
    Tensor& y = ctx.allocate_output(0, DataType::Float32, out_shape);
    std::fill_n(y.data<float>(), y.numel(), 0.0f);
    const std::vector<int64_t> items = x.to_int64_vector("TfIdfVectorizer input");
    std::vector<int64_t> counts(a_.ngram_indexes.size());
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(counts.begin(), counts.end(), 0);
      count_row(items.data() + r * cols, cols, counts);
      weigh_row(counts, y.data<float>() + r * a_.output_size);
    }
  }

 private:
  // counts[k] += occurrences of the k-th pool n-gram in row[0, cols).
  void count_row(const int64_t* row, int64_t cols, std::vector<int64_t>& counts) const {
    for (int64_t skip = 0; skip <= a_.max_skip_count; ++skip) {
      const int64_t step = skip + 1;
      // 1-grams are counted with the first skip only; with no longer n-grams, stop there.
      const int64_t min_length = skip == 0 ? a_.min_gram_length : std::max<int64_t>(a_.min_gram_length, 2);
      if (min_length > a_.max_gram_length) break;
      for (int64_t start = 0; start + (min_length - 1) * step < cols; ++start) {
        int32_t node = 0;
        for (int64_t n = 1, at = start; n <= a_.max_gram_length && at < cols; ++n, at += step) {
          node = a_.trie.child(node, row[at]);
          if (node < 0) break;
          if (n < min_length) continue;
          for (const int32_t k : a_.trie.ngrams(node)) ++counts[static_cast<size_t>(k)];
        }
      }
    }
  }

  void weigh_row(const std::vector<int64_t>& counts, float* y) const {
    for (size_t k = 0; k < counts.size(); ++k) {
      if (counts[k] == 0) continue;
      const float w = a_.weights.empty() ? 1.0f : a_.weights[k];
      float value = static_cast<float>(counts[k]);
      if (a_.weighting == Weighting::Idf) value = w;
      if (a_.weighting == Weighting::TfIdf) value *= w;
      y[a_.ngram_indexes[k]] += value;
    }
  }

  TfIdfAttrs a_;
};

// ngram_counts, pool_int64s and ngram_indexes checked against one another; fills the trie with
// the pool n-grams of lengths min_gram_length..max_gram_length and returns how many n-grams
// the pool holds.
int64_t load_pool(const std::vector<int64_t>& ngram_counts, const std::vector<int64_t>& pool, TfIdfAttrs& a) {
  const auto size = static_cast<int64_t>(pool.size());
  if (ngram_counts.empty() || ngram_counts[0] != 0) throw Error("TfIdfVectorizer attribute 'ngram_counts' must start at 0");
  int64_t ordinal = 0;
  for (size_t i = 0; i < ngram_counts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(i) + 1;
    const int64_t begin = ngram_counts[i];
    const int64_t end = i + 1 < ngram_counts.size() ? ngram_counts[i + 1] : size;
    if (end < begin || end > size || (end - begin) % n != 0) {
      throw Error("TfIdfVectorizer attribute 'ngram_counts' does not split the pool of " + std::to_string(size) +
                  " items into runs of " + std::to_string(n) + "-grams at index " + std::to_string(i));
    }
    for (int64_t at = begin; at < end; at += n, ++ordinal) {
      if (n < a.min_gram_length || n > a.max_gram_length) continue;  // never counted
      a.trie.insert(pool.data() + at, n, static_cast<int32_t>(ordinal));
    }
  }
  return ordinal;
}

}  // namespace

std::unique_ptr<Kernel> make_tfidf_vectorizer(const KernelInit& init) {
  TfIdfAttrs a;
  const std::string what = "TfIdfVectorizer attribute ";
  if (!init.has_attr("mode")) throw Error(what + "'mode' is required");
  const std::string mode = init.attr_string("mode", "");
  if (mode == "TF") a.weighting = Weighting::Tf;
  else if (mode == "IDF") a.weighting = Weighting::Idf;
  else if (mode == "TFIDF") a.weighting = Weighting::TfIdf;
  else throw Error(what + "'mode' is '" + mode + "'; expected 'TF', 'IDF' or 'TFIDF'");
  a.min_gram_length = init.required_int("min_gram_length");
  a.max_gram_length = init.required_int("max_gram_length");
  a.max_skip_count = init.required_int("max_skip_count");
  if (a.min_gram_length < 1 || a.max_gram_length < a.min_gram_length || a.max_skip_count < 0) {
    throw Error(what + "values min_gram_length " + std::to_string(a.min_gram_length) + ", max_gram_length " +
                std::to_string(a.max_gram_length) + ", max_skip_count " + std::to_string(a.max_skip_count) +
                " are invalid: 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0");
  }
  if (init.has_attr("pool_strings")) {
    throw Error(what + "'pool_strings' is not supported: onnxtrain tensors hold no strings");
  }
  if (!init.has_attr("pool_int64s")) throw Error(what + "'pool_int64s' is required (pool_strings is not supported)");
  if (!init.has_attr("ngram_counts") || !init.has_attr("ngram_indexes")) {
    throw Error(what + "'ngram_counts' and 'ngram_indexes' are required");
  }
  const int64_t ngrams = load_pool(init.attr_ints("ngram_counts"), init.attr_ints("pool_int64s"), a);
  a.ngram_indexes = init.attr_ints("ngram_indexes");
  if (static_cast<int64_t>(a.ngram_indexes.size()) != ngrams || ngrams == 0) {
    throw Error(what + "'ngram_indexes' has " + std::to_string(a.ngram_indexes.size()) +
                " entries; the pool holds " + std::to_string(ngrams) + " n-grams (at least one is needed)");
  }
  constexpr int64_t kMaxOutput = int64_t{1} << 31;
  for (const int64_t index : a.ngram_indexes) {
    if (index < 0 || index >= kMaxOutput) {
      throw Error(what + "'ngram_indexes' holds " + std::to_string(index) + ", outside [0, 2^31)");
    }
    a.output_size = std::max(a.output_size, index + 1);
  }
  a.weights = init.attr_floats("weights");
  if (!a.weights.empty() && static_cast<int64_t>(a.weights.size()) != ngrams) {
    throw Error(what + "'weights' has " + std::to_string(a.weights.size()) + " entries; expected one per pool n-gram (" +
                std::to_string(ngrams) + ")");
  }
  return std::make_unique<TfIdfKernel>(std::move(a));
}

}  // namespace onnxtrain::ops
