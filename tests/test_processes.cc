// Exact collectives, compressed calls and ccCommSplit with ranks as processes (launched by mpirun; MPI only shares
// the unique id and compares results across ranks), and one communicator of several thread ranks in every process.
// Every case checks the result against an fp64 reference computed from all ranks' inputs (each rank can generate every
// rank's input) and checks that all ranks hold the same bytes. The large exact float cases and every codec also run on
// inputs whose sums round, and their bytes must be those of the same call on thread ranks of one process (the local
// transport): results do not depend on the transport.
//
//   mpirun -np 4 test_processes        (UCX_TLS picks shared memory or TCP)
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ccoll.h"
#include "compress/float16.h"
#include "core/comm.h"
#include "first_difference.h"
#include "rank_harness.h"
#include "transport/ucx.h"

namespace {

int gRank = 0, gRanks = 1, gPassed = 0, gFailed = 0;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool IsUnsigned(ccDataType_t t) { return t == ccUint8 || t == ccUint32 || t == ccUint64; }
bool IsInt(ccDataType_t t) { return t == ccInt8 || t == ccInt32 || t == ccInt64 || IsUnsigned(t); }

// Input of `rank` at index i: small integers for integer types (0..32 unsigned, -16..16 for int8, so that sums
// over 4 ranks fit), small multiples of 1/8 (exact in every float type) otherwise, and values in {-1, 1, 2} for
// products ({1, 2} unsigned).
double Input(int rank, size_t i, ccRedOp_t op, ccDataType_t t, uint64_t salt) {
  uint64_t h = Mix((static_cast<uint64_t>(rank) << 40) ^ i ^ (salt << 20));
  if (op == ccProd) return (h % 4 == 0) ? 2.0 : ((h % 4 == 1 && !IsUnsigned(t)) ? -1.0 : 1.0);
  if (IsUnsigned(t)) return static_cast<double>(h % 33);
  int v = static_cast<int>(h % 65) - 32;
  if (t == ccInt8) return v / 2;
  return IsInt(t) ? v : v / 8.0;
}

size_t Size(ccDataType_t t) {
  switch (t) {
    case ccInt8: case ccUint8: return 1;
    case ccInt32: case ccUint32: case ccFloat32: return 4;
    case ccInt64: case ccUint64: case ccFloat64: return 8;
    default: return 2;
  }
}

void Store(void* buf, size_t i, ccDataType_t t, double v) {
  switch (t) {
    case ccInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case ccUint8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case ccUint32: static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(v); break;
    case ccUint64: static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(v); break;
    case ccInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case ccInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case ccFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case ccFloat64: static_cast<double*>(buf)[i] = v; break;
    case ccFloat16: static_cast<ccoll::Half*>(buf)[i] = ccoll::FloatToHalf(static_cast<float>(v)); break;
    case ccBfloat16: static_cast<ccoll::Bf16*>(buf)[i] = ccoll::FloatToBf16(static_cast<float>(v)); break;
  }
}

double Load(const void* buf, size_t i, ccDataType_t t) {
  switch (t) {
    case ccInt8: return static_cast<const int8_t*>(buf)[i];
    case ccUint8: return static_cast<const uint8_t*>(buf)[i];
    case ccUint32: return static_cast<const uint32_t*>(buf)[i];
    case ccUint64: return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case ccInt32: return static_cast<const int32_t*>(buf)[i];
    case ccInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case ccFloat32: return static_cast<const float*>(buf)[i];
    case ccFloat64: return static_cast<const double*>(buf)[i];
    case ccFloat16: return ccoll::HalfToFloat(static_cast<const ccoll::Half*>(buf)[i]);
    case ccBfloat16: return ccoll::Bf16ToFloat(static_cast<const ccoll::Bf16*>(buf)[i]);
  }
  return 0;
}

double Eps(ccDataType_t t) {
  switch (t) {
    case ccFloat16: return std::ldexp(1.0, -11);
    case ccBfloat16: return std::ldexp(1.0, -8);
    case ccFloat32: return std::ldexp(1.0, -24);
    case ccFloat64: return std::ldexp(1.0, -53);
    default: return 0;
  }
}

// op over ranks of Input(r, i); avg divides (integer types truncate like C).
double Reference(size_t i, ccRedOp_t op, ccDataType_t t, uint64_t salt, double* magnitude) {
  double acc = Input(0, i, op, t, salt);
  *magnitude = std::fabs(acc);
  for (int r = 1; r < gRanks; ++r) {
    double x = Input(r, i, op, t, salt);
    *magnitude += std::fabs(x);
    switch (op) {
      case ccSum: case ccAvg: acc += x; break;
      case ccProd: acc *= x; break;
      case ccMax: acc = x > acc ? x : acc; break;
      case ccMin: acc = x < acc ? x : acc; break;
    }
  }
  if (op == ccAvg) acc = IsInt(t) ? std::trunc(acc / gRanks) : acc / gRanks;
  return acc;
}

// FNV-1a of `bytes` bytes at buf: what the ranks all-gather to compare their results.
uint64_t HashBytes(const void* buf, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(buf);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// True when every rank's `bytes` bytes at buf are identical (compared through a hash all-gathered by MPI).
bool SameOnAllRanks(const void* buf, size_t bytes) {
  uint64_t h = HashBytes(buf, bytes);
  std::vector<uint64_t> all(gRanks);
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (uint64_t x : all) {
    if (x != all[0]) return false;
  }
  return true;
}

// Every rank reports; a case passes only if it passed on all ranks (the result: the same on every rank).
bool Report(bool okHere, const std::string& what) {
  int ok = okHere ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) {
    ++gPassed;
  } else {
    ++gFailed;
    if (!okHere) std::fprintf(stderr, "rank %d FAILED: %s\n", gRank, what.c_str());
  }
  return all != 0;
}

const char* Name(ccDataType_t t) {
  switch (t) {
    case ccInt8: return "int8"; case ccUint8: return "uint8"; case ccUint32: return "uint32";
    case ccUint64: return "uint64";
    case ccInt32: return "int32"; case ccInt64: return "int64"; case ccFloat16: return "float16";
    case ccFloat32: return "float32"; case ccFloat64: return "float64"; case ccBfloat16: return "bfloat16";
  }
  return "?";
}

void AllReduceCase(ccComm_t comm, const char* algo, size_t count, ccDataType_t t, ccRedOp_t op, bool inPlace) {
  const uint64_t salt = count * 131 + t * 7 + op;
  size_t es = Size(t);
  std::vector<char> send(count * es + 1), recv(count * es + 1);
  for (size_t i = 0; i < count; ++i) Store(send.data(), i, t, Input(gRank, i, op, t, salt));
  void* out = inPlace ? send.data() : recv.data();
  char what[160];
  std::snprintf(what, sizeof(what), "allreduce %s count %zu %s op %d%s", algo, count, Name(t), op,
                inPlace ? " in-place" : "");
  // Every rank makes the same MPI calls whatever its call returned (a failure on some ranks only must not leave the
  // others in another collective).
  ccResult_t rc = ccAllReduce(send.data(), out, count, t, op, nullptr, comm, nullptr);
  size_t wrong = 0;
  for (size_t i = 0; rc == ccSuccess && i < count; ++i) {
    double mag;
    double ref = Reference(i, op, t, salt, &mag);
    double got = Load(out, i, t);
    double tol = IsInt(t) ? 0 : gRanks * Eps(t) * (mag + std::fabs(ref)) + 1e-300;
    if (!(std::fabs(got - ref) <= tol)) ++wrong;
  }
  const bool same = SameOnAllRanks(out, count * es);
  Report(rc == ccSuccess && wrong == 0 && same,
         std::string(what) + ": " +
             (rc != ccSuccess ? std::string(ccGetLastError(comm)) : std::to_string(wrong) + " wrong"));
}

void OtherCollectives(ccComm_t comm, size_t count) {
  const ccDataType_t t = ccFloat32;
  // Reduce-scatter (in place: recvbuff = sendbuff + rank * count).
  std::vector<float> send(count * gRanks), recv(count);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(Input(gRank, i, ccSum, t, 7));
  bool ok = ccReduceScatter(send.data(), recv.data(), count, t, ccSum, comm, nullptr) == ccSuccess;
  for (size_t i = 0; ok && i < count; ++i) {
    double ref = 0;
    for (int r = 0; r < gRanks; ++r) ref += Input(r, gRank * count + i, ccSum, t, 7);
    ok = std::fabs(recv[i] - ref) <= gRanks * Eps(t) * 8 * gRanks;
  }
  Report(ok, "reducescatter count " + std::to_string(count));
  // All-gather in place.
  std::vector<float> gather(count * gRanks);
  for (size_t i = 0; i < count; ++i) gather[gRank * count + i] = static_cast<float>(gRank * 1000 + i % 997);
  ok = ccAllGather(gather.data() + gRank * count, gather.data(), count, t, comm, nullptr) == ccSuccess;
  for (int r = 0; ok && r < gRanks; ++r) {
    for (size_t i = 0; ok && i < count; ++i) ok = gather[r * count + i] == static_cast<float>(r * 1000 + i % 997);
  }
  Report(ok, "allgather count " + std::to_string(count));
  // Broadcast from every root.
  for (int root = 0; root < gRanks; ++root) {
    std::vector<float> b(count, -1.0f);
    if (gRank == root) {
      for (size_t i = 0; i < count; ++i) b[i] = static_cast<float>(root + i % 13);
    }
    ok = ccBroadcast(b.data(), b.data(), count, t, root, comm, nullptr) == ccSuccess;
    for (size_t i = 0; ok && i < count; ++i) ok = b[i] == static_cast<float>(root + i % 13);
    Report(ok, "broadcast root " + std::to_string(root) + " count " + std::to_string(count));
  }
  // Reduce into every root; the others pass a recvbuff that must stay as it was.
  for (int root = 0; root < gRanks; ++root) {
    std::vector<float> in(count), out(count, -1.0f);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Input(gRank, i, ccSum, t, 11 + root));
    ok = ccReduce(in.data(), out.data(), count, t, ccSum, root, comm, nullptr) == ccSuccess;
    for (size_t i = 0; ok && i < count; ++i) {
      double ref = 0, mag = 0;
      for (int r = 0; r < gRanks; ++r) {
        ref += Input(r, i, ccSum, t, 11 + root);
        mag += std::fabs(Input(r, i, ccSum, t, 11 + root));
      }
      ok = gRank == root ? std::fabs(out[i] - ref) <= gRanks * Eps(t) * (mag + std::fabs(ref)) : out[i] == -1.0f;
    }
    Report(ok, "reduce root " + std::to_string(root) + " count " + std::to_string(count));
  }
}

