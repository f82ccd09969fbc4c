#include "dist/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/communicator.h"

namespace fs = std::filesystem;

namespace jtok::dist {

Watchdog::Watchdog(const std::string& dir, double timeout_s) : dir_((fs::path(dir) / ".ranks").string()), timeout_s_(timeout_s) {
  if (world_size() == 1 || timeout_s <= 0) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
  std::error_code ec;
  fs::remove(fs::path(dir_) / ("rank_" + std::to_string(rank())), ec);
}

void Watchdog::run() {
  const int me = rank(), P = world_size();
  const fs::path mine = fs::path(dir_) / ("rank_" + std::to_string(me));
  // A live rank's watchdog beats every second; older than this is a rank that stopped.
  const double stale_s = std::min(5.0, std::max(2.0, timeout_s_ / 2));
  while (!stop_.load()) {
    double in_s = 0;
    const char* call = current_call(&in_s);
    {  // heartbeat: "step in_mpi seconds call"
      std::ofstream(mine.string() + ".tmp") << step_.load() << ' ' << (call ? 1 : 0) << ' ' << in_s << ' ' << (call ? call : "-") << '\n';
      std::error_code ec;
      fs::rename(mine.string() + ".tmp", mine, ec);
    }
    if (call && in_s > timeout_s_) {
      std::ostringstream why;
      const auto now = fs::file_time_type::clock::now();
      for (int r = 0; r < P; ++r) {
        if (r == me) continue;
        const fs::path f = fs::path(dir_) / ("rank_" + std::to_string(r));
        std::error_code ec;
        const auto t = fs::last_write_time(f, ec);
        if (ec) {
          why << " rank " << r << ": no heartbeat file;";
          continue;
        }
        const double age = std::chrono::duration<double>(now - t).count();
        int64_t step = 0;
        int in_mpi = 0;
        double secs = 0;
        std::string what;
        std::ifstream(f) >> step >> in_mpi >> secs >> what;
        if (age > stale_s) why << " rank " << r << " stopped beating " << static_cast<int64_t>(age) << " s ago (at step " << step << ": stopped, dead or wedged);";
        else if (!in_mpi) why << " rank " << r << " is busy outside MPI (step " << step << ");";
      }
      std::string w = why.str();
      if (w.empty()) w = " every other rank is waiting in MPI too (a mismatched collective?)";
      std::fprintf(stderr, "jtok: error: rank %d of %d: blocked %.0f s in %s at step %lld (--dist-timeout %.0f s):%s ending the job\n", me, P,
                   in_s, call, static_cast<long long>(step_.load()), timeout_s_, w.c_str());
      std::fflush(stderr);
      _exit(3);
    }
    for (int i = 0; i < 10 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace jtok::dist
