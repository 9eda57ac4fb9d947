// world() of a build without MPI (ONNXTRAIN_MPI=OFF): training runs in one process.
#include "onnxtrain/distributed.h"

namespace onnxtrain::distributed {

std::shared_ptr<Communicator> world() { return nullptr; }
bool built_with_mpi() { return false; }

}  // namespace onnxtrain::distributed