// Input of the transport comparison: uniform in [-2, 2) with every bit of the type's mantissa used, so that sums round
// and the order in which they were taken shows in the result's bits (Input's values sum exactly).
void RoughInput(int rank, uint64_t salt, ccDataType_t t, size_t count, void* buf) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t h = Mix((static_cast<uint64_t>(rank) << 40) ^ i ^ (salt << 20));
    Store(buf, i, t, (std::ldexp(static_cast<double>(h >> 11), -53) - 0.5) * 4.0);
  }
}

// Results do not depend on the transport: two all-reduces of RoughInput over UCX here (with a compressor, the second
// starts from the state the first left: error feedback, warm start), and the same two calls on gRanks thread ranks of
// rank 0's process (the local transport, this communicator's algorithm, fresh compressors of the same spec; thread
// rank r takes process rank r's input), must give the same bytes. spec NULL: the exact all-reduce.
void SameAsThreadRanksCase(ccComm_t comm, size_t count, ccDataType_t t, ccRedOp_t op, const char* spec) {
  const uint64_t salt = count * 17 + t * 5 + op + (spec != nullptr ? std::strlen(spec) * 1000 : 0);
  const size_t bytes = count * Size(t);
  const std::string what = std::string("same bytes as thread ranks: ") + (spec != nullptr ? spec : "exact") + " " +
                           Name(t) + " op " + std::to_string(op) + " count " + std::to_string(count);
  std::vector<char> in(bytes), got(bytes);
  RoughInput(gRank, salt, t, count, in.data());
  ccCompressor_t c = nullptr;
  bool ok = spec == nullptr || ccCompressorCreateFromString(&c, spec) == ccSuccess;
  for (int call = 0; call < 2 && ok; ++call) {
    ok = ccAllReduce(in.data(), got.data(), count, t, op, c, comm, nullptr) == ccSuccess;
  }
  ccCompressorDestroy(c);
  const bool same = SameOnAllRanks(got.data(), bytes);  // every rank, whatever its call returned
  Report(ok && same, what + ": processes: " + ccGetLastError(comm));
  std::string diff;
  if (!ok && gRank == 0) {
    diff = "not run: the call over UCX failed";
  } else if (gRank == 0) {
    cctest::Group g = cctest::Group::InitConfig(gRanks, cctest::MakeConfig(comm->config.algorithm, 60000));
    std::unique_ptr<cctest::Compressors> comps;
    if (spec != nullptr) comps = std::make_unique<cctest::Compressors>(spec, gRanks);
    if (g.status != ccSuccess) {
      diff = "init: " + g.error;
    } else if (comps && comps->status != ccSuccess) {
      diff = "compressors: " + comps->error;
    } else {
      std::vector<std::vector<char>> ins(static_cast<size_t>(gRanks), std::vector<char>(bytes));
      std::vector<std::vector<char>> outs(ins);
      std::vector<cctest::RankResult> results(static_cast<size_t>(gRanks));
      cctest::RunRanks(gRanks, [&](int r) {
        const size_t i = static_cast<size_t>(r);
        RoughInput(r, salt, t, count, ins[i].data());
        for (int call = 0; call < 2 && results[i].rc == ccSuccess; ++call) {
          results[i] = cctest::Record(
              ccAllReduce(ins[i].data(), outs[i].data(), count, t, op, comps ? (*comps)[r] : nullptr, g[r], nullptr),
              g[r]);
        }
      });
      diff = cctest::FirstFailure(results);
      if (diff.empty()) diff = cctest::FirstDifference(outs[0], got);
    }
  }
  Report(diff.empty(), what + ": thread ranks: " + diff);
}

