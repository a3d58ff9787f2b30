#include "collectives/call_check.h"

#include <cstdio>
#include <string>
#include <vector>

#include "collectives/coll_args.h"
#include "collectives/reduce.h"
#include "compress/compressor.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fnv.h"

namespace ccoll {
namespace {

enum Field { kKind, kCount, kDtype, kOp, kRoot, kCompressor, kCalls, kPath, kDeviceCodec, kRefused, kFields };
const char* const kFieldNames[kFields] = {"collective", "count", "datatype", "op", "root", "compressor",
                                          "compressor call number", "path", "device codec", "arguments"};

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

Agreement Start(const CallDescriptor& d, int rank) {
  const uint64_t v[kFields] = {static_cast<uint64_t>(d.kind),
                               d.count,
                               static_cast<uint64_t>(d.dtype),
                               static_cast<uint64_t>(d.op),
                               static_cast<uint64_t>(static_cast<int64_t>(d.root)),
                               d.compressor,
                               d.calls,
                               static_cast<uint64_t>(d.path),
                               static_cast<uint64_t>(d.deviceCodec),
                               static_cast<uint64_t>(d.refused)};
  Agreement a;
  for (int i = 0; i < kFields; ++i) a.f[i] = FieldRange{v[i], v[i], rank, rank};
  return a;
}

// Commutative, associative and idempotent, so the order and repetition of the dissemination steps do not matter.
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

ccResult_t CheckCallMatches(ccComm* comm, const CallDescriptor& mine, bool* agreed, bool* anyDeviceCodec) {
  *agreed = false;
  if (anyDeviceCodec != nullptr) *anyDeviceCodec = mine.deviceCodec != 0;
  const int n = comm->nranks, r = comm->rank;
  if (n == 1) return ccSuccess;
  const uint64_t seq = comm->NextSeq();
  Agreement acc = Start(mine, r);
  std::vector<Agreement> sent;  // step k's send reads sent[k] until it completes
  sent.reserve(32);
  Inflight io(comm, kWireCallCheck);
  int step = 0;
  for (int dist = 1; dist < n; dist *= 2, ++step) {
    Agreement in;
    Request *recv = nullptr, *send = nullptr;
    sent.push_back(acc);
    CC_CHECK(io.Recv(Mod(r - dist, n), &in, sizeof(in), Tag(seq, step), &recv));
    CC_CHECK(io.Send(Mod(r + dist, n), &sent.back(), sizeof(Agreement), Tag(seq, step), &send));
    comm->callCheckBytesSent.fetch_add(sizeof(Agreement), std::memory_order_relaxed);
    CC_CHECK(io.Wait(&recv));
    Combine(&acc, in);
  }
  CC_CHECK(io.WaitAll());
  const FieldRange& refused = acc.f[kRefused];
  if (refused.hi != 0) {  // the other fields of a rank that refused its arguments mean nothing
    *agreed = true;
    return Fail(ccInvalidUsage, "rank %d refused the call (%s there; its ccGetLastError says why), so no rank ran "
                "it; nothing was written", refused.hiRank,
                ResultName(static_cast<ccResult_t>(refused.hi)));
  }
  std::string differ;
  for (int i = 0; i < kFields; ++i) {
    const FieldRange& f = acc.f[i];
    if (f.lo == f.hi || i == kDeviceCodec) continue;  // device codecs and host schedules may meet
    differ += std::string(differ.empty() ? "" : "; ") + kFieldNames[i] + " " + ValueText(i, f.lo) + " on rank " +
              std::to_string(f.loRank) + " but " + ValueText(i, f.hi) + " on rank " + std::to_string(f.hiRank);
  }
  if (differ.empty()) {
    if (anyDeviceCodec != nullptr) *anyDeviceCodec = acc.f[kDeviceCodec].hi != 0;
    return ccSuccess;
  }
  *agreed = true;
  return Fail(ccInvalidUsage,
              "the ranks made different calls: %s (rank %d was called for: %s). Every rank must make the same call "
              "(collective, count, datatype, op, root and compressor parameters), with compressors made and reset "
              "alike (a compressor's call number picks its dithers and chunks), and on buffers that meet on one path "
              "(with transport nccl, device buffers on every rank or on none; PowerSGD with its products on cuBLAS "
              "on every rank or on none)",
              differ.c_str(), r, Text(mine).c_str());
}

}  // namespace ccoll
