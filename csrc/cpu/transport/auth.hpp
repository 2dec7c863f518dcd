// Authentication of the TCP meshes' connections (tcp.cpp): each connection proves, when it is
// made, that both ends hold the group's secret, so a stranger on a ddplite port (a port scanner,
// an HTTP client, garbage, a replayed handshake) is dropped and never becomes a peer.
//
// The secret, one of two ways (docs/security.md has the trust model):
//   * from the store (the default): 32 random bytes (getrandom) that rank 0 of the group writes
//     to the group's store ("<mesh>auth/secret", hex) before it publishes its address; every
//     other rank reads it from there. Whoever can read the job's store is trusted, as torch's
//     store itself is.
//   * from a key file (DDPLITE_AUTH_KEY_FILE, on every rank): the key never enters the store.
//     Rank 0 writes "external <salt> <check>" there instead: a fresh random salt, from which
//     every rank derives the mesh's secret as HMAC(key, "ddplite-mesh" | mesh | salt), and a
//     check value HMAC(key, "ddplite-key-check" | salt) (first 8 bytes) that lets a rank with
//     another key, or none, say so at once instead of failing every handshake. Only holders of
//     the key can then join, even if the store is readable by others.
//
// Handshake, on every connection (the higher rank connects to the lower one, which listens):
//   listener  -> connector: Challenge {magic, nonce_L}                  (fresh random nonce)
//   connector -> listener:  Hello {magic, rank, size, nonce_C, HMAC(secret, "hello" | nonce_L | rank | size | nonce_C)}
//   listener  -> connector: Ack {magic, HMAC(secret, "ack" | nonce_C | nonce_L | listener's rank)}
// The listener accepts the rank only if the MAC is right (a Hello replayed from another
// connection carries a MAC over another nonce_L); the connector accepts the listener only if the
// Ack is right (so it never sends data to a process that took over a peer's port). MACs are
// compared in constant time. Cost: one more round trip per connection at set-up, nothing after.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddplite::auth {

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 16>;

// SHA-256 (FIPS 180-4) of `bytes` bytes at `data`.
Digest sha256(const void* data, size_t bytes);
// HMAC-SHA256 (RFC 2104) of `message` under `key`.
Digest hmacSha256(const std::string& key, const std::string& message);
// Equal digests, in time independent of where they differ.
bool sameDigest(const Digest& a, const Digest& b);

// `bytes` random bytes from the kernel (getrandom); throws std::runtime_error if it cannot.
std::string randomBytes(size_t bytes);
Nonce newNonce();

// A new secret for a group: 32 random bytes, as 64 hex digits (store values are text).
std::string newSecret();

// The key in DDPLITE_AUTH_KEY_FILE: the file's bytes, one trailing newline dropped; "" when the
// knob is unset. Throws std::runtime_error naming the file when it cannot be read or holds fewer
// than kMinKeyBytes bytes.
constexpr size_t kMinKeyBytes = 16;
std::string keyFromFile();
// A mesh's secret from the external key (hex), and the key's check value for `salt` (16 hex digits).
std::string meshSecretFromKey(const std::string& key, const std::string& mesh, const std::string& salt);
std::string keyCheck(const std::string& key, const std::string& salt);

}  // namespace ddplite::auth
