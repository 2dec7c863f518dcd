#include "cpu/shm/shm_group.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/numa.hpp"
#include "common/process_identity.hpp"
#include "cpu/shm/futex_wait.hpp"
#include "cpu/transport/wait_policy.hpp"

#include <unistd.h>

#include <csignal>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <thread>

namespace ddplite::cpu {

namespace {

// peersStarted's look: at most this long, none when the group has more ranks than this process
// has CPUs (a path decision for an async op, not a wait for data: docs/shared-memory.md, "Waiting").
constexpr auto kStartedSpin = std::chrono::microseconds(50);
// A step's wait yields its core every 64 pauses while it spins (an 8-byte all_reduce at 4
// namespace hosts x 2 ranks on 2 cores: docs/data/crosshost/shm_yield_ab.txt); peersStarted, a
// look that decides a path rather than a wait for data, every 1024.
constexpr unsigned kYieldEvery = 64;
// A step's wait spins while the group has at most this many ranks per CPU of this process, and
// sleeps after 64 pauses beyond (docs/data/shm_spin_ab.txt: with yields, the spin took a small
// all_reduce at 3-4 ranks on 2 cores from 37-82 to 34-48 us; at 64 ranks it sped the op up but
// slowed the first collective while ranks still arrived, 0.2-0.5 s to 5-10 s from the last
// rank's init): kSpinRanksPerCpu, cpu/transport/wait_policy.hpp, which the TCP waits share.
constexpr unsigned kStartedYieldEvery = 1024;

constexpr auto kSleepSlice = std::chrono::milliseconds(20);
constexpr auto kLivenessInterval = std::chrono::milliseconds(50);  // a poll() of the peer's socket and of its process
constexpr size_t kAlignment = 64;
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

// Whether a flag value has reached `target`, modulo 2^32 (steps wrap after 4 billion chunks).
bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

const char* flagVerb(int which) {
  switch (which) {
    case 0: return "post its data for";
    case 1: return "reduce its slice of";
    default: return "finish reading";
  }
}

}  // namespace

// One rank's flags and fingerprints. The segment starts zero-filled (posix_fallocate), which is
// every flag at 0 ("no step yet"), `broken` at 0 and the wake words at 0.
// 256 bytes: the first three cache lines are written by the owner only; the last by waiters of
// any process (`sleepers`, `wakeups`; the owner's identity too, written once at set-up), so that
// a waiter announcing itself does not take the line holding the flags it polls from under the
// owner (docs/shared-memory.md, "Control block").
struct alignas(kAlignment) ShmGroup::RankControl {
  std::atomic<uint32_t> flags[3];   // indexed by Flag: posted, reduced, consumed
  std::atomic<uint64_t> startedSeq;  // markStarted: the latest op this rank has started
  // 1 once this rank broke the group (breakGroup): stored seq_cst, then every rank's `wakeups` is
  // bumped; waiters load it seq_cst after their wake ticket.
  std::atomic<uint32_t> broken;
  // Why this rank left the group for good (Departure; 0: it has not): compare-exchanged seq_cst
  // by abort(); read seq_cst by a peer's liveness look, which then reloads the flag it waits for
  // and raises when it is still short. A rank aborted from another thread than its collective's
  // may store one more flag after it: its op fails anyway, so the peer's error stands.
  std::atomic<uint32_t> departed;
  WireHeader headers[2];            // fingerprint of the step with that parity; written before `posted`
  // The collective this rank last ran over TCP (announceTcpCollective): a seqlock, see the header.
  std::atomic<uint32_t> tcpAnnounced;
  std::atomic<uint64_t> tcpHeader[sizeof(WireHeader) / sizeof(uint64_t)];
  // With an arrival tree: the latest step whose arrival this rank has finished (posted: [0],
  // consumed: [1]), stored release after arrive() returns, so that a peer that sees this rank's
  // process ended tells "arrived, then exited" (no failure) from "died between its flag and its
  // arrival" (the step never completes). A process's stores are visible to every other once it is
  // seen to have ended (its exit passed through the kernel, a full barrier); read acquire.
  std::atomic<uint32_t> arrived[2];
  // Written by waiters, on a line of their own.
  alignas(kAlignment) std::atomic<uint32_t> sleepers;  // waiters of any process blocked on this rank
  // The futex word those waiters sleep on: bumped (seq_cst) by the owner after a flag store that
  // found sleepers, and by any rank's abort() or breakGroup(). A count, never a step: bumping it
  // from another process changes no flag.
  std::atomic<uint32_t> wakeups;
  // Written once at set-up, before the store exchange; read by a waiter's liveness look (every
  // 50 ms of a long wait), so it may share the waiters' line: no hot path touches it.
  ProcessIdentity process;
  // This rank's NUMA node (numaNodeOfThisProcess; -1: not pinned to one), written once at set-up
  // like `process`; every rank reads all of them once, after the barrier, to shape the tree.
  int32_t numaNode;
};

// Where waiters for every peer at once sleep (waitForAll), one per flag kind, each on a cache line
// of its own at the start of the segment. `sleepers`: how many such waiters of any process are
// blocked or about to block; `release`: their futex word, bumped (seq_cst) by a rank that stores
// the flag, finds sleepers and sees every rank at its step (publish), and by abort() and
// breakGroup(). So a step wakes each waiter once, when the last rank arrives, instead of once per
// peer it waited for in turn: with more ranks than cores that was P wake-ups per rank per step.
// With an arrival tree (see the header), also the step the whole group reached for that flag
// (`treeReached`: stored seq_cst by the rank that completes the root, loaded seq_cst or acquire by
// waiters), and, in the `posted` line only, the first fingerprint disagreement a completer found
// (`treeMismatch`: (a+1) << 32 | (b+1) for ranks a and b, compare-exchanged seq_cst before the root
// is released; 0: none) and whether any rank broke the group (`anyBroken`: stored seq_cst by
// breakGroup() before its wakes; lets a tree wait skip reading every rank's `broken`), and who
// combined the step of each parity (`combined`: step << 32 | (rank + 1), 0 for none, stored relaxed
// by the root's completer before its seq_cst store of treeReached, which publishes it; postCombining).
struct alignas(kAlignment) ShmGroup::GroupWake {
  std::atomic<uint32_t> sleepers;
  std::atomic<uint32_t> release;
  std::atomic<uint32_t> treeReached;
  std::atomic<uint32_t> anyBroken;
  std::atomic<uint64_t> treeMismatch;
  std::atomic<uint64_t> combined[2];
};

// One counter of the arrival tree per step parity, on a cache line of its own (the members of one
// node share it). Zero-filled at creation; reset to 0 by the arrival that completes the node.
struct alignas(kAlignment) ShmGroup::TreeNode {
  std::atomic<uint32_t> arrivals[2];
};

// A tree node's started summary (markStarted; 0: none yet), on a line of its own after the
// counters: raised once per op by ranks starting it, spun on (the root's) by peersStarted, so it
// stays off the lines the step's arrivals hit.
struct alignas(kAlignment) ShmGroup::StartedSummary {
  std::atomic<uint64_t> lowest;
};

size_t ShmGroup::groupWakeBytes() {
  return roundUp(sizeof(GroupWake) * kFlagKinds, kAlignment);
}

size_t ShmGroup::treeBytes(int treeCapacity) {
  const size_t nodes = static_cast<size_t>(treeCapacity);
  return sizeof(TreeNode) * nodes * 2 + sizeof(StartedSummary) * nodes;  // posted and consumed; summaries
}

std::unique_ptr<ShmGroup> ShmGroup::create(StoreRendezvous& rendezvous, Transport& liveness, int rank, int size,
                                           size_t chunkBytes, std::string* whyNot, bool* spansHosts,
                                           std::vector<int> processGroupRanks) {
  chunkBytes = roundUp(chunkBytes, kAlignment);
  const int fanIn = env::shmTreeFanIn(size);
  // Laid out for any shape (the ranks' NUMA nodes are learnt through the segment itself).
  const int treeCapacity = ArrivalTree::nodeCapacity(size, fanIn);
  const size_t bytes = groupWakeBytes() + treeBytes(treeCapacity) + roundUp(sizeof(RankControl) * size, kAlignment) +
                       2 * chunkBytes * size;
  if (chunkBytes > kMaxChunkBytes) {  // env.cpp caps the knob; this keeps the size arithmetic exact
    *whyNot = strCat("a chunk of ", chunkBytes, " bytes is over the ", kMaxChunkBytes, "-byte limit");
    return nullptr;
  }
  ShmSegment::Outcome outcome = ShmSegment::create(rendezvous, rank, size, bytes);
  if (!outcome.segment) {
    *whyNot = outcome.whyNot;
    *spansHosts = outcome.spansHosts;
    return nullptr;
  }
  std::unique_ptr<ShmGroup> group(
      new ShmGroup(std::move(outcome.segment), liveness, rank, size, chunkBytes, treeCapacity));
  group->processGroupRanks_ = std::move(processGroupRanks);
  RankControl& mine = group->control(rank);
  mine.process = ProcessIdentity::ofThisProcess();
  const env::TestHooks hooks = env::testHooks();
  mine.numaNode = hooks.shmNumaNodes > 0 ? rank % hooks.shmNumaNodes : numaNodeOfThisProcess();
  group->step_ = hooks.shmFirstStep;  // every flag "at" the step before the first
  for (auto& word : mine.flags) word.store(hooks.shmFirstStep, std::memory_order_relaxed);
  for (auto& word : mine.arrived) word.store(hooks.shmFirstStep, std::memory_order_relaxed);
  // Every rank stores the same value; nobody reads it before the barrier below.
  for (Flag which : {Flag::kPosted, Flag::kConsumed}) {
    group->groupWake(which).treeReached.store(hooks.shmFirstStep, std::memory_order_relaxed);
  }
  if (hooks.shmFaultRank == rank) group->faultSeq_ = hooks.shmFaultSeq;
  if (hooks.shmExitUnarrivedRank == rank) group->exitUnarrivedSeq_ = hooks.shmExitUnarrivedSeq;
  if (hooks.shmDelayArrivalRank == rank) {
    group->delayArrivalSeq_ = hooks.shmDelayArrivalSeq;
    group->delayArrival_ = std::chrono::milliseconds(hooks.shmDelayArrivalMs);
  }
  group->combineDelay_ = std::chrono::milliseconds(hooks.shmCombineDelayMs);
  // Every rank's process identity and first flags are visible to the others after this store
  // round trip (plain fields written before it, read only after it).
  rendezvous.barrier("shm/ready/", rank, size, "", "every rank to map shared memory");
  if (fanIn >= 2) {  // every rank reads the same nodes, so every rank builds the same tree
    std::vector<int> domains(static_cast<size_t>(size));
    for (int owner = 0; owner < size; ++owner) domains[static_cast<size_t>(owner)] = group->control(owner).numaNode;
    group->tree_ = ArrivalTree(size, fanIn, domains);
    TORCH_INTERNAL_ASSERT(group->tree_.nodeCount() <= treeCapacity, "arrival tree over its capacity");
  }
  return group;
}

ShmGroup::ShmGroup(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size, size_t chunkBytes,
                   int treeCapacity)
    : segment_(std::move(segment)),
      liveness_(liveness),
      rank_(rank),
      size_(size),
      chunkBytes_(chunkBytes),
      tree_(size, 0),
      treeCapacity_(treeCapacity),
      controlsOffset_(groupWakeBytes() + treeBytes(treeCapacity)),
      spin_(size <= kSpinRanksPerCpu * usableCpus() ? env::shmSpin() : std::chrono::microseconds(0)),
      startedSpin_(size <= usableCpus() ? kStartedSpin : std::chrono::microseconds(0)) {
  static_assert(sizeof(RankControl) == 4 * kAlignment, "a control block is four cache lines (docs/shared-memory.md)");
}

ShmGroup::~ShmGroup() = default;

ShmGroup::RankControl& ShmGroup::control(int owner) const {
  return reinterpret_cast<RankControl*>(segment_->base() + controlsOffset_)[owner];
}

ShmGroup::GroupWake& ShmGroup::groupWake(Flag which) const {
  return reinterpret_cast<GroupWake*>(segment_->base())[static_cast<int>(which)];
}

ShmGroup::TreeNode& ShmGroup::treeNode(Flag which, int node) const {
  const int kind = which == Flag::kPosted ? 0 : 1;
  return reinterpret_cast<TreeNode*>(segment_->base() + groupWakeBytes())[kind * treeCapacity_ + node];
}

std::string ShmGroup::syncDescription() const {
  if (!tree_.enabled()) return "flat waits (each rank reads every peer's flag at every step)";
  std::string numa;
  if (tree_.domainCount() > 1) numa = strCat("; level 0 within each of ", tree_.domainCount(), " NUMA nodes");
  return strCat("an arrival tree (fan-in ", tree_.fanIn(), ", ", tree_.levels(), tree_.levels() == 1 ? " level" : " levels",
                numa, ")");
}

std::atomic<uint32_t>& ShmGroup::flag(int owner, Flag which) const {
  return control(owner).flags[static_cast<int>(which)];
}

char* ShmGroup::buffer(int owner, uint32_t step) const {
  const size_t controls = controlsOffset_ + roundUp(sizeof(RankControl) * size_, kAlignment);
  return segment_->base() + controls + (static_cast<size_t>(owner) * 2 + (step & 1)) * chunkBytes_;
}

void ShmGroup::beginCollective(const Fingerprint& fingerprint, uint64_t refusedSeq) {
  refusedSeq_ = refusedSeq;
  nextPart_ = fingerprint.seq == lastSeq_ ? static_cast<uint8_t>(nextPart_ + 1) : 0;
  lastSeq_ = fingerprint.seq;
  current_ = fingerprint;
  current_.part = nextPart_;
  open_ = true;
}

uint32_t ShmGroup::beginStep(Deadline deadline) {
  settleDeferredCheck(deadline);
  const uint32_t step = ++step_;
  waitForAll(Flag::kConsumed, step - 2, deadline);
  return step;
}

void ShmGroup::publish(Flag which, uint32_t step) {
  RankControl& mine = control(rank_);
  mine.flags[static_cast<int>(which)].store(step, std::memory_order_seq_cst);
  if (mine.sleepers.load(std::memory_order_seq_cst) > 0) wake(mine);
  if (treeSync(which)) {
    if (exitUnarrivedSeq_ != 0 && which == Flag::kPosted && current_.seq == exitUnarrivedSeq_) ::raise(SIGKILL);
    if (delayArrivalSeq_ != 0 && which == Flag::kPosted && current_.seq == delayArrivalSeq_) {
      std::this_thread::sleep_for(delayArrival_);
    }
    arrive(which, step);
    markArrived(which, step);
    return;
  }
  // The store above, then `sleepers`, then every rank's flag, all seq_cst: of the ranks that
  // store this step after a waiter counted itself, the last one in that order sees every flag at
  // the step and the waiter's count, so it bumps `release` after the waiter's ticket (waitForAll).
  GroupWake& group = groupWake(which);
  if (group.sleepers.load(std::memory_order_seq_cst) > 0 && everyRankReached(which, step)) {
    group.release.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&group.release);
  }
}

