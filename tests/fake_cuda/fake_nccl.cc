// A CPU stand-in for the part of NCCL (nccl.h, 2.28) that ccoll's NCCL transport calls, on the fake CUDA runtime
// (fake_cuda_runtime.cc), so that the NCCL path runs where there is no GPU, with ranks as threads of one process, under
// the sanitizers too. What it models, which the tests rely on:
//
// Communicators. ncclGetUniqueId fills random bytes. ncclCommInitRank blocks until all nranks ranks of the id have
// joined; a bad nranks or rank, nranks that differ between ranks, a rank that joins twice or an id whose communicator
// is complete: ncclInvalidArgument. After FAKE_NCCL_TIMEOUT_S seconds (default 60) without all ranks it says so on
// stderr and returns ncclSystemError. Inside a group (ncclGroupStart) it joins at once and waits at the outermost
// ncclGroupEnd, so that one thread can create several ranks, as with NCCL. ncclCommInitRankConfig: the same, with the
// config's blocking attribute (NCCL_CONFIG_UNDEF_INT or no config: blocking; not 0 or 1: ncclInvalidArgument); see
// below for blocking == 0. The communicator keeps the fake device that was current (cudaGetDevice).
//
// Non-blocking communicators (config blocking == 0), which a caller must wait for: after every call that returns
// ncclInProgress it polls ncclCommGetAsyncError until that reads ncclSuccess (or an error) before it calls NCCL on the
// communicator again or queues anything else on the stream. The fake makes each part of that necessary:
//   - Init: ncclCommInitRankConfig joins at once and returns ncclInProgress (inside a group too, and then the group's
//     ncclGroupEnd returns ncclInProgress). A thread of the fake waits for the other ranks; the async error reads
//     ncclInProgress until all have joined, then ncclSuccess, or ncclSystemError after FAKE_NCCL_TIMEOUT_S.
//   - Lazy connection (NCCL connects peers at the first operations that need them): a rank's first group (or lone
//     call) that sends to a given peer, the first that receives from it (one connection per peer and direction; not
//     to itself), and its first collective (not on one rank) connect. The call that ends that group (ncclGroupEnd,
//     or the lone ncclSend, ncclAllReduce, ...) returns ncclInProgress, the async error of every rank in the group
//     reads ncclInProgress, and the group is queued on its streams only FAKE_NCCL_CONNECT_MS milliseconds later
//     (default 5), by a thread of the fake (cctest::FakePush, so recorded if the stream captures by then); then the
//     async error reads ncclSuccess again. Work the caller queued on the stream meanwhile runs BEFORE the NCCL
//     operation, as on a GPU, where the kernel is launched only once the connection is set up. Later groups with the
//     same connections are queued at once and return ncclSuccess, as with a blocking communicator.
//   - Any call on the communicator while its async error reads ncclInProgress (ncclCommGetAsyncError, ncclCommAbort
//     and ncclCommDestroy excepted; ncclCommCount, ncclCommUserRank, ncclCommCuDevice and ncclCommFinalize included)
//     fails with ncclInvalidArgument, as NCCL's ncclCommEnsureReady does ("Attempt to use communicator before the
//     previous operation returned ncclSuccess"), with a sentence saying so.
//   - As in NCCL, a call that fails on a non-blocking rank (an argument refused, a call while in progress) and a group
//     that fails (a failed call in it, a queuing error) leave that error as the async error of the group's
//     non-blocking ranks: every later call returns it, and the caller must abort the communicator. (NCCL's background
//     job may overwrite it with its own result when it ends, a race; here the first error stays.)
//   - Blocking and non-blocking communicators in one group: ncclInvalidArgument at ncclGroupEnd, as NCCL.
// The fake's threads hold the shared state, never a handle; ncclCommAbort ends them at once (a rank aborted before its
// connecting group is queued has its operations dropped, and one aborted while its init waits leaves the forming
// communicator, so the id can form anew), ncclCommDestroy waits for them (an init's wait included).
//
// Operations. Each is queued on its stream as one fake-CUDA operation (cctest::FakePush), recorded instead while the
// stream captures a graph; every match happens when the operation runs on the stream's thread, not when it is queued
// (so a graph's replays match again). Buffers must be fake device memory large enough for the call
// (cudaPointerGetAttributes), else ncclInvalidArgument at the call; so are an unknown datatype (the fp8 types
// included) or op, a peer or root out of range, and buffers that overlap other than as the in-place layouts below.
// Empty collectives (count 0) are discarded at the call, as NCCL does; empty sends and receives are matched. A call on
// a communicator with an async error returns that error, as NCCL does.
//
// Groups. ncclGroupStart/End nest (a per-thread depth). Calls inside a group are collected; at the outermost
// ncclGroupEnd the ones on each stream become ONE operation that progresses all of them at once and completes when
// all are done (NCCL's fused group kernel). Outside a group each call is a group of one. A call that fails inside a
// group makes ncclGroupEnd drop the whole group and return that error, as NCCL does. One rank of one communicator on
// several streams of a group is not modelled: ncclInvalidUsage. Groups may mix sends, receives and collectives.
//
// Send and receive. The k-th ncclSend from rank a to rank b of a communicator matches the k-th ncclRecv at b from a
// (order, no tags), in execution order. Rendezvous: a send completes only once its receive has copied the data, the
// most deadlock-prone model on purpose (NCCL may complete a small send early, into the peer's buffer; a schedule that
// needs that hangs on larger messages). A group posts all its sends, serves its receives as their sends appear, then
// waits for its sends to be taken. A matched pair whose byte sizes differ is the caller's bug: both sides are printed
// and the process aborts. peer == own rank is a copy (within one group: across groups it deadlocks, as on a GPU).
//
// Collectives. The k-th collective each rank of a communicator runs must be the same call (collective, count,
// datatype, op, root), else the difference is printed and the process aborts. Each rank waits until all ranks' k-th
// call has arrived, computes its output from all inputs combined in rank order 0..n-1 (every rank gets the same
// bytes: a reduce-scatter chunk or a reduce's result is the matching part of the all-reduce's), waits until all have
// computed (an in-place call must not overwrite an input another rank still reads), then writes. Integers wrap; ncclAvg
// of integers is the sum divided by nranks (truncating toward zero), of floats the sum of each input multiplied by
// 1/nranks rounded to the type (NCCL's PreMulSum, its factor rounded too); float16 and bfloat16 are combined in
// float and rounded to nearest even after every step, as NCCL's ring does. In-place: AllReduce, Broadcast and Reduce
// with sendbuff == recvbuff, AllGather with sendbuff == recvbuff + rank * sendcount, ReduceScatter with
// recvbuff == sendbuff + rank * recvcount.
//
// Failures. ncclCommAbort frees the handle but nothing a queued operation uses (the state is shared): its rank's
// operations, blocked or still queued, return at once without touching memory, and the rank counts as gone. A peer's
// operation that waits for a gone rank gives up promptly, leaves its buffers as they are and sets that peer's async
// error to ncclRemoteError (what a real peer sees when the connection closes); its rank then counts as gone as well,
// as if its owner had aborted it on seeing the error, so that a failure spreads instead of hanging the others. An
// operation that waits FAKE_NCCL_TIMEOUT_S seconds for a live rank is a deadlock a GPU would hang on forever: it says
// which operation of which rank waits for which rank, and aborts the process. ncclCommDestroy waits until the
// operations queued on the communicator have run (not graph launches: an operation that runs after the destroy aborts
// with a message, a use after free on a GPU), then frees; its peers do not see it as gone. ncclCommFinalize:
// ncclSuccess (ncclInvalidArgument on a non-blocking communicator in progress). ncclGetLastError: the calling thread's
// last error sentence, or "" (a failure in one of the fake's own threads is printed on stderr). ncclGetVersion: 22809.
//
// Thread safety: every rank's state, matching and data movement is under one mutex, so reads of a peer's buffer cannot
// race with its abort; a CPU test moves little data.
//
// Not modelled: the other nccl* functions (ncclCommInitAll, ncclCommSplit, ncclAlltoAll, ncclGather, ncclScatter,
// ncclBcast, user reduction ops, registration, windows), several devices, NCCL's environment variables
// (NCCL_COMM_BLOCKING, NCCL_RUNTIME_CONNECT included) and its own timeouts. Of non-blocking communicators: a
// ncclCommFinalize or ncclCommDestroy that returns ncclInProgress (here they complete in the call), a connection that
// fails or never completes (a peer that never answers is seen when the operation runs, as for a blocking
// communicator), and connections per channel or per algorithm. Only the nccl* symbols are defined, not the pnccl*
// profiling aliases.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "fake_launch.h"

