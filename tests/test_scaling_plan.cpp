// isoFLOPs plan grid and the resumable run/collect logic, with a fake trainer.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/atomic_file.h"
#include "scaling/flops.h"
#include "scaling/plan.h"
#include "scaling/run.h"
#include "scaling/table.h"
#include "train/config.h"

namespace fs = std::filesystem;
using namespace jtok;

namespace {
// A fresh directory under the build's temp area, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("jtok_scaling_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& s) const { return (path / s).string(); }
};

std::string write_base(const TempDir& t) {
  std::string p = t / "base.json";
  write_file_atomic(p, R"({"vocab_size": 256, "vocab_pad_multiple": 64, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256, "seq_len": 64,
    "micro_batch_size": 4, "max_position_embeddings": 128})");
  return p;
}
}  // namespace

TEST(Plan, GridRowsFollowDEqualsCOver6Nc) {
  TempDir t;
  std::string base = write_base(t);
  auto shapes = grid_shapes(read_json_file(base), base, {64, 128}, {2, 4});
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[3].name, "d128_L4");
  EXPECT_EQ(shapes[3].overrides["num_attention_heads"], 8);  // head size 16 kept
  EXPECT_EQ(shapes[3].overrides["intermediate_size"], 512);  // ratio 4 kept
  Plan p = make_plan(base, shapes, {1e12, 1e13}, 1);
  ASSERT_EQ(p.rows.size(), 8u);
  for (auto& r : p.rows) {
    Config c = config_from_json(merged_config(read_json_file(base), r.overrides, "t"), "t");
    EXPECT_EQ(r.n_c, flops_report(c.model, c.train.seq_len).n_c);
    EXPECT_DOUBLE_EQ(r.tokens_target, r.budget / (6.0 * r.n_c));
    EXPECT_EQ(r.tokens_per_step, 256);
    EXPECT_EQ(r.steps, std::llround(r.tokens_target / 256));
    EXPECT_EQ(r.tokens, r.steps * 256);
    EXPECT_NEAR(r.compute / r.budget, 1.0, 256.0 / r.tokens_target);  // within one step of rounding
  }
  EXPECT_EQ(p.rows[0].run_id, "C1e12_d64_L2");
  // Round trip through JSON.
  Plan q = plan_from_json(to_json(p), "t");
  ASSERT_EQ(q.rows.size(), p.rows.size());
  EXPECT_EQ(q.rows[5].run_id, p.rows[5].run_id);
  EXPECT_EQ(q.rows[5].steps, p.rows[5].steps);
  EXPECT_EQ(q.rows[5].overrides, p.rows[5].overrides);
  // An integer field given as a float is named, not converted (1e300 -> int64 is undefined).
  nlohmann::json bad = to_json(p);
  bad["rows"][3]["steps"] = 1e300;
  try {
    plan_from_json(bad, "plan.json");
    FAIL() << "a float step count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json: field 'steps' must be an integer"), std::string::npos) << e.what();
  }
}