void ShmGroup::arrive(Flag which, uint32_t step) {
  int member = tree_.positionOf(rank_);
  for (int level = 0; level < tree_.levels(); ++level) {
    std::atomic<uint32_t>& count = treeNode(which, tree_.nodeOf(level, member)).arrivals[step & 1];
    // acq_rel: releases this rank's data, flag and header (and, for a completer, every arrival it
    // acquired below); the completing arrival acquires all of the node's, through the release
    // sequence of the counter's read-modify-writes.
    const uint32_t before = count.fetch_add(1, std::memory_order_acq_rel);
    if (before + 1 < static_cast<uint32_t>(tree_.membersOf(level, member))) return;
    // Relaxed: the next arrival at this counter (step + 2) happens-after the tree wait that this
    // completion leads to (see the header: every rank arrives for posted s, resets included,
    // before it publishes consumed s, and arrives at step s + 2 only after beginStep's tree wait
    // for consumed s).
    count.store(0, std::memory_order_relaxed);
    if (which == Flag::kPosted) compareMembers(level, member, step);
    member = tree_.parentMember(member);
  }
  if (which == Flag::kPosted && combine_ != nullptr) combineAtRoot(step);
  GroupWake& group = groupWake(which);
  // seq_cst, then `sleepers`: the waiter's protocol in waitForTree (as publish's for flat waits).
  group.treeReached.store(step, std::memory_order_seq_cst);
  if (group.sleepers.load(std::memory_order_seq_cst) > 0) {
    group.release.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&group.release);
  }
}

