// Checkpoints round-trip exactly; an interrupted write is never loaded; corrupt files give errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/weights_io.h"
#include "train/checkpoint.h"
#include "train/trainer_state.h"
#include "error_test_util.h"

using namespace jtok;
namespace fs = std::filesystem;

static Config small() {
  Config c;
  c.model.vocab_size = 40; c.model.hidden_size = 16; c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 2; c.model.num_key_value_heads = 1; c.model.intermediate_size = 24;
  c.model.max_position_embeddings = 16; c.train.seq_len = 8;
  return c;
}

static std::string fresh_dir(const char* name) {
  auto d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

static std::string error_of(const std::function<void()>& f) {
  try { f(); } catch (const Error& e) { return e.what(); }
  return "";
}

TEST(Checkpoint, RoundTripIsExactAndKeepsLastN) {
  Config cfg = small();
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  for (size_t i = 0; i < opt.m.size(); ++i) { opt.m[i] = 0.001f * i; opt.v[i] = 0.002f * i; }
  opt.step = 17;
  std::string run = fresh_dir("ckpt_roundtrip");
  for (int64_t step : {10, 20, 30}) save_checkpoint(run, step, cfg, m, opt, {{"step", step}, {"run_id", "r1"}}, 2);
  auto latest = latest_checkpoint(run);
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path(*latest).filename(), "step_00000030");
  EXPECT_FALSE(fs::exists(fs::path(run) / "checkpoints" / "step_00000010"));  // only the last 2 kept
  EXPECT_TRUE(fs::exists(fs::path(run) / "checkpoints" / "step_00000020"));
  Config back = load_checkpoint_config(*latest);
  Model m2 = make_model(back.model, 99);
  AdamWState o2;
  auto state = load_checkpoint(*latest, m2, &o2);
  EXPECT_EQ(state["step"], 30);
  EXPECT_EQ(m2.params, m.params);
  EXPECT_EQ(o2.m, opt.m);
  EXPECT_EQ(o2.v, opt.v);
  EXPECT_EQ(o2.step, 17);
}

TEST(Checkpoint, InterruptedWriteLeavesPreviousCheckpointNewest) {
  Config cfg = small();
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  std::string run = fresh_dir("ckpt_interrupted");
  save_checkpoint(run, 5, cfg, m, opt, {{"step", 5}, {"run_id", "r1"}}, 3);
  // A write killed half-way: a .tmp directory, and a renamed one whose marker never came.
  fs::create_directories(fs::path(run) / "checkpoints" / "step_00000010.tmp");
  std::ofstream(fs::path(run) / "checkpoints" / "step_00000010.tmp" / "model.safetensors") << "partial";
  fs::create_directories(fs::path(run) / "checkpoints" / "step_00000015");
  auto latest = latest_checkpoint(run);
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path(*latest).filename(), "step_00000005");
  Model m2 = make_model(cfg.model, 1);
  EXPECT_NO_THROW(load_checkpoint(*latest, m2, nullptr));
  EXPECT_NE(error_of([&] { load_checkpoint((fs::path(run) / "checkpoints" / "step_00000015").string(), m2, nullptr); })
                .find("incomplete"), std::string::npos);
}

