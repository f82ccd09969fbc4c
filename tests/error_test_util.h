// Helpers for tests of error paths: the error names what it should.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace jtok::testing {

// Expects f() to throw jtok::Error whose message contains every needle.
template <typename F>
void expect_error(F f, const std::vector<std::string>& needles) {
  try {
    f();
    FAIL() << "no error";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

}  // namespace jtok::testing