void ShmGroup::compareMembers(int level, int member, uint32_t step) {
  const int first = tree_.firstMemberOf(member);
  const int members = tree_.membersOf(level, member);
  const int reference = tree_.representative(level, first);
  // Stable: a member writes the header of this parity again only at step + 2, after every rank,
  // this one included, consumed `step`. Compared as waitPosted() would (an equivalence), so a
  // record means every rank disagrees with one of the two and raises: the group is then broken,
  // and no stale record can stand in for a later step's.
  const WireHeader& expected = control(reference).headers[step & 1];
  for (int other = first + 1; other < first + members; ++other) {
    const int rank = tree_.representative(level, other);
    if (sameCollectiveStep(control(rank).headers[step & 1], expected)) continue;
    uint64_t none = 0;
    const uint64_t pair = (static_cast<uint64_t>(reference + 1) << 32) | static_cast<uint64_t>(rank + 1);
    groupWake(Flag::kPosted).treeMismatch.compare_exchange_strong(none, pair, std::memory_order_seq_cst);
    return;
  }
}

void ShmGroup::combineAtRoot(uint32_t step) {
  GroupWake& group = groupWake(Flag::kPosted);
  // Acquire: each completer recorded before it arrived further up, and this rank's read-modify-
  // writes on the way up acquired every arrival. A record: the ranks' steps differ (sizes,
  // dtypes), so there is nothing to combine; every rank raises after its wait.
  if (group.treeMismatch.load(std::memory_order_acquire) != 0) return;
  if (combineDelay_.count() > 0) std::this_thread::sleep_for(combineDelay_);  // DDPLITE_TEST_HOOKS
  (*combine_)();
  // Relaxed: published by the seq_cst store of treeReached that follows (arrive), which every
  // tree wait acquires before combinedBy() reads this.
  group.combined[step & 1].store((static_cast<uint64_t>(step) << 32) | static_cast<uint32_t>(rank_ + 1),
                                 std::memory_order_relaxed);
}

