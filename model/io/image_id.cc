#include "model/io/image_id.h"

#include <openssl/evp.h>

#include <memory>
#include <stdexcept>

namespace maskd {
namespace {

// The inputs are framed (tag, lengths) so that no two different (identity, kind, content) triples
// hash the same byte string.
constexpr std::string_view kDomain = "maskd.image_id.v1";

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) {
      throw std::runtime_error("OpenSSL EVP SHA-256 is unavailable");
    }
  }
  void Update(std::string_view s) {
    if (!s.empty() && EVP_DigestUpdate(ctx_.get(), s.data(), s.size()) != 1) {
      throw std::runtime_error("OpenSSL EVP_DigestUpdate failed");
    }
  }
  void UpdateU64(uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    Update(std::string_view(b, 8));
  }
  void UpdateFramed(std::string_view s) {
    UpdateU64(s.size());
    Update(s);
  }
  std::string HexDigest() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &n) != 1) {
      throw std::runtime_error("OpenSSL EVP_DigestFinal_ex failed");
    }
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * n);
    for (unsigned int i = 0; i < n; ++i) {
      out.push_back(kHex[md[i] >> 4]);
      out.push_back(kHex[md[i] & 15]);
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

}  // namespace

std::string ImageIdForEncoded(std::string_view model_identity, std::string_view bytes) {
  Sha256 h;
  h.UpdateFramed(kDomain);
  h.UpdateFramed(model_identity);
  h.UpdateFramed("encoded");
  h.UpdateFramed(bytes);
  return h.HexDigest();
}

std::string ImageIdForRaw(std::string_view model_identity, uint32_t width, uint32_t height,
                          std::string_view rgb) {
  Sha256 h;
  h.UpdateFramed(kDomain);
  h.UpdateFramed(model_identity);
  h.UpdateFramed("raw");
  h.UpdateU64(width);
  h.UpdateU64(height);
  h.UpdateFramed(rgb);
  return h.HexDigest();
}

bool LooksLikeImageId(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.HexDigest();
}

}  // namespace maskd
