#include "collectives/call_check.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/coll_args.h"
#include "collectives/inline_call.h"
#include "collectives/reduce.h"
#include "compress/compressor.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fnv.h"

namespace ccoll {
namespace {

enum Field { kKind, kCount, kDtype, kOp, kRoot, kCompressor, kCalls, kPath, kDeviceCodec, kRefused, kInline, kFields };
const char* const kFieldNames[kFields] = {
    "collective",   "count",     "datatype",          "op", "root", "compressor", "compressor call number", "path",
    "device codec", "arguments", "input in the check"};

// The lowest and highest value of one field over the ranks seen so far, and the lowest rank holding each.
struct FieldRange {
  uint64_t lo;
  uint64_t hi;
  int32_t loRank;
  int32_t hiRank;
};
struct Agreement {
  FieldRange f[kFields];
};
static_assert(sizeof(Agreement) == kCallCheckRecordBytes, "the agreement record is a wire format");

const char* KindText(uint64_t kind) {
  static const char* names[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast", "reduce"};
  return kind < 5 ? names[kind] : "unknown collective";
}

std::string Text(const CallDescriptor& d) {
  std::string s = std::string(KindText(d.kind)) + " of " + std::to_string(d.count) + " " +
                  DataTypeName(static_cast<ccDataType_t>(d.dtype));
  if (d.kind <= 1 || d.kind == 4) s += std::string(" ") + RedOpName(static_cast<ccRedOp_t>(d.op));
  if (d.kind == 3) s += " from root " + std::to_string(d.root);
  if (d.kind == 4) s += " to root " + std::to_string(d.root);
  if (d.compressor != 0) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), " (%016llx)", static_cast<unsigned long long>(d.compressor));
    s += " with compressor " + d.spec + buf;
  }
  return s;
}

std::string ValueText(int field, uint64_t v) {
  char buf[64];
  switch (field) {
    case kKind:
      return KindText(v);
    case kDtype:
      return DataTypeName(static_cast<ccDataType_t>(static_cast<int>(v)));
    case kOp:
      return RedOpName(static_cast<ccRedOp_t>(static_cast<int>(v)));
    case kPath:
      if ((v & kPathStream) != 0) return "device buffers on the NCCL stream";
      return (v & kPathDeviceProducts) != 0 ? "device buffers with PowerSGD's products on cuBLAS"
                                            : "host buffers or a proxy's host-compatible schedule";
    case kCompressor:
      if (v == 0) return "none";
      std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
      return buf;
    default:
      return std::to_string(static_cast<int64_t>(v));
  }
}

Agreement Start(const CallDescriptor& d, int rank, bool rides) {
  const uint64_t v[kFields] = {static_cast<uint64_t>(d.kind),
                               d.count,
                               static_cast<uint64_t>(d.dtype),
                               static_cast<uint64_t>(d.op),
                               static_cast<uint64_t>(static_cast<int64_t>(d.root)),
                               d.compressor,
                               d.calls,
                               static_cast<uint64_t>(d.path),
                               static_cast<uint64_t>(d.deviceCodec),
                               static_cast<uint64_t>(d.refused),
                               rides ? 1u : 0u};
  Agreement a;
  for (int i = 0; i < kFields; ++i) a.f[i] = FieldRange{v[i], v[i], rank, rank};
  return a;
}

// Commutative, associative and idempotent, so the order and repetition of the exchange's steps do not matter.
void Combine(Agreement* acc, const Agreement& in) {
  for (int i = 0; i < kFields; ++i) {
    FieldRange& a = acc->f[i];
    const FieldRange& b = in.f[i];
    if (b.lo < a.lo || (b.lo == a.lo && b.loRank < a.loRank)) {
      a.lo = b.lo;
      a.loRank = b.loRank;
    }
    if (b.hi > a.hi || (b.hi == a.hi && b.hiRank < a.hiRank)) {
      a.hi = b.hi;
      a.hiRank = b.hiRank;
    }
  }
}

// Whether the ranks must agree on field i. Device codecs and host schedules may meet; so may ranks whose input rides
// and ranks whose input does not (its buffers on the device): then no rank takes the ridden result.
bool Compared(int i) { return i != kDeviceCodec && i != kInline; }

// Whether every rank took its arguments and made the same call.
bool SameCall(const Agreement& a) {
  if (a.f[kRefused].hi != 0) return false;
  for (int i = 0; i < kFields; ++i) {
    if (Compared(i) && a.f[i].lo != a.f[i].hi) return false;
  }
  return true;
}

}  // namespace

