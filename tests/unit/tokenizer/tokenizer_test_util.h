// tokenizer_test_util.h — what the tokenizer tests share: where the fixtures are, reading one,
// and a JSON id list as ids.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace hk::tokenizer_test {

inline std::string fixture_dir() {
  const char* src = std::getenv("HK_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/tokenizer";
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<int64_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int64_t>>();
}

}  // namespace hk::tokenizer_test
