// The shared-memory state of one process group whose ranks share a host, and the step protocol
// the shared-memory algorithms (shm_algorithms.hpp) are written against.
//
// Layout of the segment (segment.hpp): three GroupWake lines (shm_group.cpp), the arrival tree's
// lines when there is one (per node: a `posted` and a `consumed` counter, a started summary), one
// RankControl per rank (its own cache lines), then per
// rank two slot buffers of chunkBytes() each. Only the owner writes its control block and its
// buffers' contents (except the in-place reduction of its own slice, also by the owner).
//
// Steps. Every chunk of every shared-memory collective is one step, numbered 1, 2, ... in the
// same order on every rank (the group runs one collective at a time; see Threading).
// Step s uses buffer (s & 1) of every rank. Per rank, three monotone 32-bit flags say how far it
// got (compared modulo 2^32):
//   posted:   its input for step s is in its buffer, and its fingerprint for step s is written;
//   reduced:  it has reduced its slice of step s in place (allreduce, large chunks);
//   consumed: it no longer reads any rank's buffer of step s.
// A rank may write its buffer for step s only once every rank has consumed step s-2 (beginStep):
// two buffers let copy-in of one chunk overlap the peers' reading of the previous one.
//
// Memory ordering. The owner writes its buffer and fingerprint, then stores the flag with
// seq_cst (a release store would do for the data; seq_cst also orders it before the load of
// `sleepers`, so a waiter about to block is never missed: the waiter increments `sleepers`
// with seq_cst, then re-reads the flag with seq_cst before futex-waiting on it, and futex_wait
// itself re-checks the value). Readers load flags with acquire (seq_cst on the blocking path)
// before touching the data they guard.
//
// A rank that runs a collective over TCP instead (a pinned algorithm on one rank only, or a
// refused call) is found by the same waits: the TCP path announces its fingerprint in the rank's
// control block (a seqlock: `tcpAnnounced` odd while the words are written; the writer stores
// the count relaxed, then a release fence, the words relaxed, then the even count with release;
// the reader loads the count with acquire, the words relaxed, an acquire fence, the count again).
//
// Waiting: spin with a pause instruction for DDPLITE_SHM_SPIN_US (50 us; only the first 64 pauses
// when the group has more than two ranks per CPU of this process), yielding the core every 64 pauses (spinUntil: the rank waited for may need it, whether it is of
// this group or of another host or job on the same cores; an 8-byte all_reduce at 4 namespace
// hosts x 2 ranks on 2 cores, docs/data/crosshost/shm_yield_ab.txt; 4 ranks on 2 cores,
// docs/data/shm_spin_ab.txt), then futex-wait in slices of at most 20 ms;
// between slices check the deadline, abort() and, every 50 ms, the peer's TCP connection (a rank
// that died closed it), so a crash is reported within about 0.1 s and a rank that never arrives
// at the op's timeout, as on the TCP path. A wait for one peer sleeps on that peer's wake word; a
// wait for every peer (waitAllPosted, waitAllReduced, beginStep) sleeps on
// the group's word for that flag, which only the last rank to arrive bumps: one wake-up per
// waiter per step, however many ranks share the cores (GroupWake in shm_group.cpp).
//
// Arrival tree (DDPLITE_SHM_SYNC; by default from 3 ranks on a host): "every rank has posted / consumed
// step s" is learnt from one word per flag kind (GroupWake::treeReached) instead of P-1 flags.
// A rank stores its flag as above (per-peer waits and diagnostics still read it), then arrives
// at the tree (arrival_tree.hpp): fetch_add (acq_rel) on its node's counter for the step's
// parity; the arrival that completes a node resets that counter (relaxed) and arrives at the
// parent; the one that completes the root stores treeReached = s (seq_cst) and, finding sleepers,
// bumps the group's word. A completer also compares the fingerprints of its node's members (a rank
// under each: ArrivalTree::representative) and records the first disagreement (treeMismatch, compare-exchange), so every
// rank raises the mismatch after the step without reading P headers. The root's completer of a
// step posted with postCombining() also combines the step's data (a small all_reduce) before it
// stores treeReached, which publishes the result with the step. Waits for the whole group
// return only on treeReached: a tree wait happens-after every arrival of the step, every reset
// included, and no rank arrives for step s+2 at a counter of the same parity before such a wait
// (beginStep waits for consumed s first), so a counter never mixes two steps. Only `posted` and
// `consumed` use it (every rank marks them once per step); `reduced` stays flat. While a tree wait
// sleeps, the peers whose flags are missing are looked at every 50 ms (liveness, path), as above;
// when none is missing but the root is not released, every peer's liveness (a rank that died
// between its flag and its arrival would otherwise hold the step until the deadline).
//
// Threading: everything but abort() on the thread that runs the group's collectives: the worker
// thread, or a caller running a small op itself (Worker::tryClaimIdle: never two at once, and the
// worker's mutex orders one after the other); abort() from any thread.
#pragma once

