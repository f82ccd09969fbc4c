#include "infer/blimp.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"

namespace fs = std::filesystem;

namespace jtok {

// BLiMP's data spells one field two ways: 13 paradigms say "syntax_semantics", principle_A_case_2
// says "syntax/semantics". It is one field, reported once, as "syntax/semantics".
static std::string blimp_field(const std::string& field) {
  return field == "syntax_semantics" ? "syntax/semantics" : field;
}

std::vector<BlimpPair> load_blimp(const std::string& dir, int64_t limit) {
  if (!fs::is_directory(dir)) fail("BLiMP directory ", dir, " not found");
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jsonl" && e.path().filename() != "models_summary.jsonl") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) fail("BLiMP directory ", dir, " has no paradigm .jsonl files");
  std::vector<BlimpPair> pairs;
  for (auto& f : files) {
    std::ifstream in(f);
    std::string line;
    int64_t n = 0, lineno = 0;
    while (std::getline(in, line) && (limit <= 0 || n < limit)) {
      ++lineno;
      if (line.empty()) continue;
      try {
        auto j = nlohmann::json::parse(line);
        pairs.push_back({j.at("sentence_good"), j.at("sentence_bad"), blimp_field(j.at("field")), j.at("linguistics_term"),
                         j.at("UID")});
      } catch (const std::exception& e) {
        fail(f.string(), ":", lineno, ": bad BLiMP line: ", e.what());
      }
      ++n;
    }
  }
  return pairs;
}

// The published models' accuracy (models_summary.jsonl in dir, when there) on the paradigms we
// evaluated: per paradigm from the summary; per term and overall, the mean over those paradigms
// (the BLiMP paper averages paradigms the same way). term_of_uid: paradigm -> linguistics term.
static void add_reference_models(nlohmann::json& out, const std::string& dir,
                                 const std::map<std::string, std::string>& term_of_uid) {
  const fs::path summary = fs::path(dir) / "models_summary.jsonl";
  if (!fs::exists(summary)) return;
  std::ifstream in(summary);
  std::string line;
  std::map<std::string, std::map<std::string, double>> ref;  // model -> uid -> acc
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("UID")) continue;
    for (const char* model : {"ngram", "lstm", "txl", "gpt2"})
      if (j.contains(model) && j[model].is_number()) ref[model][j["UID"]] = j[model].get<double>();
  }
  for (auto& [model, per_uid] : ref) {
    double sum = 0;
    int64_t n = 0;
    std::map<std::string, std::pair<double, int64_t>> term_sum;
    for (auto& [uid, term] : term_of_uid) {
      auto it = per_uid.find(uid);
      if (it == per_uid.end()) continue;
      sum += it->second;
      ++n;
      auto& ts = term_sum[term];
      ts.first += it->second;
      ts.second += 1;
      out["reference"][model]["by_paradigm"][uid] = it->second;
    }
    if (n) out["reference"][model]["accuracy"] = sum / static_cast<double>(n);
    for (auto& [term, ts] : term_sum) out["reference"][model]["by_term"][term] = ts.first / static_cast<double>(ts.second);
  }
}

nlohmann::json evaluate_blimp(const std::vector<BlimpPair>& pairs,
                              const std::function<std::vector<double>(const std::vector<std::string>&)>& score,
                              const std::string& dir) {
  std::vector<std::string> sents;
  sents.reserve(pairs.size() * 2);
  for (auto& p : pairs) {
    sents.push_back(p.good);
    sents.push_back(p.bad);
  }
  std::vector<double> lp = score(sents);
  struct Acc { int64_t right = 0, total = 0; };
  Acc all;
  std::map<std::string, Acc> by_field, by_term, by_uid;
  std::map<std::string, std::string> term_of_uid;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const bool ok = lp[2 * i] > lp[2 * i + 1];
    for (Acc* a : {&all, &by_field[pairs[i].field], &by_term[pairs[i].term], &by_uid[pairs[i].uid]}) {
      a->right += ok;
      a->total += 1;
    }
    term_of_uid[pairs[i].uid] = pairs[i].term;
  }
  auto acc = [](const Acc& a) { return a.total ? static_cast<double>(a.right) / static_cast<double>(a.total) : 0.0; };
  nlohmann::json out = {{"pairs", all.total}, {"accuracy", acc(all)}};
  for (auto& [k, a] : by_field) out["by_field"][k] = acc(a);
  for (auto& [k, a] : by_term) out["by_term"][k] = acc(a);
  for (auto& [k, a] : by_uid) out["by_paradigm"][k] = acc(a);
  add_reference_models(out, dir, term_of_uid);
  // Our own paradigm mean, comparable with the references' paradigm means (with or without them).
  double s = 0;
  for (auto& [k, a] : by_uid) s += acc(a);
  out["accuracy_paradigm_mean"] = by_uid.empty() ? 0.0 : s / static_cast<double>(by_uid.size());
  return out;
}

}  // namespace jtok