namespace cctest {
namespace fakenccl {

using Clock = std::chrono::steady_clock;

int TimeoutSeconds() {
  static const int seconds = [] {
    const char* v = std::getenv("FAKE_NCCL_TIMEOUT_S");
    return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 60;
  }();
  return seconds;
}

// How long a non-blocking communicator's connecting group waits before it is queued (FAKE_NCCL_CONNECT_MS).
int ConnectDelayMs() {
  static const int ms = [] {
    const char* v = std::getenv("FAKE_NCCL_CONNECT_MS");
    return v != nullptr && std::atoi(v) >= 0 && *v != 0 ? std::atoi(v) : 5;
  }();
  return ms;
}

thread_local std::string tLastError;

ncclResult_t Fail(ncclResult_t result, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t Fail(ncclResult_t result, const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  tLastError = buf;
  return result;
}

enum class Kind { kSend, kRecv, kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };

const char* KindName(Kind k) {
  static const char* const kNames[] = {"ncclSend",      "ncclRecv",      "ncclAllReduce", "ncclReduceScatter",
                                       "ncclAllGather", "ncclBroadcast", "ncclReduce"};
  return kNames[static_cast<int>(k)];
}

// The datatypes the fake models, by their ncclDataType_t value (the fp8 ones are not).
struct TypeInfo {
  size_t size;
  const char* name;
};
constexpr TypeInfo kTypes[] = {{1, "int8"},   {1, "uint8"},   {4, "int32"},   {4, "uint32"},  {8, "int64"},
                               {8, "uint64"}, {2, "float16"}, {4, "float32"}, {8, "float64"}, {2, "bfloat16"}};
constexpr unsigned kNumTypes = sizeof kTypes / sizeof kTypes[0];

size_t TypeSize(ncclDataType_t t) { return static_cast<unsigned>(t) < kNumTypes ? kTypes[t].size : 0; }
const char* TypeName(ncclDataType_t t) { return static_cast<unsigned>(t) < kNumTypes ? kTypes[t].name : "unknown"; }

const char* OpName(ncclRedOp_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return static_cast<unsigned>(op) <= ncclAvg ? kNames[op] : "unknown";
}

// ---- Element arithmetic: each type's combine step, rounded to the type as NCCL's kernels store it.

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, overflow to infinity, NaN kept quiet.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // 65520 and up round to infinity
  if (abs < 0x38800000u) {                       // below 2^-14: a subnormal half, in steps of 2^-24
    float a;
    std::memcpy(&a, &abs, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // exact scaling; rounds to even
  }
  const uint32_t rebased = abs - 0x38000000u;  // exponent bias 127 -> 15
  return sign | static_cast<uint16_t>((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13);
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <typename T>
struct IntArith {
  using Storage = T;
  using U = std::make_unsigned_t<T>;
  // Wrapping, in unsigned arithmetic (signed overflow is undefined).
  static T Combine(ncclRedOp_t op, T a, T b) {
    switch (op) {
      case ncclProd:
        return static_cast<T>(static_cast<U>(uint64_t{static_cast<U>(a)} * uint64_t{static_cast<U>(b)}));
      case ncclMax:
        return std::max(a, b);
      case ncclMin:
        return std::min(a, b);
      default:
        return static_cast<T>(static_cast<U>(uint64_t{static_cast<U>(a)} + uint64_t{static_cast<U>(b)}));
    }
  }
  static T Divide(T sum, int n) {
    if (std::is_signed<T>::value) return static_cast<T>(static_cast<int64_t>(sum) / n);
    return static_cast<T>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(n));
  }
  static constexpr bool kPremultiplies = false;
  static T Premultiply(T x, int) { return x; }
};

template <typename T>
struct FloatArith {
  using Storage = T;
  static T Combine(ncclRedOp_t op, T a, T b) {
    switch (op) {
      case ncclProd:
        return a * b;
      case ncclMax:
        return std::max(a, b);
      case ncclMin:
        return std::min(a, b);
      default:
        return a + b;
    }
  }
  static T Divide(T sum, int n) { return sum / static_cast<T>(n); }
  static constexpr bool kPremultiplies = true;
  static T Premultiply(T x, int n) { return x * static_cast<T>(1.0 / n); }
};

// float16 and bfloat16: in float, rounded back after every step (float's 24 bits make that the correctly rounded
// result of the step).
template <float (*kToFloat)(uint16_t), uint16_t (*kFromFloat)(float)>
struct Arith16 {
  using Storage = uint16_t;
  static uint16_t Combine(ncclRedOp_t op, uint16_t a, uint16_t b) {
    return kFromFloat(FloatArith<float>::Combine(op, kToFloat(a), kToFloat(b)));
  }
  static uint16_t Divide(uint16_t sum, int n) { return kFromFloat(kToFloat(sum) / static_cast<float>(n)); }
  static constexpr bool kPremultiplies = true;
  static uint16_t Premultiply(uint16_t x, int n) {
    return kFromFloat(kToFloat(x) * kToFloat(kFromFloat(static_cast<float>(1.0 / n))));
  }
};

template <typename F>
void WithArith(ncclDataType_t type, F&& f) {
  switch (type) {
    case ncclInt8:
      f(IntArith<int8_t>());
      return;
    case ncclUint8:
      f(IntArith<uint8_t>());
      return;
    case ncclInt32:
      f(IntArith<int32_t>());
      return;
    case ncclUint32:
      f(IntArith<uint32_t>());
      return;
    case ncclInt64:
      f(IntArith<int64_t>());
      return;
    case ncclUint64:
      f(IntArith<uint64_t>());
      return;
    case ncclFloat16:
      f(Arith16<HalfToFloat, FloatToHalf>());
      return;
    case ncclFloat32:
      f(FloatArith<float>());
      return;
    case ncclFloat64:
      f(FloatArith<double>());
      return;
    case ncclBfloat16:
      f(Arith16<Bf16ToFloat, FloatToBf16>());
      return;
    default:
      std::abort();  // refused at the call
  }
}

// out[i] = in[0][i] op in[1][i] op ... in rank order (ncclAvg: of floats each input premultiplied, of integers the sum
// divided by n).
void ReduceRanks(ncclDataType_t type, ncclRedOp_t op, const std::vector<const char*>& in, size_t count, char* out) {
  WithArith(type, [&](auto arith) {
    using A = decltype(arith);
    using S = typename A::Storage;
    const ncclRedOp_t step = op == ncclAvg ? ncclSum : op;
    const int n = static_cast<int>(in.size());
    const bool premultiply = op == ncclAvg && A::kPremultiplies;
    for (size_t i = 0; i < count; ++i) {
      S acc;
      std::memcpy(&acc, in[0] + i * sizeof(S), sizeof(S));
      if (premultiply) acc = A::Premultiply(acc, n);
      for (size_t j = 1; j < in.size(); ++j) {
        S x;
        std::memcpy(&x, in[j] + i * sizeof(S), sizeof(S));
        acc = A::Combine(step, acc, premultiply ? A::Premultiply(x, n) : x);
      }
      if (op == ncclAvg && !premultiply) acc = A::Divide(acc, n);
      std::memcpy(out + i * sizeof(S), &acc, sizeof(S));
    }
  });
}

// ---- Shared state: everything below is guarded by gMutex; gCv is notified at every change.

std::mutex gMutex;
std::condition_variable gCv;

// How a rank stands, as its peers see it. Gone (failed or aborted): peers waiting for it give up. Destroyed: its
// queued operations have all run; a peer still waiting for it waits for good (a deadlock).
enum class RankState { kAlive, kFailed, kAborted, kDestroyed };

struct SendPost {
  const char* data;  // the fake's view of the sender's buffer
  size_t count;
  ncclDataType_t type;
  bool consumed = false;
};

// Sends from one rank to another (or to itself): the k-th posted matches the k-th receive.
struct Channel {
  uint64_t sends = 0, recvs = 0;  // posted, claimed
  std::map<uint64_t, SendPost> posted;
};

// The k-th collective of a communicator, as the ranks arrive.
struct CollSlot {
  Kind kind;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  int first = -1;  // the first rank to arrive, whose call the others must match
  std::vector<const char*> send;
  std::vector<char> arrived, computed;
  int arrivedCount = 0, computedCount = 0, finishedCount = 0;
};

// A communicator's state, shared by its ranks' handles and by every operation queued on it.
struct Clique {
  std::string key;  // the unique id's bytes
  int serial;       // for messages
  int nranks;
  std::vector<char> joined;
  int joinedCount = 0;
  std::vector<RankState> state;
  std::vector<ncclResult_t> asyncError;
  std::vector<int> pending;    // operations queued (not recorded into a graph) and not yet run, per rank
  std::vector<char> blocking;  // per rank, from its config
  // Per rank: the fake's background jobs that work for it (a non-blocking init waiting for the other ranks, a
  // connecting group not yet queued). While there is one, a non-blocking rank's async error reads ncclInProgress.
  std::vector<int> busy;
  // Connections a non-blocking rank has set up: [rank * nranks + peer] for its sends and its receives, and per rank
  // for its collectives.
  std::vector<char> sendConnected, recvConnected, collConnected;
  std::vector<Channel> channels;  // [src * nranks + dst]
  std::vector<uint64_t> collNext;
  std::map<uint64_t, CollSlot> colls;

  bool Gone(int r) const { return state[r] == RankState::kFailed || state[r] == RankState::kAborted; }
  Channel& Chan(int src, int dst) { return channels[static_cast<size_t>(src * nranks + dst)]; }
};

// Unique ids whose communicator is still forming, and those whose ranks have all joined.
std::map<std::string, std::shared_ptr<Clique>>& Forming() {
  static auto* m = new std::map<std::string, std::shared_ptr<Clique>>();
  return *m;
}
std::set<std::string>& Formed() {
  static auto* s = new std::set<std::string>();
  return *s;
}
int gSerial = 0;

// One call, as the stream runs it. Buffers are the fake's views (FakeHostView), taken at the call as kernel arguments
// are.
struct Task {
  Kind kind;
  std::shared_ptr<Clique> clique;
  int rank;
  const char* send;
  char* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int peer;  // the peer of a send or receive, the root of a broadcast or reduce, else -1
};

// Where one run of a task is: one run per execution, so that a graph can replay it.
struct TaskRun {
  uint64_t seq = 0;  // its number among the sends on its channel, the receives, or the collectives
  int phase = 0;     // collectives: 0 waiting for all to arrive, 1 computed, waiting for all to compute
  bool done = false;
  std::vector<char> out;
};

std::string Describe(const Task& t, const TaskRun& run) {
  char buf[256];
  const size_t bytes = t.count * TypeSize(t.type);
  switch (t.kind) {
    case Kind::kSend:
    case Kind::kRecv:
      std::snprintf(buf, sizeof buf, "%s #%llu %s rank %d (%zu elements of %s, %zu bytes; communicator %d)",
                    KindName(t.kind), static_cast<unsigned long long>(run.seq), t.kind == Kind::kSend ? "to" : "from",
                    t.peer, t.count, TypeName(t.type), bytes, t.clique->serial);
      break;
    default:
      std::snprintf(buf, sizeof buf, "%s (collective #%llu of communicator %d: count %zu, %s, op %s, root %d)",
                    KindName(t.kind), static_cast<unsigned long long>(run.seq), t.clique->serial, t.count,
                    TypeName(t.type), OpName(t.op), t.peer);
  }
  return buf;
}

void CheckSameCall(const Task& t, const CollSlot& s, uint64_t seq) {
  if (s.kind == t.kind && s.count == t.count && s.type == t.type && s.op == t.op && s.root == t.peer) return;
  std::fprintf(stderr,
               "fake NCCL: collective #%llu of communicator %d differs between ranks: rank %d calls %s(count %zu, %s, "
               "op %s, root %d) but rank %d calls %s(count %zu, %s, op %s, root %d). Every rank must make the same "
               "collective calls in the same order; on a GPU this hangs or corrupts data.\n",
               static_cast<unsigned long long>(seq), t.clique->serial, s.first, KindName(s.kind), s.count,
               TypeName(s.type), OpName(s.op), s.root, t.rank, KindName(t.kind), t.count, TypeName(t.type),
               OpName(t.op), t.peer);
  std::abort();
}

// Posts a send, claims a receive's number, or arrives at a collective.
void Start(const Task& t, TaskRun& run) {
  Clique& c = *t.clique;
  switch (t.kind) {
    case Kind::kSend: {
      Channel& ch = c.Chan(t.rank, t.peer);
      run.seq = ch.sends++;
      ch.posted.emplace(run.seq, SendPost{t.send, t.count, t.type});
      return;
    }
    case Kind::kRecv:
      run.seq = c.Chan(t.peer, t.rank).recvs++;
      return;
    default: {
      run.seq = c.collNext[static_cast<size_t>(t.rank)]++;
      CollSlot& s = c.colls[run.seq];
      if (s.first < 0) {
        s.kind = t.kind;
        s.count = t.count;
        s.type = t.type;
        s.op = t.op;
        s.root = t.peer;
        s.first = t.rank;
        s.send.assign(static_cast<size_t>(c.nranks), nullptr);
        s.arrived.assign(static_cast<size_t>(c.nranks), 0);
        s.computed.assign(static_cast<size_t>(c.nranks), 0);
      } else {
        CheckSameCall(t, s, run.seq);
      }
      s.send[static_cast<size_t>(t.rank)] = t.send;
      s.arrived[static_cast<size_t>(t.rank)] = 1;
      ++s.arrivedCount;
    }
  }
}

// This rank's output of a collective, from all ranks' inputs (all have arrived and are alive).
void Compute(const Task& t, const CollSlot& s, std::vector<char>* out) {
  const int n = t.clique->nranks;
  const size_t es = TypeSize(t.type);
  const size_t bytes = t.count * es;
  switch (t.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceScatter:
    case Kind::kReduce: {
      if (t.kind == Kind::kReduce && t.rank != t.peer) return;  // only the root receives
      const size_t offset = t.kind == Kind::kReduceScatter ? static_cast<size_t>(t.rank) * bytes : 0;
      std::vector<const char*> in;
      for (int j = 0; j < n; ++j) in.push_back(s.send[static_cast<size_t>(j)] + offset);
      out->resize(bytes);
      ReduceRanks(t.type, t.op, in, t.count, out->data());
      return;
    }
    case Kind::kAllGather:
      out->resize(bytes * static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) {
        std::memcpy(out->data() + static_cast<size_t>(j) * bytes, s.send[static_cast<size_t>(j)], bytes);
      }
      return;
    case Kind::kBroadcast:
      out->assign(s.send[static_cast<size_t>(t.peer)], s.send[static_cast<size_t>(t.peer)] + bytes);
      return;
    default:
      return;
  }
}

enum class Step { kWait, kProgress, kDone, kPeerGone };

// Moves the task on as far as it can without waiting. *waitsFor: the rank it waits for (kWait, kPeerGone).
Step Advance(const Task& t, TaskRun& run, int* waitsFor, const char** what) {
  Clique& c = *t.clique;
  const int n = c.nranks;
  switch (t.kind) {
    case Kind::kSend: {
      Channel& ch = c.Chan(t.rank, t.peer);
      auto it = ch.posted.find(run.seq);
      if (it->second.consumed) {
        ch.posted.erase(it);
        return Step::kDone;
      }
      *waitsFor = t.peer;
      *what = "to receive it";
      return c.Gone(t.peer) ? Step::kPeerGone : Step::kWait;
    }
    case Kind::kRecv: {
      *waitsFor = t.peer;
      *what = "to send it";
      if (c.Gone(t.peer)) return Step::kPeerGone;  // its buffer may be gone with it
      Channel& ch = c.Chan(t.peer, t.rank);
      auto it = ch.posted.find(run.seq);
      if (it == ch.posted.end()) return Step::kWait;
      SendPost& post = it->second;
      const size_t sent = post.count * TypeSize(post.type);
      const size_t bytes = t.count * TypeSize(t.type);
      if (sent != bytes) {
        std::fprintf(stderr,
                     "fake NCCL: rank %d's ncclSend #%llu to rank %d sends %zu elements of %s (%zu bytes), but rank "
                     "%d's ncclRecv #%llu from rank %d, which it matches, takes %zu elements of %s (%zu bytes) "
                     "(communicator %d). A bug in the caller: on a GPU the receive is truncated or waits for data "
                     "that never comes.\n",
                     t.peer, static_cast<unsigned long long>(run.seq), t.rank, post.count, TypeName(post.type), sent,
                     t.rank, static_cast<unsigned long long>(run.seq), t.peer, t.count, TypeName(t.type), bytes,
                     c.serial);
        std::abort();
      }
      if (bytes > 0) std::memcpy(t.recv, post.data, bytes);
      post.consumed = true;
      return Step::kDone;
    }
    default: {
      CollSlot& s = c.colls[run.seq];
      if (run.phase == 0) {
        *what = "to join the collective";
        for (int r = 0; r < n; ++r) {
          if (!s.arrived[static_cast<size_t>(r)] || c.Gone(r)) {
            *waitsFor = r;
            if (c.Gone(r)) return Step::kPeerGone;
          }
        }
        if (s.arrivedCount < n) return Step::kWait;
        Compute(t, s, &run.out);
        s.computed[static_cast<size_t>(t.rank)] = 1;
        ++s.computedCount;
        run.phase = 1;
        return Step::kProgress;
      }
      *what = "to read the inputs of the collective";
      if (s.computedCount < n) {
        for (int r = 0; r < n; ++r) {
          if (!s.computed[static_cast<size_t>(r)]) {
            *waitsFor = r;
            if (c.Gone(r)) return Step::kPeerGone;
          }
        }
        return Step::kWait;
      }
      if (!run.out.empty()) std::memcpy(t.recv, run.out.data(), run.out.size());
      if (++s.finishedCount == n) c.colls.erase(run.seq);
      return Step::kDone;
    }
  }
}

// One group's operations of one stream, run on the stream's thread. counted: queued directly (not from a graph), so
// each task holds its rank's pending count.
void RunGroup(const std::vector<Task>& tasks, bool counted) {
  std::unique_lock<std::mutex> lock(gMutex);
  auto finish = [&] {
    if (counted) {
      for (const Task& t : tasks) --t.clique->pending[static_cast<size_t>(t.rank)];
    }
    gCv.notify_all();
  };
  for (const Task& t : tasks) {
    const RankState st = t.clique->state[static_cast<size_t>(t.rank)];
    if (st == RankState::kDestroyed) {
      std::fprintf(stderr,
                   "fake NCCL: rank %d's %s on communicator %d runs after ncclCommDestroy of that rank (a CUDA graph "
                   "launched after the destroy, or not finished before it): on a GPU a use after free.\n",
                   t.rank, KindName(t.kind), t.clique->serial);
      std::abort();
    }
    if (st != RankState::kAlive) {  // aborted or failed: return at once, touching nothing
      finish();
      return;
    }
  }
  std::vector<TaskRun> runs(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) Start(tasks[i], runs[i]);
  gCv.notify_all();

  const auto timeout = std::chrono::seconds(TimeoutSeconds());
  Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    bool progress = false, all = true, gone = false;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const Task& t = tasks[i];
      if (runs[i].done) continue;
      if (t.clique->state[static_cast<size_t>(t.rank)] != RankState::kAlive) {  // aborted meanwhile
        finish();
        return;
      }
      int waitsFor = -1;
      const char* what = "";
      switch (Advance(t, runs[i], &waitsFor, &what)) {
        case Step::kDone:
          runs[i].done = true;
          progress = true;
          break;
        case Step::kProgress:
          progress = true;
          all = false;
          break;
        case Step::kWait:
          all = false;
          break;
        case Step::kPeerGone:
          all = false;
          gone = true;
          break;
      }
    }
    if (gone) {
      // The whole group gives up, as an aborted NCCL kernel does; its ranks count as gone from now on.
      for (const Task& t : tasks) {
        const size_t r = static_cast<size_t>(t.rank);
        if (t.clique->state[r] == RankState::kAlive) {
          t.clique->state[r] = RankState::kFailed;
          t.clique->asyncError[r] = ncclRemoteError;
        }
      }
      finish();
      return;
    }
    if (all) {
      finish();
      return;
    }
    if (progress) {
      gCv.notify_all();
      deadline = Clock::now() + timeout;
      continue;
    }
    if (Clock::now() >= deadline) {
      for (size_t i = 0; i < tasks.size(); ++i) {
        if (runs[i].done) continue;
        int waitsFor = -1;
        const char* what = "";
        Advance(tasks[i], runs[i], &waitsFor, &what);
        const Clique& c = *tasks[i].clique;
        std::fprintf(stderr,
                     "fake NCCL: deadlock: rank %d's %s has waited %d s for rank %d %s; rank %d %s. On a GPU this "
                     "hangs forever (FAKE_NCCL_TIMEOUT_S sets the wait).\n",
                     tasks[i].rank, Describe(tasks[i], runs[i]).c_str(), TimeoutSeconds(), waitsFor, what, waitsFor,
                     waitsFor >= 0 && c.state[static_cast<size_t>(waitsFor)] == RankState::kDestroyed
                         ? "has destroyed its communicator"
                         : "is alive (its stream has not run the matching call)");
      }
      std::abort();
    }
    gCv.wait_until(lock, deadline);
  }
}

// ---- Calls.

struct Queued {
  Task task;
  cudaStream_t stream;
};

// The calling thread's group (ncclGroupStart .. ncclGroupEnd).
struct GroupState {
  int depth = 0;
  ncclResult_t error = ncclSuccess;  // the first call that failed inside the group
  std::vector<Queued> ops;
  std::vector<ncclComm_t> inits;  // joined, waiting for the other ranks at the outermost ncclGroupEnd
};
thread_local GroupState tGroup;

// Queues each stream's part of a group as one operation.
ncclResult_t Queue(const std::vector<Queued>& ops) {
  FakeKeepLastError keep;
  std::vector<cudaStream_t> streams;
  for (const Queued& q : ops) {
    if (std::find(streams.begin(), streams.end(), q.stream) == streams.end()) streams.push_back(q.stream);
  }
  for (cudaStream_t stream : streams) {
    auto tasks = std::make_shared<std::vector<Task>>();
    for (const Queued& q : ops) {
      if (q.stream == stream) tasks->push_back(q.task);
    }
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &status);
    if (e != cudaSuccess) {
      return Fail(ncclUnhandledCudaError, "%s: cudaStreamIsCapturing: %s", KindName(tasks->front().kind),
                  cudaGetErrorString(e));
    }
    const bool counted = status == cudaStreamCaptureStatusNone;
    if (counted) {
      std::lock_guard<std::mutex> lock(gMutex);
      for (const Task& t : *tasks) ++t.clique->pending[static_cast<size_t>(t.rank)];
    }
    std::shared_ptr<const std::vector<Task>> run = tasks;
    e = FakePush(stream, [run, counted] { RunGroup(*run, counted); });
    if (e != cudaSuccess) {
      if (counted) {
        std::lock_guard<std::mutex> lock(gMutex);
        for (const Task& t : *tasks) --t.clique->pending[static_cast<size_t>(t.rank)];
        gCv.notify_all();
      }
      return Fail(ncclUnhandledCudaError, "%s: queuing on the stream failed: %s", KindName(tasks->front().kind),
                  cudaGetErrorString(e));
    }
  }
  return ncclSuccess;
}

// A failed call or group leaves its error as the async error of the non-blocking ranks involved, as NCCL's enqueue
// and group cleanup do: the communicator is unusable from then on. Under gMutex.
void SetAsyncErrorLocked(Clique& c, int rank, ncclResult_t r) {
  const size_t i = static_cast<size_t>(rank);
  if (!c.blocking[i] && c.asyncError[i] == ncclSuccess) c.asyncError[i] = r;
}
void SetAsyncErrorLocked(const Task& t, ncclResult_t r) {
  if (t.clique != nullptr) SetAsyncErrorLocked(*t.clique, t.rank, r);
}
void SetAsyncError(const std::vector<Queued>& ops, ncclResult_t r) {
  std::lock_guard<std::mutex> lock(gMutex);
  for (const Queued& q : ops) SetAsyncErrorLocked(q.task, r);
}

// Marks the connection a non-blocking rank's task needs; true if it had none yet (NCCL connects it now, at the first
// group that needs it). A send to itself and a one-rank collective need none. Under gMutex.
bool ConnectLocked(const Task& t) {
  Clique& c = *t.clique;
  const size_t rank = static_cast<size_t>(t.rank);
  if (c.blocking[rank]) return false;  // connected inline, invisibly
  char* flag;
  switch (t.kind) {
    case Kind::kSend:
    case Kind::kRecv:
      if (t.peer == t.rank) return false;
      flag = &(t.kind == Kind::kSend
                   ? c.sendConnected
                   : c.recvConnected)[rank * static_cast<size_t>(c.nranks) + static_cast<size_t>(t.peer)];
      break;
    default:
      if (c.nranks == 1) return false;
      flag = &c.collConnected[rank];
  }
  const bool fresh = *flag == 0;
  *flag = 1;
  return fresh;
}

using RankRef = std::pair<std::shared_ptr<Clique>, int>;

// The ranks that ops work for, each once.
std::vector<RankRef> RanksOf(const std::vector<Queued>& ops) {
  std::vector<RankRef> ranks;
  for (const Queued& q : ops) {
    RankRef r{q.task.clique, q.task.rank};
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(std::move(r));
  }
  return ranks;
}

// A group that connects: queued a little later by a thread of the fake, its ranks busy (ncclInProgress) until then.
// The thread holds the shared state, never a handle, which ncclCommAbort may delete meanwhile.
void QueueLater(std::vector<Queued> ops) {
  std::vector<RankRef> ranks = RanksOf(ops);
  {
    std::lock_guard<std::mutex> lock(gMutex);
    for (const RankRef& r : ranks) ++r.first->busy[static_cast<size_t>(r.second)];
  }
  std::thread([ops = std::move(ops), ranks = std::move(ranks)]() mutable {
    auto aborted = [](const Task& t) { return t.clique->state[static_cast<size_t>(t.rank)] == RankState::kAborted; };
    {
      std::unique_lock<std::mutex> lock(gMutex);
      gCv.wait_until(lock, Clock::now() + std::chrono::milliseconds(ConnectDelayMs()), [&] {
        return std::any_of(ops.begin(), ops.end(), [&](const Queued& q) { return aborted(q.task); });
      });
      // An aborted rank's operations are dropped: its stream may go with it (its peers see it gone).
      ops.erase(std::remove_if(ops.begin(), ops.end(), [&](const Queued& q) { return aborted(q.task); }), ops.end());
    }
    const ncclResult_t r = ops.empty() ? ncclSuccess : Queue(ops);
    std::lock_guard<std::mutex> lock(gMutex);
    if (r != ncclSuccess) {
      std::fprintf(stderr, "fake NCCL: queuing a non-blocking group after its connection setup failed: %s\n",
                   tLastError.c_str());
      for (const Queued& q : ops) SetAsyncErrorLocked(q.task, r);
    }
    for (const RankRef& rank : ranks) --rank.first->busy[static_cast<size_t>(rank.second)];
    gCv.notify_all();
  }).detach();
}

// Queues a group whose calls have all been checked: at once, or, for non-blocking ranks that need a new connection,
// a little later (ncclInProgress).
ncclResult_t Launch(std::vector<Queued> ops) {
  if (ops.empty()) return ncclSuccess;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (ops[i].task.clique == ops[j].task.clique && ops[i].task.rank == ops[j].task.rank &&
          ops[i].stream != ops[j].stream) {
        const ncclResult_t r = Fail(ncclInvalidUsage,
                                    "ncclGroupEnd: rank %d of one communicator has operations on two streams in the "
                                    "group; the fake NCCL does not model a group that joins several streams",
                                    ops[i].task.rank);
        SetAsyncError(ops, r);
        return r;
      }
    }
  }
  bool connecting = false;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    for (const Queued& q : ops) connecting = ConnectLocked(q.task) || connecting;
  }
  if (connecting) {
    QueueLater(std::move(ops));
    return ncclInProgress;
  }
  const ncclResult_t r = Queue(ops);
  if (r != ncclSuccess) SetAsyncError(ops, r);
  return r;
}

