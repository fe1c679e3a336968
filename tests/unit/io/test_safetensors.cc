// Safetensors reader/writer on good files: round trips over every hk dtype, non-contiguous
// sources, the on-disk layout the writer promises, zero-copy views, dtype conversion on load, a
// file written by PyTorch, and the dtypes hk lists but cannot load.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "hk/error.h"
#include "hk/safetensors.h"
#include "io_test_util.h"

namespace hk {
namespace {

using test::ScratchDir;

std::string bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.view().ptr()), c.nbytes());
}

TEST(Safetensors, RoundTripEveryDtype) {
  ScratchDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<std::pair<std::string, Tensor>> originals = {
      {"f32", Tensor::from_floats({1.5f, -2.25f, 3.0f, 1e-3f, 7.0f, -0.0f}, {2, 3}, DType::F32)},
      {"f16", Tensor::from_floats({0.5f, -65504.0f, 1e-4f}, {3}, DType::F16)},
      {"bf16", Tensor::from_floats({1.0f, 3.14159f, -1e30f, 0.1f}, {2, 2}, DType::BF16)},
      {"f64", Tensor::from_floats({1.0f, -2.5f}, {2}, DType::F64)},
      {"i32", Tensor::from_ints({1, -2, 2147483647}, {3, 1}, DType::I32)},
      {"i64", Tensor::from_ints({-5, 1LL << 40}, {2}, DType::I64)},
      {"u8", Tensor::from_ints({0, 255, 7}, {3}, DType::U8)},
      {"bool", Tensor::from_ints({1, 0, 1, 1}, {2, 2}, DType::Bool)},
      {"empty", Tensor::empty({0, 5}, DType::F32)},
      {"scalar", Tensor::from_floats({42.0f}, {}, DType::F32)},
  };
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, t] : originals) views.emplace_back(name, t.view());
  save_safetensors(path, views, {{"format", "pt"}, {"note", "round trip"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), originals.size());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "round trip");
  for (size_t i = 1; i < file.tensors().size(); ++i)
    EXPECT_LT(file.tensors()[i - 1].name, file.tensors()[i].name);  // name order
  for (const auto& [name, original] : originals) {
    SCOPED_TRACE(name);
    const TensorInfo& info = file.info(name);
    ASSERT_TRUE(info.dtype.has_value());
    EXPECT_EQ(*info.dtype, original.dtype());
    EXPECT_EQ(info.dtype_name, safetensors_dtype_name(original.dtype()));
    EXPECT_EQ(info.shape, original.sizes());
    const Tensor loaded = file.load(name);
    EXPECT_EQ(loaded.dtype(), original.dtype());
    EXPECT_EQ(loaded.sizes(), original.sizes());
    EXPECT_EQ(bytes_of(loaded), bytes_of(original));
    // The zero-copy view reads the same bytes straight from the mapping.
    EXPECT_EQ(bytes_of(Tensor::wrap(file.view(name))), bytes_of(original));
  }
}

