// hk/hub_signing.h — signed kernels: Ed25519 publisher keys and metadata.json signatures.
//
// A variant's metadata.json lists the sha256 of every file, the library included, so one
// signature over metadata.json covers the whole variant. The publisher signs it with an Ed25519
// key (`hk kernels sign`, or the SDK at publish time) and the hub serves the signature beside it:
//
//   <variant>/metadata.json.sig   {"algorithm": "ed25519", "public_key": "<64 hex>",
//                                  "signature": "<128 hex>"}
//
// The signed message is the exact bytes of metadata.json prefixed with the domain string
// "hk kernel metadata v1\n" (kSignatureDomain), so a publisher key signs nothing else by accident.
// Clients trust keys per org (HK_PUBLISHER_KEYS, a JSON file {"org": ["<64 hex>", ...]}). The
// policy, applied on every load (Hub::load / Hub::verify) and before a download:
//   - a repo whose org has publisher keys needs a valid signature by one of them;
//   - HK_REQUIRE_SIGNED=1 (HubConfig::require_signed, LoadOptions::require_signed_kernels)
//     requires that of every hub repo (an org without keys then cannot load);
//   - otherwise an unsigned repo loads on the trust of its org name, as before.
// Refusals are IntegrityErrors naming the repo and the key. Local kernels (paths the user named)
// are not subject to signatures. Crypto is OpenSSL's (EVP, Ed25519).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hk::hub {

inline constexpr std::string_view kSignatureDomain = "hk kernel metadata v1\n";
inline constexpr std::string_view kSignatureFileName = "metadata.json.sig";

// Trusted publisher keys per org: org → Ed25519 public keys as 64 lower-case hex characters.
struct PublisherKeys {
  std::map<std::string, std::vector<std::string>> by_org;
  bool empty() const { return by_org.empty(); }
  const std::vector<std::string>* for_org(const std::string& org) const;
  // The orgs that trust `public_key` (for "this key belongs to another org" messages).
  std::vector<std::string> orgs_of(const std::string& public_key) const;
};
// {"org": ["<64 hex>", ...], ...}; strict (InvalidArgument naming `origin` and the org).
PublisherKeys parse_publisher_keys(std::string_view text, const std::string& origin);
PublisherKeys load_publisher_keys(const std::filesystem::path& path);

// One metadata.json.sig.
struct MetadataSignature {
  std::string public_key;  // 64 hex
  std::string signature;   // 128 hex
};
MetadataSignature parse_signature(std::string_view text, const std::string& origin);
std::string serialize_signature(const MetadataSignature& signature);
// Writes a metadata.json.sig atomically (a planted file or symlink is never written through).
void save_signature(const std::filesystem::path& path, const MetadataSignature& signature);

// Creates a new Ed25519 private key at `private_key_pem` (PEM, PKCS#8, mode 0600; an existing
// file is never overwritten) and returns its public key (64 hex).
std::string generate_signing_key(const std::filesystem::path& private_key_pem);
// The public key (64 hex) of a PEM private key.
std::string signing_key_public(const std::filesystem::path& private_key_pem);
// Signs the exact bytes of a metadata.json.
MetadataSignature sign_metadata(std::string_view metadata_bytes,
                                const std::filesystem::path& private_key_pem);
// Whether `signature` is a valid signature of `metadata_bytes` by its public key (crypto only).
bool signature_matches(std::string_view metadata_bytes, const MetadataSignature& signature);

// The policy above for one hub repo: returns how it is signed, for reports ("signed by publisher
// key <hex> of org", "unsigned (trusted by org name)"), or throws IntegrityError.
// `signature_text` is the content of metadata.json.sig, nullopt when there is none.
std::string check_metadata_signature(const std::string& repo, std::string_view metadata_bytes,
                                     const std::optional<std::string>& signature_text,
                                     const PublisherKeys& keys, bool require_signed);

}  // namespace hk::hub