// A call inside a group joins it (its error fails the group); outside, it is a group of its own. A failed call on a
// non-blocking rank leaves its error as the rank's async error.
ncclResult_t Submit(ncclResult_t checked, const Task& task, cudaStream_t stream) {
  if (checked != ncclSuccess && task.clique != nullptr) {
    std::lock_guard<std::mutex> lock(gMutex);
    SetAsyncErrorLocked(task, checked);
  }
  if (tGroup.depth > 0) {
    if (checked != ncclSuccess) {
      if (tGroup.error == ncclSuccess) tGroup.error = checked;
      return checked;
    }
    tGroup.ops.push_back(Queued{task, stream});
    return ncclSuccess;
  }
  if (checked != ncclSuccess) return checked;
  return Launch({Queued{task, stream}});
}

}  // namespace fakenccl
}  // namespace cctest

// The handle: a rank's view of the shared state (nccl.h declares the struct here, outside any namespace).
struct ncclComm {
  std::shared_ptr<cctest::fakenccl::Clique> clique;
  int rank;
  int device;
};

namespace cctest {
namespace fakenccl {

// What ncclCommGetAsyncError reads. Under gMutex.
ncclResult_t AsyncErrorLocked(const Clique& c, int rank) {
  const size_t r = static_cast<size_t>(rank);
  if (c.asyncError[r] != ncclSuccess) return c.asyncError[r];
  return !c.blocking[r] && c.busy[r] > 0 ? ncclInProgress : ncclSuccess;
}

// A call on a non-blocking communicator whose async error reads ncclInProgress: NCCL's ncclCommEnsureReady. Under
// gMutex.
ncclResult_t CheckReadyLocked(ncclComm_t comm, const char* fn) {
  if (AsyncErrorLocked(*comm->clique, comm->rank) != ncclInProgress) return ncclSuccess;
  return Fail(ncclInvalidArgument,
              "%s: rank %d: the non-blocking communicator's previous operation has not completed: "
              "ncclCommGetAsyncError reads ncclInProgress (NCCL: \"Attempt to use communicator before the previous "
              "operation returned ncclSuccess\"). The caller must poll ncclCommGetAsyncError until it reads "
              "ncclSuccess before its next call on the communicator, and before it queues other work on the stream, "
              "which would otherwise run before the NCCL operation",
              fn, comm->rank);
}

ncclResult_t CheckReady(ncclComm_t comm, const char* fn) {
  std::lock_guard<std::mutex> lock(gMutex);
  return CheckReadyLocked(comm, fn);
}

ncclResult_t CheckComm(ncclComm_t comm, const char* fn) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  std::lock_guard<std::mutex> lock(gMutex);
  const ncclResult_t async = comm->clique->asyncError[static_cast<size_t>(comm->rank)];
  if (async != ncclSuccess) {
    return Fail(async, "%s: rank %d: the communicator failed earlier (%s); abort it", fn, comm->rank,
                ncclGetErrorString(async));
  }
  return CheckReadyLocked(comm, fn);
}

// bytes at p must be fake device memory, in one allocation.
ncclResult_t CheckBuffer(const char* fn, const char* name, const void* p, size_t bytes, int rank) {
  if (bytes == 0) return ncclSuccess;
  if (p == nullptr) return Fail(ncclInvalidArgument, "%s: rank %d: %s is NULL", fn, rank, name);
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    return Fail(ncclInvalidArgument, "%s: rank %d: %s %p is not device memory (cudaPointerGetAttributes type %d)", fn,
                rank, name, p, static_cast<int>(a.type));
  }
  const char* last = static_cast<const char*>(p) + bytes - 1;
  if (cudaPointerGetAttributes(&a, last) != cudaSuccess || a.type != cudaMemoryTypeDevice ||
      HostView(last) != HostView(static_cast<const char*>(p)) + bytes - 1) {
    return Fail(ncclInvalidArgument, "%s: rank %d: %s %p does not hold the %zu bytes the call reaches", fn, rank, name,
                p, bytes);
  }
  return ncclSuccess;
}

