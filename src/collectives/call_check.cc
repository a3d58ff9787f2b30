#include "collectives/call_check.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>

#include "collectives/coll_args.h"
#include "collectives/reduce.h"
#include "compress/compressor.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {
namespace {

constexpr uint32_t kCallMagic = 0x63636c6c;  // "ccll"
constexpr uint16_t kCallVersion = 1;

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

const char* KindText(int kind) {
  static const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};
  return kind >= 0 && kind < 4 ? names[kind] : "unknown collective";
}

std::string Text(const CallDescriptor& d) {
  std::string s = std::string(KindText(d.kind)) + " of " + std::to_string(d.count) + " " +
                  DataTypeName(static_cast<ccDataType_t>(d.dtype));
  if (d.kind <= 1) s += std::string(" ") + RedOpName(static_cast<ccRedOp_t>(d.op));
  if (d.kind == 3) s += " from root " + std::to_string(d.root);
  if (d.compressor != 0) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), " with compressor %016llx", static_cast<unsigned long long>(d.compressor));
    s += buf;
  }
  return s;
}

bool Same(const CallDescriptor& a, const CallDescriptor& b) {
  return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op && a.root == b.root &&
         a.compressor == b.compressor;
}

}  // namespace

CallDescriptor DescribeCall(int kind, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                            const ccCompressor* compressor) {
  CallDescriptor d;
  d.magic = kCallMagic;
  d.version = kCallVersion;
  d.kind = static_cast<uint16_t>(kind);
  d.count = count;
  d.dtype = dtype;
  d.op = op;
  d.root = root;
  d.compressor = compressor != nullptr ? Fnv1a(CompressorSpec(*compressor)) | 1u : 0;
  return d;
}

ccResult_t CheckCallMatches(ccComm* comm, const CallDescriptor& mine) {
  const int n = comm->nranks, r = comm->rank;
  if (n == 1) return ccSuccess;
  const int next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const uint64_t seq = ++comm->seq;
  CallDescriptor fromPrev, fromNext;
  Inflight io(comm);
  Request *rp = nullptr, *rn = nullptr, *sp = nullptr, *sn = nullptr;
  // Tag 0 travels forward (to next), tag 1 backward (to prev); with two ranks prev == next and the tags tell apart.
  CC_CHECK(io.Recv(prev, &fromPrev, sizeof(fromPrev), Tag(seq, 0), &rp));
  CC_CHECK(io.Recv(next, &fromNext, sizeof(fromNext), Tag(seq, 1), &rn));
  CC_CHECK(io.Send(next, &mine, sizeof(mine), Tag(seq, 0), &sn));
  CC_CHECK(io.Send(prev, &mine, sizeof(mine), Tag(seq, 1), &sp));
  // Each descriptor is compared as soon as it is in: a rank that sees a different call reports that, rather than
  // the abort of a neighbour that saw it first.
  for (const auto& [peer, theirs, req] : {std::tuple<int, const CallDescriptor*, Request**>{prev, &fromPrev, &rp},
                                          {next, &fromNext, &rn}}) {
    CC_CHECK(io.Wait(req));
    if (theirs->magic != kCallMagic || theirs->version != kCallVersion) {
      return Fail(ccRemoteError, "rank %d sent a malformed call descriptor (magic 0x%x, version %u) to rank %d", peer,
                  theirs->magic, theirs->version, r);
    }
    if (!Same(mine, *theirs)) {
      return Fail(ccInvalidUsage, "rank %d was called for: %s; but rank %d for: %s. Every rank must make the same "
                  "call (count, datatype, op, root and compressor parameters)", r, Text(mine).c_str(), peer,
                  Text(*theirs).c_str());
    }
  }
  CC_CHECK(io.WaitAll());
  return ccSuccess;
}

}  // namespace ccoll
