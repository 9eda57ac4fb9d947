// onnxtrain::Error — the one exception type for bad input.
//
// Every malformed model, wrong feed, unsupported operator or invalid binding is reported by
// throwing Error with a message that says what was wrong and where (file, graph, node name,
// op type, tensor name, expected vs got). Internal invariants use assertions instead.
// The command-line tool prints "error: <what()>" and exits with status 2 for an Error.
#pragma once

#include <stdexcept>
#include <string>

namespace onnxtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}

  // A copy of this error with `context` prepended ("context: message"). Used as an error
  // travels outwards: a kernel names the tensor, the executor adds the node, the loader the file.
  [[nodiscard]] Error with_context(const std::string& context) const {
    return Error(context + ": " + what());
  }
};

}  // namespace onnxtrain