// Compressed all-reduce across processes: every rank ends with the same bytes, and the error is that of the codec
// (loose sanity bounds; the tight bounds live in test_compression).
void CompressedCase(ccComm_t comm, const char* spec, double bound, size_t count = (1u << 16) + 7) {
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Input(gRank, i, ccSum, ccFloat32, 99));
  ccCompressor_t c = nullptr;
  bool ok = ccCompressorCreateFromString(&c, spec) == ccSuccess;
  ok = ok && ccAllReduce(in.data(), out.data(), count, ccFloat32, ccAvg, c, comm, nullptr) == ccSuccess;
  double num = 0, den = 0;
  for (size_t i = 0; ok && i < count; ++i) {
    double mag, ref = Reference(i, ccAvg, ccFloat32, 99, &mag);
    num += (out[i] - ref) * (out[i] - ref);
    den += ref * ref;
  }
  ccCompressorDestroy(c);
  bool same = SameOnAllRanks(out.data(), count * sizeof(float));
  Report(ok && same && num <= bound * den, std::string("compressed ") + spec + ": vNMSE " + std::to_string(num / den) +
                                               (same ? "" : ", ranks differ") + " " + ccGetLastError(comm));
  SameAsThreadRanksCase(comm, count, ccFloat32, ccAvg, spec);
}

