// The `onnxtrain` command line: the executable (src/cli/main.cpp) and the Python package's
// console script (python/) both call cli::main.
#pragma once

namespace onnxtrain::cli {

// Parses `argv` (argv[0] is the program name) and runs the subcommand. Returns the exit
// status: 0 success, 2 bad input or bad flags, 1 internal error, 130/143 for a `train`
// interrupted by SIGINT/SIGTERM. Writes to std::cout and std::cerr.
int main(int argc, char** argv);

}  // namespace onnxtrain::cli