TEST(Checkpoint, CorruptOrMismatchedFilesGiveClearErrors) {
  Config cfg = small();
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  std::string run = fresh_dir("ckpt_corrupt");
  std::string dir = save_checkpoint(run, 1, cfg, m, opt, {{"step", 1}, {"run_id", "r1"}}, 3);
  const std::string mp = dir + "/model.safetensors";
  const std::string good = read_file(mp);

  // Truncated file.
  write_file_atomic(mp, good.substr(0, good.size() / 2));
  Model m2 = make_model(cfg.model, 1);
  std::string e = error_of([&] { load_checkpoint(dir, m2, nullptr); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("beyond"), std::string::npos) << e;
  // Header length beyond the file.
  std::string bad = good;
  uint64_t huge = 1ull << 40;
  std::memcpy(bad.data(), &huge, 8);
  write_file_atomic(mp, bad);
  e = error_of([&] { load_checkpoint(dir, m2, nullptr); });
  EXPECT_NE(e.find("header length"), std::string::npos) << e;
  // Shorter than a header.
  write_file_atomic(mp, "abc");
  EXPECT_NE(error_of([&] { load_checkpoint(dir, m2, nullptr); }).find("truncated"), std::string::npos);
  write_file_atomic(mp, good);
  // Config that does not match the weights (wider model).
  Config wide = cfg;
  wide.model.intermediate_size = 32;
  Model mw = make_model(wide.model, 1);
  e = error_of([&] { load_checkpoint(dir, mw, nullptr); });
  EXPECT_NE(e.find("has shape"), std::string::npos) << e;
  // Missing tensor and wrong dtype.
  StFile f = read_safetensors(mp);
  f.tensors.erase("model.norm.weight");
  write_safetensors(mp, f);
  EXPECT_NE(error_of([&] { load_checkpoint(dir, m2, nullptr); }).find("missing tensor model.norm.weight"), std::string::npos);
  f = read_safetensors(dir + "/optimizer.safetensors");
  write_file_atomic(mp, good);
  StFile g = read_safetensors(mp);
  auto& t = g.tensors.at("model.norm.weight");
  t.dtype = "I32";
  write_safetensors(mp, g);
  EXPECT_NE(error_of([&] { load_checkpoint(dir, m2, nullptr); }).find("dtype I32"), std::string::npos);
}

TEST(Checkpoint, JTokTablesAndTheirMomentsRoundTrip) {
  Config cfg = small();
  cfg.model.jtok = true;
  cfg.model.jtok_layers = "0";
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  ASSERT_EQ(m.tables.size(), 1u);  // layer 0 only
  ASSERT_EQ(m.jtok_table[0], 0);
  ASSERT_EQ(m.jtok_table[1], -1);
  ASSERT_EQ(m.tables[0].rows, cfg.model.padded_vocab());
  for (size_t i = 0; i < opt.tables.m[0].size(); ++i) { opt.tables.m[0][i] = 1e-3f * i; opt.tables.v[0][i] = 2e-3f * i; }
  std::string run = fresh_dir("ckpt_jtok");
  std::string dir = save_checkpoint(run, 4, cfg, m, opt, {{"step", 4}, {"run_id", "r1"}}, 2);
  Model m2 = make_model(load_checkpoint_config(dir).model, 8);
  AdamWState o2;
  load_checkpoint(dir, m2, &o2);
  EXPECT_EQ(m2.tables[0].to_vector(), m.tables[0].to_vector());
  EXPECT_EQ(o2.tables.m[0], opt.tables.m[0]);
  EXPECT_EQ(o2.tables.v[0], opt.tables.v[0]);
  EXPECT_EQ(m2.params, m.params);
  // The same weights into a model without JTok: the table is an unexpected tensor.
  Model plain = make_model(small().model, 1);
  EXPECT_NE(error_of([&] { load_checkpoint(dir, plain, nullptr); }).find("unexpected tensor model.layers.0.jtok"),
            std::string::npos);
}

TEST(Checkpoint, JTokMTablesAndTheirMomentsRoundTrip) {
  Config cfg = small();
  cfg.model.jtokm = true;
  cfg.model.jtokm_layers = "1";
  cfg.model.jtokm_n_e = 3;
  cfg.model.jtokm_top_k = 2;
  cfg.model.jtok = true;  // both modules: JTok's table comes first, in layer order
  cfg.model.jtok_layers = "1";
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  ASSERT_EQ(m.tables.size(), 4u);
  EXPECT_EQ(m.jtok_table[1], 0);
  EXPECT_EQ(m.jtokm_table[1], 1);
  EXPECT_EQ(m.jtokm_table[0], -1);
  EXPECT_EQ(m.table_names[3], "model.layers.1.jtokm.embed.2.weight");
  for (size_t k = 0; k < m.tables.size(); ++k)
    for (size_t i = 0; i < opt.tables.m[k].size(); i += 7) { opt.tables.m[k][i] = 1e-3f * (i + k); opt.tables.v[k][i] = 2e-3f * i; }
  std::string run = fresh_dir("ckpt_jtokm");
  std::string dir = save_checkpoint(run, 4, cfg, m, opt, {{"step", 4}, {"run_id", "r1"}}, 2);
  Model m2 = make_model(load_checkpoint_config(dir).model, 8);
  AdamWState o2;
  load_checkpoint(dir, m2, &o2);
  for (size_t k = 0; k < m.tables.size(); ++k) {
    EXPECT_EQ(m2.tables[k].to_vector(), m.tables[k].to_vector()) << m.table_names[k];
    EXPECT_EQ(o2.tables.m[k], opt.tables.m[k]) << m.table_names[k];
    EXPECT_EQ(o2.tables.v[k], opt.tables.v[k]) << m.table_names[k];
  }
  EXPECT_EQ(m2.params, m.params);
  // A config with fewer tables per layer does not silently load it.
  Config fewer = cfg;
  fewer.model.jtokm_n_e = 2;
  Model m3 = make_model(fewer.model, 1);
  EXPECT_NE(error_of([&] { load_checkpoint(dir, m3, nullptr); }).find("jtokm"), std::string::npos);
}

// Writes a safetensors file by hand: header JSON and data bytes as given (to test the reader's bounds).
static void write_raw_safetensors(const std::string& path, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t hl = header.size();
  std::memcpy(out.data(), &hl, 8);
  write_file_atomic(path, out + header + data);
}

TEST(Safetensors, ShapesWhoseElementCountOverflowsAreRefused) {
  const std::string p = fresh_dir("st_overflow") + "/x.safetensors";
  // 2^62 x 4 elements wrap to 0 in 64 bits: 0 bytes of data would pass an unchecked product.
  write_raw_safetensors(p, R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", "");
  std::string e = error_of([&] { read_safetensors_index(p); });
  EXPECT_NE(e.find("more elements than any file"), std::string::npos) << e;
  EXPECT_NE(e.find("x.safetensors"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { read_safetensors(p); }), "");
  // A product that fits but disagrees with the byte span.
  write_raw_safetensors(p, R"({"t":{"dtype":"F32","shape":[3,2],"data_offsets":[0,20]}})", std::string(20, 'a'));
  e = error_of([&] { read_safetensors_index(p); });
  EXPECT_NE(e.find("20 bytes of data for shape [3,2]"), std::string::npos) << e;
  // A zero dim with zero bytes is a valid empty tensor.
  write_raw_safetensors(p, R"({"t":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}})", "");
  EXPECT_EQ(read_safetensors(p).tensors.at("t").numel(), 0);
}

TEST(Safetensors, IndexReadsOneTensorAtATimeExactly) {
  const std::string p = fresh_dir("st_index") + "/x.safetensors";
  StFile f;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-7.5f};
  f.tensors["a"] = st_f32({2, 3}, a.data());
  f.tensors["b"] = st_f32({1}, b.data());
  write_safetensors(p, f);
  StIndex idx = read_safetensors_index(p);
  ASSERT_EQ(idx.tensors.size(), 2u);
  EXPECT_EQ(idx.tensors.at("a").shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> got(6);
  read_tensor_bytes(idx, "a", got.data());
  EXPECT_EQ(got, a);
  float one = 0;
  read_tensor_bytes(idx, "b", &one);
  EXPECT_EQ(one, -7.5f);
  EXPECT_NE(error_of([&] { read_tensor_bytes(idx, "c", &one); }).find("missing tensor c"), std::string::npos);
}

TEST(Checkpoint, RetentionDeletesOnlyItsOwnRunAndNeverReplacesAnother) {
  Config cfg = small();
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  const std::string run = fresh_dir("ckpt_two_runs");
  const fs::path ck = fs::path(run) / "checkpoints";
  for (int64_t step : {20, 30}) save_checkpoint(run, step, cfg, m, opt, {{"step", step}, {"run_id", "old"}}, 3);
  // A second run in the same directory (the trainer refuses this; save_checkpoint must be safe anyway).
  for (int64_t step : {5, 10, 15}) save_checkpoint(run, step, cfg, m, opt, {{"step", step}, {"run_id", "new"}}, 2);
  EXPECT_TRUE(fs::exists(ck / "step_00000020" / "COMPLETE"));  // the old run's, though "newer" by step
  EXPECT_TRUE(fs::exists(ck / "step_00000030" / "COMPLETE"));
  EXPECT_FALSE(fs::exists(ck / "step_00000005"));               // the new run's oldest beyond keep 2
  EXPECT_TRUE(fs::exists(ck / "step_00000010" / "COMPLETE"));
  EXPECT_TRUE(fs::exists(ck / "step_00000015" / "COMPLETE"));
  const std::string e = error_of([&] { save_checkpoint(run, 20, cfg, m, opt, {{"step", 20}, {"run_id", "new"}}, 2); });
  EXPECT_NE(e.find("belongs to another run"), std::string::npos) << e;
  EXPECT_EQ(read_file((ck / "step_00000020" / "trainer_state.json").string()).find("\"new\""), std::string::npos);
}

// trainer_state.json's integers: step is a non-negative int64, max_steps an int64; a value past
// int64 (2^64 - 1, once read as -1) or a float is an error naming the field and the value.
TEST(Checkpoint, TrainerStateIntegersAreCheckedNotWrapped) {
  const std::string rest = R"("data": {}, "sample_rng": ")" + [] {
    std::ostringstream os;
    os << std::mt19937_64(1);
    return os.str();
  }() + "\"";
  auto parse = [&](const std::string& fields) { return parse_trainer_state_text("{" + fields + ", " + rest + "}", "ts.json"); };
  EXPECT_EQ(parse(R"("step": 9223372036854775807, "max_steps": -1)").step, INT64_MAX);
  EXPECT_EQ(parse(R"("step": 7, "max_steps": -1)").max_steps, -1);
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad = {
      {R"("step": -1)", {"ts.json", "'step'", "-1"}},
      {R"("step": 9223372036854775808)", {"'step'", "9223372036854775808"}},
      {R"("step": 3.0)", {"'step'", "3.0"}},
      {R"("step": 1, "max_steps": 18446744073709551615)", {"'max_steps'", "18446744073709551615"}},
      {R"("step": 1, "max_steps": 1e300)", {"'max_steps'", "1e+300"}},
  };
  for (const auto& [fields, needles] : bad) jtok::testing::expect_error([&] { parse(fields); }, needles);
}