// MoE family: N_c counts the activated experts only (as `jtok flops` does), so D = C / (6 N_c)
// gives the MoE more tokens than its stored size would; expert width scales with d.
TEST(Plan, MoeShapesCountActivatedParams) {
  TempDir t;
  std::string base = t / "moe.json";
  write_file_atomic(base, R"({"model_type": "jtok_moe", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256, "first_k_dense_replace": 1,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "seq_len": 64, "micro_batch_size": 4, "max_position_embeddings": 128})");
  auto shapes = grid_shapes(read_json_file(base), base, {64, 128}, {3, 5});
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[0].overrides["moe_intermediate_size"], 32);
  EXPECT_EQ(shapes[2].overrides["moe_intermediate_size"], 64);  // ratio 1/2 of d kept
  EXPECT_EQ(shapes[2].overrides["intermediate_size"], 512);
  Plan p = make_plan(base, shapes, {1e12}, 1);
  ASSERT_EQ(p.rows.size(), 4u);
  // d64 L3 by hand: attention 3 * 4 d^2; one dense MLP 3 d 256; two MoE layers of shared (32) +
  // top-2 of 32 each: 3 d (32 + 2 * 32). The 6 routed experts not chosen are not in N_c.
  const int64_t d = 64;
  EXPECT_EQ(p.rows[0].n_c, 3 * 4 * d * d + 3 * d * 256 + 2 * 3 * d * (32 + 2 * 32));
  EXPECT_EQ(p.rows[0].n_experts_inactive, 2 * 3 * d * 6 * 32);
  for (auto& r : p.rows) {
    Config c = config_from_json(merged_config(read_json_file(base), r.overrides, "t"), "t");
    ASSERT_TRUE(c.model.is_moe());
    FlopsReport f = flops_report(c.model, c.train.seq_len);
    EXPECT_EQ(r.n_c, f.n_c);
    EXPECT_GT(r.n_experts_inactive, 0);
    EXPECT_GT(r.n_total, r.n_c + r.n_experts_inactive);  // plus embedding, norms, routers
    EXPECT_DOUBLE_EQ(r.tokens_target, r.budget / (6.0 * double(r.n_c)));
    EXPECT_EQ(r.steps, std::llround(r.tokens_target / 256));
  }
  Plan q = plan_from_json(to_json(p), "t");
  EXPECT_EQ(q.rows[3].n_experts_inactive, p.rows[3].n_experts_inactive);
  // first_k_dense_replace is the base's: a shape with fewer layers fails naming the field.
  nlohmann::json b2 = read_json_file(base);
  b2["first_k_dense_replace"] = 2;
  try {
    grid_shapes(b2, base, {64}, {1});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("first_k_dense_replace"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("d64_L1"), std::string::npos) << e.what();
  }
}

TEST(Plan, MinStepsLeavesOutTooLargeShapes) {
  TempDir t;
  std::string base = write_base(t);
  auto shapes = grid_shapes(read_json_file(base), base, {64, 256}, {2});
  Plan p = make_plan(base, shapes, {1e11}, 300);
  // d64:  N_c = 2*(4*64*64 + 3*64*256)    = 131072  -> 1e11/(6 N_c)/256 = 497 steps: kept;
  // d256: N_c = 2*(4*256*256 + 3*256*1024) = 2097152 -> 31 steps < 300: left out.
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].shape, "d64_L2");
  EXPECT_EQ(p.rows[0].steps, 497);
  ASSERT_EQ(p.skipped.size(), 1u);
  EXPECT_NE(p.skipped[0].find("d256_L2"), std::string::npos);
  // --max-tokens leaves out the other end: d64 would train on 497 * 256 = 127232 tokens.
  Plan q = make_plan(base, shapes, {1e11}, 1, 1e5);
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0].shape, "d256_L2");
  ASSERT_EQ(q.skipped.size(), 1u);
  EXPECT_NE(q.skipped[0].find("d64_L2: 127232 tokens > max"), std::string::npos) << q.skipped[0];
}

TEST(Plan, ShapesFileWithNamesAndBadFields) {
  TempDir t;
  std::string base = write_base(t);
  std::string sp = t / "shapes.json";
  write_file_atomic(sp, R"({"shapes": [{"name": "tiny", "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2},
                                        {"num_hidden_layers": 3}]})");
  auto s = read_shapes(sp, read_json_file(base));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].name, "tiny");
  EXPECT_FALSE(s[0].overrides.contains("name"));
  EXPECT_EQ(s[1].name, "d64_L3");
  write_file_atomic(sp, R"([{"hidden_sizes": 32}])");
  try {
    read_shapes(sp, read_json_file(base));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hidden_sizes"), std::string::npos) << e.what();
  }
}

