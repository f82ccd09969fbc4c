#include "model/table_attach.h"

#include <algorithm>

#include "core/error.h"

namespace jtok {

void attach_disk_rows(Model& m, const std::vector<std::shared_ptr<const DiskRows>>& rows, const std::string& manifest,
                       const std::string& whose) {
  std::vector<std::shared_ptr<const DiskRows>> mine;  // (tables) m's table k's rows
  for (size_t k = 0; k < m.tables.size(); ++k) {
    const auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r->name() == m.table_names[k]; });
    if (it == rows.end()) fail(manifest, ": no table ", m.table_names[k], " (", whose, " has it)");
    const DiskRows& r = **it;
    if (r.ids() != m.tables[k].rows || r.dim() != m.tables[k].dim)
      fail(manifest, ": table ", r.name(), " is ", r.ids(), " x ", r.dim(), ", ", whose, " has ", m.tables[k].rows, " x ",
           m.tables[k].dim);
    mine.push_back(*it);
  }
  if (rows.size() != m.tables.size()) fail(manifest, ": ", rows.size(), " tables, ", whose, " has ", m.tables.size());
  for (size_t k = 0; k < m.tables.size(); ++k) m.tables[k] = TokenTable::on_disk(mine[k]);
}

}  // namespace jtok