void ShmGroup::markArrived(Flag which, uint32_t step) {
  // Release: after every read-modify-write of the arrival (see RankControl::arrived).
  control(rank_).arrived[which == Flag::kPosted ? 0 : 1].store(step, std::memory_order_release);
}

bool ShmGroup::everyRankReached(Flag which, uint32_t step) const {
  for (int owner = 0; owner < size_; ++owner) {
    if (!reached(flag(owner, which).load(std::memory_order_seq_cst), step)) return false;
  }
  return true;
}

void ShmGroup::wake(RankControl& owner) {
  owner.wakeups.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(&owner.wakeups);
}

void ShmGroup::post(uint32_t step, uint64_t stepBytes) {
  control(rank_).headers[step & 1] = encodeHeader(current_, stepBytes);
  // Only some algorithms mark `reduced`; keep it one step behind `posted` so that the modulo-2^32
  // comparison never meets a flag more than 2^31 steps old. Published by the posted store below
  // (a reader waits for `reduced` only after it acquired `posted`).
  flag(rank_, Flag::kReduced).store(step - 1, std::memory_order_relaxed);
  publish(Flag::kPosted, step);
  if (faultSeq_ != 0 && current_.seq == faultSeq_) throw std::bad_alloc();  // DDPLITE_TEST_HOOKS
}

void ShmGroup::postCombining(uint32_t step, uint64_t stepBytes, c10::function_ref<void()> combine) {
  TORCH_INTERNAL_ASSERT(combinesOnArrival(), "postCombining without an arrival tree: nobody would combine");
  struct Clear {
    const c10::function_ref<void()>*& slot;
    ~Clear() { slot = nullptr; }
  } clear{combine_};
  combine_ = &combine;
  post(step, stepBytes);
}

int ShmGroup::combinedBy(uint32_t step) const {
  // Stable until every rank consumed `step`: the next store to this parity comes with step + 2.
  const uint64_t word = groupWake(Flag::kPosted).combined[step & 1].load(std::memory_order_relaxed);
  const uint32_t rankPlusOne = static_cast<uint32_t>(word & 0xffffffffu);
  if (rankPlusOne == 0 || static_cast<uint32_t>(word >> 32) != step) {
    // The rank that completed the step did not combine: it was not in this collective's combining
    // path, yet its fingerprint agreed (not expected: every such rank posts through postCombining).
    throw TransportError(TransportError::Kind::kMismatch, -1,
                         strCat("no rank combined step ", step, " of ", current_.describe(),
                                " in shared memory although every rank posted it; a rank on another path?"));
  }
  return static_cast<int>(rankPlusOne) - 1;
}

void ShmGroup::markReduced(uint32_t step) {
  publish(Flag::kReduced, step);
}