// ccCommSplit across processes: ranks by parity, keys reversed, and with 3 or more ranks the last one takes no part.
// Each new communicator sums its members' inputs exactly and gives them the same bytes of a compressed call; the
// parent still works after.
void SplitCase(ccComm_t comm) {
  const bool apart = gRanks >= 3 && gRank == gRanks - 1;
  const int color = apart ? CC_SPLIT_NOCOLOR : gRank % 2;
  std::vector<int> members;  // parent ranks of this rank's color, in their new order (descending parent rank)
  for (int r = gRanks - 1; r >= 0 && !apart; --r) {
    if (r % 2 == color && !(gRanks >= 3 && r == gRanks - 1)) members.push_back(r);
  }
  ccComm_t sub = reinterpret_cast<ccComm_t>(0x1);
  ccResult_t rc = ccCommSplit(comm, color, -gRank, &sub, nullptr);
  Report(rc == ccSuccess && (apart ? sub == nullptr : sub != nullptr), std::string("split: ") + ccGetLastError(comm));
  if (rc != ccSuccess) return;
  int count = -1, rank = -1;
  if (sub != nullptr) {
    ccCommCount(sub, &count);
    ccCommUserRank(sub, &rank);
  }
  const int want = apart ? -1 : static_cast<int>(std::find(members.begin(), members.end(), gRank) - members.begin());
  Report(apart || (count == static_cast<int>(members.size()) && rank == want), "split: new rank and size");

  // Exact sums within the group; the bytes compared among its members through every rank's hash.
  const size_t n = (1u << 18) + 3;
  std::vector<float> in(n), out(n, -1.0f);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(Input(gRank, i, ccSum, ccFloat32, 5));
  bool ok = apart || ccAllReduce(in.data(), out.data(), n, ccFloat32, ccSum, nullptr, sub, nullptr) == ccSuccess;
  for (size_t i = 0; ok && !apart && i < n; ++i) {
    double ref = 0, mag = 0;
    for (int m : members) {
      ref += Input(m, i, ccSum, ccFloat32, 5);
      mag += std::fabs(Input(m, i, ccSum, ccFloat32, 5));
    }
    ok = std::fabs(out[i] - ref) <= members.size() * Eps(ccFloat32) * (mag + std::fabs(ref));
  }
  Report(ok, std::string("split: exact sum within the group ") + (sub ? ccGetLastError(sub) : ""));
  ccCompressor_t c = nullptr;
  ok = apart || (ccCompressorCreateFromString(&c, "quant:bits=4,mode=requant") == ccSuccess &&
                 ccAllReduce(in.data(), out.data(), n, ccFloat32, ccAvg, c, sub, nullptr) == ccSuccess);
  ccCompressorDestroy(c);
  uint64_t h = HashBytes(out.data(), apart ? 0 : n * sizeof(float));
  std::vector<uint64_t> hashes(gRanks);
  MPI_Allgather(&h, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int m : members) ok = ok && hashes[m] == h;
  Report(ok, "split: a compressed call gives the group's members the same bytes");
  Report(ccCommDestroy(sub) == ccSuccess, "split: destroy");
  AllReduceCase(comm, "ring after split", 1023, ccFloat32, ccSum, false);
}

}  // namespace

// Rank `from`'s bytes for rank `to`, message k: any bits.
std::vector<unsigned char> P2PBytes(int from, int to, int k, size_t bytes) {
  std::vector<unsigned char> b(bytes);
  const uint64_t key = (uint64_t(from) << 40) ^ (uint64_t(to) << 24) ^ (uint64_t(k) << 56);
  for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(Mix(key ^ i));
  return b;
}