TEST(TrainLog, LastValLossAndTornLine) {
  TempDir t;
  std::string p = t / "log.jsonl";
  write_file_atomic(p, "{\"step\": 0, \"loss\": 5.0}\n{\"step\": 10, \"val_loss\": 4.5}\n{\"step\": 19, \"loss\": 4.1}\n"
                       "{\"step\": 20, \"val_loss\": 4.2}\n{\"step\": 21, \"lo");
  auto s = read_train_log(p);
  EXPECT_TRUE(s.has_val);
  EXPECT_DOUBLE_EQ(s.val_loss, 4.2);
  EXPECT_EQ(s.val_step, 20);
  EXPECT_DOUBLE_EQ(s.train_loss, 4.1);
  EXPECT_EQ(s.last_step, 20);
  write_file_atomic(p, "{\"step\": 3, \"loss\": 5.0}\n{\"step\": 1e300, \"loss\": 4.0}\n");  // a float step is not a step
  EXPECT_EQ(read_train_log(p).last_step, 3);
  write_file_atomic(p, "{\"step\": 0, \"loss\": 5.0}\nnot json\n{\"step\": 1, \"val_loss\": 4.0}\n");
  try {
    read_train_log(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("log.jsonl:2"), std::string::npos) << e.what();
  }
}

TEST(RunPlan, ResumableWithFakeTrainer) {
  TempDir t;
  std::string base = write_base(t);
  Plan p = make_plan(base, grid_shapes(read_json_file(base), base, {64, 128}, {2}), {1e12, 3e12}, 1);
  ASSERT_EQ(p.rows.size(), 4u);
  std::vector<std::string> calls;
  RunOptions o;
  o.out_dir = t / "runs";
  o.trainer = "/fake/jtok";
  // Fake trainer: loss depends on the run; the run "C3e12_d128_L2" fails the first time.
  bool fail_once = true;
  o.runner = [&](const std::vector<std::string>& argv, const std::string& log_path) {
    EXPECT_EQ(argv[0], "/fake/jtok");
    EXPECT_EQ(argv[1], "train");
    EXPECT_EQ(argv[2], "--config");
    EXPECT_EQ(argv[4], "--out");
    EXPECT_EQ(argv[6], "--max-steps");
    const std::string dir = argv[5];
    calls.push_back(fs::path(dir).filename().string());
    auto cfg = read_json_file(argv[3]);
    EXPECT_EQ(cfg["max_steps"].get<int64_t>(), std::stoll(argv[7]));
    if (calls.back() == "C3e12_d128_L2" && fail_once) {
      fail_once = false;
      return 1;
    }
    double loss = 3.0 + 1e-3 * cfg["hidden_size"].get<double>();
    std::ofstream(dir + "/log.jsonl") << "{\"step\": 1, \"loss\": 9}\n{\"step\": " << argv[7] << ", \"val_loss\": " << loss << "}\n";
    return 0;
  };
  RunSummary s1 = run_plan(p, o);
  EXPECT_EQ(s1.ran, 3);
  EXPECT_EQ(s1.failed, 1);
  EXPECT_EQ(calls.size(), 4u);
  EXPECT_FALSE(fs::exists(t / "runs/C3e12_d128_L2/result.json"));
  // Second pass: only the failed run is redone.
  calls.clear();
  RunSummary s2 = run_plan(p, o);
  EXPECT_EQ(s2.done_before, 3);
  EXPECT_EQ(s2.ran, 1);
  EXPECT_EQ(s2.failed, 0);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], "C3e12_d128_L2");
  // Results table, in plan order, read back as a CSV.
  CsvTable tab = parse_csv(results_csv(s2.results), "results");
  ASSERT_EQ(tab.rows.size(), 4u);
  EXPECT_EQ(tab.cell(0, "run_id"), "C1e12_d64_L2");
  EXPECT_NEAR(tab.number(3, "loss"), 3.128, 1e-12);
  EXPECT_EQ(tab.number(3, "n_c"), double(p.rows[3].n_c));
  EXPECT_EQ(tab.number(3, "tokens"), double(p.rows[3].tokens));
  // A run whose log has no val_loss is a failure, not a result.
  fs::remove(t / "runs/C1e12_d64_L2/result.json");
  o.runner = [&](const std::vector<std::string>& argv, const std::string&) {
    std::ofstream(argv[5] + "/log.jsonl") << "{\"step\": 1, \"loss\": 9}\n";
    return 0;
  };
  RunSummary s3 = run_plan(p, o);
  EXPECT_EQ(s3.failed, 1);
  EXPECT_NE(s3.failures[0].find("val_loss"), std::string::npos);
}

