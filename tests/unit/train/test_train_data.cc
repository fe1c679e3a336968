// Training data: the `datasets` text / json loaders' reading, run_clm.py's group_texts, the blocks
// of the shipped corpus against the fixture made with `tokenizers`, epoch orders, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "hk/error.h"
#include "hk/tokenizer.h"
#include "hk/train_data.h"
#include "train_test_util.h"

namespace hk {
namespace {

using Docs = std::vector<std::string>;

Docs read_txt(const test::TempDir& dir, const std::string& text) {
  test::write_text(dir / "d.txt", text);
  return BlockDataset::read_documents(dir / "d.txt");
}

TEST(TrainData, TextLinesAsPythonSplitlines) {
  test::TempDir dir;
  EXPECT_EQ(read_txt(dir, "a\nb\n"), (Docs{"a", "b"}));
  EXPECT_EQ(read_txt(dir, "a\r\nb\rc"), (Docs{"a", "b", "c"}));
  EXPECT_EQ(read_txt(dir, "a\n\nb"), (Docs{"a", "", "b"}));
  EXPECT_EQ(read_txt(dir, ""), Docs{});
  EXPECT_EQ(read_txt(dir, "\n"), (Docs{""}));
  EXPECT_EQ(read_txt(dir,
                     "x\vy\fz\x1c"
                     "w"),
            (Docs{"x", "y", "z", "w"}));
  EXPECT_EQ(read_txt(dir, "p\xc2\x85q\xe2\x80\xa8r\xe2\x80\xa9s"), (Docs{"p", "q", "r", "s"}));
  EXPECT_EQ(read_txt(dir, "caf\xc3\xa9 \xe2\x80\x94 ok"), (Docs{"caf\xc3\xa9 \xe2\x80\x94 ok"}));
}

TEST(TrainData, JsonlTextField) {
  test::TempDir dir;
  test::write_text(dir / "d.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 3}\r\n");
  EXPECT_EQ(BlockDataset::read_documents(dir / "d.jsonl"), (Docs{"one", "two"}));
  test::write_text(dir / "bad.jsonl", "{\"text\": \"one\"}\n{\"txt\": 1}\n");
  try {
    BlockDataset::read_documents(dir / "bad.jsonl");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
  }
  test::write_text(dir / "bad2.jsonl", "not json\n");
  EXPECT_THROW(BlockDataset::read_documents(dir / "bad2.jsonl"), InvalidArgument);
}

TEST(TrainData, FileErrors) {
  test::TempDir dir;
  EXPECT_THROW(BlockDataset::read_documents(dir / "missing.txt"), NotFound);
  test::write_text(dir / "d.csv", "a,b\n");
  EXPECT_THROW(BlockDataset::read_documents(dir / "d.csv"), InvalidArgument);
}

TEST(TrainData, GroupTextsDropsTheRemainderPerGroup) {
  // Documents of 3, 4 and 5 ids, block 4: one group → 12 ids → 3 blocks.
  const std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11, 12}};
  BlockDataset all = BlockDataset::from_documents(docs, {.block_size = 4, .group_documents = 0});
  ASSERT_EQ(all.num_blocks(), 3);
  EXPECT_EQ(std::vector<int64_t>(all.block(2), all.block(2) + 4),
            (std::vector<int64_t>{9, 10, 11, 12}));
  // Groups of 2 documents (run_clm's per-batch drop): {1..7} → 1 block (3 dropped), {8..12} → 1.
  BlockDataset grouped =
      BlockDataset::from_documents(docs, {.block_size = 4, .group_documents = 2});
  ASSERT_EQ(grouped.num_blocks(), 2);
  EXPECT_EQ(std::vector<int64_t>(grouped.block(1), grouped.block(1) + 4),
            (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(grouped.num_corpus_tokens(), 12);
  EXPECT_NE(all.fingerprint(), grouped.fingerprint());
}

TEST(TrainData, ShortOrEmptyCorporaAreRefusedWithASentence) {
  EXPECT_THROW(BlockDataset::from_documents({{1, 2}}, {.block_size = 4}), InvalidArgument);
  EXPECT_THROW(BlockDataset::from_documents({{}, {}}, {.block_size = 4}), InvalidArgument);
  EXPECT_THROW(BlockDataset::from_documents({{1, 2, 3, 4}}, {.block_size = 0}), InvalidArgument);
  try {
    BlockDataset::from_documents({{1, 2}}, {.block_size = 4}, "tiny.txt");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one block"), std::string::npos) << e.what();
  }
}

TEST(TrainData, ShippedCorpusBlocksMatchTheTokenizersReference) {
  for (const char* model : {"qwen3-tiny", "llama-tiny-bf16"}) {
    const auto ref = test::read_json(test::train_fixture(std::string("blocks-") + model + ".json"));
    const Tokenizer tok = Tokenizer::from_pretrained(test::model_fixture(model));
    BlockDataset data = BlockDataset::from_file(test::train_fixture("corpus.txt"), tok,
                                                {.block_size = ref["block_size"].get<int64_t>()});
    ASSERT_EQ(static_cast<size_t>(data.num_blocks()), ref["blocks"].size()) << model;
    for (int64_t i = 0; i < data.num_blocks(); ++i) {
      const auto expected = ref["blocks"][static_cast<size_t>(i)].get<std::vector<int64_t>>();
      ASSERT_EQ(std::vector<int64_t>(data.block(i), data.block(i) + data.block_size()), expected)
          << model << " block " << i;
    }
  }
}

TEST(TrainData, EpochOrders) {
  const auto in_order = epoch_order(5, 42, 0, false);
  EXPECT_EQ(in_order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const auto a = epoch_order(100, 42, 0, true), b = epoch_order(100, 42, 0, true);
  const auto c = epoch_order(100, 42, 1, true), d = epoch_order(100, 7, 0, true);
  EXPECT_EQ(a, b);  // reproducible
  EXPECT_NE(a, c);  // per epoch
  EXPECT_NE(a, d);  // per seed
  EXPECT_NE(a, epoch_order(100, 42, 0, false));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, epoch_order(100, 0, 0, false));  // a permutation
  EXPECT_EQ(epoch_order(1, 42, 3, true), (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace hk
