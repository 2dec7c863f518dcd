// MPI's own collectives as a CPU data path (DDPLITE_CPU_TRANSPORT=mpi).
//
// Replaces the byte-level algorithms of cpu/algorithms/ for one group: cpu/collectives.cpp asks
// handles() and, when true, calls run()/runExchange() with the same AlgorithmArgs / ExchangeArgs
// contract as the algorithm it replaces (same buffers, same in-place results), so the tensor-level
// code (contiguity, AVG, PREMUL_SUM, coalescing) is shared by both paths.
//
// MPI does the choosing of algorithms (Open MPI's "tuned" component, or whatever the cluster's MPI
// is tuned to); DDPLITE_ALGO pins do not apply. Reductions use MPI's built-in MPI_SUM/PROD/MIN/MAX
// on the types MPI has (float, double, int8/uint8/int32/int64), so an MPI with network offload can
// use it, and user-defined ops running ddplite's own kernels for half, bfloat16 and bool.
//
// Threads: called on the group's worker thread only. Every call is non-blocking MPI plus a poll
// loop against the op's deadline: a rank that never arrives raises TransportError(kTimeout) like
// the TCP path, instead of hanging in MPI. A timed-out MPI collective cannot be cancelled; the
// backend marks the group unusable, as it does for every transport failure.
#pragma once

#include "cpu/algorithms/algorithm.hpp"
#include "cpu/algorithms/selector.hpp"
#include "rendezvous/mpi.hpp"

#include <c10/core/ScalarType.h>
#include <atomic>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace ddplite::cpu {

class MpiCollectives {
 public:
  explicit MpiCollectives(mpi::GroupComm& comm) : comm_(comm) {}

  // Whether MPI carries a collective whose whole buffer (the allreduce buffer, the gathered
  // output, the reduce_scatter input, all bytes of an exchange) is `bufferBytes`: every dtype
  // ddplite supports, while counts fit MPI's int; larger ones take the TCP path.
  bool handles(size_t bufferBytes) const;
  // The MPI path's fingerprint check (cpu/transport/fingerprint.hpp): one MPI_Iallreduce(MAX) of
  // the fingerprint and its negation before every collective, so every rank learns whether all
  // agree. Every rank's first MPI call of each collective is this one (a refused call makes none),
  // so these calls always pair with each other and never with a data collective. On disagreement
  // an MPI_Iallgather of the fingerprints names the ranks on each side, and every rank throws
  // TransportError(kMismatch): none starts the data collective.
  void agree(const Fingerprint& fingerprint, Deadline deadline) const;
  // `op` is the reduction MPI performs (AVG and PREMUL_SUM arrive as SUM: the caller scales).
  void run(Collective collective, const AlgorithmArgs& args, c10::ScalarType dtype,
           c10d::ReduceOp::RedOpType op) const;
  void gather(const ExchangeArgs& args) const;
  void scatter(const ExchangeArgs& args) const;
  void alltoall(const ExchangeArgs& args) const;
  // Any thread: the op in flight and every later one raise TransportError(kAborted). (MPI cannot
  // cancel a started collective; its request is abandoned with the group.)
  void abort() { aborted_ = true; }

 private:
  mpi::GroupComm& comm_;  // owned by the backend
  std::atomic<bool> aborted_{false};
};

}  // namespace ddplite::cpu
