// onnxtrain._core.cli_main: the `onnxtrain` command in-process, for the console script.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <csignal>
#include <iostream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "python/cli.h"

namespace onnxtrain::python {

void bind_cli(nb::module_& m) {
  m.def(
      "cli_main",
      [](std::vector<std::string> argv) {
        if (argv.empty()) argv.emplace_back("onnxtrain");
        std::vector<char*> pointers;
        for (std::string& arg : argv) pointers.push_back(arg.data());
        pointers.push_back(nullptr);
        // `train` installs its own SIGINT/SIGTERM handlers (to checkpoint and stop): the caller's
        // come back afterwards. SIGXFSZ is ignored while it runs, as in the executable
        // (src/cli/main.cpp): a file-size limit is a write error, exit 2. (CPython ignores it
        // from startup; an embedding program may not.)
        struct sigaction old_int {}, old_term {}, old_xfsz {}, ignore {};
        sigaction(SIGINT, nullptr, &old_int);
        sigaction(SIGTERM, nullptr, &old_term);
        ignore.sa_handler = SIG_IGN;
        sigaction(SIGXFSZ, &ignore, &old_xfsz);
        int status = 0;
        {
          nb::gil_scoped_release release;
          status = cli::main(static_cast<int>(argv.size()), pointers.data());
          std::cout.flush();
          std::cerr.flush();
        }
        sigaction(SIGINT, &old_int, nullptr);
        sigaction(SIGTERM, &old_term, nullptr);
        sigaction(SIGXFSZ, &old_xfsz, nullptr);
        return status;
      },
      nb::arg("argv"),
      "Runs the onnxtrain command line with `argv` (argv[0]: the program name) in this process, "
      "with the GIL released, writing to the process's stdout and stderr. Returns the exit status: "
      "0 success, 2 bad input or flags, 1 internal error, 130/143 for a `train` stopped by SIGINT/SIGTERM.");
}

}  // namespace onnxtrain::python
