// Incremental sha256 (OpenSSL EVP) for kernel files: the digest of what hk reads is computed on
// the same bytes that are then used (copied into a private library image, or compared), never by
// re-reading a path. Internal to libhk.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

struct evp_md_ctx_st;

namespace hk::hub {

std::string to_hex(const unsigned char* bytes, size_t n);  // lower-case

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex();  // lower-case hex; the object is spent afterwards

 private:
  evp_md_ctx_st* ctx_;
};

}  // namespace hk::hub
