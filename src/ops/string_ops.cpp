// String operators (ONNX operator docs). Strings are UTF-8 byte strings (onnx.proto).
//   StringNormalizer (10): X of shape [C] or [1, C]; drops the elements equal to one of
//     `stopwords` (compared case-insensitively unless is_case_sensitive = 1), then lowercases
//     or uppercases the rest (case_change_action LOWER, UPPER or NONE). When every element is
//     dropped the output is one empty string, of shape [1] or [1, 1]. Case is changed per
//     Unicode code point with the C library's towlower/towupper in the C.UTF-8 locale; the
//     `locale` attribute is accepted but not used for anything else.
//   StringConcat (20): X + Y element-wise, with numpy broadcasting.
//   StringSplit (20): splits each element of X at `delimiter` (at most `maxsplit` times when it
//     is given). Without a delimiter (or with an empty one) runs of whitespace separate the
//     pieces and leading or trailing whitespace gives none, as Python's str.split(). Outputs
//     Y: X's shape plus one dim, the largest piece count, padded with empty strings; Z: the
//     piece count of each element (int64, X's shape).
//   RegexFullMatch (20): whether each element matches `pattern` in full, in RE2 syntax (the
//     syntax the ONNX doc names), with the RE2 library.
#include <re2/re2.h>

#include <clocale>
#include <cwctype>
#include <locale.h>

#include "ops/broadcast.h"
#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

const Tensor& string_input(KernelContext& ctx, int i) {
  const Tensor& t = ctx.input(i);
  if (t.dtype() != DataType::String) fail("input " + ctx.input_name(i) + " must be a string tensor, got " + t.description());
  return t;
}

// --- UTF-8 case mapping ---
// Decodes one code point at s[i] (advancing i); invalid bytes decode to themselves.
char32_t decode_utf8(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = byte(i);
  const int extra = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : 0;
  if (extra == 0 || i + static_cast<size_t>(extra) >= s.size()) return byte(i++);
  char32_t c = b & (0x3f >> extra);
  for (int k = 1; k <= extra; ++k) {
    if ((byte(i + static_cast<size_t>(k)) & 0xc0) != 0x80) return byte(i++);
    c = (c << 6) | (byte(i + static_cast<size_t>(k)) & 0x3f);
  }
  i += static_cast<size_t>(extra) + 1;
  return c;
}

void encode_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

locale_t utf8_locale() {
  static const locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    return l ? l : newlocale(LC_CTYPE_MASK, "C", static_cast<locale_t>(nullptr));
  }();
  return loc;
}

enum class CaseChange { None, Lower, Upper };

std::string change_case(const std::string& s, CaseChange change) {
  if (change == CaseChange::None) return s;
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<wint_t>(decode_utf8(s, i));
    const wint_t mapped = change == CaseChange::Lower ? towlower_l(c, utf8_locale()) : towupper_l(c, utf8_locale());
    encode_utf8(static_cast<char32_t>(mapped), out);
  }
  return out;
}

std::unique_ptr<Kernel> make_string_normalizer(const KernelInit& init) {
  const std::string action = init.attr_string("case_change_action", "NONE");
  CaseChange change = CaseChange::None;
  if (action == "LOWER") change = CaseChange::Lower;
  else if (action == "UPPER") change = CaseChange::Upper;
  else if (action != "NONE") fail("attribute 'case_change_action' is '" + action + "', expected LOWER, UPPER or NONE");
  const bool case_sensitive = init.attr_int("is_case_sensitive", 0) != 0;
  std::vector<std::string> stopwords;
  if (const ir::Attribute* a = init.attr("stopwords")) {
    if (a->type != ir::AttributeType::Strings) fail("attribute 'stopwords' must be a list of strings");
    for (const std::string& w : a->strings) stopwords.push_back(case_sensitive ? w : change_case(w, CaseChange::Lower));
  }
  return make_kernel([change, case_sensitive, stopwords](KernelContext& ctx) {
    const Tensor& x = string_input(ctx, 0);
    const bool row = x.rank() == 2;
    if (!(x.rank() == 1 || (row && x.dim(0) == 1))) {
      fail("input " + ctx.input_name(0) + " must have shape [C] or [1, C], got " + x.description());
    }
    std::vector<std::string> kept;
    for (const std::string& s : x.values<std::string>()) {
      const std::string key = case_sensitive ? s : change_case(s, CaseChange::Lower);
      if (std::find(stopwords.begin(), stopwords.end(), key) != stopwords.end()) continue;
      kept.push_back(change_case(s, change));
    }
    if (kept.empty()) kept.emplace_back();
    const auto c = static_cast<int64_t>(kept.size());
    Tensor& y = ctx.allocate_output(0, DataType::String, row ? Shape{1, c} : Shape{c});
    std::move(kept.begin(), kept.end(), y.data<std::string>());
  });
}

