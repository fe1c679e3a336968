// The one JSON reader for text hk does not control (config.json, KernelConfig files, hub
// metadata, refs, lockfiles, signatures, listings): internal to libhk.
//
// nlohmann's parser itself is iterative, but much of what follows a parse is not (dump() for an
// error message, copies, comparisons), and its parser keeps the *last* of two equal keys without
// a word. So this reader builds the document through nlohmann's SAX interface and refuses, with a
// sentence: nesting deeper than `max_depth` (no real hk file nests more than a few levels) and,
// unless allowed, a key given twice in one object (a second "RMSNorm" entry must not silently
// replace the first). It is linear in the input.
//
// Safetensors headers are not read through here: they have their own streaming reader
// (src/io/safetensors_reader.cc) that never builds a document.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace hk {

struct JsonLimits {
  int max_depth = 64;
  bool allow_duplicate_keys = false;
};

// Parses `text`. Every failure is an InvalidArgument: `subject` (e.g. "kernel config cfg.json ")
// followed by what is wrong ("is not valid JSON (...)", "nests deeper than 64 levels, ...", "has
// the key \"RMSNorm\" twice in \"kernel_mapping\" ...").
// nlohmann's message without its "[json.exception.parse_error.101] " prefix, control bytes
// escaped, at most 300 characters: the position and the reason.
std::string json_error_reason(const nlohmann::detail::exception& e);

nlohmann::json parse_json_strict(std::string_view text, std::string_view subject,
                                 const JsonLimits& limits = {});

}  // namespace hk
