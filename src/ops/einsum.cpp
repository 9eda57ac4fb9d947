// Einsum (ai.onnx opset 12+; version 28 only adds bfloat16), numpy's einsum: "ij,jk->ik", "bij,bjk->bik", "ii->i", "...ij->...ji".
//
// The equation names every dim of every input with a letter; "..." stands for the dims no
// letter names, which broadcast across the inputs (numpy rules). With "->" the output lists
// its labels; without it the output is "..." (when any input has one) followed by the letters
// that occur exactly once, in alphabetical order. Labels absent from the output are summed
// over; a letter repeated within one input reads that input's diagonal. Dims a letter names
// must agree wherever it occurs. Every output element sums, over all values of the summed
// labels, the product of one element per input (accumulated in compute_t: float for float16,
// else the type itself); outputs are computed in parallel.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/einsum_equation.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

// Labels: letters are their char code (< 128); ellipsis dims are kEllipsis + k, k counting
// the broadcast ellipsis dims from the left.
constexpr int kEllipsis = 1000;

struct Term {
  std::vector<int> letters;  // in order, with -1 where "..." stands
  bool ellipsis = false;
};

Term parse_term(const std::string& text, const std::string& equation) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      if (t.ellipsis || text.compare(i, 3, "...") != 0) {
        throw Error("attribute 'equation' is '" + equation + "': '.' must come as one '...' per term");
      }
      t.ellipsis = true;
      t.letters.push_back(-1);
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      t.letters.push_back(c);
    } else {
      throw Error("attribute 'equation' is '" + equation + "': unexpected character '" + std::string(1, c) + "'");
    }
  }
  return t;
}

struct Equation {
  std::vector<Term> inputs;
  Term output;  // explicit or implicit (split_einsum)
};

Equation parse_equation(const std::string& equation) {
  const EinsumTerms terms = split_einsum(equation);
  Equation eq;
  for (const std::string& term : terms.inputs) eq.inputs.push_back(parse_term(term, equation));
  eq.output = parse_term(terms.output, equation);
  std::vector<int> seen;
  for (int l : eq.output.letters) {
    if (l < 0) continue;
    if (std::find(seen.begin(), seen.end(), l) != seen.end()) {
      throw Error("attribute 'equation' is '" + equation + "': output label '" + std::string(1, static_cast<char>(l)) + "' repeats");
    }
    seen.push_back(l);
    bool in_input = false;
    for (const Term& t : eq.inputs) in_input |= std::find(t.letters.begin(), t.letters.end(), l) != t.letters.end();
    if (!in_input) {
      throw Error("attribute 'equation' is '" + equation + "': output label '" + std::string(1, static_cast<char>(l)) +
                  "' names no input dim");
    }
  }
  return eq;
}

std::string label_name(int l) {
  return l >= kEllipsis ? "... dim " + std::to_string(l - kEllipsis) : "'" + std::string(1, static_cast<char>(l)) + "'";
}

