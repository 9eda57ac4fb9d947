#include "autodiff/builder.h"

namespace onnxtrain::autodiff {

const Rule* find_rule(const std::string&, const std::string&) { return nullptr; }
std::vector<const Rule*> all_rules() { return {}; }

}  // namespace onnxtrain::autodiff
