#include "collectives/inline_call.h"

#include <cstring>

#include "collectives/average.h"
#include "collectives/call_check.h"
#include "collectives/reduce.h"
#include "core/comm.h"

namespace ccoll {
namespace {

bool Reduces(int kind) { return kind == kCallAllReduce || kind == kCallReduceScatter || kind == kCallReduce; }

// Elements in the room.
size_t RoomElements(int kind, size_t count, int nranks) {
  return kind == kCallReduceScatter || kind == kCallAllGather ? count * static_cast<size_t>(nranks) : count;
}

// The first rank of the group of dist ranks that holds rank.
int GroupOf(int rank, int dist) { return rank / dist * dist; }

}  // namespace

size_t InlineBytes(int kind, size_t count, size_t eltSize, int nranks) {
  return RoomElements(kind, count, nranks) * eltSize;
}

bool RidesInCallCheck(const ccComm* comm, int kind, const CollArgs& args) {
  return comm->config.checkCalls && comm->hostTransports && comm->nranks > 1 &&
         (kind != kCallAllReduce || comm->config.algorithm == ccAlgoAuto) && !args.onDevice &&
         InlineBytes(kind, args.count, args.eltSize, comm->nranks) <= CallCheckInlineBytes(comm);
}

void InlineFill(const InlineCall& c, int rank, int nranks, char* room) {
  const size_t es = c.args.eltSize, elems = RoomElements(c.kind, c.args.count, nranks);
  if (elems == 0) return;
  switch (c.kind) {
    case kCallAllReduce:
    case kCallReduceScatter:
    case kCallReduce:
      if (PremultipliesAverage(c.args.op, c.args.dtype)) {
        PremultiplyHost(room, c.args.send, elems, c.args.dtype, nranks);
      } else {
        std::memcpy(room, c.args.send, elems * es);
      }
      break;
    case kCallAllGather:
      std::memcpy(room + static_cast<size_t>(rank) * c.args.count * es, c.args.send, c.args.count * es);
      break;
    case kCallBroadcast:
      if (rank == c.args.root) std::memcpy(room, c.args.send, elems * es);
      break;
  }
}

size_t InlineStepBytes(const InlineCall& c, int sender, int dist, int nranks) {
  const size_t block = c.args.count * c.args.eltSize;
  switch (c.kind) {
    case kCallReduceScatter:
      return static_cast<size_t>(nranks / (2 * dist)) * block;
    case kCallAllGather:
      return static_cast<size_t>(dist) * block;
    case kCallBroadcast:
      return GroupOf(c.args.root, dist) == GroupOf(sender, dist) ? block : 0;
    default:
      return block;
  }
}

size_t InlineStepOut(const InlineCall& c, int rank, int dist, int nranks, const char* room, char* out) {
  const size_t block = c.args.count * c.args.eltSize, bytes = InlineStepBytes(c, rank, dist, nranks);
  if (c.kind == kCallReduceScatter) {  // the blocks the partner keeps, in order
    const int keep = (rank ^ dist) & (2 * dist - 1);
    for (int b = keep; b < nranks; b += 2 * dist, out += block) {
      std::memcpy(out, room + static_cast<size_t>(b) * block, block);
    }
  } else if (c.kind == kCallAllGather) {
    std::memcpy(out, room + static_cast<size_t>(GroupOf(rank, dist)) * block, bytes);
  } else {
    std::memcpy(out, room, bytes);
  }
  return bytes;
}

void InlineCombine(const InlineCall& c, int rank, int peer, int dist, int nranks, char* mine, const char* theirs) {
  const size_t es = c.args.eltSize, block = c.args.count * es;
  if (block == 0) return;
  // ccAvg reduces as a sum (the premultiplied float16 average too)
  auto reduce = [&](char* into, const char* in, size_t elems) {
    if (peer < rank) {
      ReduceHost(into, in, into, elems, c.args.dtype, c.args.op);
    } else {
      ReduceHost(into, into, in, elems, c.args.dtype, c.args.op);
    }
  };
  switch (c.kind) {
    case kCallReduceScatter: {  // the blocks this rank keeps, in the order the partner sent them
      const int keep = rank & (2 * dist - 1);
      for (int b = keep; b < nranks; b += 2 * dist, theirs += block) {
        reduce(mine + static_cast<size_t>(b) * block, theirs, c.args.count);
      }
      break;
    }
    case kCallAllGather:
      std::memcpy(mine + static_cast<size_t>(GroupOf(peer, dist)) * block, theirs, static_cast<size_t>(dist) * block);
      break;
    case kCallBroadcast:
      if (GroupOf(c.args.root, dist) == GroupOf(peer, dist)) std::memcpy(mine, theirs, block);  // the root's data
      break;
    default:
      reduce(mine, theirs, c.args.count);
      break;
  }
}

void InlineFinish(const InlineCall& c, int rank, int nranks, const char* room) {
  const size_t es = c.args.eltSize;
  const char* result = room;
  size_t elems = RoomElements(c.kind, c.args.count, nranks);
  if (c.kind == kCallReduceScatter) {
    result += static_cast<size_t>(rank) * c.args.count * es;
    elems = c.args.count;
  }
  if (elems == 0 || (c.kind == kCallReduce && rank != c.args.root)) return;
  std::memcpy(c.args.recv, result, elems * es);
  if (Reduces(c.kind) && c.args.op == ccAvg && !PremultipliesAverage(c.args.op, c.args.dtype)) {
    FinishAvgHost(c.args.recv, elems, c.args.dtype, nranks);
  }
}

}  // namespace ccoll