#include "cpu/shm/arrival_tree.hpp"
#include "cpu/shm/segment.hpp"
#include "cpu/transport/transport.hpp"

#include <c10/util/FunctionRef.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddplite::cpu {

class ShmGroup {
 public:
  // Collective over the group (through the store). Null with *whyNot when the ranks cannot
  // share memory (another host: *spansHosts; /dev/shm full, ...). `liveness` is the group's TCP
  // mesh: a closed connection is one way a dead peer is noticed; the other is its process, watched
  // through its ProcessIdentity where both ranks share a PID namespace (peerProcessEnded), which still works
  // while another process (a child given the rank's descriptors) keeps its sockets open. The
  // same outcome on every rank.
  // `processGroupRanks`: what errors call rank i, when the ShmGroup is part of a process group
  // (the ranks of one host; HostHierarchy); empty: i itself.
  static std::unique_ptr<ShmGroup> create(StoreRendezvous& rendezvous, Transport& liveness, int rank, int size,
                                          size_t chunkBytes, std::string* whyNot, bool* spansHosts,
                                          std::vector<int> processGroupRanks = {});
  ~ShmGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t chunkBytes() const { return chunkBytes_; }
  const std::string& segmentName() const { return segment_->name(); }
  // How the steps synchronise, for cpu_path(): "an arrival tree (fan-in 8, 2 levels)" or "flat: ...".
  std::string syncDescription() const;

  // The collective the next steps belong to; its part is numbered like the TCP path's (a
  // coalesced op runs several collectives under one sequence number). `refusedSeq`: the op just
  // before, when this rank refused it (0 otherwise): a peer still in it over TCP is a mismatch.
  void beginCollective(const Fingerprint& fingerprint, uint64_t refusedSeq = 0);
  // Starts the next step and returns its number, once this rank's buffer for it is free.
  uint32_t beginStep(Deadline deadline);
  // Rank `owner`'s buffer for `step`.
  char* buffer(int owner, uint32_t step) const;

  // This rank's flags (the fingerprint of the current step is published with `posted`).
  void post(uint32_t step, uint64_t stepBytes);
  // Combining on arrival (with an arrival tree only: combinesOnArrival()). post(), and the rank
  // whose arrival completes the tree for `step` calls `combine` before it releases the step: every
  // rank's data and fingerprint for `step` are visible to it then. `combine` must leave the step's
  // result in that rank's own buffer for `step`; it is skipped when a completer recorded a
  // mismatch (every rank raises instead). After waitAllPosted(step), combinedBy(step) names the
  // rank whose buffer holds the result. So a small all_reduce reads P*S bytes on one rank and S on
  // the others, instead of P*S on every rank. Collective thread.
  bool combinesOnArrival() const { return treeSync(Flag::kPosted); }
  void postCombining(uint32_t step, uint64_t stepBytes, c10::function_ref<void()> combine);
  int combinedBy(uint32_t step) const;
  void markReduced(uint32_t step);
  void markConsumed(uint32_t step);

  // Waits until `peer` posted `step` and checks that it is in the same collective (same
  // fingerprint, same step length): else TransportError(kMismatch).
  void waitPosted(int peer, uint32_t step, uint64_t stepBytes, Deadline deadline);
  void waitAllPosted(uint32_t step, uint64_t stepBytes, Deadline deadline);
  void waitAllReduced(uint32_t step, Deadline deadline);
  // In place of waitAllPosted + markConsumed, for a rank that reads no one's data in `step` (a
  // broadcast root): when every peer has already posted, checks now; else the check runs at this
  // rank's next beginStep (or announceTcpCollective), and `step` is marked consumed only then. The root need not wait for its
  // peers now (one sleep and wake-up less per broadcast); a disagreement is still found, one
  // step later, and reported naming this collective. No rank can need this rank's `consumed`
  // flag for `step` before this rank reaches step + 1 (beginStep waits for step - 2).
  void checkAllPostedLater(uint32_t step, uint64_t stepBytes);