void ShmGroup::markConsumed(uint32_t step) {
  publish(Flag::kConsumed, step);
}

void ShmGroup::waitPosted(int peer, uint32_t step, uint64_t stepBytes, Deadline deadline) {
  waitFor(peer, Flag::kPosted, step, deadline);
  // The peer cannot overwrite this header before this rank consumes `step` (beginStep).
  const WireHeader& header = control(peer).headers[step & 1];
  if (!agrees(header, current_, stepBytes)) {
    const WireHeader copy = header;
    throw TransportError(TransportError::Kind::kMismatch, peer,
                         headerMismatch(copy, current_, stepBytes, describePeer(peer)));
  }
}

void ShmGroup::waitAllPosted(uint32_t step, uint64_t stepBytes, Deadline deadline) {
  waitForAll(Flag::kPosted, step, deadline);
  if (treeSync(Flag::kPosted)) {
    checkTreeAgreement(step, stepBytes, deadline);
    return;
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_) waitPosted(peer, step, stepBytes, deadline);  // reached: checks the header only
  }
}

void ShmGroup::checkAllPostedLater(uint32_t step, uint64_t stepBytes) {
  // seq_cst, like this rank's `posted` store before it and a peer's load of it in waitPosted:
  // of this rank and a late peer, at least one sees the other's post (no store buffering), so a
  // disagreement raises on one side at once.
  bool allPosted = true;
  if (treeSync(Flag::kPosted)) {
    // Deferring is always safe: the completer recorded any disagreement for the later check.
    allPosted = reached(groupWake(Flag::kPosted).treeReached.load(std::memory_order_seq_cst), step);
  } else {
    for (int peer = 0; peer < size_ && allPosted; ++peer) {
      allPosted = peer == rank_ || reached(flag(peer, Flag::kPosted).load(std::memory_order_seq_cst), step);
    }
  }
  if (allPosted) {  // the root came last: check now, nothing to wait for
    waitAllPosted(step, stepBytes, Clock::now());
    markConsumed(step);
    return;
  }
  deferred_ = DeferredCheck{true, step, stepBytes, current_, refusedSeq_};
}

void ShmGroup::settleDeferredCheck(Deadline deadline) {
  if (!deferred_.pending) return;
  // Checked as the collective it belongs to (errors name it), then back to the current one,
  // whether the check passes or throws.
  struct Restore {
    ShmGroup& group;
    Fingerprint fingerprint;
    uint64_t refusedSeq;
    ~Restore() {
      group.current_ = fingerprint;
      group.refusedSeq_ = refusedSeq;
    }
  } restore{*this, current_, refusedSeq_};
  const DeferredCheck check = deferred_;
  deferred_ = DeferredCheck{};
  current_ = check.fingerprint;
  refusedSeq_ = check.refusedSeq;
  waitAllPosted(check.step, check.stepBytes, deadline);
  markConsumed(check.step);
}

void ShmGroup::waitAllReduced(uint32_t step, Deadline deadline) {
  waitForAll(Flag::kReduced, step, deadline);
}

void ShmGroup::waitForAll(Flag which, uint32_t target, Deadline deadline) {
  if (treeSync(which)) {
    waitForTree(which, target, deadline);
    if (refusedSeq_ == 0) return;
    for (int peer = 0; peer < size_; ++peer) {  // right after a refusal only
      if (peer != rank_) checkNotRefusedOverTcp(peer);
    }
    return;
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    waitUntilReached(peer, which, target, deadline, &groupWake(which));
    checkNotRefusedOverTcp(peer);
  }
}

void ShmGroup::waitFor(int peer, Flag which, uint32_t target, Deadline deadline) {
  waitUntilReached(peer, which, target, deadline, nullptr);
  checkNotRefusedOverTcp(peer);
}

void ShmGroup::waitForTree(Flag which, uint32_t target, Deadline deadline) {
  GroupWake& group = groupWake(which);
  // seq_cst on the first look: see checkAllPostedLater; acquire while spinning (pairs with the
  // root completer's store).
  if (reached(group.treeReached.load(std::memory_order_seq_cst), target)) return;
  // Bounded by the deadline and cut short by this rank's abort() or a broken group, as in
  // waitUntilReached.
  spinUntil<kYieldEvery>(std::min(deadline, Clock::now() + spinFor(spin_, callerSpin_)),
                         [&] { return reached(group.treeReached.load(std::memory_order_acquire), target) || stopHint(); });
  if (reached(group.treeReached.load(std::memory_order_acquire), target)) return;
  // Who is missing is looked up only on this slow path, after a first slice: a wait that ends
  // with the step's last arrival reads no peer's flag.
  auto nextLook = Clock::now() + kSleepSlice;
  while (true) {
    const auto now = Clock::now();
    if (now >= deadline) throwTreeTimeout(which, target);
    if (now >= nextLook) {
      lookAtMissingPeers(which, target);
      nextLook = now + kLivenessInterval;
    }
    // waitUntilReached's sleep protocol on the group's word: announce, take a ticket, look.
    group.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t ticket = group.release.load(std::memory_order_seq_cst);
    const bool stop = aborted_.load(std::memory_order_seq_cst) ||
                      groupWake(Flag::kPosted).anyBroken.load(std::memory_order_seq_cst) != 0;
    if (!stop && !reached(group.treeReached.load(std::memory_order_seq_cst), target)) {
      futexWait(&group.release, ticket, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline - now));
    }
    group.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(group.treeReached.load(std::memory_order_acquire), target)) return;
    if (stop) throwIfStopped(std::max(firstMissing(which, target), 0));
  }
}

