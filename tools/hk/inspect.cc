// `hk inspect FILE.safetensors|DIR [--json]` — list the tensors of a checkpoint and validate it.
//
// Accepts what hk::Checkpoint::open accepts: a .safetensors file, a directory with
// model.safetensors or model.safetensors.index.json, or the index itself. Opening validates the
// whole file (see hk/safetensors.h); a malformed file is reported as one sentence on stderr with
// exit status 1.
//
// Text output: one line per tensor (name, dtype, shape, bytes), then the metadata and totals.
// Tensors of dtypes hk cannot compute with are marked "(not loadable by hk)".
//
// --json output (stable; extra keys may be added):
//   {"path": "<as given>",
//    "files": ["<shard or file path>", ...],
//    "tensors": [{"name": "..", "dtype": "BF16",        // safetensors dtype name
//                 "hk_dtype": "bf16" | null,          // null: hk cannot compute with it
//                 "shape": [2, 3], "bytes": 12,
//                 "offset": 136,                      // byte offset of the data in its file
//                 "file": "<path of its file>"}, ...], // in name order
//    "metadata": {"format": "pt", ...},               // "__metadata__" (first shard if sharded)
//    "total_bytes": 123, "total_elements": 45}
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "hk/checkpoint.h"
#include "hk/error.h"

namespace {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

void print_json(const hk::Checkpoint& ckpt) {
  nlohmann::json out;
  out["path"] = ckpt.path();
  out["files"] = nlohmann::json::array();
  for (const auto& f : ckpt.files()) out["files"].push_back(f.path());
  out["tensors"] = nlohmann::json::array();
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  for (const auto& name : ckpt.names()) {
    const hk::SafetensorsFile& file = ckpt.file_of(name);
    const hk::TensorInfo& t = file.info(name);
    out["tensors"].push_back(
        {{"name", t.name},
         {"dtype", t.dtype_name},
         {"hk_dtype", t.dtype ? nlohmann::json(hk::dtype_name(*t.dtype)) : nlohmann::json(nullptr)},
         {"shape", t.shape},
         {"bytes", t.nbytes()},
         {"offset", file.data_start() + t.data_begin},
         {"file", file.path()}});
    total_bytes += t.nbytes();
    total_elements += t.numel();
  }
  out["metadata"] = ckpt.metadata();
  out["total_bytes"] = total_bytes;
  out["total_elements"] = total_elements;
  // Names from a file need not be valid UTF-8; replace bad bytes rather than fail.
  std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

void print_text(const hk::Checkpoint& ckpt) {
  // Names and metadata come from the file: escaped so they cannot drive the terminal.
  size_t name_width = 4, shape_width = 5;
  for (const auto& name : ckpt.names()) {
    name_width = std::max(name_width, hk::escape_control_bytes(name).size());
    shape_width = std::max(shape_width, hk::shape_str(ckpt.info(name).shape).size());
  }
  uint64_t total_bytes = 0;
  int64_t total_elements = 0;
  for (const auto& name : ckpt.names()) {
    const hk::TensorInfo& t = ckpt.info(name);
    std::string line = hk::escape_control_bytes(name);
    line.append(name_width + 2 - line.size(), ' ');
    std::string dtype = t.dtype_name;
    dtype.resize(std::max<size_t>(dtype.size(), 8), ' ');
    std::string shape = hk::shape_str(t.shape);
    shape.resize(std::max(shape.size(), shape_width), ' ');
    line += dtype + " " + shape + "  " + std::to_string(t.nbytes()) + " bytes";
    if (!t.dtype) line += "  (not loadable by hk)";
    std::cout << line << "\n";
    total_bytes += t.nbytes();
    total_elements += t.numel();
  }
  for (const auto& [key, value] : ckpt.metadata())
    std::cout << "metadata " << hk::escape_control_bytes(key) << " = "
              << hk::escape_control_bytes(value) << "\n";
  std::cout << ckpt.names().size() << " tensors, " << total_elements << " elements, " << total_bytes
            << " bytes (" << human_bytes(total_bytes) << ") in " << ckpt.files().size()
            << (ckpt.files().size() == 1 ? " file" : " files") << "\n";
}

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect", "List the tensors of a safetensors file or checkpoint directory and validate it");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("path", *path,
                  "FILE.safetensors, or a directory with model.safetensors[.index.json]")
      ->required();
  cmd->add_flag("--json", *json, "Machine-readable output (format in tools/hk/inspect.cc)");
  cmd->callback([path, json] {
    const hk::Checkpoint ckpt = hk::Checkpoint::open(*path);
    if (*json)
      print_json(ckpt);
    else
      print_text(ckpt);
  });
}

}  // namespace

HK_REGISTER_COMMAND(inspect, add_inspect);
