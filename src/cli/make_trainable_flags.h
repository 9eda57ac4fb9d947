// The flags of `onnxtrain make-trainable` (docs/make-trainable.md): registered on the command
// line parser, then turned into training::MakeTrainableOptions once parsed.
#pragma once

#include <string>
#include <vector>

#include "cli/commands.h"

namespace CLI {
class App;
}

namespace onnxtrain::cli {

struct MakeTrainableFlags {
  MakeTrainableArgs args;
  // Named choices, resolved after parsing.
  std::string loss = "cross_entropy", reduction = "mean", optimizer = "sgd", schedule = "constant", init = "keep";
  std::vector<std::string> param_groups;  // --param-group 'REGEX:key=value,...'
  std::vector<std::string> schedulers;    // --scheduler 'NAME:key=value,...' (sequential)
};

// Adds the make-trainable subcommand with every flag bound to `flags`.
CLI::App* add_make_trainable(CLI::App& app, MakeTrainableFlags& flags);

// Fills flags.args.options from the named choices, --param-group and --scheduler specs; throws
// CLI::ValidationError naming the flag for a bad value.
void resolve_make_trainable(MakeTrainableFlags& flags);

}  // namespace onnxtrain::cli