  // Op-level progress, a hint for running small ops on the calling thread (Worker): this rank
  // has started op `seq` (called when it starts running it, on whichever thread); and whether
  // every peer has started op `seq`, waiting for it at most `within`. Nothing depends on it for
  // correctness. Flat: each rank's startedSeq, stored seq_cst by its owner, read by the others
  // (P-1 reads per question). With an arrival tree, a summary per tree node: the lowest
  // startedSeq under it as some rank last saw it, only ever raised (compare-exchange), so the
  // question reads one word (the root's); markStarted() reads the k members of each node on its
  // way up (k log_k P reads) and stops where the node already held that much (see
  // summariseStarted in shm_group.cpp for why the last of racing ranks always carries it up).
  void markStarted(uint64_t seq);
  bool peersStarted(uint64_t seq, std::chrono::microseconds within) const;

  // Says, in this rank's control block, that it runs `fingerprint` over TCP (gather, scatter,
  // all_to_all, or a collective with a pinned algorithm). A peer waiting in shared memory for
  // this rank in a collective with the same or a lower sequence number learns from it that this
  // rank went another way, and raises a mismatch within one wait slice instead of timing out.
  // Settles a pending checkAllPostedLater() first (by `deadline`).
  void announceTcpCollective(const Fingerprint& fingerprint, Deadline deadline);

  // A wait on a blocked caller's thread spins up to `spin` instead when longer (wait_policy.hpp),
  // where this group spins at all. Set once, before the first collective, by the hierarchy across
  // hosts for its host's segment. A group of one host keeps its spin: at 2 ranks on 2 cores the
  // longer spin gained nothing (8 B, 64 KB, 16 MB and barrier alike, docs/data/crosshost/
  // caller_spin_2026-12-01.md), and a rank that never sleeps keeps its core from a peer that
  // waits behind another task there.
  void setCallerSpin(std::chrono::microseconds spin) { callerSpin_ = spin; }

  // Why a rank left the group for good, as its peers' errors say it (RankControl::departed).
  enum class Departure : uint32_t { kAborted = 1, kFailed = 2, kShutDown = 3, kExiting = 4 };
  // This rank leaves the group: every waiter of this process wakes, and its blocked and later
  // waits throw TransportError(kAborted); a peer's wait for a flag this rank has not stored throws
  // kPeerClosed naming this rank and `why` within one liveness look (about 50 ms), as a closed
  // connection would say it (the TCP mesh says so only for the pairs it connected: on demand,
  // maybe none). The flags this rank stored stay valid: a peer still finishing a collective this
  // rank finished reads them as before. Idempotent (the first `why` stays). Any thread.
  void abort(Departure why);
  // abort(kFailed), and says so to every rank of the segment: their blocked and later waits throw
  // TransportError(kPeerClosed) naming this rank, whatever their flags. For a rank that left a collective part-way
  // (an exception between two steps): its flags no longer say what its buffers hold. Any thread.
  void breakGroup();

  // Whether a collective began (beginCollective) and has not ended (endCollective): an exception
  // in between leaves the steps half done, and the caller must breakGroup(). Collective thread.
  bool collectiveOpen() const { return open_; }
  void endCollective() { open_ = false; }
  // Settles a broadcast's pending check (checkAllPostedLater) by `deadline`, as the next step
  // would: at shutdown, when the broadcast was this rank's last op. Throws what the check finds
  // (TransportError). Collective thread, or any once the collective thread has stopped.
  void settlePendingCheck(Deadline deadline) { settleDeferredCheck(deadline); }
  bool checkPending() const { return deferred_.pending; }

  std::string describePeer(int peer) const;

 private:
  struct RankControl;
  struct GroupWake;
  struct TreeNode;
  struct StartedSummary;
  enum class Flag { kPosted, kReduced, kConsumed };
  static constexpr int kFlagKinds = 3;
  static size_t groupWakeBytes();  // the GroupWake lines at the start of the segment
  GroupWake& groupWake(Flag which) const;

