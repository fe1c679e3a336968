// The BPE model: splits a pre-token (already in the vocabulary's alphabet: byte-level characters
// after a ByteLevel pre-tokenizer, '▁'-marked text for SentencePiece-style files) into
// characters, maps each to its id — or, when it is missing, to its <0xXX> byte tokens
// (byte_fallback), to the unk token (fused over a run with fuse_unk), or drops it, in the
// reference's order — then applies merges lowest rank first (leftmost among equal ranks) with a
// heap over adjacent pairs, exactly like the reference's Word::merge_all, so long pieces cost
// O(n log n), not O(n²). ignore_merges (Llama 3) emits a pre-token that is itself in the
// vocabulary whole. Results are cached per pre-token. No dropout or subword prefixes/suffixes
// (rejected at load).
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "io/tokenizer_internal.h"

namespace hk::tok {
namespace {

constexpr size_t kCacheCapacity = 65536;
constexpr size_t kCacheMaxPieceBytes = 256;

uint64_t pair_key(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int64_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  for (const auto& [token, id] : vocab_) {
    if (id < 0 || id > INT32_MAX)
      throw std::invalid_argument("token '" + token + "' has id " + std::to_string(id) +
                                  ", outside 0..2^31-1");
    auto [it, inserted] = tokens_.emplace(id, &token);
    if (!inserted)
      throw std::invalid_argument("tokens '" + *it->second + "' and '" + token + "' share the id " +
                                  std::to_string(id));
  }
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab_.find(left), r = vocab_.find(right), m = vocab_.find(left + right);
    const std::string& missing = l == vocab_.end()   ? left
                                 : r == vocab_.end() ? right
                                                     : left + right;
    if (l == vocab_.end() || r == vocab_.end() || m == vocab_.end())
      throw std::invalid_argument("merge #" + std::to_string(rank) + " ('" + left + "', '" + right +
                                  "') uses '" + missing + "', which is not in the vocabulary");
    // A repeated pair takes its last rank: the reference collects merges into a map the same way.
    merges_[pair_key(l->second, r->second)] = Merge{static_cast<int32_t>(rank), m->second};
  }
  low_char_ids_.fill(-1);
  for (uint32_t cp = 0; cp < low_char_ids_.size(); ++cp) {
    std::string c;
    append_utf8(c, cp);
    auto it = vocab_.find(c);
    if (it != vocab_.end()) low_char_ids_[cp] = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_token_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

int64_t Bpe::char_id(std::string_view piece, size_t begin, size_t end, uint32_t cp) const {
  if (cp < low_char_ids_.size()) return low_char_ids_[cp];
  auto it = vocab_.find(std::string(piece.substr(begin, end - begin)));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::token(int64_t id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : it->second;
}

void Bpe::encode(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  bool cacheable = piece.size() <= kCacheMaxPieceBytes;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  if (options_.ignore_merges) {
    auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end())
      out.push_back(it->second);
    else
      merge_word(piece, out);
  } else {
    merge_word(piece, out);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::move(key), std::vector<int64_t>(out.begin() + start, out.end()));
  }
}

void Bpe::merge_word(std::string_view piece, std::vector<int64_t>& out) const {
  // Symbols form a doubly linked list over the initial byte characters; a merged-away symbol
  // gets length 0, like the reference's Symbol::len.
  struct Symbol {
    int64_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&](int64_t id) {
    int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };
  bool pending_unk = false;  // an unk not yet added (fuse_unk extends it)
  for (size_t i = 0; i < piece.size();) {
    const size_t begin = i;
    uint32_t cp = 0;
    if (!next_code_point(piece, i, cp)) {  // not reachable: pieces come from valid UTF-8
      cp = 0xFFFD;
      i = begin + 1;
    }
    const int64_t id = char_id(piece, begin, i, cp);
    if (id >= 0) {
      if (pending_unk) add(*options_.unk_id);
      pending_unk = false;
      add(id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (size_t b = begin; b < i; ++b)
        all_bytes = all_bytes && byte_token_ids_[static_cast<unsigned char>(piece[b])] >= 0;
      if (all_bytes) {
        // The reference leaves a pending unk pending here: it is added after the byte tokens.
        for (size_t b = begin; b < i; ++b)
          add(byte_token_ids_[static_cast<unsigned char>(piece[b])]);
        continue;
      }
    }
    // The reference drops a missing character when there is no unk token.
    if (!options_.unk_id) continue;
    if (pending_unk && !options_.fuse_unk) add(*options_.unk_id);
    pending_unk = true;
  }
  if (pending_unk) add(*options_.unk_id);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int pos;
    int64_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int left) {
    int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) push_pair(static_cast<int>(i));

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Stale entry: the pair at this position changed since it was queued.
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace hk::tok
