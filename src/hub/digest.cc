// sha256 digests of kernel files (OpenSSL EVP) and the check of a variant directory against its
// metadata.json and, when a lock applies, against the locked digests.
//
// This runs before every dlopen: reading a few MB is cheap next to running unverified code. Files
// are opened as regular files only and hashed through that one descriptor. It does not fetch
// anything or decide what to do about a mismatch beyond throwing IntegrityError.
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/file_io.h"
#include "hk/error.h"
#include "hk/hub.h"
#include "hub/sha256.h"

namespace hk::hub {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
    throw RuntimeFailure("OpenSSL could not start a sha256 digest");
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_);
}

void Sha256::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(ctx_, data, size) != 1) throw RuntimeFailure("OpenSSL sha256 update failed");
}

std::string to_hex(const unsigned char* bytes, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += hex[bytes[i] >> 4];
    out += hex[bytes[i] & 15];
  }
  return out;
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx_, digest, &length) != 1)
    throw RuntimeFailure("OpenSSL sha256 final failed");
  return to_hex(digest, length);
}

std::string sha256_fd(int fd, const std::filesystem::path& path_for_messages) {
  Sha256 sha;
  std::vector<unsigned char> buffer(1 << 16);
  off_t offset = 0;
  for (;;) {
    ssize_t n = ::pread(fd, buffer.data(), buffer.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw RuntimeFailure("read error on kernel file " + path_for_messages.string() + ": " +
                           std::strerror(errno));
    if (n == 0) break;
    sha.update(buffer.data(), static_cast<size_t>(n));
    offset += n;
  }
  return sha.hex();
}

std::string sha256_file(const std::filesystem::path& path) {
  files::Fd fd = files::open_regular(path, "kernel file");
  return sha256_fd(fd.get(), path);
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
    std::string actual;
    try {
      actual = sha256_file(path);
    } catch (const NotFound&) {
      throw IntegrityError("kernel file " + path.string() + " of " + what +
                           " is missing; delete the directory and fetch the kernel again");
    } catch (const InvalidArgument& e) {
      throw IntegrityError(std::string(e.what()) + "; " + what + " cannot be verified");
    }
    if (actual != expected)
      throw IntegrityError("kernel file " + path.string() + " of " + what + " has sha256 " +
                           actual + " but metadata.json expects " + expected +
                           "; the file is corrupt or was modified — delete it (or the cache "
                           "entry) and fetch the kernel again");
  }
}

}  // namespace hk::hub
