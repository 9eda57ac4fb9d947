// Einsum equations (ONNX Einsum, numpy's einsum), split into terms; shared by the kernel
// (einsum.cpp) and the gradient rule (autodiff/rules.cpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "onnxtrain/error.h"

namespace onnxtrain::ops {

struct EinsumTerms {
  std::vector<std::string> inputs;  // one term per input: letters and at most one "..."
  std::string output;               // explicit, or the implicit output (see below)
  bool explicit_output = false;
};

// Splits `equation` (spaces ignored) at ',' and "->". Without "->" the output is "..." when
// any input has one, followed by the letters that occur exactly once, in alphabetical order.
// Throws Error for a character that is no letter, ',', "->" or "...".
inline EinsumTerms split_einsum(const std::string& equation) {
  std::string e;
  for (char c : equation) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (!std::isalpha(static_cast<unsigned char>(c)) && c != ',' && c != '.' && c != '-' && c != '>') {
      throw Error("attribute 'equation' is '" + equation + "': unexpected character '" + std::string(1, c) + "'");
    }
    e += c;
  }
  EinsumTerms t;
  const size_t arrow = e.find("->");
  const std::string lhs = e.substr(0, arrow);
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    t.inputs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    t.explicit_output = true;
    t.output = e.substr(arrow + 2);
    return t;
  }
  std::string letters;
  bool ellipsis = false;
  for (const std::string& term : t.inputs) {
    ellipsis |= term.find("...") != std::string::npos;
    for (char c : term) {
      if (std::isalpha(static_cast<unsigned char>(c))) letters += c;
    }
  }
  std::string once;
  for (char c : letters) {
    if (std::count(letters.begin(), letters.end(), c) == 1) once += c;
  }
  std::sort(once.begin(), once.end());
  t.output = (ellipsis ? "..." : "") + once;
  return t;
}

}  // namespace onnxtrain::ops