TEST(Checkpoint, NonFiniteStateIsNeverWritten) {
  Config cfg = small();
  cfg.model.jtok = true;
  cfg.model.jtok_layers = "1";
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  const std::string run = fresh_dir("ckpt_nonfinite");
  const std::string good = save_checkpoint(run, 1, cfg, m, opt, {{"step", 1}, {"run_id", "r1"}}, 1);
  const std::string before = read_file(good + "/model.safetensors");
  m.tables[0].mutable_values()[5] = std::numeric_limits<float>::infinity();
  std::string e = error_of([&] { save_checkpoint(run, 2, cfg, m, opt, {{"step", 2}, {"run_id", "r1"}}, 1); });
  EXPECT_NE(e.find("model.layers.1.jtok.embed.weight holds a NaN or an infinity"), std::string::npos) << e;
  m.tables[0].mutable_values()[5] = 0;
  opt.v[7] = std::nanf("");
  e = error_of([&] { save_checkpoint(run, 2, cfg, m, opt, {{"step", 2}, {"run_id", "r1"}}, 1); });
  EXPECT_NE(e.find("AdamW moments of"), std::string::npos) << e;
  // Nothing new, and the last good checkpoint survives retention (keep 1) untouched.
  EXPECT_FALSE(fs::exists(fs::path(run) / "checkpoints" / "step_00000002"));
  EXPECT_EQ(latest_checkpoint(run), good);
  EXPECT_EQ(read_file(good + "/model.safetensors"), before);
}

