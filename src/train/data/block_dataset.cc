// BlockDataset (hk/train_data.h): reading .txt / .jsonl documents as the `datasets` loaders do,
// tokenizing them, and run_clm.py's group_texts.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hk/error.h"
#include "hk/train_data.h"

namespace hk {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  if (!fs::exists(path)) throw NotFound("training data file " + path + " does not exist");
  if (fs::is_directory(path))
    throw InvalidArgument("training data " + path + " is a directory; give a .txt or .jsonl file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFound("training data file " + path + " cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Length of the line break starting at s[i] (0 if none), Python str.splitlines' set.
size_t line_break_at(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == '\r') return (i + 1 < s.size() && s[i + 1] == '\n') ? 2 : 1;
  if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) return 1;
  if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) return 2;
  if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      (static_cast<unsigned char>(s[i + 2]) == 0xa8 ||
       static_cast<unsigned char>(s[i + 2]) == 0xa9))
    return 3;
  return 0;
}

// str.splitlines(): no empty string after a final line break; "" gives no lines.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    const size_t brk = line_break_at(s, i);
    if (brk == 0) {
      ++i;
      continue;
    }
    lines.push_back(s.substr(start, i - start));
    i += brk;
    start = i;
  }
  if (start < s.size()) lines.push_back(s.substr(start));
  return lines;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<std::string> BlockDataset::read_documents(const std::string& path) {
  const bool txt = ends_with(path, ".txt");
  const bool jsonl = ends_with(path, ".jsonl");
  if (!txt && !jsonl)
    throw InvalidArgument("training data " + path +
                          " has an unknown extension; use a .txt file (one document per line) "
                          "or a .jsonl file (a \"text\" field per line)");
  const std::string text = read_file(path);
  if (txt) return split_lines(text);
  std::vector<std::string> docs;
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (end == text.size()) break;
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument(path + ":" + std::to_string(line_no) + ": not a JSON object (" +
                            e.what() + ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw InvalidArgument(path + ":" + std::to_string(line_no) +
                            ": each line must be a JSON object with a string field \"text\"");
    docs.push_back(j["text"].get<std::string>());
    if (end == text.size()) break;
  }
  return docs;
}

BlockDataset BlockDataset::from_file(const std::string& path, const Tokenizer& tokenizer,
                                     const BlockDatasetOptions& options) {
  const std::vector<std::string> docs = read_documents(path);
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    try {
      ids.push_back(tokenizer.encode(docs[i], /*add_special_tokens=*/false));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(path + ": document " + std::to_string(i + 1) + ": " + e.what());
    }
  }
  return from_documents(ids, options, path);
}

BlockDataset BlockDataset::from_documents(const std::vector<std::vector<int64_t>>& documents,
                                          const BlockDatasetOptions& options,
                                          const std::string& source) {
  HK_CHECK(options.block_size > 0,
           "block_size must be > 0, got " + std::to_string(options.block_size));
  HK_CHECK(options.group_documents >= 0, "group_documents must be >= 0");
  BlockDataset out;
  out.block_size_ = options.block_size;
  out.num_documents_ = static_cast<int64_t>(documents.size());
  out.source_ = source;
  const size_t group = options.group_documents > 0 ? static_cast<size_t>(options.group_documents)
                                                   : std::max<size_t>(documents.size(), 1);
  std::vector<int64_t> concat;
  for (size_t g = 0; g < documents.size(); g += group) {
    concat.clear();
    for (size_t d = g; d < std::min(documents.size(), g + group); ++d)
      concat.insert(concat.end(), documents[d].begin(), documents[d].end());
    out.num_corpus_tokens_ += static_cast<int64_t>(concat.size());
    const size_t keep =
        concat.size() / static_cast<size_t>(out.block_size_) * static_cast<size_t>(out.block_size_);
    out.tokens_.insert(out.tokens_.end(), concat.begin(), concat.begin() + static_cast<long>(keep));
  }
  out.num_blocks_ = static_cast<int64_t>(out.tokens_.size()) / out.block_size_;
  if (out.num_corpus_tokens_ == 0)
    throw InvalidArgument("training data " + source +
                          " has no text: it is empty or holds only empty lines");
  if (out.num_blocks_ == 0)
    throw InvalidArgument(
        "training data " + source + " has " + std::to_string(out.num_corpus_tokens_) +
        " tokens, fewer than one block of --block-size " + std::to_string(out.block_size_) +
        (options.group_documents > 0 && out.num_documents_ > options.group_documents
             ? " in every group of " + std::to_string(options.group_documents) + " documents"
             : "") +
        "; use a smaller block size or more text");
  return out;
}

std::string BlockDataset::fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>(v >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(block_size_);
  for (int64_t t : tokens_) mix(t);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<int64_t> epoch_order(int64_t num_blocks, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(num_blocks, 0)));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (!shuffle || order.size() < 2) return order;
  uint64_t state = seed ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(epoch + 1));
  for (size_t i = order.size() - 1; i > 0; --i) {
    // Unbiased index in [0, i] by rejection.
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = splitmix64(state);
    while (r >= limit);
    std::swap(order[i], order[static_cast<size_t>(r % bound)]);
  }
  return order;
}

}  // namespace hk
