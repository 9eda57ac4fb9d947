// The onnxtrain executable; see src/cli/app.h.
#include "cli/app.h"

int main(int argc, char** argv) { return onnxtrain::cli::main(argc, argv); }
