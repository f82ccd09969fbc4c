// `jtok scaling plan|run|fit`: isoFLOPs studies (paper sections 3.1.2, 4.2; Appendices A and C).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "core/atomic_file.h"
#include "scaling/fit_report.h"
#include "scaling/plan.h"
#include "scaling/run.h"

namespace cmd_scaling {

// "1e18,3e18" or repeated options -> numbers; fails naming the option on a bad value.
std::vector<double> parse_numbers(const std::vector<std::string>& items, const char* option) {
  std::vector<double> out;
  for (auto& item : items) {
    std::stringstream ss(item);
    for (std::string tok; std::getline(ss, tok, ',');) {
      if (tok.empty()) continue;
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(tok, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != tok.size() || !std::isfinite(v)) jtok::fail(option, ": not a number: '", tok, "'");
      out.push_back(v);
    }
  }
  return out;
}

std::vector<int64_t> parse_ints(const std::vector<std::string>& items, const char* option) {
  std::vector<int64_t> out;
  for (double v : parse_numbers(items, option)) {
    if (v != std::floor(v)) jtok::fail(option, ": not an integer: ", v);
    out.push_back(int64_t(v));
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

void setup_plan(CLI::App* sub) {
  static std::string config, shapes_file, out, csv;
  static std::vector<std::string> budgets, hidden, layers;
  static int64_t min_steps = 1;
  static double max_tokens = 0;
  sub->add_option("--config", config, "base config JSON file")->required();
  sub->add_option("--budgets", budgets, "compute budgets C in FLOPs, e.g. 1e15,3e15,1e16")->required();
  sub->add_option("--shapes", shapes_file, "JSON file: array of config-override objects (optional \"name\")");
  sub->add_option("--hidden-sizes", hidden, "hidden sizes of a shape grid, e.g. 64,128,256");
  sub->add_option("--layers", layers, "layer counts of a shape grid, e.g. 2,4,8");
  sub->add_option("--min-steps", min_steps, "leave out runs shorter than this many steps (default 1)");
  sub->add_option("--max-tokens", max_tokens, "leave out runs that would train on more tokens than this (default: no limit)");
  sub->add_option("--out", out, "write the plan here (.json, or .csv for the table only); default: stdout JSON");
  sub->add_option("--csv", csv, "also write the plan as a CSV table here");
  sub->callback([] {
    if (!shapes_file.empty() && (!hidden.empty() || !layers.empty()))
      jtok::fail("scaling plan: give either --shapes or --hidden-sizes/--layers, not both");
    nlohmann::json base = jtok::read_json_file(config);
    std::vector<jtok::ShapeSpec> shapes =
        !shapes_file.empty() ? jtok::read_shapes(shapes_file, base)
                             : jtok::grid_shapes(base, config, parse_ints(hidden, "--hidden-sizes"), parse_ints(layers, "--layers"));
    jtok::Plan p = jtok::make_plan(config, shapes, parse_numbers(budgets, "--budgets"), min_steps, max_tokens);
    for (auto& s : p.skipped) std::fprintf(stderr, "scaling plan: left out %s\n", s.c_str());
    if (p.rows.empty()) jtok::fail("scaling plan: every run was left out (by --min-steps or --max-tokens)");
    const std::string j = jtok::to_json(p).dump(2) + "\n";
    if (out.empty()) std::printf("%s", j.c_str());
    else jtok::write_file_atomic(out, ends_with(out, ".csv") ? jtok::plan_csv(p) : j);
    if (!csv.empty()) jtok::write_file_atomic(csv, jtok::plan_csv(p));
    if (!out.empty())
      std::fprintf(stderr, "scaling plan: %zu runs (%zu budgets x %zu shapes, %zu left out) -> %s\n", p.rows.size(),
                   p.budgets.size(), shapes.size(), p.skipped.size(), out.c_str());
  });
}

void setup_run(CLI::App* sub) {
  static std::string plan_file, out, results, trainer = "/proc/self/exe";
  static bool dry = false, rm_ck = false;
  sub->add_option("--plan", plan_file, "plan JSON written by `jtok scaling plan`")->required();
  sub->add_option("--out", out, "directory of the runs (one subdirectory per run)")->required();
  sub->add_option("--results", results, "results CSV (default: OUT/results.csv)");
  sub->add_option("--trainer", trainer, "the binary invoked as `TRAINER train ...` (default: this jtok)");
  sub->add_flag("--dry-run", dry, "print what would run; run nothing");
  sub->add_flag("--remove-checkpoints", rm_ck, "delete a run's checkpoints/ once its result.json is written");
  sub->callback([] {
    jtok::Plan p = jtok::plan_from_json(jtok::read_json_file(plan_file), plan_file);
    jtok::RunOptions o;
    o.out_dir = out;
    // /proc/self/exe names this binary even when it was started through a relative path.
    o.trainer = trainer == "/proc/self/exe" ? std::filesystem::read_symlink("/proc/self/exe").string() : trainer;
    o.dry_run = dry;
    o.remove_checkpoints = rm_ck;
    o.log = [](const std::string& s) { std::fprintf(stderr, "scaling run: %s\n", s.c_str()); };
    jtok::RunSummary s = jtok::run_plan(p, o);
    if (!dry) {
      const std::string path = results.empty() ? out + "/results.csv" : results;
      jtok::write_file_atomic(path, jtok::results_csv(s.results));
      std::fprintf(stderr, "scaling run: %d done before, %d ran, %d failed; %zu results -> %s\n", s.done_before, s.ran,
                   s.failed, s.results.size(), path.c_str());
    }
    if (s.failed > 0) {
      std::string list;
      for (auto& f : s.failures) list += "\n  " + f;
      jtok::fail("scaling run: ", s.failed, " run(s) failed (rerun to retry them; finished runs are kept):", list);
    }
  });
}

void setup_fit(CLI::App* sub) {
  static jtok::FitInputs in;
  static bool json = false;
  sub->add_option("--frontier", in.frontier_files, "CSV with columns compute,loss (repeatable; the first is the base)");
  sub->add_option("--isoflops", in.isoflops_files, "CSV with columns budget (or compute),n_c,loss[,tokens] (repeatable)");
  sub->add_option("--eta", in.eta_file, "CSV with columns eta,loss (loss against log2 eta)");
  sub->add_option("--window", in.window, "isoFLOP quadratic: the k runs nearest the lowest loss (default 0: all)");
  sub->add_option("--svg-dir", in.svg_dir, "write SVG pictures (profiles, frontiers, eta) into this directory");
  sub->add_option("--bootstrap", in.bootstrap,
                  "resample the runs this many times for intervals of the savings and slopes (default 0: off; needs >= 2 --isoflops)");
  sub->add_option("--bootstrap-seed", in.bootstrap_seed, "seed of the bootstrap (default 1)");
  sub->add_option("--bootstrap-method", in.bootstrap_method, "cases (runs drawn with replacement, default) | residuals");
  sub->add_flag("--json", json, "print one JSON object");
  sub->callback([] {
    nlohmann::json j = jtok::run_fits(in);
    if (json) std::printf("%s\n", j.dump(2).c_str());
    else std::printf("%s", jtok::fit_report_text(j).c_str());
  });
}

void setup(CLI::App* sub) {
  sub->require_subcommand(1);
  setup_plan(sub->add_subcommand("plan", "the run grid of an isoFLOPs study (budgets x model shapes)"));
  setup_run(sub->add_subcommand("run", "train every run of a plan (resumable) and collect the results table"));
  setup_fit(sub->add_subcommand("fit", "isoFLOP minima, frontier fits, compute savings, Kaplan and eta fits"));
}

const bool registered = jtok::register_command({"scaling", "isoFLOPs studies: plan, run, fit", setup});
}  // namespace cmd_scaling
