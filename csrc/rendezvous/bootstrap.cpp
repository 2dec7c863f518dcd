#include "rendezvous/bootstrap.hpp"

#include "common/errors.hpp"

namespace ddplite {

std::string StoreBootstrap::broadcast(const std::string& key, const std::string& blob, int root) {
  if (size_ == 1) return blob;
  const std::string storeKey = "bootstrap/" + key;
  if (rank_ == root) {
    rendezvous_.set(storeKey, blob);
    return blob;
  }
  std::string value = rendezvous_.get(storeKey, strCat(key, " from rank ", root));
  try {
    if (rendezvous_.add(storeKey + "/read", 1) == size_ - 1) {  // every other rank has read it
      rendezvous_.erase(storeKey);
      rendezvous_.erase(storeKey + "/read");
    }
  } catch (const std::exception&) {
    // Cleanup only: the blob was read, and the run's own key prefix keeps it from a later run.
  }
  return value;
}

}  // namespace ddplite
