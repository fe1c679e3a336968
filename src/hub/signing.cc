// Ed25519 signatures over metadata.json, publisher keys per org, and the signature policy (see
// hk/hub_signing.h). OpenSSL EVP does the cryptography; this file only frames it.
#include "hk/hub_signing.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/file_io.h"
#include "core/strict_json.h"
#include "hk/error.h"
#include "hk/hub_spec.h"
#include "hub/sha256.h"

namespace hk::hub {
namespace {

using nlohmann::json;
using PKey = std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)>;
using Bio = std::unique_ptr<BIO, int (*)(BIO*)>;

constexpr size_t kPublicKeyBytes = 32, kSignatureBytes = 64;

bool is_hex(std::string_view s, size_t length) {
  if (s.size() != length) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::vector<unsigned char> from_hex(std::string_view s) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::vector<unsigned char> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<unsigned char>(nibble(s[2 * i]) << 4 | nibble(s[2 * i + 1]));
  return out;
}

std::string message_of(std::string_view metadata_bytes) {
  std::string message(kSignatureDomain);
  message.append(metadata_bytes);
  return message;
}

PKey load_private_key(const std::filesystem::path& path) {
  std::string pem = files::read_regular_file(path, 64 << 10, "signing key");
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  PKey key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr,
           &EVP_PKEY_free);
  if (!key || EVP_PKEY_get_id(key.get()) != EVP_PKEY_ED25519)
    throw InvalidArgument("signing key " + path.string() +
                          " is not an unencrypted Ed25519 private key in PEM form (make one with "
                          "`hk kernels keygen FILE`)");
  return key;
}

std::string public_hex(EVP_PKEY* key) {
  unsigned char raw[kPublicKeyBytes];
  size_t length = sizeof raw;
  if (EVP_PKEY_get_raw_public_key(key, raw, &length) != 1 || length != kPublicKeyBytes)
    throw RuntimeFailure("OpenSSL could not export an Ed25519 public key");
  return to_hex(raw, length);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

}  // namespace

const std::vector<std::string>* PublisherKeys::for_org(const std::string& org) const {
  auto it = by_org.find(org);
  return it == by_org.end() || it->second.empty() ? nullptr : &it->second;
}

std::vector<std::string> PublisherKeys::orgs_of(const std::string& public_key) const {
  std::vector<std::string> orgs;
  for (const auto& [org, keys] : by_org)
    if (std::find(keys.begin(), keys.end(), public_key) != keys.end()) orgs.push_back(org);
  return orgs;
}

PublisherKeys parse_publisher_keys(std::string_view text, const std::string& origin) {
  json j = parse_json_strict(text, "publisher keys " + origin + " ");
  if (!j.is_object())
    throw InvalidArgument("publisher keys " + origin +
                          " must be an object {\"org\": [\"<64 hex public key>\", ...]}");
  PublisherKeys keys;
  for (const auto& [org, list] : j.items()) {
    try {
      parse_repo_name(org + "/x");  // the org part of a repo name
    } catch (const InvalidArgument&) {
      throw InvalidArgument("publisher keys " + origin + ": '" + escape_control_bytes(org) +
                            "' is not an org name");
    }
    if (!list.is_array())
      throw InvalidArgument("publisher keys " + origin + ": the keys of org " + org +
                            " must be a list of 64-hex Ed25519 public keys");
    auto& out = keys.by_org[org];
    for (const auto& k : list) {
      if (!k.is_string() || !is_hex(k.get_ref<const std::string&>(), 2 * kPublicKeyBytes))
        throw InvalidArgument("publisher keys " + origin + ": a key of org " + org +
                              " is not 64 lower-case hex characters (an Ed25519 public key)");
      out.push_back(k.get<std::string>());
    }
  }
  return keys;
}

PublisherKeys load_publisher_keys(const std::filesystem::path& path) {
  return parse_publisher_keys(files::read_regular_file(path, 1 << 20, "publisher keys file"),
                              path.string());
}

MetadataSignature parse_signature(std::string_view text, const std::string& origin) {
  json j = parse_json_strict(text, "signature " + origin + " ");
  auto field = [&](const char* key) -> std::string {
    auto it = j.is_object() ? j.find(key) : j.end();
    if (it == j.end() || !it->is_string())
      throw InvalidArgument("signature " + origin + " has no \"" + key + "\" string");
    return it->get<std::string>();
  };
  if (field("algorithm") != "ed25519")
    throw InvalidArgument("signature " + origin + " uses algorithm '" +
                          escape_control_bytes(field("algorithm")) + "'; hk knows ed25519 only");
  MetadataSignature sig{field("public_key"), field("signature")};
  if (!is_hex(sig.public_key, 2 * kPublicKeyBytes) || !is_hex(sig.signature, 2 * kSignatureBytes))
    throw InvalidArgument("signature " + origin +
                          " needs a 64-hex \"public_key\" and a 128-hex \"signature\"");
  return sig;
}

