// src/train/table_optimizer.cpp (the table AdamW cases' CPU twin) reaches a disk training store's
// rows through these two members; the cases' tables are in RAM, so the store (seven files of
// src/store) is not linked: its symbols are defined here to stop the run loudly if a case reaches them.
#include <cstdio>
#include <cstdlib>

#include "store/train_table_store.h"

namespace jtok {

[[noreturn]] static void not_linked(const char* fn) {
  std::fprintf(stderr, "cuda emulation: %s (a disk training store) is not linked\n", fn);
  std::abort();
}

bool TrainTableStore::load_row(int64_t, int64_t, float*, float*, float*, int32_t*) {
  not_linked("TrainTableStore::load_row");
}
void TrainTableStore::store_row(int64_t, int64_t, const float*, const float*, const float*, int32_t) {
  not_linked("TrainTableStore::store_row");
}

}  // namespace jtok
