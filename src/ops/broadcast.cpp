#include "ops/broadcast.h"

namespace onnxtrain::ops {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out = Shape::filled(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t da = d + a.size() >= rank ? a[d + a.size() - rank] : 1;
    const int64_t db = d + b.size() >= rank ? b[d + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1) {
      throw Error("shapes " + a.to_string() + " and " + b.to_string() +
                  " cannot be broadcast together (dim " + std::to_string(d) + ": " +
                  std::to_string(da) + " vs " + std::to_string(db) + ")");
    }
    out[d] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace onnxtrain::ops
