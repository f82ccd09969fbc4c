// Runs an isoFLOPs plan with the trainer, resumably, and collects the results table.
//
// For each plan row, in OUT/<run_id>/:
//   result.json exists  -> the run is finished; it is not redone;
//   otherwise           -> write config.json (base config + the row's overrides + max_steps),
//                          run `TRAINER train --config OUT/<run_id>/config.json --out OUT/<run_id>
//                          --max-steps STEPS [--resume]` (output appended to train.log; --resume
//                          when a complete checkpoint exists), read the last "val_loss" of
//                          log.jsonl, which must be at step STEPS, and write result.json atomically.
// Then the results CSV lists every finished run.
#pragma once
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "scaling/plan.h"

namespace jtok {

// What a trainer's log.jsonl says at its end.
struct TrainLogSummary {
  bool has_val = false;
  double val_loss = 0;      // the last "val_loss" line
  int64_t val_step = -1;    // its "step" (-1 when absent)
  bool has_train = false;
  double train_loss = 0;    // the last line with "loss"
  int64_t last_step = -1;   // the largest "step" seen
};
// Reads a JSONL log. A malformed last line (a run killed mid-write) is ignored; a malformed
// line elsewhere fails naming the file and line.
TrainLogSummary read_train_log(const std::string& path);

// Runs argv with stdout and stderr appended to log_path; returns the exit status (128+signal
// when killed by a signal).
using Runner = std::function<int(const std::vector<std::string>& argv, const std::string& log_path)>;
int run_subprocess(const std::vector<std::string>& argv, const std::string& log_path);

struct RunOptions {
  std::string out_dir;                      // runs live in out_dir/<run_id>
  std::string trainer = "/proc/self/exe";   // the jtok binary
  bool dry_run = false;                     // print what would run, run nothing
  bool remove_checkpoints = false;          // delete OUT/<run_id>/checkpoints once result.json is written
  Runner runner = run_subprocess;           // replaced in tests
  std::function<void(const std::string&)> log = nullptr;  // progress lines (nullptr: quiet)
};

struct RunSummary {
  int done_before = 0, ran = 0, failed = 0, pending = 0;  // pending: dry run
  std::vector<nlohmann::json> results;  // result.json of every finished run, in plan order
  std::vector<std::string> failures;    // "run_id: reason"
};

RunSummary run_plan(const Plan& plan, const RunOptions& opt);

// The results table: run_id,budget,shape,n_c,n_n,eta,tokens,steps,compute,loss
// (`jtok scaling fit --isoflops` reads budget, n_c, tokens and loss).
std::string results_csv(const std::vector<nlohmann::json>& results);

}  // namespace jtok