// ccSend and ccRecv between processes over UCX: a ring exchange and an all-to-all (sends to the rank itself
// included) in groups, ordered blocking sends, and exchanges between all-reduces whose call numbers cross the one UCX
// would read as point-to-point's (the tag carries 24 bits of it).
void PointToPointCase(ccComm_t comm) {
  const int n = gRanks, r = gRank;
  bool ok = true;
  std::string why;
  auto fail = [&](const std::string& w) {
    if (ok) why = w;
    ok = false;
  };
  for (size_t bytes : {size_t{1}, size_t{1023}, (size_t{1} << 22) + 3}) {
    const auto in = P2PBytes(r, (r + 1) % n, 0, bytes);
    std::vector<unsigned char> out(bytes, 0);
    ccGroupStart();
    ccSend(in.data(), bytes, ccUint8, (r + 1) % n, comm, nullptr);
    ccRecv(out.data(), bytes, ccUint8, (r + n - 1) % n, comm, nullptr);
    if (ccGroupEnd() != ccSuccess) fail(std::string("ring group: ") + ccGetLastError(nullptr));
    if (out != P2PBytes((r + n - 1) % n, r, 0, bytes)) fail("ring bytes at " + std::to_string(bytes));
  }
  // All-to-all: a size per pair.
  auto countOf = [](int from, int to) { return size_t{4000} + size_t(from) * 13 + size_t(to); };
  std::vector<std::vector<unsigned char>> in(n), out(n);
  ccGroupStart();
  for (int p = 0; p < n; ++p) {
    in[p] = P2PBytes(r, p, 1, countOf(r, p) * 4);
    out[p].assign(countOf(p, r) * 4, 0);
    ccSend(in[p].data(), countOf(r, p), ccFloat32, p, comm, nullptr);
    ccRecv(out[p].data(), countOf(p, r), ccFloat32, p, comm, nullptr);
  }
  if (ccGroupEnd() != ccSuccess) fail(std::string("all-to-all group: ") + ccGetLastError(nullptr));
  for (int p = 0; p < n; ++p) {
    if (out[p] != P2PBytes(p, r, 1, countOf(p, r) * 4)) fail("all-to-all bytes from " + std::to_string(p));
  }
  // Ordered: rank 0 sends four messages (small, large, empty, small) to every other rank, one blocking call each.
  const size_t sizes[] = {16, size_t{1} << 20, 0, 3};
  for (int k = 0; k < 4 && n > 1; ++k) {
    if (r == 0) {
      for (int p = 1; p < n; ++p) {
        const auto b = P2PBytes(0, p, 2 + k, sizes[k]);
        if (ccSend(b.data(), sizes[k], ccInt8, p, comm, nullptr) != ccSuccess) fail(ccGetLastError(comm));
      }
    } else {
      std::vector<unsigned char> b(sizes[k], 0);
      if (ccRecv(b.data(), sizes[k], ccInt8, 0, comm, nullptr) != ccSuccess) fail(ccGetLastError(comm));
      if (b != P2PBytes(0, r, 2 + k, sizes[k])) fail("ordered message " + std::to_string(k));
    }
  }
  // Between all-reduces whose call numbers cross 0xffffff (set alike on every rank).
  comm->seq = 0xfffff8;
  for (int k = 0; k < 12 && ok; ++k) {
    std::vector<int64_t> x(1000, r + k);
    if (ccAllReduce(x.data(), x.data(), x.size(), ccInt64, ccSum, nullptr, comm, nullptr) != ccSuccess) {
      fail(std::string("all-reduce: ") + ccGetLastError(comm));
    }
    if (x[999] != int64_t(n) * (n - 1) / 2 + int64_t(n) * k) fail("all-reduce value");
    const auto a = P2PBytes(r, (r + 1) % n, 10 + k, 777);
    std::vector<unsigned char> b(777, 0);
    ccGroupStart();
    ccRecv(b.data(), 777, ccUint8, (r + n - 1) % n, comm, nullptr);
    ccSend(a.data(), 777, ccUint8, (r + 1) % n, comm, nullptr);
    if (ccGroupEnd() != ccSuccess) fail(std::string("exchange: ") + ccGetLastError(nullptr));
    if (b != P2PBytes((r + n - 1) % n, r, 10 + k, 777)) fail("exchange bytes " + std::to_string(k));
  }
  if (comm->seq <= 0xffffff) fail("the call numbers did not cross 0xffffff");
  Report(ok, "point-to-point: " + why);
}

