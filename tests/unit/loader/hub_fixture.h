// Test helpers: where the embedded hub and the test hub are, and how to find a published
// library in them by ref (a plain-file walk; the real resolver is the hub layer's).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace hk::test {

inline std::filesystem::path binary_dir() {
  const char* dir = std::getenv("HK_BINARY_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::current_path();
}
inline std::filesystem::path embedded_hub() {
  return binary_dir() / "hub";
}
inline std::filesystem::path test_hub() {
  return binary_dir() / "test-hub";
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// Commit a ref ("heads/v1", "tags/v1.0.0") points at.
inline std::string ref_commit(const std::filesystem::path& hub, const std::string& repo,
                              const std::string& ref) {
  return trim(read_text(hub / repo / "refs" / ref));
}

// Variant folder of `repo@ref` whose name contains `backend_tag` ("-cpu-", "-cu").
inline std::filesystem::path variant_dir(const std::filesystem::path& hub, const std::string& repo,
                                         const std::string& ref, const std::string& backend_tag) {
  const std::filesystem::path build = hub / repo / ref_commit(hub, repo, ref) / "build";
  if (std::filesystem::is_directory(build)) {
    for (const auto& entry : std::filesystem::directory_iterator(build)) {
      if (entry.path().filename().string().find(backend_tag) != std::string::npos)
        return entry.path();
    }
  }
  return {};
}

inline std::filesystem::path library_path(const std::filesystem::path& hub, const std::string& repo,
                                          const std::string& ref, const std::string& backend_tag,
                                          const std::string& lib) {
  const std::filesystem::path dir = variant_dir(hub, repo, ref, backend_tag);
  return dir.empty() ? dir : dir / lib;
}

inline std::vector<float> random_values(size_t n, uint32_t seed, float lo = -2.0f,
                                        float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace hk::test
