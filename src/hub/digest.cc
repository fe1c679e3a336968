// sha256 digests of kernel files (OpenSSL EVP) and the check of a variant directory against its
// metadata.json and, when a lock applies, against the locked digests.
//
// This runs before every dlopen: reading a few MB is cheap next to running unverified code. It does
// not fetch anything or decide what to do about a mismatch beyond throwing IntegrityError.
#include <openssl/evp.h>

#include <cstdio>
#include <memory>

#include "hk/error.h"
#include "hk/hub.h"

namespace hk::hub {

std::string sha256_file(const std::filesystem::path& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) throw NotFound("cannot open kernel file " + path.string() + " to check its digest");
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw RuntimeFailure("OpenSSL could not start a sha256 digest");
  std::vector<unsigned char> buffer(1 << 16);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0)
    if (EVP_DigestUpdate(ctx.get(), buffer.data(), n) != 1)
      throw RuntimeFailure("OpenSSL sha256 update failed on " + path.string());
  if (std::ferror(file.get())) throw RuntimeFailure("read error on kernel file " + path.string());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &length) != 1)
    throw RuntimeFailure("OpenSSL sha256 final failed on " + path.string());
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

void verify_variant_dir(const std::filesystem::path& dir, const VariantMetadata& metadata,
                        const std::map<std::string, std::string>* locked) {
  const std::string what = metadata.repo + " (commit " + metadata.id.substr(0, 12) + ", variant " +
                           metadata.variant + ")";
  if (locked && *locked != metadata.sha256) {
    // Name the first file whose locked digest differs, so the message is concrete.
    for (const auto& [file, sha] : metadata.sha256) {
      auto it = locked->find(file);
      std::string lock_sha = it == locked->end() ? "(not in the lock)" : it->second;
      if (lock_sha != sha)
        throw IntegrityError("kernel file " + file + " of " + what + " has sha256 " + sha +
                             " in metadata.json but hk.lock pins " + lock_sha +
                             "; the kernel changed since it was locked — run `hk kernels lock` "
                             "again if that is intended");
    }
    throw IntegrityError("the files of " + what +
                         " differ from the ones hk.lock pins; run `hk kernels lock` again if the "
                         "change is intended");
  }
  for (const auto& [file, expected] : metadata.sha256) {
    std::filesystem::path path = dir / file;
    if (!std::filesystem::exists(path))
      throw IntegrityError("kernel file " + path.string() + " of " + what +
                           " is missing; delete the directory and fetch the kernel again");
    std::string actual = sha256_file(path);
    if (actual != expected)
      throw IntegrityError("kernel file " + path.string() + " of " + what + " has sha256 " +
                           actual + " but metadata.json expects " + expected +
                           "; the file is corrupt or was modified — delete it (or the cache "
                           "entry) and fetch the kernel again");
  }
}

}  // namespace hk::hub
