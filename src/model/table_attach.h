// The one attach of a disk store's tables to a model, for inference (a token-major store,
// apps/run_setup.cpp) and training (a training store, train/disk_tables.cpp) alike: the model's
// token tables become the store's rows (DiskRows, store/disk_rows.h), matched by name.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "store/disk_rows.h"

namespace jtok {

// m's table named n becomes rows' table named n (TokenTable::on_disk; its RAM rows are freed).
// A table of m that rows lack, one of another shape, or another count of tables fails naming
// manifest (the store's) and whose (the model's owner in the message: "the checkpoint DIR").
void attach_disk_rows(Model& m, const std::vector<std::shared_ptr<const DiskRows>>& rows, const std::string& manifest,
                       const std::string& whose);

}  // namespace jtok
