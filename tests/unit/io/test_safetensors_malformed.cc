// Every way a safetensors file can be malformed → hk::InvalidArgument whose message names the file
// (and the tensor, where there is one). Each case is a small edit of a good file built here, run
// both through open() (the mmap path) and from_bytes() (the in-memory path the fuzzer uses).
#include <gtest/gtest.h>

#include "hk/error.h"
#include "hk/safetensors.h"
#include "io_test_util.h"

namespace hk {
namespace {

struct BadFile {
  const char* label;
  std::string bytes;
  const char* expected;     // a phrase the message must contain
  const char* tensor = "";  // the tensor name the message must contain, if any
};

// Good layout: a = F32 [2] at [0, 8), b = BF16 [2, 2] at [8, 16).
const std::string kGoodHeader = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
const std::string kGoodData(16, '\x11');

std::string two(const std::string& a, const std::string& b) {
  return "{" + a + "," + b + "}";
}
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}
const std::string kA = entry("a", "F32", "[2]", "[0,8]");

std::vector<BadFile> bad_files() {
  using test::safetensors_bytes;
  const std::string good = safetensors_bytes(kGoodHeader, kGoodData);
  return {
      {"empty", "", "shorter than the 8-byte header length"},
      {"shorter_than_8", "\x05\x00\x00", "shorter than the 8-byte header length"},
      {"truncated_data", good.substr(0, good.size() - 5), "beyond the 11-byte data buffer", "b"},
      {"truncated_header", good.substr(0, 20), "beyond the end of the 20-byte file"},
      {"absurd_header_length", safetensors_bytes(kGoodHeader, kGoodData, 1LL << 40),
       "exceeds the 100000000-byte limit"},
      {"header_length_max_u64", test::le64(~0ULL) + kGoodHeader + kGoodData, "exceeds"},
      {"header_not_json", safetensors_bytes("{\"a\": nonsense", ""), "not valid JSON"},
      {"header_binary", safetensors_bytes(std::string("\x00\xff\xfe{", 4), ""), "not valid JSON"},
      {"header_invalid_utf8", safetensors_bytes("{\"\xc3\x28\":1}", ""), "not valid JSON"},
      {"header_array", safetensors_bytes("[1, 2]  ", ""), "not a JSON object"},
      {"header_string", safetensors_bytes("\"abc\"", ""), "not a JSON object"},
      {"deep_nesting", safetensors_bytes(std::string(5000, '[') + std::string(5000, ']'), ""),
       "nests deeper"},
      {"duplicate_tensor", safetensors_bytes(two(kA, kA), std::string(8, 0)), "twice"},
      {"metadata_not_object", safetensors_bytes(two("\"__metadata__\":[1]", kA), std::string(8, 0)),
       "__metadata__"},
      {"metadata_value_not_string",
       safetensors_bytes(two("\"__metadata__\":{\"k\":1}", kA), std::string(8, 0)),
       "must be a string"},
      {"entry_not_object", safetensors_bytes("{\"a\":5}", ""), "must be a JSON object", "a"},
      {"missing_dtype", safetensors_bytes("{\"a\":{\"shape\":[],\"data_offsets\":[0,4]}}", "1234"),
       "no \"dtype\"", "a"},
      {"unknown_dtype", safetensors_bytes(two(kA, entry("b", "F17", "[2]", "[8,16]")), kGoodData),
       "unknown dtype 'F17'", "b"},
      {"dtype_not_string",
       safetensors_bytes("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "1234"),
       "no \"dtype\" string", "a"},
      {"negative_dim",
       safetensors_bytes(two(kA, entry("b", "BF16", "[-2,-2]", "[8,16]")), kGoodData),
       "negative dimension", "b"},
      {"fractional_dim",
       safetensors_bytes(two(kA, entry("b", "BF16", "[1.5,2]", "[8,16]")), kGoodData),
       "not an integer", "b"},
      {"dim_too_large",
       safetensors_bytes(two(kA, entry("b", "BF16", "[18446744073709551615]", "[8,16]")),
                         kGoodData),
       "too large for int64", "b"},
      {"shape_overflow",
       safetensors_bytes(two(kA, entry("b", "BF16", "[4294967296,4294967296]", "[8,16]")),
                         kGoodData),
       "overflows", "b"},
      {"byte_size_overflow",
       safetensors_bytes(two(kA, entry("b", "F64", "[4611686018427387904]", "[8,16]")), kGoodData),
       "overflows", "b"},
      {"shape_not_array", safetensors_bytes(two(kA, entry("b", "BF16", "4", "[8,16]")), kGoodData),
       "no \"shape\" array", "b"},
      {"offsets_one_value",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[8]")), kGoodData), "two increasing",
       "b"},
      {"offsets_decreasing",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[16,8]")), kGoodData),
       "two increasing", "b"},
      {"offsets_negative",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[-8,0]")), kGoodData),
       "two increasing", "b"},
      {"offsets_missing", safetensors_bytes("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", "1"),
       "data_offsets", "a"},
      {"offsets_out_of_bounds",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[4096,4104]")), kGoodData),
       "beyond the 16-byte data buffer", "b"},
      {"size_mismatch",
       safetensors_bytes(two(kA, entry("b", "BF16", "[3,2]", "[8,16]")), kGoodData),
       "need 12 bytes", "b"},
      {"overlapping",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[4,12]")), kGoodData.substr(0, 12)),
       "and 'b' [4, 12) overlap"},
      {"hole_between",
       safetensors_bytes(two(kA, entry("b", "BF16", "[2,2]", "[12,20]")), std::string(20, 0)),
       "no holes", "b"},
      {"hole_at_start",
       safetensors_bytes("{" + entry("a", "F32", "[2]", "[4,12]") + "}", std::string(12, 0)),
       "no holes", "a"},
      {"trailing_bytes", safetensors_bytes(kGoodHeader, kGoodData + "polyglot"),
       "8 bytes after the last tensor"},
  };
}

class Malformed : public ::testing::TestWithParam<BadFile> {};

void expect_message(const std::string& message, const std::string& file, const BadFile& bad) {
  EXPECT_NE(message.find("'" + file + "'"), std::string::npos) << message;
  EXPECT_NE(message.find(bad.expected), std::string::npos) << message;
  if (*bad.tensor)
    EXPECT_NE(message.find("tensor '" + std::string(bad.tensor) + "'"), std::string::npos)
        << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one sentence, one line: " << message;
}

TEST_P(Malformed, OpenThrowsInvalidArgumentNamingFileAndTensor) {
  const BadFile& bad = GetParam();
  test::ScratchDir dir;
  const std::string path = dir.file(std::string(bad.label) + ".safetensors");
  test::write_file(path, bad.bytes);
  try {
    (void)SafetensorsFile::open(path);
    FAIL() << "expected InvalidArgument for " << bad.label;
  } catch (const InvalidArgument& e) {
    expect_message(e.what(), path, bad);
  }
}

TEST_P(Malformed, FromBytesThrowsTheSameError) {
  const BadFile& bad = GetParam();
  try {
    (void)SafetensorsFile::from_bytes(bad.bytes.data(), bad.bytes.size(), bad.label);
    FAIL() << "expected InvalidArgument for " << bad.label;
  } catch (const InvalidArgument& e) {
    expect_message(e.what(), bad.label, bad);
  }
}

INSTANTIATE_TEST_SUITE_P(Safetensors, Malformed, ::testing::ValuesIn(bad_files()),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(SafetensorsMalformed, GoodBaseFileIsAccepted) {
  // The cases above are edits of this file; it must itself be valid or they prove nothing.
  const std::string good = test::safetensors_bytes(kGoodHeader, kGoodData);
  const SafetensorsFile file = SafetensorsFile::from_bytes(good.data(), good.size());
  EXPECT_EQ(file.tensors().size(), 2u);
}

TEST(SafetensorsMalformed, MissingFileIsNotFound) {
  EXPECT_THROW((void)SafetensorsFile::open("/nonexistent/dir/x.safetensors"), NotFound);
  test::ScratchDir dir;
  EXPECT_THROW((void)SafetensorsFile::open(dir.path().string()), InvalidArgument);  // a directory
}

}  // namespace
}  // namespace hk