  ShmGroup(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size, size_t chunkBytes,
           int treeCapacity);
  // The tree's lines for up to `treeCapacity` nodes (ArrivalTree::nodeCapacity), after the GroupWake lines.
  static size_t treeBytes(int treeCapacity);
  RankControl& control(int owner) const;
  // Whether waits for every rank's `which` go through the arrival tree.
  bool treeSync(Flag which) const { return tree_.enabled() && which != Flag::kReduced; }
  TreeNode& treeNode(Flag which, int node) const;
  // The tree part of publish(): arrive for `step`, carry completed nodes up, release at the root.
  void arrive(Flag which, uint32_t step);
  // At the root of `posted`, before the release: runs the step's combiner (postCombining).
  void combineAtRoot(uint32_t step);
  // markStarted with an arrival tree: raises the summaries of this rank's nodes, bottom up.
  void summariseStarted(uint64_t seq);
  // The value of `member` of `level` for the started summary: a rank's startedSeq (level 0) or
  // the summary of a node of the level below.
  uint64_t startedOf(int level, int member) const;
  std::atomic<uint64_t>& startedSummary(int node) const;
  // A completer's check of its node's members' fingerprints for `step` (posted only).
  void compareMembers(int level, int member, uint32_t step);
  // waitForAll through the tree: returns once treeReached reaches `target`.
  void waitForTree(Flag which, uint32_t target, Deadline deadline);
  // After a tree wait for `posted`: throws the mismatch a completer recorded, naming a peer whose
  // fingerprint differs from this rank's.
  void checkTreeAgreement(uint32_t step, uint64_t stepBytes, Deadline deadline);
  // Slow path of a tree wait: the first rank whose `which` flag has not reached `target` (-1: none);
  // and a look at each such rank (process ended, connection closed, gone over TCP): throws.
  int firstMissing(Flag which, uint32_t target) const;
  void lookAtMissingPeers(Flag which, uint32_t target) const;
  // Throws kPeerClosed when `peer` is gone while its `which` flag is still short of `target`.
  void throwIfPeerGone(int peer, Flag which, uint32_t target) const;
  // How a peer is gone: it left the group (abort(): RankControl::departed), its connection
  // closed, or its process ended. `how` completes "rank 3 (...)"; `crashed`: not a departure,
  // so probably an exit or a crash.
  struct Gone {
    const char* how = nullptr;
    bool crashed = false;
  };
  // Whether `peer` is gone, and how (null `how`: it is not). Collective thread (the liveness
  // probe's peerHungUp).
  Gone peerGone(int peer) const;
  // The kPeerClosed error for `peer`, `gone` while this rank `waited` ("waited for it to post its
  // data for step 3 of ...").
  [[noreturn]] void throwPeerGone(int peer, Gone gone, const std::string& waited) const;
  // A completed tree arrival of this rank (see RankControl::arrived).
  void markArrived(Flag which, uint32_t step);
  [[noreturn]] void throwTreeTimeout(Flag which, uint32_t target) const;
  std::atomic<uint32_t>& flag(int owner, Flag which) const;
  // Stores this rank's flag and wakes who waits for it: waiters for this rank alone, and, when
  // every rank has now reached `step`, waiters for the whole group.
  void publish(Flag which, uint32_t step);
  bool everyRankReached(Flag which, uint32_t step) const;
  // Waits until `peer`'s `which` flag reaches `target` (waitUntilReached: spin, then futex
  // slices with the deadline, abort, liveness and path checks); right after a refusal, also
  // checks that the peer did not run the refused op over TCP.
  void waitFor(int peer, Flag which, uint32_t target, Deadline deadline);
  // waitFor for every peer, sleeping on the group's word for `which` (one wake-up, when the last
  // rank arrives).
  void waitForAll(Flag which, uint32_t target, Deadline deadline);
  // `group` null: sleep on `peer`'s own wake word; else on the group's word for `which`.
  void waitUntilReached(int peer, Flag which, uint32_t target, Deadline deadline, GroupWake* group);
  // Right after a refusal: throws kMismatch when `peer` ran the refused op over TCP.
  void checkNotRefusedOverTcp(int peer) const;
  // Whether `peer`'s process has ended (common/process_identity.hpp: /proc, no descriptor kept);
  // false when it lives, when its pid means another process here (another PID namespace) or when
  // this cannot be told. Any thread.
  bool peerProcessEnded(int peer) const;
  [[noreturn]] void throwTimeout(int peer, Flag which, uint32_t target) const;
  // The first other rank whose `broken` is set; -1 when none.
  int brokenBy() const;
  // Whether this rank aborted or any rank broke the group, read relaxed: ends a spin early.
  bool stopHint() const;
  // Throws when this rank aborted or another broke the group; the wait was for `peer`.
  void throwIfStopped(int peer) const;
  // Bumps `owner`'s wake word and wakes its sleepers (waitUntilReached's protocol).
  static void wake(RankControl& owner);
  void wakeEveryRank();
  // `peer`'s latest announceTcpCollective() header; false when it made none (or kept rewriting it).
  bool tcpAnnouncement(int peer, WireHeader* header) const;
  // Throws TransportError(kMismatch) when `peer` announced a TCP collective at or after the
  // current one (or the one this rank refused) while its `which` flag has still not reached
  // `target`.
  void checkPeerStayedOnPath(int peer, Flag which, uint32_t target) const;
  // kMismatch naming what `peer` announced against the current collective, and `why`.
  [[noreturn]] void throwWentOverTcp(int peer, const WireHeader& header, const char* why) const;

