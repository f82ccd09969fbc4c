#include "scaling/run.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/json_int.h"
#include "core/atomic_file.h"
#include "scaling/table.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace jtok {

TrainLogSummary read_train_log(const std::string& path) {
  std::string text = read_file(path);
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  TrainLogSummary s;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(lines[i]);
    } catch (const nlohmann::json::exception& e) {
      if (i + 1 == lines.size()) break;  // torn last line of a killed run
      fail(path, ":", i + 1, ": not a JSON line: ", e.what());
    }
    if (!j.is_object()) fail(path, ":", i + 1, ": expected a JSON object per line");
    // An integer step only: a float (1e300) would convert to int64 with undefined behaviour.
    int64_t step = j.contains("step") ? json_int64(j["step"]).value_or(-1) : -1;
    s.last_step = std::max(s.last_step, step);
    if (j.contains("val_loss")) {
      if (!j["val_loss"].is_number()) fail(path, ":", i + 1, ": \"val_loss\" is not a number");
      s.has_val = true, s.val_loss = j["val_loss"].get<double>(), s.val_step = step;
    }
    if (j.contains("loss") && j["loss"].is_number()) s.has_train = true, s.train_loss = j["loss"].get<double>();
  }
  return s;
}

int run_subprocess(const std::vector<std::string>& argv, const std::string& log_path) {
  JTOK_CHECK(!argv.empty());
  int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail(log_path, ": cannot open for the trainer's output: ", std::strerror(errno));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    fail("cannot fork to run ", argv[0], ": ", std::strerror(errno));
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(args[0], args.data());
    const char msg[] = "jtok scaling run: exec of the trainer failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) fail("waitpid failed: ", std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

namespace {

// A run stopped part way (killed, or the trainer's clean stop on SIGINT/SIGTERM) continues from
// its newest complete checkpoint instead of starting over; one stopped before its first checkpoint
// left a log, and `train` refuses a fresh run there, so it too is resumed (from scratch).
bool resumable(const std::string& dir) {
  return (fs::exists(dir + "/checkpoints") && latest_checkpoint(dir).has_value()) || fs::exists(dir + "/log.jsonl");
}

// Row r's config (the plan's base with the row's overrides and steps) written to cfg_path in dir.
void write_row_config(const nlohmann::json& base, const Plan& plan, const PlanRow& r, const std::string& dir,
                      const std::string& cfg_path) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, ": cannot create directory: ", ec.message());
  nlohmann::json cfg = merged_config(base, r.overrides, plan.base_config + " with shape " + r.shape);
  cfg["max_steps"] = r.steps;
  write_file_atomic(cfg_path, cfg.dump(2) + "\n");
}

// Why the training of row r in dir (exit status rc) gives no result ("" when it does; log then
// holds its log's summary).
std::string training_failure(int rc, const std::string& dir, const PlanRow& r, TrainLogSummary& log) {
  if (rc != 0) return "trainer exited with status " + std::to_string(rc) + " (see " + dir + "/train.log)";
  if (!fs::exists(dir + "/log.jsonl")) return "trainer wrote no " + dir + "/log.jsonl";
  try {
    log = read_train_log(dir + "/log.jsonl");
    if (!log.has_val) return dir + "/log.jsonl has no \"val_loss\" line";
    // The trainer exits 0 after a clean stop on a signal; its last val_loss is then from an
    // earlier step and must not be taken as the run's result.
    if (log.val_step != r.steps)
      return dir + "/log.jsonl: last \"val_loss\" is at step " + std::to_string(log.val_step) + ", not at the planned " +
             std::to_string(r.steps) + " (stopped early? a rerun resumes it)";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Row r's result.json.
nlohmann::json row_result(const PlanRow& r, const TrainLogSummary& log, double seconds, bool resume) {
  return {{"run_id", r.run_id}, {"budget", r.budget}, {"shape", r.shape}, {"n_c", r.n_c},
          {"n_n", r.n_n}, {"tokens", r.tokens}, {"steps", r.steps}, {"compute", r.compute},
          {"loss", log.val_loss}, {"val_step", log.val_step}, {"last_step", log.last_step},
          {"train_loss", log.has_train ? nlohmann::json(log.train_loss) : nlohmann::json(nullptr)},
          {"seconds", seconds}, {"resumed", resume}};
}

}  // namespace

RunSummary run_plan(const Plan& plan, const RunOptions& opt) {
  if (opt.out_dir.empty()) fail("scaling run: no output directory");
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail(opt.out_dir, ": cannot create directory: ", ec.message());
  nlohmann::json base = read_json_file(plan.base_config);
  auto say = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  RunSummary sum;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const PlanRow& r = plan.rows[i];
    const std::string dir = opt.out_dir + "/" + r.run_id;
    const std::string result_path = dir + "/result.json";
    const std::string tag = std::string("[") + std::to_string(i + 1) + "/" + std::to_string(plan.rows.size()) + "] " + r.run_id;
    if (fs::exists(result_path)) {
      sum.results.push_back(read_json_file(result_path));
      ++sum.done_before;
      say(tag + ": done before, skipped");
      continue;
    }
    const std::string cfg_path = dir + "/config.json";
    std::vector<std::string> argv = {opt.trainer, "train", "--config", cfg_path, "--out", dir, "--max-steps",
                                     std::to_string(r.steps)};
    const bool resume = resumable(dir);
    if (resume) argv.push_back("--resume");
    if (opt.dry_run) {
      std::string cmd;
      for (auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
      say(tag + ": would run: " + cmd);
      ++sum.pending;
      continue;
    }
    write_row_config(base, plan, r, dir, cfg_path);
    say(tag + ": training " + std::to_string(r.steps) + " steps (N_c " + std::to_string(r.n_c) + ", " +
        std::to_string(r.tokens) + " tokens)");
    const auto t0 = std::chrono::steady_clock::now();
    int rc = opt.runner(argv, dir + "/train.log");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    TrainLogSummary log;
    const std::string why = training_failure(rc, dir, r, log);
    if (!why.empty()) {
      ++sum.failed;
      sum.failures.push_back(r.run_id + ": " + why);
      say(tag + ": FAILED: " + why);
      continue;
    }
    const nlohmann::json res = row_result(r, log, seconds, resume);
    write_file_atomic(result_path, res.dump(2) + "\n");
    if (opt.remove_checkpoints) fs::remove_all(dir + "/checkpoints", ec);  // result.json now stands for the run
    sum.results.push_back(res);
    ++sum.ran;
    say(tag + ": val_loss " + fmt_double(log.val_loss));
  }
  return sum;
}

std::string results_csv(const std::vector<nlohmann::json>& results) {
  std::vector<std::vector<std::string>> rows;
  for (auto& r : results) {
    double n_c = r.at("n_c").get<double>(), n_n = r.value("n_n", 0.0);
    rows.push_back({r.at("run_id").get<std::string>(), fmt_double(r.at("budget").get<double>()),
                    r.at("shape").get<std::string>(), std::to_string(r.at("n_c").get<int64_t>()),
                    std::to_string(r.value("n_n", int64_t(0))), fmt_double(n_c > 0 ? n_n / n_c : 0.0),
                    std::to_string(r.at("tokens").get<int64_t>()), std::to_string(r.at("steps").get<int64_t>()),
                    fmt_double(r.at("compute").get<double>()), fmt_double(r.at("loss").get<double>())});
  }
  return to_csv({"run_id", "budget", "shape", "n_c", "n_n", "eta", "tokens", "steps", "compute", "loss"}, rows);
}

}  // namespace jtok
