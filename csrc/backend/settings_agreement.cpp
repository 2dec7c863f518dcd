#include "backend/settings_agreement.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"

#include <string>
#include <utility>
#include <vector>

namespace ddplite {

namespace {

// The value of `name` in "NAME=value\n..." text, or "?" when it is not there.
std::string settingIn(const std::string& text, const std::string& name) {
  const std::string lines = "\n" + text;
  const size_t at = lines.find("\n" + name + "=");
  if (at == std::string::npos) return "?";
  const size_t begin = at + name.size() + 2;
  return lines.substr(begin, lines.find('\n', begin) - begin);
}

// The knobs `mine` sets differently in `theirs` (settingsText's form), described from this rank.
std::string settingDifferences(const std::vector<std::pair<std::string, std::string>>& mine, const std::string& theirs,
                               int peer) {
  std::string differences;
  for (const auto& [name, value] : mine) {
    const std::string other = settingIn(theirs, name);
    if (other == value) continue;
    differences += strCat(differences.empty() ? "" : "; ", name, "='", value, "' here, '", other, "' on rank ", peer);
  }
  return differences;
}

}  // namespace

void agreeOnGroupWideKnobs(StoreRendezvous& rendezvous, int rank, int size) {
  if (size == 1) return;
  const auto mine = env::groupWideSettings();
  std::string text;
  for (const auto& [name, value] : mine) text += strCat(name, "=", value, "\n");
  if (rank == 0) rendezvous.set("knobs/reference", text);
  const std::string reference = rank == 0 ? text : rendezvous.get("knobs/reference", "rank 0's settings");
  const std::string first = rendezvous.barrier("knobs/", rank, size, reference == text ? "" : strCat(rank, "\n", text),
                                               "every rank's settings");
  if (first.empty()) return;
  const size_t newline = first.find('\n');
  int peer = std::stoi(first.substr(0, newline));
  std::string theirs = first.substr(newline + 1);
  if (peer == rank || theirs == text) {
    peer = 0;
    theirs = reference;
  }
  throwValueError(OpContext{rank, size, "init", 0},
                  strCat("the ranks of this group run with different settings: ", settingDifferences(mine, theirs, peer)),
                  "set these DDPLITE_* variables the same on every rank (or unset them everywhere); "
                  "python -m torch_ddp_lite.collect_env shows what a rank sees");
}
}  // namespace ddplite
