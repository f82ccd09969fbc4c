// The training log (log.jsonl, JsonlLog): a line whose text is not valid UTF-8 (a periodic sample
// cut inside a byte-level token's character) is written with U+FFFD for the bad bytes instead of
// throwing, which used to end the training run at the sample.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "train/trainer_run.h"

TEST(JsonlLog, InvalidUtf8InALineIsReplacedNotThrown) {
  const std::string path = ::testing::TempDir() + "jsonl_log_" + std::to_string(::getpid()) + ".jsonl";
  {
    jtok::JsonlLog log;
    log.out.open(path);
    EXPECT_NO_THROW(log.write({{"type", "sample"}, {"text", std::string("ok \xe2\x82 cut")}}));
    log.write({{"type", "next"}});
  }
  std::ifstream in(path);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  const nlohmann::json j = nlohmann::json::parse(first);
  EXPECT_EQ(j["text"].get<std::string>(), "ok \xef\xbf\xbd cut");
  EXPECT_EQ(nlohmann::json::parse(second)["type"], "next");
  std::remove(path.c_str());
}
