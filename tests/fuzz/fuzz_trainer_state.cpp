// trainer_state.json, the whole of what --resume reads from it (train/trainer_state.h): the step,
// the run id, the sample RNG's saved state, and the data loader's position (data/loader.h, as
// `jtok train` restores it). Whatever parses must survive a write and a re-read unchanged.
#include <cstdlib>
#include <string_view>

#include "data/loader.h"
#include "fuzz_util.h"
#include "train/trainer_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  jtok::TrainerState s;
  jtok::LoaderState loader;
  bool ok = false;
  jtok::fuzz::expect_clean([&] {
    s = jtok::parse_trainer_state_text(text, "trainer_state.json");
    loader = jtok::loader_state_from_json(s.data);
    ok = true;
  });
  if (!ok) return 0;
  // Round trip, outside expect_clean: a state we accepted must be one we can write and read back.
  const jtok::TrainerState t = jtok::parse_trainer_state(jtok::to_json(s), "round trip");
  if (t.step != s.step || t.run_id != s.run_id || t.data != s.data || t.sample_rng != s.sample_rng || t.lr != s.lr ||
      t.max_steps != s.max_steps)
    std::abort();
  if (!(jtok::loader_state_from_json(jtok::to_json(loader)) == loader)) std::abort();
  return 0;
}