ncclResult_t CheckType(const char* fn, ncclDataType_t type, int rank) {
  if (TypeSize(type) == 0) {
    return Fail(ncclInvalidArgument, "%s: rank %d: datatype %d is not one the fake NCCL models", fn, rank,
                static_cast<int>(type));
  }
  return ncclSuccess;
}

ncclResult_t CheckOp(const char* fn, ncclRedOp_t op, int rank) {
  if (static_cast<unsigned>(op) > ncclAvg) {
    return Fail(ncclInvalidArgument, "%s: rank %d: reduction op %d is not one the fake NCCL models", fn, rank,
                static_cast<int>(op));
  }
  return ncclSuccess;
}

ncclResult_t CheckRank(const char* fn, const char* name, int r, int nranks, int rank) {
  if (r < 0 || r >= nranks) {
    return Fail(ncclInvalidArgument, "%s: rank %d: %s %d is not a rank of the %d", fn, rank, name, r, nranks);
  }
  return ncclSuccess;
}

// Two ranges that overlap other than as the in-place layout (a == b + inPlaceOffset).
ncclResult_t CheckOverlap(const char* fn, const void* send, size_t sendBytes, const void* recv, size_t recvBytes,
                          size_t inPlaceOffset, int rank) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (sendBytes == 0 || recvBytes == 0 || s + sendBytes <= r || r + recvBytes <= s) return ncclSuccess;
  if (sendBytes <= recvBytes ? s == r + inPlaceOffset : r == s + inPlaceOffset) return ncclSuccess;
  return Fail(ncclInvalidArgument,
              "%s: rank %d: sendbuff %p and recvbuff %p overlap, but not as the in-place layout (NCCL leaves that "
              "undefined)",
              fn, rank, send, recv);
}