TEST(Checkpoint, LoadingForInferenceNeedsNoInitAndNoGradients) {
  Config cfg = small();
  cfg.model.jtokm = true;
  cfg.model.jtokm_layers = "0";
  Model m = make_model(cfg.model, 3);
  AdamWState opt = make_adamw_state(m);
  const std::string dir = save_checkpoint(fresh_dir("ckpt_noinit"), 1, cfg, m, opt, {{"step", 1}, {"run_id", "r1"}}, 1);
  Model bare = make_model(cfg.model, 3, {.init = false, .grads = false});
  EXPECT_TRUE(bare.grads.empty());
  for (float x : bare.params) ASSERT_EQ(x, 0.0f);  // not initialised: the file gives every value
  load_checkpoint(dir, bare, nullptr);
  EXPECT_EQ(bare.params, m.params);
  for (size_t k = 0; k < m.tables.size(); ++k) EXPECT_EQ(bare.tables[k].to_vector(), m.tables[k].to_vector());
}

// --tables mmap: the tables stay in model.safetensors and are read in place; the model computes the
// same logits as with the tables copied into RAM. Missing tensors and incomplete checkpoints fail.
TEST(Checkpoint, MappedTablesAreReadInPlaceAndGiveTheSameLogits) {
  Config cfg = small();
  cfg.model.jtok = true;
  cfg.model.jtok_layers = "0";
  cfg.model.jtokm = true;
  cfg.model.jtokm_layers = "1";
  cfg.model.jtokm_n_e = 3;
  cfg.model.jtokm_top_k = 2;
  cfg.model.jtokm_scale_init = 2.0;
  Model m = make_model(cfg.model, 3);
  std::string dir = save_checkpoint(fresh_dir("ckpt_mapped"), 2, cfg, m, make_adamw_state(m),
                                    {{"step", 2}, {"run_id", "mapped"}}, 1);
  Model ram = make_model(cfg.model, 9), mapped = make_model(cfg.model, 9, {.init = false, .grads = false, .tables = false});
  EXPECT_EQ(mapped.tables[0].data(), nullptr);  // no storage of its own before loading
  load_checkpoint(dir, ram, nullptr);
  load_checkpoint_mapped(dir, mapped);
  EXPECT_EQ(mapped.params, m.params);
  for (size_t k = 0; k < m.tables.size(); ++k) {
    EXPECT_TRUE(mapped.tables[k].read_only()) << m.table_names[k];
    EXPECT_FALSE(ram.tables[k].read_only());
    EXPECT_EQ(mapped.tables[k].to_vector(), m.tables[k].to_vector()) << m.table_names[k];
    EXPECT_THROW(mapped.tables[k].mutable_data(), Error);
  }
  std::vector<int32_t> ids = {1, 5, 5, 39, 0, 7, 5, 12};
  for (size_t k = 0; k < m.tables.size(); ++k) {  // rows announced to the kernel: nothing changes
    EXPECT_EQ(prefetch_rows(mapped.tables[k], ids.data(), 8), 8);
    EXPECT_EQ(prefetch_rows(ram.tables[k], ids.data(), 8), 0);
  }
  Activations a1, a2;
  forward(ram, a1, ids.data(), 2, 4);
  forward(mapped, a2, ids.data(), 2, 4);
  EXPECT_EQ(a1.logits, a2.logits);
  // A model whose config names a table the file lacks.
  Config more = cfg;
  more.model.jtok_layers = "0,1";
  Model wrong = make_model(more.model, 1);
  EXPECT_NE(error_of([&] { load_checkpoint_mapped(dir, wrong); }).find("missing tensor model.layers.1.jtok"),
            std::string::npos);
  fs::remove(fs::path(dir) / "COMPLETE");
  EXPECT_NE(error_of([&] { load_checkpoint_mapped(dir, mapped); }).find("incomplete"), std::string::npos);
}

