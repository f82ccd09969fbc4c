// jtok: train and serve Transformers with token-indexed parameters (JTok / JTok-M).
#include <algorithm>
#include <cstdio>
#include "commands.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace jtok {
static std::string g_command_line;
std::string command_line_string() { return g_command_line; }
}  // namespace jtok

int main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (i) jtok::g_command_line += ' ';
    jtok::g_command_line += argv[i];
  }
  // Under mpirun: one process per rank (issue 11); without a launcher MPI is never touched.
  jtok::dist::init(&argc, &argv);
  // Only rank 0 speaks on stdout (progress, results); errors still reach stderr from every rank.
  if (jtok::dist::rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  CLI::App app{"jtok: a C++ engine for Transformers with token-indexed parameters (JTok, JTok-M)"};
  app.require_subcommand(1);
  auto& cmds = jtok::command_registry();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(app.add_subcommand(c.name, c.help));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    jtok::dist::finalize();
    return rc;
  } catch (const std::exception& e) {
    // With several ranks the others may wait in a collective for this one: end the whole job,
    // naming the rank (dist::abort); alone, the usual one line and exit 1.
    if (jtok::dist::world_size() > 1) jtok::dist::abort(e.what());
    std::fprintf(stderr, "jtok: error: %s\n", e.what());
    return 1;
  }
  jtok::dist::finalize();
  return 0;
}