// Over UCX a message longer than a slice travels as slices after its length, except where the endpoints of both ranks
// use shared memory (ccComm::p2pSliced; here UCX_TLS=tcp,self slices and sysv,self does not). A receive of another
// length fails on the receiver with ccInvalidUsage, whatever the two lengths:
// - both many slices long (2 MiB sent, 1 MiB expected, and the other way round): sliced, the lengths differ, instead
//   of the receive taking the first slices; unsliced, the length in the header that goes ahead of a payload longer
//   than a slice (the payload follows as a message of its own, and is received, cut short or drained);
// - 512 KiB sent, 8 bytes expected, and 8 bytes sent, 512 KiB expected: sliced, the 8-byte message and the length
//   sent before the slices are payloads of different kinds (the length used to pass for the 8-byte message, and the
//   slices for the next receives), and the error names both sizes where the receiver got the length, or the
//   receiver's size and that the sender's was at most a slice; unsliced, the header's length, and UCX's length;
// - 64 KiB sent, 8 bytes expected (one message, also over tcp): UCX's truncation.
// On a communicator of its own, which the failure ends; the sender, whose data left, gets success or a timeout,
// never a hang.
void PointToPointMismatchCase(int seconds, size_t sendBytes, size_t recvBytes) {
  if (gRanks < 2) return;
  ccUniqueId id;
  if (gRank == 0 && ccGetUniqueId(&id) != ccSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  config.timeoutMs = static_cast<int>(seconds * 1000 * cctest::TimeScale());  // init and all-reduce meet it too
  ccComm_t comm = nullptr;
  const std::string which = " (" + std::to_string(sendBytes) + " bytes sent, " + std::to_string(recvBytes) +
                            " expected)";
  if (ccCommInitRankConfig(&comm, gRanks, id, gRank, &config) != ccSuccess) {
    Report(false, std::string("mismatch init: ") + ccGetLastError(nullptr));
    return;
  }
  std::vector<char> buf(std::max(sendBytes, recvBytes), 1);
  bool ok = true;
  std::string why;
  const char* tlsSet = std::getenv("UCX_TLS");
  const std::string tls = tlsSet != nullptr ? tlsSet : "";
  const int sliceExpected = tls == "tcp,self" ? 1 : tls == "sysv,self" ? 0 : -1;  // -1: not checked
  for (int peer = 0; peer < gRanks && sliceExpected >= 0; ++peer) {
    const int want = peer == gRank ? 0 : sliceExpected;
    if (comm->p2pSliced.at(peer) != want) {
      ok = false;
      why = "UCX_TLS=" + tls + ": messages to rank " + std::to_string(peer) + (want ? " are not" : " are") + " sliced";
    }
  }
  const bool sliced = comm->p2pSliced.at(gRank == 0 ? 1 : 0) != 0;
  const size_t slice = comm->config.sliceBytes;
  // Every endpoint connected first: torn down after the failure, one never connected would try to connect to peers
  // that are gone (UCX's tcp logs each refusal).
  if (ccAllReduce(buf.data(), buf.data(), 8, ccInt8, ccMax, nullptr, comm, nullptr) != ccSuccess) {
    ok = false;
    why = std::string("all-reduce: ") + ccGetLastError(comm);
  }
  if (ok && gRank == 0) {
    const ccResult_t rc = ccSend(buf.data(), sendBytes, ccInt8, 1, comm, nullptr);
    if (rc != ccSuccess && rc != ccTimeout) {
      ok = false;
      why = std::string("sender: ") + ccGetLastError(comm);
    }
  } else if (ok && gRank == 1) {
    std::fill(buf.begin(), buf.end(), 7);
    const ccResult_t rc = ccRecv(buf.data(), recvBytes, ccInt8, 0, comm, nullptr);
    const std::string e = ccGetLastError(comm);
    std::string want, end;
    if (sliced && sendBytes > slice && recvBytes > slice) {
      want = "rank 0 sent " + std::to_string(sendBytes) + " bytes but rank 1 expects " + std::to_string(recvBytes) +
             " bytes";
      end = want;
    } else if (sliced && sendBytes > slice) {  // the length of the slices met the receive of one message
      want = "rank 0 sent " + std::to_string(sendBytes) + " bytes (in slices) but rank 1 expects " +
             std::to_string(recvBytes) + " bytes";
      end = "a ccSend and its ccRecv differ in size";
    } else if (sliced && recvBytes > slice) {  // one message met the receive of the slices' length
      want = "rank 1 expects " + std::to_string(recvBytes) + " bytes from rank 0, more than a slice";
      end = "but rank 0 sent a message of at most a slice";
    } else {
      // A payload longer than a slice travels apart from its header, which says how long it is.
      const bool told = sendBytes <= recvBytes || sendBytes > ccoll::SplitBytesFor(slice);
      want = "rank 1 expected " + std::to_string(recvBytes) + " bytes from rank 0 (tag ";
      end = told ? "but " + std::to_string(sendBytes) + " bytes arrived" : "but a larger message arrived";
    }
    if (rc != ccInvalidUsage || e.find(want) == std::string::npos || e.find(end) == std::string::npos) {
      ok = false;
      why = "receiver: " + std::string(ccGetErrorString(rc)) + ": " + e;
    }
  }
  Report(ok, "point-to-point size mismatch" + which + ": " + why);  // (a barrier: every rank is done first)
  ccCommAbort(comm);
}

// One communicator of `threads` thread ranks in every process (rank p * threads + t): messages between threads of a
// process take the local transport, the others UCX, and the communicator knows it spans processes (acrossProcesses;
// with one process it does not). Broadcast and reduce from every root (long enough for the chains' shrunk slices,
// collectives/ring.cc), an exact all-reduce and a compressed one, every result checked and the compressed bytes the
// same on every rank of every process.
void MixedCase(int threads) {
  const int n = gRanks * threads;
  const size_t count = (size_t{1} << 18) + 1;
  ccUniqueId id;
  if (gRank == 0 && ccGetUniqueId(&id) != ccSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  struct Outcome {
    std::string why;  // empty: every check passed
    uint64_t hash = 0;
  };
  std::vector<Outcome> outcomes(static_cast<size_t>(threads));
  cctest::RunRanks(threads, [&](int t) {
    const int rank = gRank * threads + t;
    Outcome& out = outcomes[static_cast<size_t>(t)];
    // Said at once as well (a rank that fails can hold the others up to their timeout before the report).
    auto fail = [&](const std::string& what, ccComm_t comm, bool callFailed) {
      const std::string why = "rank " + std::to_string(rank) + ": " + what +
                              (callFailed ? std::string(": ") + ccGetLastError(comm) : std::string(": wrong result"));
      std::fprintf(stderr, "MixedCase: %s\n", why.c_str());
      if (out.why.empty()) out.why = why;
    };
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    config.timeoutMs = cctest::ScaledMs(20000);
    ccComm_t comm = nullptr;
    if (ccCommInitRankConfig(&comm, n, id, rank, &config) != ccSuccess) return fail("init", nullptr, true);
    if (comm->acrossProcesses != (gRanks > 1)) {
      fail("acrossProcesses is " + std::to_string(comm->acrossProcesses), comm, false);
    }
    for (int root = 0; root < n; ++root) {
      std::vector<float> b(count, -1.0f);
      if (rank == root) {
        for (size_t i = 0; i < count; ++i) b[i] = static_cast<float>(root + i % 13);
      }
      const bool called = ccBroadcast(b.data(), b.data(), count, ccFloat32, root, comm, nullptr) == ccSuccess;
      bool ok = called;
      for (size_t i = 0; ok && i < count; ++i) ok = b[i] == static_cast<float>(root + i % 13);
      if (!ok) fail("broadcast root " + std::to_string(root), comm, !called);
    }
    // Inputs are multiples of 1/8 of at most 4 in magnitude: every partial sum is exact in float32.
    for (int root = 0; root < n; ++root) {
      std::vector<float> in(count), red(count, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Input(rank, i, ccSum, ccFloat32, 31 + root));
      const bool called = ccReduce(in.data(), red.data(), count, ccFloat32, ccSum, root, comm, nullptr) == ccSuccess;
      bool ok = called;
      for (size_t i = 0; ok && i < count; ++i) {
        double ref = 0;
        for (int r = 0; r < n; ++r) ref += Input(r, i, ccSum, ccFloat32, 31 + root);
        ok = rank == root ? red[i] == static_cast<float>(ref) : red[i] == -1.0f;
      }
      if (!ok) fail("reduce root " + std::to_string(root), comm, !called);
    }
    std::vector<float> in(count), sum(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Input(rank, i, ccSum, ccFloat32, 77));
    std::vector<double> ref(count, 0.0);
    for (size_t i = 0; i < count; ++i) {
      for (int r = 0; r < n; ++r) ref[i] += Input(r, i, ccSum, ccFloat32, 77);
    }
    bool called = ccAllReduce(in.data(), sum.data(), count, ccFloat32, ccSum, nullptr, comm, nullptr) == ccSuccess;
    bool ok = called;
    for (size_t i = 0; ok && i < count; ++i) ok = sum[i] == static_cast<float>(ref[i]);
    if (!ok) fail("exact all-reduce", comm, !called);
    // The codec's average, on an output that holds no earlier result, within a loose bound of its error (the tight
    // bounds live in test_compression). A compressor that cannot be made here still joins the call (as no codec),
    // which the call check then refuses on every rank at once.
    std::fill(sum.begin(), sum.end(), std::nanf(""));
    ccCompressor_t c = nullptr;
    const bool made = ccCompressorCreateFromString(&c, "quant:bits=4,mode=requant") == ccSuccess;
    called = ccAllReduce(in.data(), sum.data(), count, ccFloat32, ccAvg, c, comm, nullptr) == ccSuccess;
    ccCompressorDestroy(c);
    double num = 0, den = 0;
    for (size_t i = 0; called && i < count; ++i) {
      const double avg = ref[i] / n;
      num += (sum[i] - avg) * (sum[i] - avg);
      den += avg * avg;
    }
    if (!made || !called || !(num <= 0.1 * den)) {
      fail("compressed all-reduce (vNMSE " + std::to_string(den > 0 ? num / den : -1.0) + ")", comm, !called);
    }
    out.hash = HashBytes(sum.data(), count * sizeof(float));
    if (ccCommDestroy(comm) != ccSuccess) fail("destroy", nullptr, true);
  });
  const std::string what = std::to_string(threads) + " thread ranks per process";
  std::string why;
  for (const Outcome& o : outcomes) {
    if (why.empty()) why = o.why;
  }
  Report(why.empty(), "mixed communicator, " + what + ": " + why);
  std::vector<uint64_t> mine, all(static_cast<size_t>(n));
  for (const Outcome& o : outcomes) mine.push_back(o.hash);
  MPI_Allgather(mine.data(), threads, MPI_UINT64_T, all.data(), threads, MPI_UINT64_T, MPI_COMM_WORLD);
  bool same = true;
  for (uint64_t h : all) same = same && h == all[0];
  Report(same, "mixed communicator, " + what + ": the compressed all-reduce's bytes differ between ranks");
}

int main(int argc, char** argv) {
  int provided = 0;  // MixedCase's threads make no MPI calls: only the main thread does
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &gRank);
  MPI_Comm_size(MPI_COMM_WORLD, &gRanks);
  const ccDataType_t types[] = {ccInt8,    ccUint8,   ccInt32,   ccUint32,  ccInt64,
                                ccUint64,  ccFloat16, ccFloat32, ccFloat64, ccBfloat16};
  const ccRedOp_t ops[] = {ccSum, ccProd, ccMax, ccMin, ccAvg};
  const size_t counts[] = {0, 1, 7, 1023, (1u << 20) + 3};
  for (int algo = ccAlgoRing; algo <= ccAlgoTree; ++algo) {
    ccUniqueId id;
    if (gRank == 0 && ccGetUniqueId(&id) != ccSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    config.algorithm = algo;
    config.timeoutMs = 60000;
    ccComm_t comm = nullptr;
    ccResult_t rc = ccCommInitRankConfig(&comm, gRanks, id, gRank, &config);
    // (On the agreed result: a rank whose init failed alone must not leave the others in this loop's MPI calls.)
    if (!Report(rc == ccSuccess, std::string("init: ") + ccGetLastError(nullptr))) break;
    const char* name = algo == ccAlgoRing ? "ring" : "tree";
    for (size_t count : counts) {
      for (ccDataType_t t : types) {
        for (ccRedOp_t op : ops) {
          bool large = count > 4096;
          if (large && !(op == ccSum || op == ccAvg)) continue;  // the large count: the ops that accumulate
          for (int inPlace = 0; inPlace < (large ? 1 : 2); ++inPlace) AllReduceCase(comm, name, count, t, op, inPlace);
        }
      }
    }
    if (algo == ccAlgoRing) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, size_t{(1 << 18) + 1}}) OtherCollectives(comm, count);
    }
    for (ccDataType_t t : {ccFloat16, ccBfloat16, ccFloat32, ccFloat64}) {
      for (ccRedOp_t op : {ccSum, ccAvg}) SameAsThreadRanksCase(comm, (size_t{1} << 20) + 3, t, op, nullptr);
    }
    CompressedCase(comm, "cast16", 1e-4);
    CompressedCase(comm, "quant:bits=8,mode=homomorphic", 1e-3);
    CompressedCase(comm, "quant:bits=4,mode=homomorphic,rounding=correlated", 0.1);
    CompressedCase(comm, "quant:bits=4,mode=requant,group=32", 0.1);
    // Long enough to run in segments over UCX, the next segment's pre-pass in the waits (collectives/compressed.cc).
    CompressedCase(comm, "quant:bits=4,mode=homomorphic", 0.1, (size_t{1} << 20) + 1029);
    CompressedCase(comm, "topk:density=0.5", 1.0);
    CompressedCase(comm, "randk:density=0.5", 1.0);
#ifdef CCOLL_HAVE_BLAS
    SameAsThreadRanksCase(comm, 300 * 219, ccFloat32, ccAvg, "powersgd:rank=4,rows=300,cols=219");
#endif
    if (algo == ccAlgoRing) SplitCase(comm);
    if (algo == ccAlgoRing) PointToPointCase(comm);
    if (algo == ccAlgoRing) {
      PointToPointMismatchCase(3, size_t{2} << 20, size_t{1} << 20);
      PointToPointMismatchCase(3, size_t{1} << 20, size_t{2} << 20);
      PointToPointMismatchCase(3, size_t{512} << 10, 8);
      PointToPointMismatchCase(3, 8, size_t{512} << 10);
      PointToPointMismatchCase(3, size_t{64} << 10, 8);
    }
    ccCommStats_t stats;
    stats.size = sizeof(stats);
    Report(ccCommGetStats(comm, &stats) == ccSuccess && (gRanks == 1 || stats.bytesSent > 0), "stats");
    Report(ccCommDestroy(comm) == ccSuccess, "destroy");
  }
  MixedCase(2);
  if (gRank == 0) std::printf("%d passed, %d failed\n", gPassed, gFailed);
  MPI_Finalize();
  return gFailed == 0 ? 0 : 1;
}