// The checks every collective shares, then the task.
ncclResult_t Collective(Kind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = KindName(kind);
  ncclResult_t r = CheckComm(comm, fn);
  Task t{kind, nullptr, 0, nullptr, nullptr, count, type, op, root};
  if (comm != nullptr) {
    t.clique = comm->clique;
    t.rank = comm->rank;
  }
  if (r == ncclSuccess) r = CheckType(fn, type, comm->rank);
  const bool reduces = kind == Kind::kAllReduce || kind == Kind::kReduceScatter || kind == Kind::kReduce;
  if (r == ncclSuccess && reduces) r = CheckOp(fn, op, comm->rank);
  if (!reduces) t.op = ncclSum;  // not part of the call
  const bool rooted = kind == Kind::kBroadcast || kind == Kind::kReduce;
  if (!rooted) t.peer = -1;
  if (r == ncclSuccess && rooted) r = CheckRank(fn, "root", root, comm->clique->nranks, comm->rank);
  if (r == ncclSuccess) {
    const int n = comm->clique->nranks, rank = comm->rank;
    const size_t bytes = count * TypeSize(type), all = bytes * static_cast<size_t>(n);
    const size_t mine = static_cast<size_t>(rank) * bytes;
    size_t sendBytes = bytes, recvBytes = bytes;
    if (kind == Kind::kReduceScatter) sendBytes = all;
    if (kind == Kind::kAllGather) recvBytes = all;
    if (kind == Kind::kBroadcast && rank != root) sendBytes = 0;  // only the root's sendbuff is read
    if (kind == Kind::kReduce && rank != root) recvBytes = 0;     // only the root's recvbuff is written
    r = CheckBuffer(fn, "sendbuff", sendbuff, sendBytes, rank);
    if (r == ncclSuccess) r = CheckBuffer(fn, "recvbuff", recvbuff, recvBytes, rank);
    if (r == ncclSuccess) {
      r = CheckOverlap(fn, sendbuff, sendBytes, recvbuff, recvBytes,
                       kind == Kind::kAllGather || kind == Kind::kReduceScatter ? mine : 0, rank);
    }
    t.send = static_cast<const char*>(HostView(sendBytes ? sendbuff : nullptr));
    t.recv = static_cast<char*>(HostView(recvBytes ? recvbuff : nullptr));
  }
  if (r == ncclSuccess && count == 0) return ncclSuccess;  // NCCL discards empty collectives
  return Submit(r, t, stream);
}

