// hk/train_data.h — causal-LM training data: a text corpus tokenized and cut into blocks, and the
// order in which an epoch visits them.
//
// Reading follows what Transformers' run_clm.py does with the `datasets` loaders:
//   .txt    one document per line, without its line break (Python's str.splitlines: \n, \r\n, \r,
//           \v, \f, \x1c–\x1e, U+0085, U+2028, U+2029); an empty line gives no tokens.
//   .jsonl  one JSON object per line with a string field "text" (blank lines skipped).
// Each document is tokenized with the model's tokenizer *without* special tokens; the ids of
// consecutive documents are concatenated and cut into blocks of `block_size`, the remainder
// dropped — group_texts, which run_clm applies per batch of 1000 documents (`datasets.map`'s
// default batch size), so a remainder is dropped per group of `group_documents` documents
// (0 = the whole corpus is one group). Labels are the input ids (the model shifts them).
//
// Epoch order: blocks in file order with shuffle off, else a Fisher–Yates permutation driven by
// SplitMix64 seeded from (seed, epoch) — reproducible and resumable from (seed, epoch) alone. It is
// deliberately not torch's RandomSampler order (that needs torch's Mersenne-Twister stream).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hk/tokenizer.h"

namespace hk {

struct BlockDatasetOptions {
  int64_t block_size = 0;          // > 0
  int64_t group_documents = 1000;  // group_texts' batch; 0 = one group
};

class BlockDataset {
 public:
  BlockDataset() = default;
  // Reads, tokenizes and blocks `path` (.txt or .jsonl). Throws NotFound for a missing file and
  // InvalidArgument with a sentence for an unknown extension, invalid UTF-8 or JSON (with the
  // line number), a file without any text, or a corpus shorter than one block.
  static BlockDataset from_file(const std::string& path, const Tokenizer& tokenizer,
                                const BlockDatasetOptions& options);
  // The documents of a file as the loaders above read them (before tokenization).
  static std::vector<std::string> read_documents(const std::string& path);
  // Blocks from already tokenized documents (tests, custom pipelines); `source` names them.
  static BlockDataset from_documents(const std::vector<std::vector<int64_t>>& documents,
                                     const BlockDatasetOptions& options,
                                     const std::string& source = "documents");

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Block i: block_size ids.
  const int64_t* block(int64_t i) const { return tokens_.data() + i * block_size_; }
  int64_t num_documents() const { return num_documents_; }
  int64_t num_corpus_tokens() const { return num_corpus_tokens_; }  // before the remainder drop
  const std::string& source() const { return source_; }
  // 64-bit FNV-1a (hex) of the block size and ids: checkpoints record it so that resuming on
  // different data is refused.
  std::string fingerprint() const;

 private:
  std::vector<int64_t> tokens_;
  int64_t block_size_ = 0;
  int64_t num_blocks_ = 0;
  int64_t num_documents_ = 0;
  int64_t num_corpus_tokens_ = 0;
  std::string source_;
};

// The block indices of `epoch` in visiting order (see above).
std::vector<int64_t> epoch_order(int64_t num_blocks, uint64_t seed, int64_t epoch, bool shuffle);

}  // namespace hk