void ShmGroup::checkTreeAgreement(uint32_t step, uint64_t stepBytes, Deadline deadline) {
  // Acquire: the completer's compare-exchange precedes its release of the root, which this rank's
  // wait acquired.
  const uint64_t record = groupWake(Flag::kPosted).treeMismatch.load(std::memory_order_acquire);
  if (record == 0) return;  // every rank posted the same header as this one
  // The two recorded ranks disagree, so this rank disagrees with at least one: waitPosted names it.
  for (const int peer : {static_cast<int>(record >> 32) - 1, static_cast<int>(record & 0xffffffffu) - 1}) {
    if (peer != rank_) waitPosted(peer, step, stepBytes, deadline);
  }
}

int ShmGroup::firstMissing(Flag which, uint32_t target) const {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && !reached(flag(peer, which).load(std::memory_order_acquire), target)) return peer;
  }
  return -1;
}

void ShmGroup::lookAtMissingPeers(Flag which, uint32_t target) const {
  bool anyMissing = false;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || reached(flag(peer, which).load(std::memory_order_acquire), target)) continue;
    anyMissing = true;
    throwIfPeerGone(peer, which, target);
    checkPeerStayedOnPath(peer, which, target);
  }
  if (anyMissing) return;
  // Every flag is stored but the root is not released: the last arrivals are still climbing the
  // tree, or a rank died (or left) between its flag and its arrival, and the step never completes.
  // A peer gone after its arrival (a non-root of a final reduce that exited while the last rank
  // climbs) holds nothing up.
  const int kind = which == Flag::kPosted ? 0 : 1;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const Gone gone = peerGone(peer);
    if (gone.how == nullptr) continue;
    // Acquire, after seeing it gone: see RankControl::arrived.
    if (reached(control(peer).arrived[kind].load(std::memory_order_acquire), target)) continue;
    throwPeerGone(peer, gone,
                  strCat("waited for step ", target, " of ", current_.describe(),
                         " to complete in shared memory (its flag was stored, its arrival never reached the group)"));
  }
}

ShmGroup::Gone ShmGroup::peerGone(int peer) const {
  // seq_cst: see RankControl::departed.
  switch (static_cast<Departure>(control(peer).departed.load(std::memory_order_seq_cst))) {
    case Departure::kAborted: return {" aborted the process group (abort() on that rank)", false};
    case Departure::kFailed: return {" stopped after a failure it saw in this process group", false};
    case Departure::kShutDown: return {" shut the process group down (destroy_process_group() on that rank)", false};
    case Departure::kExiting: return {"'s process is exiting with ops of this group pending", false};
  }
  if (liveness_.peerHungUp(peer)) return {" closed the connection", true};
  if (peerProcessEnded(peer)) return {"'s process ended", true};
  return {};
}

void ShmGroup::throwIfPeerGone(int peer, Flag which, uint32_t target) const {
  // a peer may publish its last flag and then exit or leave: look at the flag once more first
  const Gone gone = peerGone(peer);
  if (gone.how != nullptr && !reached(flag(peer, which).load(std::memory_order_acquire), target)) {
    throwPeerGone(peer, gone,
                  strCat("waited for it to ", flagVerb(static_cast<int>(which)), " step ", target, " in shared memory"));
  }
}

void ShmGroup::throwPeerGone(int peer, Gone gone, const std::string& waited) const {
  throw TransportError(TransportError::Kind::kPeerClosed, peer,
                       strCat(describePeer(peer), gone.how, " while this rank ", waited,
                              gone.crashed ? "; that rank probably exited or crashed" : ""));
}

void ShmGroup::throwTreeTimeout(Flag which, uint32_t target) const {
  const int peer = firstMissing(which, target);
  if (peer >= 0) throwTimeout(peer, which, target);
  throw TransportError(TransportError::Kind::kTimeout, rank_,
                       strCat("Timed out waiting for step ", target, " of ", current_.describe(),
                              " to complete in shared memory: every rank stored its flag, but the last arrival "
                              "never reached the top of the arrival tree (a rank that died in between?)"));
}

bool ShmGroup::peerProcessEnded(int peer) const {
  return stateOf(control(peer).process) == ProcessState::kEnded;
}

void ShmGroup::checkNotRefusedOverTcp(int peer) const {
  if (refusedSeq_ == 0) return;
  // Right after a refusal: a peer that ran the refused op over TCP announced it before it
  // published this flag (release, then the flag's seq_cst store; acquired above).
  WireHeader header;
  if (tcpAnnouncement(peer, &header) && header.seq == refusedSeq_) {
    throwWentOverTcp(peer, header, "it ran over TCP the op this rank refused");
  }
}