CallDescriptor RefusedCall(int kind, size_t count, int dtype, int op, int root, ccResult_t refused) {
  CallDescriptor d;
  d.kind = kind;
  d.count = count;
  d.dtype = dtype;
  d.op = op;
  d.root = root;
  d.refused = refused;
  return d;
}

CallDescriptor DescribeCall(int kind, size_t count, ccDataType_t dtype, ccRedOp_t op, int root,
                            const ccCompressor* compressor, int path, bool deviceCodec) {
  CallDescriptor d = RefusedCall(kind, count, dtype, op, root, ccSuccess);  // a call taken: refused 0
  d.path = path;
  d.deviceCodec = deviceCodec ? 1 : 0;
  if (compressor != nullptr) {
    d.spec = CompressorSpec(*compressor);
    d.compressor = Fnv1a(d.spec) | 1u;
    d.calls = compressor->calls;
  }
  return d;
}

size_t CallCheckInlineBytes(const ccComm* comm) {
  const int n = comm->nranks;
  return (n & (n - 1)) == 0 ? comm->config.checkInlineBytes : 0;
}

ccResult_t CheckCallMatches(ccComm* comm, const CallDescriptor& mine, bool* agreed, bool* anyDeviceCodec,
                            InlineCall* small) {
  *agreed = false;
  if (anyDeviceCodec != nullptr) *anyDeviceCodec = mine.deviceCodec != 0;
  if (small != nullptr) small->done = false;
  const int n = comm->nranks, r = comm->rank;
  if (n == 1) return ccSuccess;
  const uint64_t seq = comm->NextSeq();
  const size_t room = CallCheckInlineBytes(comm);
  const bool rides = room > 0 && small != nullptr && small->rides;
  const size_t bytes = rides ? InlineBytes(small->kind, small->args.count, small->args.eltSize, n) : 0;
  if (bytes > room) {
    return Fail(ccInternalError, "a call of %zu bytes cannot ride in a %zu-byte room", bytes, room);
  }
  // A message: the record, then, where this rank's data rides, what the step sends of its partial result
  // (InlineStepBytes, at most `bytes`), else nothing. A receive takes up to a whole room; the slots are 8-byte words,
  // so that every datatype is aligned in them.
  const size_t msgBytes = sizeof(Agreement) + room;
  const size_t recvWords = (msgBytes + 7) / 8, words = (sizeof(Agreement) + bytes + 7) / 8;
  int steps = 0;
  for (int dist = 1; dist < n; dist *= 2) ++steps;
  // The incoming message (read only as far as it arrived, so left uninitialized: a room's worth of zeros per call
  // would cost more than the call), then this rank's partial result (after a record's worth of bytes, so that its
  // data lies as in a message), then each step's outgoing message (read by the send until it completes). Records
  // move in and out of them with memcpy. The memory is the calling thread's, kept from call to call: a call allocates
  // nothing for it once the thread has made one as large (but see OnExit).
  thread_local std::vector<uint64_t> scratch;
  const size_t total = recvWords + words * (1 + static_cast<size_t>(steps));
  if (scratch.size() < total) scratch.resize(total);
  uint64_t* const mem = scratch.data();
  char* const in = reinterpret_cast<char*>(mem);
  char* const room0 = reinterpret_cast<char*>(mem + recvWords) + sizeof(Agreement);
  auto out = [&](int k) { return reinterpret_cast<char*>(mem + recvWords + (1 + static_cast<size_t>(k)) * words); };
  std::memset(room0, 0, bytes);  // an all-gather's blocks not yet filled travel too
  Agreement acc = Start(mine, r, rides);
  if (rides) InlineFill(*small, r, n, room0);
  size_t got = 0;  // the length of a step's message: written by its receive, which io may wait for on the way out
  // On the way out, after io has waited for (or given up on) its transfers: what was sent counts as the check's bytes
  // (the data too, unless it was the call's whole traffic: below), also when the check fails. And after a return
  // before every transfer was done, UCX may still hold one of them (a receive a late message may yet fill): the
  // scratch is then set aside until the thread ends instead of being reused by the thread's next check.
  struct OnExit {
    ccComm* comm;
    std::vector<uint64_t>& scratch;
    uint64_t records = 0, data = 0;  // bytes sent
    bool dataWasTheCall = false, drained = false;
    ~OnExit() {
      comm->callCheckBytesSent.fetch_add(records + (dataWasTheCall ? 0 : data), std::memory_order_relaxed);
      if (drained) return;
      thread_local std::vector<std::vector<uint64_t>> setAside;
      try {
        setAside.push_back(std::move(scratch));  // (on a failure to grow, scratch stays and is reused)
      } catch (...) {
      }
      scratch = std::vector<uint64_t>();
    }
  } onExit{comm, scratch};
  Inflight io(comm, kWireCallCheck);
  int step = 0;
  for (int dist = 1; dist < n; dist *= 2, ++step) {
    // With a room, recursive doubling: both ends of a pair then hold the same ranks' inputs. Without one, the
    // dissemination exchange, which needs no power of two.
    const int to = room > 0 ? (r ^ dist) : Mod(r + dist, n);
    const int from = room > 0 ? (r ^ dist) : Mod(r - dist, n);
    char* o = out(step);
    std::memcpy(o, &acc, sizeof(Agreement));
    const size_t data = rides ? InlineStepOut(*small, r, dist, n, room0, o + sizeof(Agreement)) : 0;
    Request *recv = nullptr, *send = nullptr;
    CC_CHECK(io.RecvAtMost(from, in, msgBytes, Tag(seq, step), &got, &recv));
    CC_CHECK(io.Send(to, o, sizeof(Agreement) + data, Tag(seq, step), &send));
    onExit.records += sizeof(Agreement);
    onExit.data += data;
    CC_CHECK(io.Wait(&recv));
    if (got < sizeof(Agreement)) {
      return Fail(ccRemoteError,
                  "rank %d received a %zu-byte call check message from rank %d, shorter than its "
                  "%zu-byte record (a foreign or corrupted message)",
                  r, got, from, sizeof(Agreement));
    }
    Agreement theirs;
    std::memcpy(&theirs, in, sizeof(Agreement));
    Combine(&acc, theirs);
    // A peer whose data did not ride sent its record alone; a peer that made another call may have sent other
    // lengths. Either way the calls or the kInline field then keep every rank from taking the result.
    if (rides && got == sizeof(Agreement) + InlineStepBytes(*small, from, dist, n)) {
      InlineCombine(*small, r, from, dist, n, room0, in + sizeof(Agreement));
    }
  }
  CC_CHECK(io.WaitAll());
  onExit.drained = true;
  const bool same = SameCall(acc);
  // The data sent counts as the check's unless it was the call's whole traffic (every rank's data rode and the calls
  // match).
  const bool ran = rides && same && acc.f[kInline].lo != 0;
  onExit.dataWasTheCall = ran;
  if (same) {
    if (anyDeviceCodec != nullptr) *anyDeviceCodec = acc.f[kDeviceCodec].hi != 0;
    if (ran) {  // every rank's data rode: the result is whole, the same on every rank
      InlineFinish(*small, r, n, room0);
      small->done = true;
    }
    return ccSuccess;
  }
  *agreed = true;
  const FieldRange& refused = acc.f[kRefused];
  if (refused.hi != 0) {  // the other fields of a rank that refused its arguments mean nothing
    return Fail(ccInvalidUsage, "rank %d refused the call (%s there; its ccGetLastError says why), so no rank ran "
                "it; nothing was written", refused.hiRank,
                ResultName(static_cast<ccResult_t>(refused.hi)));
  }
  std::string differ;
  for (int i = 0; i < kFields; ++i) {
    const FieldRange& f = acc.f[i];
    if (f.lo == f.hi || !Compared(i)) continue;
    differ += std::string(differ.empty() ? "" : "; ") + kFieldNames[i] + " " + ValueText(i, f.lo) + " on rank " +
              std::to_string(f.loRank) + " but " + ValueText(i, f.hi) + " on rank " + std::to_string(f.hiRank);
  }
  return Fail(ccInvalidUsage,
              "the ranks made different calls: %s (rank %d was called for: %s). Every rank must make the same call "
              "(collective, count, datatype, op, root and compressor parameters), with compressors made and reset "
              "alike (a compressor's call number picks its dithers and chunks), and on buffers that meet on one path "
              "(with transport nccl, device buffers on every rank or on none; PowerSGD with its products on cuBLAS "
              "on every rank or on none)",
              differ.c_str(), r, Text(mine).c_str());
}

}  // namespace ccoll
