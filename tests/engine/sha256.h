// SHA-256 (FIPS 180-4) for the tests that check a regenerated fixture against a golden's sha256
// (engine_reference_conformance_test). Its own file, compiled at -O2 in every build (tests/engine/
// CMakeLists.txt): the sanitizer builds compile test files at -O0, where hashing the fixtures' 257 MB was a
// third of that test's time.
#pragma once

#include <string>

namespace car::testing {

/// The lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(const std::string& bytes);

}  // namespace car::testing
