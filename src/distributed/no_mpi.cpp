// world() of a build without MPI (ONNXTRAIN_MPI=OFF): training runs in one process.
#include <cstdlib>
#include <string>

#include "onnxtrain/distributed.h"
#include "onnxtrain/error.h"

namespace onnxtrain::distributed {

std::shared_ptr<Communicator> world() {
  // Started by mpirun with several ranks, each process would train the whole model alone and
  // all would write the same files: refuse instead.
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* size = std::getenv(variable);
    if (size && std::atoi(size) > 1) {
      throw Error(std::string("started by mpirun with ") + size +
                  " ranks, but this onnxtrain was built without MPI (configure with -DONNXTRAIN_MPI=ON and "
                  "libopenmpi-dev installed; docs/distributed.md)");
    }
  }
  return nullptr;
}

}  // namespace onnxtrain::distributed