void ShmGroup::waitUntilReached(int peer, Flag which, uint32_t target, Deadline deadline, GroupWake* group) {
  std::atomic<uint32_t>& word = flag(peer, which);
  // seq_cst: see checkAllPostedLater (free on x86, where every load is one).
  if (reached(word.load(std::memory_order_seq_cst), target)) return;
  // The spin ends at the op's deadline at the latest, and at once when this rank aborted or any
  // rank broke the group (stopHint; the loop below reads both with seq_cst and throws). A peer's
  // abort() is seen by the loop's look at the peer (throwIfPeerGone), after the first slice.
  spinUntil<kYieldEvery>(std::min(deadline, Clock::now() + spinFor(spin_, callerSpin_)),
                         [&] { return reached(word.load(std::memory_order_acquire), target) || stopHint(); });
  if (reached(word.load(std::memory_order_acquire), target)) return;
  RankControl& theirs = control(peer);
  // The first look at the peer's socket and process (two system calls and a /proc read) comes
  // after a first slice, as waitForTree's: a wait that ends with the peer's flag costs none (with
  // more than two ranks per core, every wait takes this path). A peer that died is still named within
  // kSleepSlice + kLivenessInterval.
  auto nextLivenessCheck = Clock::now() + kSleepSlice;
  while (true) {
    const auto now = Clock::now();
    if (now >= deadline) throwTimeout(peer, which, target);
    if (now >= nextLivenessCheck) {
      throwIfPeerGone(peer, which, target);
      nextLivenessCheck = now + kLivenessInterval;
    }
    checkPeerStayedOnPath(peer, which, target);
    // Sleep protocol: announce (sleepers), take a ticket (wakeups), then look at everything that
    // ends the wait; all seq_cst. A publisher stores its flag, then reads `sleepers`, and bumps
    // `wakeups` if it found any; abort() and breakGroup() store their flag, then bump. Either the
    // look below sees the store, or the bump comes after the ticket and the futex does not sleep
    // (or is woken): no wake-up is lost, so an abort is seen at once, not after a slice.
    // A waiter for every peer (`group`) sleeps on the group's word instead, woken once the last
    // rank has stored the flag (publish): the same protocol on `release`.
    std::atomic<uint32_t>& sleepers = group ? group->sleepers : theirs.sleepers;
    std::atomic<uint32_t>& wakeWord = group ? group->release : theirs.wakeups;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t ticket = wakeWord.load(std::memory_order_seq_cst);
    const bool stop = aborted_.load(std::memory_order_seq_cst) || brokenBy() >= 0;
    if (!stop && !reached(word.load(std::memory_order_seq_cst), target)) {
      futexWait(&wakeWord, ticket, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline - now));
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(word.load(std::memory_order_acquire), target)) return;
    throwIfStopped(peer);
  }
}

bool ShmGroup::stopHint() const {
  // Relaxed: a hint that ends a spin early; the waits then read both words with seq_cst.
  return aborted_.load(std::memory_order_relaxed) ||
         groupWake(Flag::kPosted).anyBroken.load(std::memory_order_relaxed) != 0;
}

int ShmGroup::brokenBy() const {
  for (int owner = 0; owner < size_; ++owner) {
    if (owner != rank_ && control(owner).broken.load(std::memory_order_seq_cst) != 0) return owner;
  }
  return -1;
}

void ShmGroup::throwIfStopped(int peer) const {
  if (aborted_.load(std::memory_order_seq_cst)) {
    throw TransportError(TransportError::Kind::kAborted, peer, "the process group was aborted");
  }
  const int breaker = brokenBy();
  if (breaker >= 0) {
    throw TransportError(TransportError::Kind::kPeerClosed, breaker,
                         strCat(describePeer(breaker), " left ", current_.describe(),
                                " part-way after an error on that rank, and broke the group's shared memory"));
  }
}

void ShmGroup::throwTimeout(int peer, Flag which, uint32_t target) const {
  throw TransportError(TransportError::Kind::kTimeout, peer,
                       strCat("Timed out waiting for ", describePeer(peer), " to ", flagVerb(static_cast<int>(which)),
                              " step ", target, " of ", current_.describe(), " (it is at step ",
                              flag(peer, Flag::kPosted).load(), "; this rank at ", step_, ")"));
}

namespace {

// Raises `word` to `value` (compare-exchange, seq_cst); false when it already held as much.
bool raiseTo(std::atomic<uint64_t>& word, uint64_t value) {
  uint64_t held = word.load(std::memory_order_seq_cst);
  while (held < value && !word.compare_exchange_weak(held, value, std::memory_order_seq_cst)) {
  }
  return held < value;
}

}  // namespace

void ShmGroup::markStarted(uint64_t seq) {
  // Raised, not stored, so that two threads of this rank (never at once today: the worker's claim
  // orders them) could not lower the value a summary already took. seq_cst: summariseStarted.
  if (!raiseTo(control(rank_).startedSeq, seq)) return;  // nothing new to summarise
  if (tree_.levels() > 0) summariseStarted(seq);
}

std::atomic<uint64_t>& ShmGroup::startedSummary(int node) const {
  const size_t counters = sizeof(TreeNode) * static_cast<size_t>(treeCapacity_) * 2;
  return reinterpret_cast<StartedSummary*>(segment_->base() + groupWakeBytes() + counters)[node].lowest;
}

uint64_t ShmGroup::startedOf(int level, int member) const {
  if (level == 0) return control(tree_.rankAt(member)).startedSeq.load(std::memory_order_seq_cst);
  return startedSummary(tree_.nodeIndex(level - 1, member)).load(std::memory_order_seq_cst);
}