ncclResult_t PointToPoint(Kind kind, const void* buff, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                          cudaStream_t stream) {
  const char* fn = KindName(kind);
  ncclResult_t r = CheckComm(comm, fn);
  Task t{kind, nullptr, 0, nullptr, nullptr, count, type, ncclSum, peer};
  if (comm != nullptr) {
    t.clique = comm->clique;
    t.rank = comm->rank;
  }
  if (r == ncclSuccess) r = CheckType(fn, type, comm->rank);
  if (r == ncclSuccess) r = CheckRank(fn, "peer", peer, comm->clique->nranks, comm->rank);
  if (r == ncclSuccess) {
    r = CheckBuffer(fn, kind == Kind::kSend ? "sendbuff" : "recvbuff", buff, count * TypeSize(type), comm->rank);
    if (kind == Kind::kSend) {
      t.send = static_cast<const char*>(HostView(count ? buff : nullptr));
    } else {
      t.recv = static_cast<char*>(HostView(count ? const_cast<void*>(buff) : nullptr));
    }
  }
  return Submit(r, t, stream);
}

// Joins the communicator of id as rank; the handle is usable once WaitJoined succeeds (blocking), or once the async
// error reads ncclSuccess (non-blocking: the rank is busy until its WaitJoinedLater is done).
ncclResult_t Join(const char* fn, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, "%s: rank %d is not a rank of nranks %d", fn, rank, nranks);
  }
  int device = 0;
  cudaGetDevice(&device);
  const std::string key(id.internal, sizeof id.internal);
  std::lock_guard<std::mutex> lock(gMutex);
  if (Formed().count(key) != 0) {
    return Fail(ncclInvalidArgument,
                "%s: rank %d: all ranks of this unique id's communicator have already joined; each communicator needs "
                "an id of its own (ncclGetUniqueId)",
                fn, rank);
  }
  std::shared_ptr<Clique> c = Forming()[key];  // a copy: the entry goes once every rank has joined
  if (c == nullptr) {
    c = std::make_shared<Clique>();
    c->key = key;
    c->serial = ++gSerial;
    c->nranks = nranks;
    const size_t n = static_cast<size_t>(nranks);
    c->joined.assign(n, 0);
    c->state.assign(n, RankState::kAlive);
    c->asyncError.assign(n, ncclSuccess);
    c->pending.assign(n, 0);
    c->blocking.assign(n, 1);
    c->busy.assign(n, 0);
    c->sendConnected.assign(n * n, 0);
    c->recvConnected.assign(n * n, 0);
    c->collConnected.assign(n, 0);
    c->channels.resize(n * n);
    c->collNext.assign(n, 0);
    Forming()[key] = c;
  } else if (c->nranks != nranks) {
    return Fail(ncclInvalidArgument, "%s: rank %d joins with nranks %d, but ranks before it joined with nranks %d", fn,
                rank, nranks, c->nranks);
  }
  if (c->joined[static_cast<size_t>(rank)]) {
    return Fail(ncclInvalidArgument, "%s: rank %d of this unique id has already joined", fn, rank);
  }
  c->joined[static_cast<size_t>(rank)] = 1;
  c->blocking[static_cast<size_t>(rank)] = blocking ? 1 : 0;
  if (!blocking) ++c->busy[static_cast<size_t>(rank)];
  if (++c->joinedCount == nranks) {
    Formed().insert(key);
    Forming().erase(key);
    gCv.notify_all();
  }
  *comm = new ncclComm{c, rank, device};
  return ncclSuccess;
}