// The real trainer exits 0 after a clean stop on SIGINT/SIGTERM, its last val_loss from an earlier
// eval: that is a failure, and the rerun passes --resume once a complete checkpoint exists.
TEST(RunPlan, StoppedEarlyIsNotAResultAndTheRerunResumes) {
  TempDir t;
  std::string base = write_base(t);
  Plan p = make_plan(base, grid_shapes(read_json_file(base), base, {64}, {2}), {1e12}, 1);
  ASSERT_EQ(p.rows.size(), 1u);
  const int64_t steps = p.rows[0].steps;
  ASSERT_GT(steps, 4);
  std::vector<std::vector<std::string>> calls;
  RunOptions o;
  o.out_dir = t / "runs";
  o.remove_checkpoints = true;
  o.runner = [&](const std::vector<std::string>& argv, const std::string&) {
    calls.push_back(argv);
    const std::string dir = argv[5];
    const bool resumed = argv.back() == "--resume";
    const int64_t at = resumed ? steps : steps / 2;  // first call: "stopped" half way
    fs::create_directories(dir + "/checkpoints/step_00000002");
    std::ofstream(dir + "/checkpoints/step_00000002/COMPLETE") << "2\n";
    std::ofstream(dir + "/log.jsonl", std::ios::app) << "{\"step\": " << at << ", \"val_loss\": 4.5}\n";
    return 0;
  };
  RunSummary s1 = run_plan(p, o);
  EXPECT_EQ(s1.failed, 1);
  ASSERT_EQ(s1.failures.size(), 1u);
  EXPECT_NE(s1.failures[0].find("not at the planned " + std::to_string(steps)), std::string::npos) << s1.failures[0];
  EXPECT_FALSE(fs::exists(t / ("runs/" + p.rows[0].run_id + "/result.json")));
  EXPECT_NE(calls[0].back(), "--resume");
  RunSummary s2 = run_plan(p, o);
  EXPECT_EQ(s2.ran, 1);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].back(), "--resume");
  nlohmann::json res = read_json_file(t / ("runs/" + p.rows[0].run_id + "/result.json"));
  EXPECT_EQ(res["val_step"].get<int64_t>(), steps);
  EXPECT_TRUE(res["resumed"].get<bool>());
  EXPECT_GE(res["seconds"].get<double>(), 0.0);
  // --remove-checkpoints: the finished run keeps its result, not its checkpoints.
  EXPECT_FALSE(fs::exists(t / ("runs/" + p.rows[0].run_id + "/checkpoints")));
}

TEST(RunPlan, SubprocessExitStatusAndOutput) {
  TempDir t;
  std::string log = t / "out.log";
  EXPECT_EQ(run_subprocess({"/bin/sh", "-c", "echo hello; exit 3"}, log), 3);
  EXPECT_EQ(read_file(log), "hello\n");
  EXPECT_EQ(run_subprocess({"/nonexistent/binary"}, log), 127);
}

TEST(AtomicFile, ReplacesWholeFileAndLeavesNoTemp) {
  TempDir t;
  std::string p = t / "x.json";
  write_file_atomic(p, "one");
  write_file_atomic(p, "two");
  EXPECT_EQ(read_file(p), "two");
  int n = 0;
  for (auto& e : fs::directory_iterator(t.path)) n += e.path().filename().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(n, 0);
  EXPECT_THROW(write_file_atomic(t / "no/such/dir/x", "a"), Error);
}
