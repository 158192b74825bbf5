#include "parallel/data_parallel/gathered_rows.h"

#include <ATen/ATen.h>

namespace tessera {

void GatheredRows::wait() const {
  idsWork->wait();
  rowsWork->wait();
}

GatheredRows gatherRows(const CommPtr& comm, const at::Tensor& ids, const at::Tensor& rows) {
  const int64_t world = comm->size(), n = ids.numel();
  auto localIds = ids.reshape({-1}).to(at::kFloat);
  auto localRows = rows.contiguous();
  GatheredRows g;
  g.ids = at::empty({world * n}, localIds.options());
  g.rows = at::empty({world * n, rows.size(1)}, localRows.options());
  g.idsWork = comm->allGather(g.ids, localIds);
  g.rowsWork = comm->allGather(g.rows, localRows);
  return g;
}

}  // namespace tessera