// A rank leaves a communicator that is still forming (its wait timed out, or it was aborted): the others wait without
// it. Under gMutex.
void LeaveFormingLocked(Clique& c, int rank) {
  if (!c.joined[static_cast<size_t>(rank)] || c.joinedCount == c.nranks) return;
  c.joined[static_cast<size_t>(rank)] = 0;
  if (--c.joinedCount == 0) Forming().erase(c.key);
}

// The rank's wait for the others timed out: it leaves and fails. Under gMutex.
void JoinTimedOutLocked(const char* fn, Clique& c, int rank) {
  std::fprintf(stderr,
               "fake NCCL: %s: rank %d waited %d s for the other ranks to join; %d of %d did (FAKE_NCCL_TIMEOUT_S)\n",
               fn, rank, TimeoutSeconds(), c.joinedCount, c.nranks);
  LeaveFormingLocked(c, rank);
  c.state[static_cast<size_t>(rank)] = RankState::kFailed;
  c.asyncError[static_cast<size_t>(rank)] = ncclSystemError;
}

// Waits until every rank has joined. On the timeout the rank leaves again and its handle is marked failed.
ncclResult_t WaitJoined(const char* fn, ncclComm_t comm) {
  Clique& c = *comm->clique;
  std::unique_lock<std::mutex> lock(gMutex);
  const auto deadline = Clock::now() + std::chrono::seconds(TimeoutSeconds());
  if (gCv.wait_until(lock, deadline, [&] { return c.joinedCount == c.nranks; })) return ncclSuccess;
  JoinTimedOutLocked(fn, c, comm->rank);
  return Fail(ncclSystemError, "%s: rank %d: only %d of %d ranks joined within %d s", fn, comm->rank, c.joinedCount,
              c.nranks, TimeoutSeconds());
}

// A non-blocking init's wait for the other ranks, by a thread of the fake, which ends the rank's busy state that Join
// began: its async error then reads ncclSuccess, or ncclSystemError after the timeout. The thread holds the shared
// state, never the handle, which ncclCommAbort may delete meanwhile (it ends the wait at once).
void WaitJoinedLater(std::shared_ptr<Clique> clique, int rank) {
  std::thread([c = std::move(clique), rank] {
    const size_t r = static_cast<size_t>(rank);
    std::unique_lock<std::mutex> lock(gMutex);
    const auto deadline = Clock::now() + std::chrono::seconds(TimeoutSeconds());
    if (!gCv.wait_until(lock, deadline,
                        [&] { return c->joinedCount == c->nranks || c->state[r] != RankState::kAlive; })) {
      JoinTimedOutLocked("ncclCommInitRankConfig (non-blocking)", *c, rank);
    }
    --c->busy[r];
    gCv.notify_all();
  }).detach();
}