// An inference export with bf16 / int8 tables (jtok export --table-dtype): generate / eval / serve
// load it into RAM or mapped, with the same logits either way (and as the quantized model had);
// the training loader refuses it, naming the table and its dtype.
TEST(Checkpoint, QuantizedTablesLoadForInferenceOnlyRamAndMappedAlike) {
  Config cfg = small();
  cfg.model.jtok = true;
  cfg.model.jtok_layers = "0";
  cfg.model.jtokm = true;
  cfg.model.jtokm_layers = "1";
  cfg.model.jtokm_n_e = 3;
  cfg.model.jtokm_top_k = 2;
  cfg.model.jtokm_scale_init = 2.0;
  for (Dtype dt : {Dtype::bf16, Dtype::int8}) {
    SCOPED_TRACE(dtype_name(dt));
    Model m = make_model(cfg.model, 3);
    std::string dir = save_checkpoint(fresh_dir((std::string("ckpt_q_") + dtype_name(dt)).c_str()), 2, cfg, m,
                                      make_adamw_state(m), {{"step", 2}, {"run_id", "q"}}, 1);
    Model q = m;
    q.w = bind_view(q.params.data(), q.layout, q.cfg);
    for (auto& t : q.tables) t = quantize_table(t, dt);
    StFile st = weights_to_st(q);
    write_safetensors((fs::path(dir) / "model.safetensors").string(), st);
    for (size_t k = 0; k < q.tables.size(); ++k) {
      EXPECT_EQ(st.tensors.at(q.table_names[k]).dtype, dt == Dtype::bf16 ? "BF16" : "I8");
      EXPECT_EQ(st.tensors.count(q.table_names[k] + "_scale"), dt == Dtype::int8 ? 1u : 0u);
    }
    Model ram = make_model(cfg.model, 9, {.init = false, .grads = false});
    Model mapped = make_model(cfg.model, 9, {.init = false, .grads = false, .tables = false});
    load_checkpoint(dir, ram, nullptr);
    load_checkpoint_mapped(dir, mapped);
    for (size_t k = 0; k < q.tables.size(); ++k) {
      EXPECT_EQ(ram.tables[k].dtype(), dt);
      EXPECT_EQ(mapped.tables[k].dtype(), dt);
      EXPECT_TRUE(mapped.tables[k].is_view());
      EXPECT_EQ(ram.tables[k].to_vector(), q.tables[k].to_vector()) << q.table_names[k];
      EXPECT_EQ(mapped.tables[k].to_vector(), q.tables[k].to_vector()) << q.table_names[k];
    }
    std::vector<int32_t> ids = {1, 5, 5, 39, 0, 7, 5, 12};
    Activations a0, a1, a2;
    forward(q, a0, ids.data(), 2, 4);
    forward(ram, a1, ids.data(), 2, 4);
    forward(mapped, a2, ids.data(), 2, 4);
    EXPECT_EQ(a1.logits, a0.logits);
    EXPECT_EQ(a2.logits, a0.logits);
    Model train = make_model(cfg.model, 9);
    AdamWState opt;
    const std::string e = error_of([&] { load_checkpoint(dir, train, &opt); });
    EXPECT_NE(e.find(std::string("is stored as ") + dtype_name(dt)), std::string::npos) << e;
    EXPECT_NE(e.find("training needs f32 tables"), std::string::npos) << e;
    // An int8 table without its scales is named.
    if (dt == Dtype::int8) {
      st.tensors.erase(q.table_names[0] + "_scale");
      write_safetensors((fs::path(dir) / "model.safetensors").string(), st);
      EXPECT_NE(error_of([&] { load_checkpoint(dir, ram, nullptr); }).find("has no per-row scales"), std::string::npos);
    }
  }
}
