// Helpers for the model golden tests: fixture paths and expected.json / expected.safetensors
// readers (written by tools/fixtures/make_model_fixtures.py with Transformers).
#pragma once

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace hk::testing {

inline std::string source_dir() {
  const char* s = std::getenv("HK_SOURCE_DIR");
  return s ? s : HK_TEST_SOURCE_DIR;
}

inline std::string model_fixture(const std::string& name) {
  return source_dir() + "/tests/fixtures/models/" + name;
}

inline const std::vector<std::string>& model_fixture_names() {
  static const std::vector<std::string> names{"qwen3-tiny", "qwen3-tiny-bf16", "llama-tiny-bf16",
                                              "qwen3-tiny-hd64-bf16"};
  return names;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// gtest name of a fixture-parameterised case: the fixture name with '-' made '_'.
template <class ParamInfo>
std::string fixture_case_name(const ParamInfo& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

}  // namespace hk::testing
