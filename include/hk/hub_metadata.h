// hk/hub_metadata.h — what the hub tree says about a repo: refs and per-variant metadata.json.
//
// These are plain data types plus strict parsers of the on-disk / on-wire text. A parser never
// trusts its input: unknown types, missing fields, file names that are not plain names and digests
// that are not 64 hex characters are rejected with hk::InvalidArgument naming the origin (a path or
// URL) and the field. Nothing here touches the file system or the network.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace hk::hub {

// One entry (a layer implementation) of a kernel library, as described by metadata.json.
struct EntryMetadata {
  std::string name;                            // "RMSNorm"
  std::string interface;                       // "rms_norm"
  int interface_version = 0;                   // 1
  std::vector<std::string> modes;              // "inference", "training", "capture"
  std::string device;                          // "cpu", "cuda", ...
  int min_capability = 0, max_capability = 0;  // 0 = no bound
  std::vector<std::string> dtypes;             // "f32", "bf16", ...
  bool backward = false;
};

// The backend a variant was built for.
struct BackendMetadata {
  std::string type;                // "cpu", "cuda", "rocm", "xpu"
  std::string version;             // "13.0" for cuda; empty for cpu
  std::vector<std::string> archs;  // cuda: "90a", "80", ...
};

// One variant's metadata.json.
struct VariantMetadata {
  std::string name;     // "rmsnorm"
  std::string repo;     // "kernels-community/rmsnorm"
  std::string version;  // "1.2.0"
  std::string id;       // commit id
  std::string variant;  // "hk1-cpu-x86_64-linux"
  int abi_major = 0, abi_minor = 0;
  BackendMetadata backend;
  std::string os, arch;
  std::string library;  // "librmsnorm.so"
  std::vector<EntryMetadata> entries;
  std::map<std::string, std::string> sha256;  // file name → lower-case hex digest
  // file name → size in bytes ("size" in metadata.json; optional for older hubs, always written by
  // the SDK). A download stops at the declared size; files without one stop at HubConfig's
  // max_file_bytes.
  std::map<std::string, uint64_t> size;
  std::string provenance_json;  // kept verbatim ("{}" when absent)

  std::vector<std::string> entry_names() const;
};

// Parses metadata.json text. `origin` (path or URL) appears in every error message.
VariantMetadata parse_variant_metadata(std::string_view text, const std::string& origin);
// Serialises back to JSON (stable key order); parse(serialize(m)) == m.
std::string serialize_variant_metadata(const VariantMetadata& metadata);

// Branches and tags of a repo → commit ids.
struct RefTable {
  std::map<std::string, std::string> branches;  // "v1" → commit
  std::map<std::string, std::string> tags;      // "v1.2.0" → commit
};

// The content of one refs/heads/* or refs/tags/* file: a 40-hex commit id plus optional newline.
std::string parse_ref_file(std::string_view text, const std::string& origin);
// {"branches": {"v1": "<commit>"}, "tags": {"v1.0.0": "<commit>"}} (served at
// /api/<org>/<repo>/refs and cached as refs.json).
RefTable parse_refs_json(std::string_view text, const std::string& origin);
std::string serialize_refs_json(const RefTable& refs);

// Whether `name` is safe as one path component of a hub tree (no '/', not '.', '..', no NUL...).
bool is_safe_file_name(std::string_view name);

}  // namespace hk::hub