TEST(Safetensors, NonContiguousSourcesAreSavedInLogicalOrder) {
  ScratchDir dir;
  const std::string path = dir.file("views.safetensors");
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[i] = static_cast<float>(i);
  const Tensor base = Tensor::from_floats(values, {3, 4}, DType::F32);
  const Tensor transposed = base.transpose(0, 1);  // [4, 3]
  const Tensor strided = base.slice(1, 0, 4, 2);   // [3, 2], every other column
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(strided.is_contiguous());
  save_safetensors(path, {{"t", transposed.view()}, {"s", strided.view()}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.info("t").shape, (Shape{4, 3}));
  EXPECT_EQ(file.load("t").to_doubles(),
            (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(file.load("s").to_doubles(), (std::vector<double>{0, 2, 4, 6, 8, 10}));
}

TEST(Safetensors, WriterPadsHeaderSortsKeysAndAlignsData) {
  ScratchDir dir;
  const std::string path = dir.file("layout.safetensors");
  const Tensor a = Tensor::from_floats({1, 2, 3}, {3}, DType::BF16);  // 6 bytes
  const Tensor b = Tensor::from_ints({1, 2}, {2}, DType::I64);        // 8-byte elements
  const Tensor c = Tensor::from_ints({1}, {1}, DType::U8);
  save_safetensors(path, {{"zeta", a.view()}, {"alpha", b.view()}, {"mid", c.view()}});

  const std::string raw = test::read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  const std::string header = raw.substr(8, header_len);
  const std::string padding = header.substr(header.rfind('}') + 1);
  EXPECT_EQ(padding, std::string(padding.size(), ' '));  // the spec's padding: spaces only
  EXPECT_LT(header.find("\"alpha\""), header.find("\"mid\""));
  EXPECT_LT(header.find("\"mid\""), header.find("\"zeta\""));
  const auto json = nlohmann::json::parse(header);
  // Largest element size first: alpha (i64) at 0, then zeta (bf16), then mid (u8).
  EXPECT_EQ(json["alpha"]["data_offsets"], nlohmann::json({0, 16}));
  EXPECT_EQ(json["zeta"]["data_offsets"], nlohmann::json({16, 22}));
  EXPECT_EQ(json["mid"]["data_offsets"], nlohmann::json({22, 23}));
  EXPECT_EQ(raw.size(), 8 + header_len + 23);
  EXPECT_FALSE(json.contains("__metadata__"));  // none given, none written

  const SafetensorsFile file = SafetensorsFile::open(path);
  for (const auto& t : file.tensors()) {
    const TensorView v = file.view(t.name);  // aligned, so views work for every tensor
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.ptr()) % dtype_size(v.dtype), 0u) << t.name;
  }
}

TEST(Safetensors, AtomicWriteReplacesAndLeavesNoTemporaryFiles) {
  ScratchDir dir;
  const std::string path = dir.file("model.safetensors");
  const Tensor one = Tensor::from_floats({1}, {1});
  const Tensor two = Tensor::from_floats({2, 3}, {2});
  save_safetensors(path, {{"x", one.view()}});
  save_safetensors(path, {{"x", two.view()}});
  EXPECT_EQ(SafetensorsFile::open(path).load("x").to_doubles(), (std::vector<double>{2, 3}));
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "model.safetensors");
  }
  EXPECT_EQ(entries, 1u);

  // A write that cannot happen leaves nothing behind and says where.
  const std::string missing = dir.file("no/such/dir/x.safetensors");
  try {
    save_safetensors(missing, {{"x", one.view()}});
    FAIL() << "expected RuntimeFailure";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(missing));
}

TEST(Safetensors, WriterRejectsBadNames) {
  ScratchDir dir;
  const std::string path = dir.file("bad.safetensors");
  const Tensor t = Tensor::from_floats({1}, {1});
  EXPECT_THROW(save_safetensors(path, {{"x", t.view()}, {"x", t.view()}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"__metadata__", t.view()}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"", t.view()}}), InvalidArgument);
  EXPECT_THROW(save_safetensors(path, {{"x", t.view()}}, {{"k", std::string("\xff\xfe")}}),
               InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, TensorKeepsMappingAliveAfterFileHandleIsGone) {
  ScratchDir dir;
  const std::string path = dir.file("alive.safetensors");
  const Tensor t = Tensor::from_floats({4, 5, 6}, {3});
  save_safetensors(path, {{"w", t.view()}});
  Tensor zero_copy;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    zero_copy = file.tensor("w");
    EXPECT_EQ(zero_copy.view().ptr(), file.view("w").ptr());  // no copy made
  }
  EXPECT_EQ(zero_copy.to_doubles(), (std::vector<double>{4, 5, 6}));
}

