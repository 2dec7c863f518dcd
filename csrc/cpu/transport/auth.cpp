#include "cpu/transport/auth.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/logging.hpp"

#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace ddplite::auth {

namespace {

constexpr size_t kBlockBytes = 64;

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

uint32_t rotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the eight state words.
void compressBlock(uint32_t state[8], const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) | (uint32_t{block[4 * i + 2]} << 8) |
           uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotateRight(w[i - 15], 7) ^ rotateRight(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotateRight(w[i - 2], 17) ^ rotateRight(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotateRight(e, 6) ^ rotateRight(e, 11) ^ rotateRight(e, 25)) + ((e & f) ^ (~e & g)) +
                        kRoundConstants[i] + w[i];
    const uint32_t t2 = (rotateRight(a, 2) ^ rotateRight(a, 13) ^ rotateRight(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
  state[4] += e;
  state[5] += f;
  state[6] += g;
  state[7] += h;
}

}  // namespace

Digest sha256(const void* data, size_t bytes) {
  uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* input = static_cast<const uint8_t*>(data);
  size_t whole = bytes - bytes % kBlockBytes;
  for (size_t offset = 0; offset < whole; offset += kBlockBytes) compressBlock(state, input + offset);
  // The tail, the 0x80 marker, zeros, and the length in bits (big-endian): one or two blocks.
  uint8_t tail[2 * kBlockBytes] = {};
  const size_t left = bytes - whole;
  if (left > 0) std::memcpy(tail, input + whole, left);
  tail[left] = 0x80;
  const size_t tailBlocks = left + 1 + 8 <= kBlockBytes ? 1 : 2;
  const uint64_t bits = uint64_t{bytes} * 8;
  for (int i = 0; i < 8; ++i) tail[tailBlocks * kBlockBytes - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  for (size_t block = 0; block < tailBlocks; ++block) compressBlock(state, tail + block * kBlockBytes);
  Digest digest;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(state[i] >> (24 - 8 * j));
  }
  return digest;
}

Digest hmacSha256(const std::string& key, const std::string& message) {
  std::string blockKey = key;
  if (blockKey.size() > kBlockBytes) {
    const Digest hashed = sha256(blockKey.data(), blockKey.size());
    blockKey.assign(reinterpret_cast<const char*>(hashed.data()), hashed.size());
  }
  blockKey.resize(kBlockBytes, '\0');
  std::string inner(kBlockBytes, '\0'), outer(kBlockBytes, '\0');
  for (size_t i = 0; i < kBlockBytes; ++i) {
    inner[i] = static_cast<char>(blockKey[i] ^ 0x36);
    outer[i] = static_cast<char>(blockKey[i] ^ 0x5c);
  }
  inner += message;
  const Digest innerDigest = sha256(inner.data(), inner.size());
  outer.append(reinterpret_cast<const char*>(innerDigest.data()), innerDigest.size());
  return sha256(outer.data(), outer.size());
}

bool sameDigest(const Digest& a, const Digest& b) {
  uint8_t difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<uint8_t>(a[i] ^ b[i]);
  return difference == 0;
}

std::string randomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  size_t filled = 0;
  while (filled < bytes) {
    const ssize_t n = getrandom(out.data() + filled, bytes - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    filled += static_cast<size_t>(n);
  }
  return out;
}

Nonce newNonce() {
  const std::string bytes = randomBytes(sizeof(Nonce));
  Nonce nonce;
  std::memcpy(nonce.data(), bytes.data(), nonce.size());
  return nonce;
}

namespace {

std::string toHex(const void* data, size_t bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < bytes; ++i) {
    const auto byte = static_cast<const unsigned char*>(data)[i];
    hex += kHex[byte >> 4];
    hex += kHex[byte & 0xf];
  }
  return hex;
}

}  // namespace

std::string newSecret() {
  const std::string bytes = randomBytes(32);
  return toHex(bytes.data(), bytes.size());
}

std::string keyFromFile() {
  const std::string path = env::authKeyFile();
  if (path.empty()) return "";
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw std::runtime_error(strCat("DDPLITE_AUTH_KEY_FILE='", path, "' cannot be read: ", std::strerror(errno)));
  }
  std::string key((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinKeyBytes) {
    throw std::runtime_error(strCat("DDPLITE_AUTH_KEY_FILE='", path, "' holds ", key.size(), " bytes; a key needs at least ",
                                    kMinKeyBytes, " (make one with: head -c 32 /dev/urandom > ", path, ")"));
  }
  struct stat info = {};
  if (stat(path.c_str(), &info) == 0 && (info.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    DDPLITE_LOG(kWarn, "DDPLITE_AUTH_KEY_FILE='", path, "' is readable by other users (chmod 600 it)");
  }
  return key;
}

std::string meshSecretFromKey(const std::string& key, const std::string& mesh, const std::string& salt) {
  const Digest secret = hmacSha256(key, "ddplite-mesh|" + mesh + "|" + salt);
  return toHex(secret.data(), secret.size());
}

std::string keyCheck(const std::string& key, const std::string& salt) {
  const Digest check = hmacSha256(key, "ddplite-key-check|" + salt);
  return toHex(check.data(), 8);
}

}  // namespace ddplite::auth
