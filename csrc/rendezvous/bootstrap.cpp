#include "rendezvous/bootstrap.hpp"

#include "common/errors.hpp"

namespace ddplite {

std::string StoreBootstrap::broadcast(const std::string& key, const std::string& blob, int root) {
  const std::string storeKey = "bootstrap/" + key;
  if (rank_ == root) {
    rendezvous_.set(storeKey, blob);
    return blob;
  }
  return rendezvous_.get(storeKey, strCat(key, " from rank ", root));
}

}  // namespace ddplite