  std::unique_ptr<ShmSegment> segment_;
  Transport& liveness_;
  const int rank_;
  const int size_;
  std::vector<int> processGroupRanks_;  // see create(); empty: the identity
  const size_t chunkBytes_;
  ArrivalTree tree_;              // none until create() has read every rank's NUMA node; fixed after
  const int treeCapacity_;        // nodes the segment has room for
  const size_t controlsOffset_;  // groupWakeBytes() + treeBytes(treeCapacity_)
  // How long a step's waiter spins before it blocks: DDPLITE_SHM_SPIN_US, or 0 when the group has
  // more than kSpinRanksPerCpu (2) ranks per CPU of this process.
  const std::chrono::microseconds spin_;
  // The spin on a blocked caller's thread (wait_policy.hpp): setCallerSpin, else 0.
  std::chrono::microseconds callerSpin_{0};
  // How long peersStarted() looks at most: kStartedSpin, or 0 when the group has more ranks than
  // this process has CPUs.
  const std::chrono::microseconds startedSpin_;
  std::atomic<bool> aborted_{false};
  uint32_t step_ = 0;
  Fingerprint current_;  // of the step in progress
  // postCombining's combiner while its post() runs (null otherwise): arrive() runs it at the root.
  const c10::function_ref<void()>* combine_ = nullptr;
  struct DeferredCheck {
    bool pending = false;  // every step number is valid (they wrap), so a flag says "none"
    uint32_t step = 0;
    uint64_t stepBytes = 0;
    Fingerprint fingerprint;
    uint64_t refusedSeq = 0;
  };
  DeferredCheck deferred_;  // checkAllPostedLater(); settled by settleDeferredCheck()
  void settleDeferredCheck(Deadline deadline);
  uint64_t lastSeq_ = 0;
  uint64_t refusedSeq_ = 0;  // of the current collective (beginCollective)
  uint8_t nextPart_ = 0;
  bool open_ = false;  // see collectiveOpen()
  // DDPLITE_TEST_HOOKS=shm_fault=<rank>:<seq>: this rank throws std::bad_alloc right after it
  // posts a step of collective <seq> (0: never). Tests only.
  uint64_t faultSeq_ = 0;
  // DDPLITE_TEST_HOOKS=shm_exit_unarrived=<rank>:<seq>: this rank SIGKILLs itself after storing
  // its posted flag of collective <seq>, before its arrival at the tree (0: never). Tests only.
  uint64_t exitUnarrivedSeq_ = 0;
  // DDPLITE_TEST_HOOKS=shm_delay_arrival=<rank>:<seq>:<ms>: this rank sleeps there instead, and
  // shm_combine_delay=<ms>: a combiner sleeps before it combines. Tests only.
  uint64_t delayArrivalSeq_ = 0;
  std::chrono::milliseconds delayArrival_{0};
  std::chrono::milliseconds combineDelay_{0};
};

}  // namespace ddplite::cpu
