// A small exact collective that rides in the call check's messages (collectives/call_check.h): what a rank puts in
// the room, how two partial results meet at a step of the recursive doubling, and what the result is.
//
// At the step of distance d = 2^k a rank's partial result covers its group, the d ranks that share rank / d; the
// partner (rank ^ d) holds the other half of the next group. What a step sends, per collective:
// - all-reduce, reduce: the room holds the call's count elements; each step sends them all and reduces;
// - reduce-scatter: the room holds the whole input, nranks * count elements (blocks of count); recursive halving: at
//   step d a rank holds the blocks b with b mod d = rank mod d, sends the partner the half it keeps (b mod 2d =
//   partner mod 2d) and reduces the half it keeps itself, so that it ends with block `rank` reduced over every rank;
// - all-gather: nranks blocks of count elements; rank r puts its own at block r, and each step sends the d blocks of
//   its group;
// - broadcast: the root's count elements, sent only by a rank whose group holds the root.
// So the all-gather and the reduce-scatter send (nranks - 1) blocks in all, as their rings do, and every rank of a
// broadcast receives the root's data once. The float16 average is premultiplied (collectives/average.h), every other
// average divided once at the end, as the schedules do.
#pragma once

#include <cstddef>

#include "ccoll.h"
#include "collectives/coll_args.h"

struct ccComm;

namespace ccoll {

// The collectives, numbered as CallDescriptor::kind (collectives/call_check.h).
constexpr int kCallAllReduce = 0;
constexpr int kCallReduceScatter = 1;
constexpr int kCallAllGather = 2;
constexpr int kCallBroadcast = 3;
constexpr int kCallReduce = 4;

// This rank's call as it rides in the check.
struct InlineCall {
  bool rides = false;  // this rank's data is in the room (nothing else is read when false)
  int kind = kCallAllReduce;
  // As the schedules take them: send holds count elements (nranks * count for a reduce-scatter), recv count (nranks *
  // count for an all-gather; a reduce writes it only on the root); op for the reduce kinds, root for broadcast and
  // reduce.
  CollArgs args;
  bool done = false;  // out: every rank's data rode and the calls matched; the result is written
};

// Bytes of the room a call of `kind` with these arguments takes on nranks ranks.
size_t InlineBytes(int kind, size_t count, size_t eltSize, int nranks);

// Whether an exact call of `kind` with these arguments rides in comm's check: none of its ranks runs a compressor
// or the stream path (the caller's to know), CC_ALGO is auto for an all-reduce, its buffers are in host memory and
// its data fits the room.
bool RidesInCallCheck(const ccComm* comm, int kind, const CollArgs& args);

// Writes rank's data into the room where the call puts it (an all-gather's block r, a broadcast's root only); the
// rest of the room is left as it is.
void InlineFill(const InlineCall& call, int rank, int nranks, char* room);

// Bytes `sender` sends at the step of distance dist (at most InlineBytes; 0 for a broadcast's rank whose group does
// not hold the root).
size_t InlineStepBytes(const InlineCall& call, int sender, int dist, int nranks);

// Writes what rank sends its partner at the step of distance dist, InlineStepBytes(call, rank, dist, nranks) bytes of
// its partial result `room`, into out; returns that length.
size_t InlineStepOut(const InlineCall& call, int rank, int dist, int nranks, const char* room, char* out);

// Takes what the partner sent at the step of distance dist (theirs: InlineStepBytes(call, peer, dist, nranks) bytes)
// into this rank's partial result. Where both ends of the pair reduce the same elements (all-reduce, reduce) they
// compute the same bytes: a reduction takes the lower ranks' partial result as its left operand.
void InlineCombine(const InlineCall& call, int rank, int peer, int dist, int nranks, char* mine, const char* theirs);

// Writes the result, once every rank's data rode and the calls matched.
void InlineFinish(const InlineCall& call, int rank, int nranks, const char* room);

}  // namespace ccoll