TEST(Safetensors, ReadsFileWrittenByPyTorch) {
  const SafetensorsFile file = SafetensorsFile::open(test::torch_fixture());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.tensors().size(), 6u);

  std::vector<double> quarters;
  for (int i = 0; i < 12; ++i) quarters.push_back(i / 4.0);
  EXPECT_EQ(file.info("embed.weight").dtype_name, "F32");
  EXPECT_EQ(file.info("embed.weight").shape, (Shape{3, 4}));
  EXPECT_EQ(file.load("embed.weight").to_doubles(), quarters);
  EXPECT_EQ(file.load("layer.0.norm.weight").dtype(), DType::BF16);
  EXPECT_EQ(file.load("layer.0.norm.weight").to_doubles(),
            (std::vector<double>{-1.5, -0.5, 0.5, 1.5}));
  EXPECT_EQ(file.load("layer.0.proj.weight").dtype(), DType::F16);
  EXPECT_EQ(file.load("layer.0.proj.weight").to_doubles(),
            (std::vector<double>{0, 0.125, 0.25, 0.375, 0.5, 0.625}));
  EXPECT_EQ(file.load("position_ids").to_int64s(),
            (std::vector<int64_t>{0, 1000000007, 2000000014, 3000000021, 4000000028}));
  EXPECT_EQ(file.info("scalar").shape, Shape{});
  EXPECT_EQ(file.load("scalar").to_doubles(), (std::vector<double>{2.5}));
  EXPECT_EQ(file.load("transposed").to_doubles(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(file.load("embed.weight").to_doubles(), file.tensor("embed.weight").to_doubles());
}

TEST(Safetensors, LoadConvertsDtypes) {
  ScratchDir dir;
  const std::string path = dir.file("convert.safetensors");
  const std::vector<float> values = {1.0f, 1.00390625f, 1.01171875f, -3.3f, 1e10f, -1e10f};
  const Tensor f32 = Tensor::from_floats(values, {6}, DType::F32);
  const Tensor i64 = Tensor::from_ints({-3, 300, 1LL << 40}, {3}, DType::I64);
  save_safetensors(path, {{"f", f32.view()}, {"i", i64.view()}});
  const SafetensorsFile file = SafetensorsFile::open(path);

  const Tensor as_bf16 = file.load("f", Device::cpu(), DType::BF16);
  ASSERT_EQ(as_bf16.dtype(), DType::BF16);
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(as_bf16.data_as<bf16_t>()[i].bits, float_to_bf16(values[i]).bits) << i;
  const Tensor as_f16 = file.load("f", Device::cpu(), DType::F16);
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(as_f16.data_as<f16_t>()[i].bits, float_to_f16(values[i]).bits) << i;
  // Float → int truncates toward zero and saturates.
  EXPECT_EQ(file.load("f", Device::cpu(), DType::I32).to_int64s(),
            (std::vector<int64_t>{1, 1, 1, -3, 2147483647, -2147483648LL}));
  EXPECT_EQ(file.load("i", Device::cpu(), DType::I32).to_int64s(),
            (std::vector<int64_t>{-3, 300, 2147483647}));
  EXPECT_EQ(file.load("i", Device::cpu(), DType::U8).to_int64s(),
            (std::vector<int64_t>{0, 255, 255}));
  EXPECT_EQ(file.load("i", Device::cpu(), DType::F32).to_doubles(),
            (std::vector<double>{-3, 300, 1099511627776.0}));
  EXPECT_EQ(file.load("i", Device::cpu(), DType::Bool).to_int64s(),
            (std::vector<int64_t>{1, 1, 1}));
}

TEST(Safetensors, ListsButRefusesDtypesHkCannotComputeWith) {
  ScratchDir dir;
  const std::string path = dir.file("fp8.safetensors");
  const std::string header = R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"I16","shape":[1],"data_offsets":[2,4]},)"
                             R"("c":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  test::write_file(path, test::safetensors_bytes(header, std::string(8, '\x01')));
  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.info("a").dtype_name, "F8_E4M3");
  EXPECT_FALSE(file.info("a").dtype.has_value());
  EXPECT_FALSE(file.info("b").dtype.has_value());
  EXPECT_EQ(file.load("c").to_int64s(), (std::vector<int64_t>{1, 1, 1, 1}));
  try {
    (void)file.load("a");
    FAIL() << "expected Unsupported";
  } catch (const Unsupported& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("F8_E4M3"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_THROW((void)file.view("b"), Unsupported);
  EXPECT_THROW((void)file.info("nope"), NotFound);
  EXPECT_EQ(file.find("nope"), nullptr);
}

TEST(Safetensors, UnalignedDataCanBeLoadedButNotViewed) {
  ScratchDir dir;
  const std::string path = dir.file("unaligned.safetensors");
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";  // 55 B
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const float values[2] = {1.5f, -4.0f};
  test::write_file(
      path, test::safetensors_bytes(header, std::string(reinterpret_cast<const char*>(values), 8)));
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_THROW((void)file.view("x"), Unsupported);
  EXPECT_EQ(file.load("x").to_doubles(), (std::vector<double>{1.5, -4.0}));
  EXPECT_EQ(file.load("x", Device::cpu(), DType::F64).to_doubles(),
            (std::vector<double>{1.5, -4.0}));
}

TEST(Safetensors, EmptyFileWithNoTensorsIsValid) {
  const std::string bytes = test::safetensors_bytes("{}      ", "");
  const SafetensorsFile file = SafetensorsFile::from_bytes(bytes.data(), bytes.size());
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_EQ(file.data_bytes(), 0u);
}

TEST(Safetensors, FromBytesMatchesOpen) {
  const std::string raw = test::read_file(test::torch_fixture());
  const SafetensorsFile mem = SafetensorsFile::from_bytes(raw.data(), raw.size(), "fixture");
  const SafetensorsFile disk = SafetensorsFile::open(test::torch_fixture());
  ASSERT_EQ(mem.tensors().size(), disk.tensors().size());
  for (const auto& t : disk.tensors())
    EXPECT_EQ(bytes_of(mem.load(t.name)), bytes_of(disk.load(t.name))) << t.name;
  EXPECT_EQ(mem.path(), "fixture");
}

}  // namespace
}  // namespace hk