std::string serialize_signature(const MetadataSignature& signature) {
  json j{{"algorithm", "ed25519"},
         {"public_key", signature.public_key},
         {"signature", signature.signature}};
  return j.dump(2) + "\n";
}

void save_signature(const std::filesystem::path& path, const MetadataSignature& signature) {
  files::write_file_atomically(path, serialize_signature(signature));
}

std::string generate_signing_key(const std::filesystem::path& private_key_pem) {
  PKey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"), &EVP_PKEY_free);
  if (!key) throw RuntimeFailure("OpenSSL could not generate an Ed25519 key");
  Bio bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    throw RuntimeFailure("OpenSSL could not write an Ed25519 key as PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  // A private key: created new (never over an existing file or symlink), readable by us only.
  files::Fd fd(
      ::open(private_key_pem.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd)
    throw RuntimeFailure("cannot create " + private_key_pem.string() + ": " + std::strerror(errno) +
                         " (an existing key is never overwritten)");
  if (::write(fd.get(), data, static_cast<size_t>(size)) != size || ::fsync(fd.get()) != 0)
    throw RuntimeFailure("cannot write " + private_key_pem.string());
  return public_hex(key.get());
}

std::string signing_key_public(const std::filesystem::path& private_key_pem) {
  return public_hex(load_private_key(private_key_pem).get());
}

MetadataSignature sign_metadata(std::string_view metadata_bytes,
                                const std::filesystem::path& private_key_pem) {
  PKey key = load_private_key(private_key_pem);
  MdCtx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  const std::string message = message_of(metadata_bytes);
  unsigned char sig[kSignatureBytes];
  size_t length = sizeof sig;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), sig, &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      length != kSignatureBytes)
    throw RuntimeFailure("OpenSSL could not sign with " + private_key_pem.string());
  return {public_hex(key.get()), to_hex(sig, length)};
}

bool signature_matches(std::string_view metadata_bytes, const MetadataSignature& signature) {
  if (!is_hex(signature.public_key, 2 * kPublicKeyBytes) ||
      !is_hex(signature.signature, 2 * kSignatureBytes))
    return false;
  const auto pub = from_hex(signature.public_key), sig = from_hex(signature.signature);
  PKey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, pub.data(), pub.size()),
           &EVP_PKEY_free);
  MdCtx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!key || !ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1)
    return false;
  const std::string message = message_of(metadata_bytes);
  return EVP_DigestVerify(ctx.get(), sig.data(), sig.size(),
                          reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

std::string check_metadata_signature(const std::string& repo, std::string_view metadata_bytes,
                                     const std::optional<std::string>& signature_text,
                                     const PublisherKeys& keys, bool require_signed) {
  const std::string org = repo.substr(0, repo.find('/'));
  const std::vector<std::string>* trusted = keys.for_org(org);
  const bool required = require_signed || trusted != nullptr;
  const std::string why_required =
      trusted ? "org " + org +
                    " has publisher keys configured (HK_PUBLISHER_KEYS: " + join(*trusted) + ")"
              : "HK_REQUIRE_SIGNED=1 requires every hub kernel to be signed, and no publisher key "
                "is configured for org " +
                    org + " (add one to HK_PUBLISHER_KEYS)";
  if (!signature_text) {
    if (!required) return "unsigned (trusted by org name)";
    throw IntegrityError("kernel repo " + repo + " is not signed (no " +
                         std::string(kSignatureFileName) + " beside its metadata.json), but " +
                         why_required + "; refusing to load it");
  }
  MetadataSignature sig;
  try {
    sig = parse_signature(*signature_text, repo + " " + std::string(kSignatureFileName));
  } catch (const InvalidArgument& e) {
    if (!required)
      return "signature unreadable, not checked (no publisher key for org " + org +
             "): " + e.what();
    throw IntegrityError(std::string(e.what()) + "; " + why_required + ", refusing to load " +
                         repo);
  }
  if (!trusted) {
    if (!required)
      return "signed by key " + sig.public_key + ", not checked (no publisher key for org " + org +
             ")";
    throw IntegrityError("kernel repo " + repo + " is signed by key " + sig.public_key + ", but " +
                         why_required + "; refusing to load it");
  }
  if (std::find(trusted->begin(), trusted->end(), sig.public_key) == trusted->end()) {
    std::vector<std::string> others = keys.orgs_of(sig.public_key);
    throw IntegrityError(
        "kernel repo " + repo + " is signed by key " + sig.public_key +
        ", which is not a publisher key of org " + org + " (its keys: " + join(*trusted) + ")" +
        (others.empty() ? std::string()
                        : "; that key is trusted for org " + join(others) +
                              " only, and a key is trusted only for the org it is listed under") +
        "; refusing to load it");
  }
  if (!signature_matches(metadata_bytes, sig))
    throw IntegrityError("the signature of " + repo + "'s metadata.json by publisher key " +
                         sig.public_key +
                         " does not match its content: metadata.json was changed after it was "
                         "signed (or the signature belongs to another file); refusing to load it");
  return "signed by publisher key " + sig.public_key + " of org " + org;
}

}  // namespace hk::hub