// Bottom up: the lowest startedSeq among the node's members (this rank's own value, or the
// summary it just raised, among them), raised into the node's summary. Two ranks that raise the
// summaries of two members of one node (or store two ranks' startedSeq) at the same time each
// write, then read the other's word, all seq_cst: in the single order of those operations one of
// them reads the other's write, so the later of them computes a node value that includes both.
// A rank that finds the node's summary already as high stops: whoever raised it carries it up.
// So once every rank has started `seq`, the root's summary reaches `seq` (as a flat look would see
// every peer's), and it never exceeds the lowest startedSeq of the group.
void ShmGroup::summariseStarted(uint64_t seq) {
  int member = tree_.positionOf(rank_);
  for (int level = 0; level < tree_.levels(); ++level) {
    const int first = tree_.firstMemberOf(member);
    uint64_t lowest = seq;
    for (int other = first; other < first + tree_.membersOf(level, member); ++other) {
      lowest = std::min(lowest, startedOf(level, other));
    }
    // not raised: another rank raised it at least this far, and carries it up
    if (!raiseTo(startedSummary(tree_.nodeOf(level, member)), lowest)) return;
    member = tree_.parentMember(member);
  }
}

bool ShmGroup::peersStarted(uint64_t seq, std::chrono::microseconds within) const {
  const auto giveUp = Clock::now() + std::min(within, startedSpin_);
  auto startedBy = [&](const std::atomic<uint64_t>& word) {
    return spinUntil<kStartedYieldEvery>(giveUp, [&] { return word.load(std::memory_order_acquire) >= seq; });
  };
  if (tree_.levels() > 0) return startedBy(startedSummary(tree_.nodeCount() - 1));  // the root's
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && !startedBy(control(peer).startedSeq)) return false;
  }
  return true;
}

void ShmGroup::announceTcpCollective(const Fingerprint& fingerprint, Deadline deadline) {
  settleDeferredCheck(deadline);  // a broadcast root's check is due before it leaves the segment
  const WireHeader header = encodeHeader(fingerprint, 0);
  uint64_t words[sizeof(WireHeader) / sizeof(uint64_t)];
  std::memcpy(words, &header, sizeof(header));
  RankControl& mine = control(rank_);
  const uint32_t count = mine.tcpAnnounced.load(std::memory_order_relaxed);  // only this rank writes it
  mine.tcpAnnounced.store(count + 1, std::memory_order_relaxed);             // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < std::size(words); ++i) mine.tcpHeader[i].store(words[i], std::memory_order_relaxed);
  mine.tcpAnnounced.store(count + 2, std::memory_order_release);
}

bool ShmGroup::tcpAnnouncement(int peer, WireHeader* header) const {
  const RankControl& theirs = control(peer);
  uint64_t words[sizeof(WireHeader) / sizeof(uint64_t)];
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint32_t before = theirs.tcpAnnounced.load(std::memory_order_acquire);
    if (before == 0) return false;  // never announced
    if (before & 1) continue;       // being written
    for (size_t i = 0; i < std::size(words); ++i) words[i] = theirs.tcpHeader[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (theirs.tcpAnnounced.load(std::memory_order_relaxed) == before) {
      std::memcpy(header, words, sizeof(words));
      return true;
    }
  }
  return false;  // rewritten all along: the next wait slice looks again
}

void ShmGroup::checkPeerStayedOnPath(int peer, Flag which, uint32_t target) const {
  WireHeader header;
  if (!tcpAnnouncement(peer, &header)) return;
  if (header.seq < current_.seq && !(refusedSeq_ != 0 && header.seq == refusedSeq_)) return;
  // The peer published every flag of the collectives it finished before announcing this one.
  if (reached(flag(peer, which).load(std::memory_order_acquire), target)) return;
  throwWentOverTcp(peer, header,
                   "it went over TCP while this rank waits for it in shared memory (an algorithm pinned on some "
                   "ranks only, with DDPLITE_ALGO or torch_ddp_lite.set_algorithm?)");
}

void ShmGroup::throwWentOverTcp(int peer, const WireHeader& header, const char* why) const {
  std::string what = headerMismatch(header, current_, header.messageBytes, describePeer(peer));
  if (what.empty()) what = strCat(describePeer(peer), " runs ", current_.describe(), " over TCP");
  throw TransportError(TransportError::Kind::kMismatch, peer, strCat(what, "; ", why));
}

void ShmGroup::abort(Departure why) {
  // seq_cst, before the wakes: see RankControl::departed. The first reason stays.
  uint32_t none = 0;
  control(rank_).departed.compare_exchange_strong(none, static_cast<uint32_t>(why), std::memory_order_seq_cst);
  if (aborted_.exchange(true, std::memory_order_seq_cst)) return;
  wakeEveryRank();
}

void ShmGroup::breakGroup() {
  control(rank_).broken.store(1, std::memory_order_seq_cst);
  groupWake(Flag::kPosted).anyBroken.store(1, std::memory_order_seq_cst);  // before the wakes below
  aborted_.store(true, std::memory_order_seq_cst);
  wakeEveryRank();  // even when this process had aborted already: the others must look now
}

void ShmGroup::wakeEveryRank() {
  // Bumped, not only woken: see waitUntilReached. Waiters of other processes wake too, look at
  // every rank's `broken` and go back to sleep when it is not set.
  for (int owner = 0; owner < size_; ++owner) wake(control(owner));
  for (int which = 0; which < kFlagKinds; ++which) {
    GroupWake& group = groupWake(static_cast<Flag>(which));
    group.release.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&group.release);
  }
}

std::string ShmGroup::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  const int named = processGroupRanks_.empty() ? peer : processGroupRanks_[static_cast<size_t>(peer)];
  return strCat("rank ", named, " (pid ", control(peer).process.pid, ", shared memory on this host)");
}

}  // namespace ddplite::cpu