std::unique_ptr<Kernel> make_string_concat(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Tensor& a = string_input(ctx, 0);
    const Tensor& b = string_input(ctx, 1);
    Broadcast<2> bc({&a.shape(), &b.shape()});
    Tensor& y = ctx.allocate_output(0, DataType::String, bc.shape());
    const std::string* pa = a.data<std::string>();
    const std::string* pb = b.data<std::string>();
    std::string* py = y.data<std::string>();
    bc.for_each_run([&](int64_t out, const auto& in, int64_t len, const auto& step) {
      for (int64_t i = 0; i < len; ++i) py[out + i] = pa[in[0] + i * step[0]] + pb[in[1] + i * step[1]];
    });
  });
}

// The pieces of `s`, as the StringSplit doc defines them.
std::vector<std::string> split(const std::string& s, const std::string& delimiter, int64_t maxsplit) {
  std::vector<std::string> pieces;
  if (delimiter.empty()) {
    size_t i = 0;
    const auto space = [&](size_t k) { return std::isspace(static_cast<unsigned char>(s[k])) != 0; };
    while (i < s.size() && space(i)) ++i;
    while (i < s.size()) {
      if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) {
        size_t end = s.size();
        while (end > i && space(end - 1)) --end;
        pieces.push_back(s.substr(i, end - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !space(j)) ++j;
      pieces.push_back(s.substr(i, j - i));
      i = j;
      while (i < s.size() && space(i)) ++i;
    }
    return pieces;
  }
  size_t start = 0;
  while (true) {
    const size_t at = (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) ? std::string::npos
                                                                                        : s.find(delimiter, start);
    if (at == std::string::npos) {
      pieces.push_back(s.substr(start));
      return pieces;
    }
    pieces.push_back(s.substr(start, at - start));
    start = at + delimiter.size();
  }
}

std::unique_ptr<Kernel> make_string_split(const KernelInit& init) {
  const std::string delimiter = init.attr_string("delimiter", "");
  const int64_t maxsplit = init.has_attr("maxsplit") ? init.attr_int("maxsplit", 0) : -1;
  if (init.has_attr("maxsplit") && maxsplit < 0) fail("attribute 'maxsplit' must be >= 0, got " + std::to_string(maxsplit));
  return make_kernel([delimiter, maxsplit](KernelContext& ctx) {
    const Tensor& x = string_input(ctx, 0);
    std::vector<std::vector<std::string>> all;
    all.reserve(static_cast<size_t>(x.numel()));
    int64_t widest = 0;
    for (const std::string& s : x.values<std::string>()) {
      all.push_back(split(s, delimiter, maxsplit));
      widest = std::max<int64_t>(widest, static_cast<int64_t>(all.back().size()));
    }
    Shape y_shape = x.shape();
    y_shape.push_back(widest);
    Tensor& y = ctx.allocate_output(0, DataType::String, y_shape);
    Tensor& z = ctx.allocate_output(1, DataType::Int64, x.shape());
    for (size_t i = 0; i < all.size(); ++i) {
      std::string* row = y.data<std::string>() + static_cast<int64_t>(i) * widest;
      for (size_t k = 0; k < all[i].size(); ++k) row[k] = std::move(all[i][k]);
      z.data<int64_t>()[i] = static_cast<int64_t>(all[i].size());
    }
  });
}

std::unique_ptr<Kernel> make_regex_full_match(const KernelInit& init) {
  const std::string pattern = init.attr_string("pattern", "");
  auto regex = std::make_shared<const re2::RE2>(pattern, re2::RE2::Quiet);
  if (!regex->ok()) fail("attribute 'pattern' is not a valid RE2 expression: " + regex->error() + " (" + pattern + ")");
  return make_kernel([regex](KernelContext& ctx) {
    const Tensor& x = string_input(ctx, 0);
    Tensor& y = ctx.allocate_output(0, DataType::Bool, x.shape());
    const std::string* in = x.data<std::string>();
    bool* out = y.data<bool>();
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = re2::RE2::FullMatch(in[i], *regex);
  });
}

}  // namespace

std::unique_ptr<Kernel> make_string_op(const KernelInit& init) {
  const std::string& op = init.op_type();
  if (op == "StringNormalizer") return make_string_normalizer(init);
  if (op == "StringConcat") return make_string_concat(init);
  if (op == "StringSplit") return make_string_split(init);
  if (op == "RegexFullMatch") return make_regex_full_match(init);
  fail("no string kernel for " + op);
}

}  // namespace onnxtrain::ops
