// infer/random_table_store.h: a random model's tables written straight into a table store hold
// make_inference_model's rows bit for bit (init streams or hash, f32, and bf16 rounded the same way), every row of
// every table (more ids than one chunk of the writer, the last chunk partial, the padded rows zero), under the model's
// table names; it refuses a model without tables and another dtype; a directory that exists is refused by the store
// writer, naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "error_test_util.h"
#include "infer/random_table_store.h"
#include "model/inference_model.h"
#include "model_test_util.h"
#include "store/table_store.h"
#include "temp_dir.h"

using namespace jtok;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSeed = 23;

// Two layers, JTok on one and JTok-M (n_e 3) on both: 7 tables of 600 ids (padded to 640) x 8.
ModelConfig config() {
  ModelConfig c = jtok::testing::tiny_jtok_config({.vocab = 600, .hidden = 8, .layers = 2, .intermediate = 16,
                                                   .context = 16, .jtok_layers = "1", .jtokm_layers = "all"});
  return c;
}

void expect_store_holds_ram_rows(Dtype dt, TableValues values) {
  const ModelConfig c = config();
  const Model ram = make_inference_model(c, kSeed, dt, values);
  const Model shape = make_inference_model_without_tables(c, kSeed);
  const std::string dir =
      jtok::testing::fresh_temp_dir(std::string("random_store_") + dtype_name(dt) + table_values_name(values));
  const int64_t bytes = write_random_table_store(shape, kSeed, dt, dir, values);
  EXPECT_EQ(bytes, static_cast<int64_t>(fs::file_size(fs::path(dir) / "tables.bin")));
  auto store = TableStore::open(dir, 1 << 20, 2);
  ASSERT_EQ(store->tables().size(), ram.tables.size());
  ASSERT_EQ(store->ids(), c.padded_vocab());
  EXPECT_GT(c.padded_vocab(), 256);  // more than one of the writer's chunks
  for (size_t k = 0; k < ram.tables.size(); ++k) {
    EXPECT_EQ(store->tables()[k].name, ram.table_names[k]);
    EXPECT_EQ(store->tables()[k].dtype, dt);
    const TokenTable& t = ram.tables[k];
    std::vector<uint8_t> row(static_cast<size_t>(t.row_stride_bytes()));
    int64_t differ = 0;
    for (int64_t id = 0; id < store->ids(); ++id) {
      float scale = 0;
      store->read_raw(static_cast<int64_t>(k), id, row.data(), &scale);
      differ += std::memcmp(row.data(), t.raw_row(id), row.size()) != 0;
    }
    EXPECT_EQ(differ, 0) << "table " << ram.table_names[k];
  }
  EXPECT_EQ(store->take_error(), "");
  const std::string source = describe_source(store->source());
  EXPECT_NE(source.find(std::string("random model's tables (seed 23, table values ") + table_values_name(values)),
            std::string::npos)
      << source;
}

TEST(RandomTableStore, HoldsTheRamModelsRowsInF32) { expect_store_holds_ram_rows(Dtype::f32, TableValues::init); }
TEST(RandomTableStore, HoldsTheRamModelsRowsInBf16) { expect_store_holds_ram_rows(Dtype::bf16, TableValues::init); }
TEST(RandomTableStore, HoldsTheRamModelsHashRowsInF32) { expect_store_holds_ram_rows(Dtype::f32, TableValues::hash); }
TEST(RandomTableStore, HoldsTheRamModelsHashRowsInBf16) { expect_store_holds_ram_rows(Dtype::bf16, TableValues::hash); }

TEST(RandomTableStore, Refusals) {
  ModelConfig plain = config();
  plain.jtok = plain.jtokm = false;
  const Model no_tables = make_inference_model_without_tables(plain, kSeed);
  jtok::testing::expect_error(
      [&] { write_random_table_store(no_tables, kSeed, Dtype::bf16, jtok::testing::fresh_temp_dir("rts_none")); },
      {"the model has no token tables"});
  const Model shape = make_inference_model_without_tables(config(), kSeed);
  jtok::testing::expect_error(
      [&] { write_random_table_store(shape, kSeed, Dtype::int8, jtok::testing::fresh_temp_dir("rts_int8")); },
      {"f32 or bf16 rows, not int8"});
  const std::string dir = jtok::testing::fresh_temp_dir("rts_exists");
  fs::create_directories(dir);
  jtok::testing::expect_error([&] { write_random_table_store(shape, kSeed, Dtype::f32, dir); }, {dir, "exists"});
}

}  // namespace