ncclResult_t InitRank(const char* fn, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  ncclResult_t r = Join(fn, comm, nranks, id, rank, blocking);
  if (tGroup.depth > 0) {
    if (r == ncclSuccess) {
      tGroup.inits.push_back(*comm);
    } else if (tGroup.error == ncclSuccess) {
      tGroup.error = r;
    }
    return r == ncclSuccess && !blocking ? ncclInProgress : r;
  }
  if (r != ncclSuccess) return r;
  if (!blocking) {
    WaitJoinedLater((*comm)->clique, rank);
    return ncclInProgress;
  }
  r = WaitJoined(fn, *comm);
  if (r != ncclSuccess) {
    delete *comm;
    *comm = nullptr;
  }
  return r;
}

}  // namespace fakenccl
}  // namespace cctest

using cctest::fakenccl::Fail;
using cctest::fakenccl::gCv;
using cctest::fakenccl::gMutex;
using cctest::fakenccl::Kind;
using cctest::fakenccl::RankState;
using cctest::fakenccl::tGroup;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  static std::mutex m;
  static std::mt19937_64 rng{(uint64_t{std::random_device()()} << 32) ^ std::random_device()()};
  std::lock_guard<std::mutex> lock(m);
  for (size_t i = 0; i < sizeof uniqueId->internal; i += 8) {
    const uint64_t v = rng();
    std::memcpy(uniqueId->internal + i, &v, std::min<size_t>(8, sizeof uniqueId->internal - i));
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return cctest::fakenccl::InitRank("ncclCommInitRank", comm, nranks, commId, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  bool blocking = true;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef) {
      return Fail(ncclInvalidArgument, "ncclCommInitRankConfig: config was not set up with NCCL_CONFIG_INITIALIZER");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
      if (config->blocking != 0 && config->blocking != 1) {
        return Fail(ncclInvalidArgument, "ncclCommInitRankConfig: invalid config blocking attribute value %d",
                    config->blocking);
      }
      blocking = config->blocking == 1;
    }
  }
  return cctest::fakenccl::InitRank("ncclCommInitRankConfig", comm, nranks, commId, rank, blocking);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return cctest::fakenccl::CheckReady(comm, "ncclCommFinalize");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::unique_lock<std::mutex> lock(gMutex);
    auto& c = *comm->clique;
    const size_t r = static_cast<size_t>(comm->rank);
    gCv.wait(lock, [&] { return c.busy[r] == 0 && c.pending[r] == 0; });
    if (c.state[r] == RankState::kAlive) c.state[r] = RankState::kDestroyed;
    gCv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::unique_lock<std::mutex> lock(gMutex);
    auto& c = *comm->clique;
    const size_t r = static_cast<size_t>(comm->rank);
    cctest::fakenccl::LeaveFormingLocked(c, comm->rank);
    c.state[r] = RankState::kAborted;
    gCv.notify_all();
    gCv.wait(lock, [&] { return c.busy[r] == 0; });  // the fake's threads end at once for an aborted rank
  }
  delete comm;  // what the queued operations use lives on in the shared state
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  }
  std::lock_guard<std::mutex> lock(gMutex);
  *asyncError = cctest::fakenccl::AsyncErrorLocked(*comm->clique, comm->rank);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return Fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  if (ncclResult_t r = cctest::fakenccl::CheckReady(comm, "ncclCommCount")) return r;
  *count = comm->clique->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return Fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  if (ncclResult_t r = cctest::fakenccl::CheckReady(comm, "ncclCommUserRank")) return r;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
  }
  if (ncclResult_t r = cctest::fakenccl::CheckReady(comm, "ncclCommCuDevice")) return r;
  *device = comm->device;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  // NCCL's own sentences, by ncclResult_t value.
  static const char* const kStrings[] = {"no error",
                                         "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                                         "unhandled system error (run with NCCL_DEBUG=INFO for details)",
                                         "internal error - please report this issue to the NCCL developers",
                                         "invalid argument (run with NCCL_DEBUG=WARN for details)",
                                         "invalid usage (run with NCCL_DEBUG=WARN for details)",
                                         "remote process exited or there was a network error",
                                         "NCCL operation in progress"};
  return static_cast<unsigned>(result) < ncclNumResults ? kStrings[result] : "unknown result code";
}

const char* ncclGetLastError(ncclComm_t /*comm*/) { return cctest::fakenccl::tLastError.c_str(); }

ncclResult_t ncclGroupStart() {
  ++tGroup.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tGroup.depth == 0) return Fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart before it");
  if (--tGroup.depth > 0) return ncclSuccess;
  std::vector<cctest::fakenccl::Queued> ops = std::move(tGroup.ops);
  std::vector<ncclComm_t> inits = std::move(tGroup.inits);
  ncclResult_t r = tGroup.error;
  tGroup = cctest::fakenccl::GroupState();
  std::vector<char> initBlocking;
  bool blocking = false, nonBlocking = false;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    for (ncclComm_t comm : inits) initBlocking.push_back(comm->clique->blocking[static_cast<size_t>(comm->rank)]);
    for (char b : initBlocking) (b ? blocking : nonBlocking) = true;
    for (const auto& q : ops)
      (q.task.clique->blocking[static_cast<size_t>(q.task.rank)] ? blocking : nonBlocking) = true;
  }
  if (blocking && nonBlocking && r == ncclSuccess) {
    r = Fail(ncclInvalidArgument,
             "ncclGroupEnd: the group holds blocking and non-blocking communicators (NCCL: \"Blocking and nonblocking "
             "communicators are not allowed in the same group.\")");
  }
  bool nonBlockingInits = false;
  for (size_t i = 0; i < inits.size(); ++i) {
    if (initBlocking[i]) {
      const ncclResult_t w = cctest::fakenccl::WaitJoined("ncclGroupEnd (ncclCommInitRank)", inits[i]);
      if (r == ncclSuccess) r = w;
    } else {
      cctest::fakenccl::WaitJoinedLater(inits[i]->clique, inits[i]->rank);
      nonBlockingInits = true;
    }
  }
  if (r != ncclSuccess) {  // the failed call said why; NCCL leaves the error to the group's non-blocking ranks
    std::lock_guard<std::mutex> lock(gMutex);
    for (const auto& q : ops) cctest::fakenccl::SetAsyncErrorLocked(q.task, r);
    for (ncclComm_t comm : inits) cctest::fakenccl::SetAsyncErrorLocked(*comm->clique, comm->rank, r);
    return r;
  }
  r = cctest::fakenccl::Launch(std::move(ops));
  return r == ncclSuccess && nonBlockingInits ? ncclInProgress : r;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return cctest::fakenccl::PointToPoint(Kind::kSend, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return cctest::fakenccl::PointToPoint(Kind::kRecv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return cctest::fakenccl::Collective(Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return cctest::fakenccl::Collective(Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm,
                                      stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return cctest::fakenccl::Collective(Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, comm,
                                      stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return cctest::fakenccl::Collective(Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                                      stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return cctest::fakenccl::Collective(Kind::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

}  // extern "C"
