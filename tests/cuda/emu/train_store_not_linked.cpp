// src/train/table_optimizer.cpp (the table AdamW cases' CPU twin) and src/store/disk_rows.cpp reach a
// disk table store's rows through these members (the sanitizer build keeps disk_rows.cpp's callers
// that --gc-sections drops otherwise); the cases' tables are in RAM, so the stores (seven files of
// src/store) are not linked: their symbols are defined here to stop the run loudly if a case reaches them.
#include <cstdio>
#include <cstdlib>

#include "store/table_store.h"
#include "store/train_table_store.h"

namespace jtok {

[[noreturn]] static void not_linked(const char* fn) {
  std::fprintf(stderr, "cuda emulation: %s (a disk table store) is not linked\n", fn);
  std::abort();
}

bool TrainTableStore::load_row(int64_t, int64_t, float*, float*, float*, int32_t*) {
  not_linked("TrainTableStore::load_row");
}
void TrainTableStore::read_value(int64_t, int64_t, float*) { not_linked("TrainTableStore::read_value"); }
void TableStore::read_raw(int64_t, int64_t, void*, float*) const { not_linked("TableStore::read_raw"); }
std::string TableStore::take_error() const { not_linked("TableStore::take_error"); }
int64_t TableStore::prefetch(const int32_t*, int64_t) const { not_linked("TableStore::prefetch"); }
void TrainTableStore::store_row(int64_t, int64_t, const float*, const float*, const float*, int32_t) {
  not_linked("TrainTableStore::store_row");
}

}  // namespace jtok
