// Whether a sync op run on its caller's thread spins in its waits (DDPLITE_CALLER_SPIN_US) or
// sleeps: tried by turns and chosen by the time it took, per group (DDPLITE_CALLER_SPIN_TRIAL).
//
// A blocked caller's spin pays where the ranks' peers are on their cores when their bytes arrive,
// and costs much where other work shares the cores: at 4 namespace hosts x 2 ranks on 2 cores,
// 0.6x the time on a quiet machine and 4x beside one busy process
// (docs/data/crosshost/caller_spin_2026-12-01.md). Nothing a wait sees tells the two apart (a spin
// that ended once a yield kept it away for long did not), so the group measures the op itself:
//   * every kPeriodOps sequence numbers a trial starts: the ops run on the caller take turns in
//     blocks of kBlockOps sequence numbers (block b spins where b has an even count of one bits,
//     else sleeps: the Thue-Morse sequence, which no loop of ops with a fixed stride keeps on one
//     side), until each side has timed kTrialOps ops that followed an op of the same side (an op
//     after a switch also waits out the peers' previous op, run the other way);
//   * the rest of the period spins only if the spin's median time was below kSpinMargin times the
//     sleep's, else sleeps (the safe side: a sleeping wait leaves the core to others). A period
//     with too few ops on the caller to fill its trial takes turns throughout (sync ops among many
//     async ones, fewer than about two per block: half of them spin). Ops of the group that run
//     on the worker are not seen: an op after them counts as following the caller op before.
// Sequence numbers are the group's, so ranks that run the same ops on their callers try the same
// side at once (a spin pays only if the peers spin as well). A rank may still keep another side
// than its peers: that changes the time, never the result.
//
// Threading: one thread at a time. DdpliteBackend::enqueue calls it only while it holds the
// group's worker claim (ops on a caller's thread run one at a time). No state is shared.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace ddplite {

class CallerSpinTrial {
 public:
  static constexpr uint64_t kPeriodOps = 256;
  static constexpr uint64_t kBlockOps = 8;
  static constexpr size_t kTrialOps = 8;  // timed per side and period
  static constexpr double kSpinMargin = 0.9;

  // measured = false: every op spins (where DDPLITE_CALLER_SPIN_US gives a spin at all).
  explicit CallerSpinTrial(bool measured) : measured_(measured) {}

  // Whether the op with group sequence number `seq` spins. Call once per op, in sequence order,
  // then record() its time.
  bool spins(uint64_t seq);
  void record(uint64_t seq, bool spun, std::chrono::nanoseconds took);

 private:
  bool trialOpen() const;
  void decide();

  bool measured_;
  bool spinKept_ = false;
  uint64_t period_ = UINT64_MAX;  // the period the samples belong to
  bool decided_ = false;          // this period's trial is over
  std::vector<int64_t> spun_;     // ns, this period's trial
  std::vector<int64_t> slept_;
  std::optional<bool> previous_;  // the side of the op recorded last
};

}  // namespace ddplite
