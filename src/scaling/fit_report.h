// `jtok scaling fit`: reads result tables (CSV), runs the fits, and reports them as JSON
// (layout in docs/scaling.md) and optionally as SVG pictures.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace jtok {

struct FitInputs {
  std::vector<std::string> frontier_files;  // columns compute,loss (one efficient frontier each)
  std::vector<std::string> isoflops_files;  // columns budget (or compute),n_c,loss[,tokens]
  std::string eta_file;                     // columns eta,loss
  int window = 0;                           // isoFLOP quadratic window (0 = all points)
  std::string svg_dir;                      // "" = no pictures
  // Bootstrap of the compute savings over runs (bootstrap.h): with bootstrap > 0 replicates,
  // needs only --isoflops files (at least 2; the first is the base), each with >= 3 budgets.
  int bootstrap = 0;
  uint64_t bootstrap_seed = 1;
  std::string bootstrap_method = "cases";
};

// Frontiers come first from frontier_files, then one per isoflops file (its fitted minima), in
// the order given; the first frontier is the base of the compute savings.
nlohmann::json run_fits(const FitInputs& in);

// The JSON as a short human-readable text.
std::string fit_report_text(const nlohmann::json& j);

}  // namespace jtok