class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(const KernelInit& init)
      : text_(init.attr_string("equation", "")), eq_(parse_equation(text_)) {
    if (!init.has_attr("equation")) fail("required attribute 'equation' is missing");
    if (static_cast<int>(eq_.inputs.size()) != init.num_inputs()) {
      fail("equation '" + text_ + "' has " + std::to_string(eq_.inputs.size()) + " input terms but the node has " +
           std::to_string(init.num_inputs()) + " inputs");
    }
  }

  void run(KernelContext& ctx) override {
    const int n = ctx.num_inputs();
    const Tensor& first = ctx.input(0);
    // Each input's dims as labels; the ellipsis dims aligned right across inputs.
    size_t ellipsis_rank = 0;
    std::vector<std::vector<int>> dim_labels(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const Tensor& x = ctx.input(i);
      if (x.dtype() != first.dtype()) {
        fail("input " + ctx.input_name(i) + " is " + x.description() + ", expected " +
             std::string(dtype_name(first.dtype())) + " like " + ctx.input_name(0));
      }
      const Term& t = eq_.inputs[static_cast<size_t>(i)];
      const size_t named = t.letters.size() - (t.ellipsis ? 1 : 0);
      if (t.ellipsis ? x.rank() < named : x.rank() != named) {
        fail("input " + ctx.input_name(i) + " has shape " + x.shape().to_string() + " but its term in '" + text_ +
             "' names " + std::to_string(named) + " dims" + (t.ellipsis ? " and '...'" : ""));
      }
      ellipsis_rank = std::max(ellipsis_rank, x.rank() - named);
    }
    std::vector<int64_t> size(kEllipsis + ellipsis_rank, -1);
    for (int i = 0; i < n; ++i) {
      const Tensor& x = ctx.input(i);
      const Term& t = eq_.inputs[static_cast<size_t>(i)];
      const size_t e = x.rank() - (t.letters.size() - (t.ellipsis ? 1 : 0));
      auto& labels = dim_labels[static_cast<size_t>(i)];
      for (int l : t.letters) {
        if (l >= 0) {
          labels.push_back(l);
          continue;
        }
        for (size_t k = 0; k < e; ++k) labels.push_back(kEllipsis + static_cast<int>(ellipsis_rank - e + k));
      }
      for (size_t d = 0; d < labels.size(); ++d) {
        const int l = labels[d];
        const int64_t dim = x.dim(d);
        int64_t& s = size[static_cast<size_t>(l)];
        if (l >= kEllipsis) {  // broadcast
          if (s == -1 || s == 1) s = dim;
          else if (dim != 1 && dim != s) fail("input " + ctx.input_name(i) + " " + x.shape().to_string() + ": its '...' dims do not broadcast with the other inputs'");
        } else if (s == -1) {
          s = dim;
        } else if (s != dim) {
          fail("label " + label_name(l) + " of '" + text_ + "' is " + std::to_string(s) + " in one place and " +
               std::to_string(dim) + " in input " + ctx.input_name(i) + " " + x.shape().to_string());
        }
      }
    }
    // Output labels, then the summed ones.
    std::vector<int> out_labels;
    for (int l : eq_.output.letters) {
      if (l >= 0) {
        out_labels.push_back(l);
      } else {
        for (size_t k = 0; k < ellipsis_rank; ++k) out_labels.push_back(kEllipsis + static_cast<int>(k));
      }
    }
    if (!eq_.output.ellipsis) {
      for (size_t k = 0; k < ellipsis_rank; ++k) {
        if (size[kEllipsis + k] != 1) fail("equation '" + text_ + "' has '...' dims in its inputs but not in its output");
      }
    }
    std::vector<int> summed;
    for (const auto& labels : dim_labels) {
      for (int l : labels) {
        if (std::find(out_labels.begin(), out_labels.end(), l) == out_labels.end() &&
            std::find(summed.begin(), summed.end(), l) == summed.end()) {
          summed.push_back(l);
        }
      }
    }
    Shape out_shape;
    for (int l : out_labels) out_shape.push_back(size[static_cast<size_t>(l)]);
    // Per input, the element stride of each label (summed over dims carrying it: diagonals),
    // 0 where an ellipsis dim broadcasts.
    auto strides_for = [&](const std::vector<int>& order) {
      std::vector<std::vector<int64_t>> s(static_cast<size_t>(n), std::vector<int64_t>(order.size(), 0));
      for (int i = 0; i < n; ++i) {
        const Tensor& x = ctx.input(i);
        const auto& labels = dim_labels[static_cast<size_t>(i)];
        int64_t stride = 1;
        for (size_t d = labels.size(); d-- > 0;) {
          const auto at = std::find(order.begin(), order.end(), labels[d]) - order.begin();
          if (at < static_cast<std::ptrdiff_t>(order.size()) && x.dim(d) != 1) s[static_cast<size_t>(i)][static_cast<size_t>(at)] += stride;
          stride *= x.dim(d);
        }
      }
      return s;
    };
    const auto out_strides = strides_for(out_labels);
    const auto sum_strides = strides_for(summed);
    std::vector<int64_t> sum_sizes;
    int64_t sum_count = 1;
    for (int l : summed) {
      sum_sizes.push_back(size[static_cast<size_t>(l)]);
      sum_count *= size[static_cast<size_t>(l)];
    }
    Tensor& y = ctx.allocate_output(0, first.dtype(), out_shape);
    visit_dtype<NumericTypes>(first.dtype(), "Einsum input " + ctx.input_name(0), [&]<class T>() {
      using C = compute_t<T>;
      std::vector<const T*> data;
      for (int i = 0; i < n; ++i) data.push_back(ctx.input(i).data<T>());
      T* out = y.data<T>();
      const int64_t total = y.numel();
      parallel_for(total, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, sum_count * n)), [&](int64_t begin, int64_t end) {
        std::vector<int64_t> base(static_cast<size_t>(n)), at(static_cast<size_t>(n)), idx(summed.size());
        for (int64_t o = begin; o < end; ++o) {
          std::fill(base.begin(), base.end(), 0);
          int64_t rest = o;
          for (size_t d = out_labels.size(); d-- > 0;) {
            const int64_t extent = out_shape[d];
            const int64_t v = rest % extent;
            rest /= extent;
            for (int i = 0; i < n; ++i) base[static_cast<size_t>(i)] += v * out_strides[static_cast<size_t>(i)][d];
          }
          C acc = C(0);
          std::fill(idx.begin(), idx.end(), 0);
          at = base;
          for (int64_t s = 0; s < sum_count; ++s) {
            C prod = static_cast<C>(data[0][at[0]]);
            for (int i = 1; i < n; ++i) prod = static_cast<C>(prod * static_cast<C>(data[static_cast<size_t>(i)][at[static_cast<size_t>(i)]]));
            acc = static_cast<C>(acc + prod);
            for (size_t d = summed.size(); d-- > 0;) {  // odometer over the summed labels
              for (int i = 0; i < n; ++i) at[static_cast<size_t>(i)] += sum_strides[static_cast<size_t>(i)][d];
              if (++idx[d] < sum_sizes[d]) break;
              for (int i = 0; i < n; ++i) at[static_cast<size_t>(i)] -= sum_strides[static_cast<size_t>(i)][d] * sum_sizes[d];
              idx[d] = 0;
            }
          }
          out[o] = convert<T>(acc);
        }
      });
    });
  }

 private:
  std::string text_;
  Equation eq_;
};

}  // namespace

std::unique_ptr<Kernel> make_einsum(const KernelInit& init) { return std::make_unique<EinsumKernel>(init); }

}  // namespace onnxtrain::ops
