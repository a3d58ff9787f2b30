// [fake] The fake NCCL (fake_cuda/fake_nccl.cc) and the fake CUDA runtime's graph capture, which the NCCL transport's
// tests run on where there is no GPU: 4 thread ranks, each with its own non-blocking stream, fresh random inputs,
// results against double-precision (or exact integer) references computed here, and byte-identical results across
// ranks, in-place and out-of-place; the capture rules; failures (an abort releases the peers, bad arguments are
// refused, a caller's bug stops the process with a message, checked in a child process). Catch2's assertions are not
// thread-safe: rank threads only record what they saw, the main thread checks it.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "first_difference.h"

using cctest::FirstDifference;
using cctest::RunHiddenCase;

namespace {

constexpr int kRanks = 4;
using Bytes = std::vector<char>;

// What a rank thread saw: its first failed expectation, or "".
#define RANK_EXPECT(err, cond)                                                              \
  do {                                                                                      \
    if (!(cond) && (err).empty()) (err) = #cond " (line " + std::to_string(__LINE__) + ")"; \
  } while (0)

void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

void CheckNoErrors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(m_);
    const int generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0, generation_ = 0;
};

// A non-blocking communicator's connecting group is queued this long after the call (the fake's default is a few
// milliseconds): long enough that the calls a test makes right after one certainly come before it, even on a loaded
// machine. Set before main, so before the fake reads it.
[[maybe_unused]] const int kConnectDelaySet = setenv("FAKE_NCCL_CONNECT_MS", "100", 1);

// Polls a non-blocking communicator's async error until it no longer reads ncclInProgress (at most 10 s).
ncclResult_t WaitAsync(ncclComm_t comm) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ncclResult_t async = ncclInProgress;
  while (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclInProgress &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return async;
}

// n ranks of one communicator, one non-blocking stream each. Non-blocking communicators (blocking = false) are waited
// for as NCCL requires: ncclCommInitRankConfig returns ncclInProgress, then the async error is polled.
struct World {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;

  explicit World(int n, bool blocking = true)
      : comms(static_cast<size_t>(n), nullptr), streams(static_cast<size_t>(n), nullptr) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    std::vector<int> rc(static_cast<size_t>(n), -1);
    RunRanks(n, [&](int r) {
      const size_t i = static_cast<size_t>(r);
      cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
      if (blocking) {
        rc[i] = ncclCommInitRank(&comms[i], n, id, r);
        return;
      }
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      rc[i] = ncclCommInitRankConfig(&comms[i], n, id, r, &config);
      if (rc[i] == ncclInProgress) rc[i] = WaitAsync(comms[i]);
    });
    for (int x : rc) REQUIRE(x == ncclSuccess);
  }
  ~World() {
    for (size_t r = 0; r < comms.size(); ++r) {
      if (comms[r] != nullptr) ncclCommDestroy(comms[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
};

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes;
  explicit DeviceBuffer(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n) == cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  char* c() const { return static_cast<char*>(p); }
};

void Upload(const DeviceBuffer& d, const Bytes& b, size_t offset = 0) {
  REQUIRE(offset + b.size() <= d.bytes);
  REQUIRE(cudaMemcpy(d.c() + offset, b.data(), b.size(), cudaMemcpyHostToDevice) == cudaSuccess);
}

Bytes Download(const DeviceBuffer& d, size_t bytes, size_t offset = 0) {
  Bytes b(bytes);
  REQUIRE(cudaMemcpy(b.data(), d.c() + offset, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  return b;
}

Bytes Poison(size_t bytes) { return Bytes(bytes, static_cast<char>(0xee)); }

// The element-wise sum of int32 buffers, wrapping as two's complement (as the fake NCCL's integer sums do).
Bytes Int32Sum(const std::vector<Bytes>& in, size_t count) {
  Bytes sum(count * 4);
  for (size_t k = 0; k < count; ++k) {
    uint32_t total = 0;
    for (const Bytes& x : in) {
      uint32_t v;
      std::memcpy(&v, x.data() + k * 4, 4);
      total += v;
    }
    std::memcpy(sum.data() + k * 4, &total, 4);
  }
  return sum;
}

std::mt19937& Rng() {
  static std::mt19937 rng(std::random_device{}());
  return rng;
}

Bytes RandomBytes(size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<char>(Rng()() & 0xff);
  return b;
}

// count int32 values, each drawn uniformly from [-bound, bound].
Bytes RandomInt32s(size_t count, int32_t bound) {
  Bytes x(count * 4);
  for (size_t k = 0; k < count; ++k) {
    const int32_t v = static_cast<int32_t>(Rng()() % (2 * static_cast<uint32_t>(bound) + 1)) - bound;
    std::memcpy(x.data() + k * 4, &v, 4);
  }
  return x;
}

// ---- Element types of the collective sweep, with their exact values for the references.

size_t ElemSize(ncclDataType_t t) { return t == ncclFloat32 || t == ncclInt32 ? 4 : 2; }

double Value(ncclDataType_t t, const char* p) {
  switch (t) {
    case ncclFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case ncclInt32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case ncclBfloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: {  // float16; the inputs are normal numbers
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int e = (h >> 10) & 0x1f;
      const double v = std::ldexp(1.0 + (h & 0x3ff) / 1024.0, e - 15);
      return (h & 0x8000) ? -v : v;
    }
  }
}

// A random input element: magnitudes in [0.25, 2) (prod: [0.5, 1.5), so that 4 ranks' product stays near 1), integers
// small enough that no sum or product of 4 overflows.
void RandomElement(ncclDataType_t t, ncclRedOp_t op, char* out) {
  auto& rng = Rng();
  const bool negative = rng() & 1;
  switch (t) {
    case ncclInt32: {
      const int32_t bound = op == ncclProd ? 30 : 1000;
      const int32_t i = static_cast<int32_t>(rng() % static_cast<uint32_t>(2 * bound + 1)) - bound;
      std::memcpy(out, &i, 4);
      return;
    }
    default: {
      const double lo = op == ncclProd ? 0.5 : 0.25, hi = op == ncclProd ? 1.5 : 2.0;
      float f = static_cast<float>(std::uniform_real_distribution<double>(lo, hi)(rng));
      if (negative) f = -f;
      if (t == ncclFloat32) {
        std::memcpy(out, &f, 4);
      } else if (t == ncclBfloat16) {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint16_t h = static_cast<uint16_t>(bits >> 16);  // truncated: an exact bfloat16
        std::memcpy(out, &h, 2);
      } else {
        int e;
        const double m = std::frexp(std::fabs(static_cast<double>(f)), &e);             // f = m * 2^e, m in [0.5, 1)
        const uint16_t man = static_cast<uint16_t>(static_cast<int>(m * 2048) - 1024);  // truncated to 10 bits
        const uint16_t h = static_cast<uint16_t>((negative ? 0x8000 : 0) | ((e - 1 + 15) << 10) | man);
        std::memcpy(out, &h, 2);
      }
    }
  }
}

// Unit roundoff of the type (0: exact).
double Roundoff(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
      return std::ldexp(1.0, -24);
    case ncclBfloat16:
      return std::ldexp(1.0, -8);
    case ncclFloat16:
      return std::ldexp(1.0, -11);
    default:
      return 0;
  }
}

const char* TypeName(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
      return "float32";
    case ncclBfloat16:
      return "bfloat16";
    case ncclFloat16:
      return "float16";
    default:
      return "int32";
  }
}

// Checks got (count elements) against the reduction of the ranks' inputs at element offset `first`.
std::string CheckReduced(ncclDataType_t t, ncclRedOp_t op, const std::vector<Bytes>& in, size_t first, const Bytes& got,
                         size_t count) {
  const size_t es = ElemSize(t);
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    double ref = 0, magnitude = 0;
    int64_t exact = 0;
    for (int j = 0; j < n; ++j) {
      const double x = Value(t, in[static_cast<size_t>(j)].data() + (first + i) * es);
      const int64_t xi = static_cast<int64_t>(x);
      magnitude += std::fabs(x);
      if (j == 0) {
        ref = x;
        exact = xi;
        continue;
      }
      switch (op) {
        case ncclProd:
          ref *= x;
          exact *= xi;
          break;
        case ncclMax:
          ref = std::max(ref, x);
          exact = std::max(exact, xi);
          break;
        case ncclMin:
          ref = std::min(ref, x);
          exact = std::min(exact, xi);
          break;
        default:
          ref += x;
          exact += xi;
      }
    }
    if (op == ncclAvg) {
      ref /= n;
      exact /= n;  // truncating, as NCCL's integer average
    }
    const double v = Value(t, got.data() + i * es);
    bool ok;
    if (t == ncclInt32) {
      ok = static_cast<int64_t>(v) == exact;
    } else if (op == ncclMax || op == ncclMin) {
      ok = v == ref;  // one of the inputs, exactly
    } else {
      const double u = Roundoff(t);
      const double tol = op == ncclProd ? 2 * n * u * std::fabs(ref) : n * u * magnitude + u * std::fabs(ref);
      ok = std::fabs(v - ref) <= tol;
    }
    if (!ok) {
      return "element " + std::to_string(i) + ": got " + std::to_string(v) + ", expected " +
             std::to_string(t == ncclInt32 ? static_cast<double>(exact) : ref);
    }
  }
  return "";
}

}  // namespace

TEST_CASE("[fake] a ring of grouped sends and receives moves every buffer to the next rank", "[fake]") {
  World w(kRanks);
  for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{4097}}) {
    INFO("count " << count);
    const size_t bytes = count * 4, half = (count / 2 + 1) * 4;
    std::vector<Bytes> in, second;
    std::vector<std::unique_ptr<DeviceBuffer>> send, recv, send2, recv2, self;
    for (int r = 0; r < kRanks; ++r) {
      in.push_back(RandomBytes(bytes));
      second.push_back(RandomBytes(half));
      send.push_back(std::make_unique<DeviceBuffer>(bytes));
      recv.push_back(std::make_unique<DeviceBuffer>(bytes));
      send2.push_back(std::make_unique<DeviceBuffer>(half));
      recv2.push_back(std::make_unique<DeviceBuffer>(half));
      self.push_back(std::make_unique<DeviceBuffer>(bytes));
      Upload(*send.back(), in.back());
      Upload(*send2.back(), second.back());
      Upload(*recv.back(), Poison(bytes));
      Upload(*self.back(), Poison(bytes));
    }
    std::vector<std::string> errors(kRanks);
    RunRanks(kRanks, [&](int r) {
      std::string& err = errors[static_cast<size_t>(r)];
      const size_t i = static_cast<size_t>(r);
      const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
      ncclComm_t comm = w.comms[i];
      cudaStream_t s = w.streams[i];
      // Two messages to the next rank in one group, matched in order, and a copy to itself; the receives first, which
      // a rendezvous model must still complete (the group posts its sends before it waits).
      RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
      RANK_EXPECT(err, ncclRecv(recv[i]->p, count, ncclInt32, prev, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclRecv(recv2[i]->p, half / 4, ncclFloat32, prev, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclRecv(self[i]->p, count, ncclUint32, r, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, next, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclSend(send2[i]->p, half / 4, ncclFloat32, next, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclUint32, r, comm, s) == ncclSuccess);
      RANK_EXPECT(err, ncclGroupEnd() == ncclSuccess);
      RANK_EXPECT(err, cudaStreamSynchronize(s) == cudaSuccess);
    });
    CheckNoErrors(errors);
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r);
      const size_t prev = static_cast<size_t>((r + kRanks - 1) % kRanks);
      CHECK(FirstDifference(Download(*recv[static_cast<size_t>(r)], bytes), in[prev]) == "");
      CHECK(FirstDifference(Download(*recv2[static_cast<size_t>(r)], half), second[prev]) == "");
      CHECK(FirstDifference(Download(*self[static_cast<size_t>(r)], bytes), in[static_cast<size_t>(r)]) == "");
    }
  }
}

TEST_CASE("[fake] one thread creates and drives every rank through groups", "[fake]") {
  // As with NCCL in one process: the inits in a group complete at its end, and a group over every rank's stream
  // becomes one operation per stream, each holding a collective and a send and a receive.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(kRanks, nullptr);
  std::vector<cudaStream_t> streams(kRanks + 1, nullptr);
  for (auto& s : streams) REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r)
    REQUIRE(ncclCommInitRank(&comms[static_cast<size_t>(r)], kRanks, id, r) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);

  const size_t count = 777, bytes = count * 4;
  std::vector<Bytes> in;
  std::vector<std::unique_ptr<DeviceBuffer>> send, sum, ring;
  for (int r = 0; r < kRanks; ++r) {
    const Bytes x = RandomInt32s(count, 10000);
    in.push_back(x);
    send.push_back(std::make_unique<DeviceBuffer>(bytes));
    sum.push_back(std::make_unique<DeviceBuffer>(bytes));
    ring.push_back(std::make_unique<DeviceBuffer>(bytes));
    Upload(*send.back(), x);
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    const size_t i = static_cast<size_t>(r);
    CHECK(ncclRecv(ring[i]->p, count, ncclInt32, (r + kRanks - 1) % kRanks, comms[i], streams[i]) == ncclSuccess);
    CHECK(ncclAllReduce(send[i]->p, sum[i]->p, count, ncclInt32, ncclSum, comms[i], streams[i]) == ncclSuccess);
    CHECK(ncclSend(send[i]->p, count, ncclInt32, (r + 1) % kRanks, comms[i], streams[i]) == ncclSuccess);
  }
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  const Bytes expected = Int32Sum(in, count);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const size_t i = static_cast<size_t>(r);
    REQUIRE(cudaStreamSynchronize(streams[i]) == cudaSuccess);
    CHECK(FirstDifference(Download(*sum[i], bytes), expected) == "");
    CHECK(FirstDifference(Download(*ring[i], bytes), in[static_cast<size_t>((r + kRanks - 1) % kRanks)]) == "");
  }

  // One rank on two streams of a group: not modelled, refused as a whole.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(send[0]->p, sum[0]->p, count, ncclInt32, ncclSum, comms[0], streams[0]) == ncclSuccess);
  CHECK(ncclAllReduce(send[0]->p, sum[0]->p, count, ncclInt32, ncclSum, comms[0], streams[kRanks]) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);

  for (auto c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  for (auto s : streams) cudaStreamDestroy(s);
}

TEST_CASE("[fake] collectives match references and agree byte for byte across ranks, in place too", "[fake]") {
  World w(kRanks);
  const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclInt32, ncclFloat16};
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const int bcastRoot = 1, reduceRoot = 2;
  for (ncclDataType_t type : types) {
    for (ncclRedOp_t op : ops) {
      for (size_t count : {size_t{1}, size_t{250}}) {
        INFO(TypeName(type) << " op " << static_cast<int>(op) << " count " << count);
        const size_t es = ElemSize(type), total = count * kRanks, chunk = count * es, bytes = total * es;
        // Each rank's input holds kRanks chunks: all-reduce, reduce and broadcast take all of them, reduce-scatter
        // reduces chunk r into rank r, all-gather gathers every rank's first chunk.
        std::vector<Bytes> in(kRanks, Bytes(bytes));
        for (auto& b : in) {
          for (size_t i = 0; i < total; ++i) RandomElement(type, op, b.data() + i * es);
        }
        struct Buffers {
          DeviceBuffer send, ar, rs, ag, bc, red, ipAr, ipRs, ipAg, ipBc, ipRed;
          explicit Buffers(size_t bytes, size_t chunk)
              : send(bytes),
                ar(bytes),
                rs(chunk),
                ag(bytes),
                bc(bytes),
                red(bytes),
                ipAr(bytes),
                ipRs(bytes),
                ipAg(bytes),
                ipBc(bytes),
                ipRed(bytes) {}
        };
        std::vector<std::unique_ptr<Buffers>> b;
        for (int r = 0; r < kRanks; ++r) {
          const Bytes& x = in[static_cast<size_t>(r)];
          b.push_back(std::make_unique<Buffers>(bytes, chunk));
          Buffers& d = *b.back();
          Upload(d.send, x);
          for (DeviceBuffer* out : {&d.ar, &d.ag, &d.bc, &d.red, &d.ipAg}) Upload(*out, Poison(bytes));
          Upload(d.rs, Poison(chunk));
          for (DeviceBuffer* ip : {&d.ipAr, &d.ipRs, &d.ipBc, &d.ipRed}) Upload(*ip, x);
          Upload(d.ipAg, Bytes(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(chunk)),
                 static_cast<size_t>(r) * chunk);
        }
        std::vector<std::string> errors(kRanks);
        RunRanks(kRanks, [&](int r) {
          std::string& err = errors[static_cast<size_t>(r)];
          Buffers& d = *b[static_cast<size_t>(r)];
          ncclComm_t c = w.comms[static_cast<size_t>(r)];
          cudaStream_t s = w.streams[static_cast<size_t>(r)];
          const size_t mine = static_cast<size_t>(r) * chunk;
          RANK_EXPECT(err, ncclAllReduce(d.send.p, d.ar.p, total, type, op, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclReduceScatter(d.send.p, d.rs.p, count, type, op, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclAllGather(d.send.p, d.ag.p, count, type, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclBroadcast(d.send.p, d.bc.p, total, type, bcastRoot, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclReduce(d.send.p, d.red.p, total, type, op, reduceRoot, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclAllReduce(d.ipAr.p, d.ipAr.p, total, type, op, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclReduceScatter(d.ipRs.p, d.ipRs.c() + mine, count, type, op, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclAllGather(d.ipAg.c() + mine, d.ipAg.p, count, type, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclBroadcast(d.ipBc.p, d.ipBc.p, total, type, bcastRoot, c, s) == ncclSuccess);
          RANK_EXPECT(err, ncclReduce(d.ipRed.p, d.ipRed.p, total, type, op, reduceRoot, c, s) == ncclSuccess);
          RANK_EXPECT(err, cudaStreamSynchronize(s) == cudaSuccess);
        });
        CheckNoErrors(errors);

        const Bytes ar0 = Download(b[0]->ar, bytes);
        CHECK(CheckReduced(type, op, in, 0, ar0, total) == "");
        Bytes gathered;
        for (const Bytes& x : in)
          gathered.insert(gathered.end(), x.begin(), x.begin() + static_cast<std::ptrdiff_t>(chunk));
        for (int r = 0; r < kRanks; ++r) {
          INFO("rank " << r);
          const Buffers& d = *b[static_cast<size_t>(r)];
          const size_t mine = static_cast<size_t>(r) * chunk;
          const Bytes arChunk(ar0.begin() + static_cast<std::ptrdiff_t>(mine),
                              ar0.begin() + static_cast<std::ptrdiff_t>(mine + chunk));
          CHECK(FirstDifference(Download(d.ar, bytes), ar0) == "");
          CHECK(FirstDifference(Download(d.ipAr, bytes), ar0) == "");
          CHECK(FirstDifference(Download(d.rs, chunk), arChunk) == "");
          CHECK(FirstDifference(Download(d.ipRs, chunk, mine), arChunk) == "");
          CHECK(FirstDifference(Download(d.ag, bytes), gathered) == "");
          CHECK(FirstDifference(Download(d.ipAg, bytes), gathered) == "");
          CHECK(FirstDifference(Download(d.bc, bytes), in[bcastRoot]) == "");
          CHECK(FirstDifference(Download(d.ipBc, bytes), in[bcastRoot]) == "");
          if (r == reduceRoot) {
            CHECK(FirstDifference(Download(d.red, bytes), ar0) == "");
            CHECK(FirstDifference(Download(d.ipRed, bytes), ar0) == "");
          } else {
            // A reduce writes the root's buffer only.
            CHECK(FirstDifference(Download(d.red, bytes), Poison(bytes)) == "");
            CHECK(FirstDifference(Download(d.ipRed, bytes), in[static_cast<size_t>(r)]) == "");
          }
        }
      }
    }
  }
}

// Queues on rank r's stream s (c its communicator) what the graph tests capture: scratch set to 0x5a, a ring step
// (send to the next rank, receive from the previous one into ring) and the all-reduce of send into sum, each call
// expected to succeed at once. Problems go to err.
void QueueRingAndSum(std::string& err, int r, ncclComm_t c, cudaStream_t s, size_t count, void* scratch,
                     const void* send, void* ring, void* sum) {
  RANK_EXPECT(err, cudaMemsetAsync(scratch, 0x5a, count * 4, s) == cudaSuccess);
  RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
  RANK_EXPECT(err, ncclSend(send, count, ncclInt32, (r + 1) % kRanks, c, s) == ncclSuccess);
  RANK_EXPECT(err, ncclRecv(ring, count, ncclInt32, (r + kRanks - 1) % kRanks, c, s) == ncclSuccess);
  RANK_EXPECT(err, ncclGroupEnd() == ncclSuccess);
  RANK_EXPECT(err, ncclAllReduce(send, sum, count, ncclInt32, ncclSum, c, s) == ncclSuccess);
}

// Every rank launches its graph on its stream and waits for it.
void LaunchGraphs(const World& w, const std::vector<cudaGraphExec_t>& execs, std::vector<std::string>* errors) {
  RunRanks(kRanks, [&](int r) {
    std::string& err = (*errors)[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    RANK_EXPECT(err, cudaGraphLaunch(execs[i], w.streams[i]) == cudaSuccess);
    RANK_EXPECT(err, cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
  });
  CheckNoErrors(*errors);
}

void DestroyGraphs(const std::vector<cudaGraph_t>& graphs, const std::vector<cudaGraphExec_t>& execs) {
  for (size_t i = 0; i < graphs.size(); ++i) {
    CHECK(cudaGraphExecDestroy(execs[i]) == cudaSuccess);
    CHECK(cudaGraphDestroy(graphs[i]) == cudaSuccess);
  }
}

TEST_CASE("[fake] a captured graph of a memset, sends and receives and an all-reduce replays with new inputs",
          "[fake]") {
  World w(kRanks);
  const size_t count = 513, bytes = count * 4;
  std::vector<std::unique_ptr<DeviceBuffer>> send, ring, sum, scratch;
  for (int r = 0; r < kRanks; ++r) {
    send.push_back(std::make_unique<DeviceBuffer>(bytes));
    ring.push_back(std::make_unique<DeviceBuffer>(bytes));
    sum.push_back(std::make_unique<DeviceBuffer>(bytes));
    scratch.push_back(std::make_unique<DeviceBuffer>(bytes));
    for (auto* b : {&send, &ring, &sum, &scratch}) Upload(*b->back(), Poison(bytes));
  }
  std::vector<cudaGraph_t> graphs(kRanks, nullptr);
  std::vector<cudaGraphExec_t> execs(kRanks, nullptr);
  std::vector<std::string> errors(kRanks);
  Barrier barrier(kRanks);
  // Global mode, the strictest: the ranks capture at the same time, so no thread may make a capture-unsafe call
  // (cudaMemcpy, cudaMalloc, a synchronization) until every rank has ended its capture.
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    cudaStream_t s = w.streams[i];
    ncclComm_t c = w.comms[i];
    barrier.Wait();
    RANK_EXPECT(err, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    QueueRingAndSum(err, r, c, s, count, scratch[i]->p, send[i]->p, ring[i]->p, sum[i]->p);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    RANK_EXPECT(err, cudaStreamIsCapturing(s, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive);
    RANK_EXPECT(err, cudaStreamEndCapture(s, &graphs[i]) == cudaSuccess && graphs[i] != nullptr);
    barrier.Wait();
    RANK_EXPECT(err, cudaStreamQuery(s) == cudaSuccess);
    RANK_EXPECT(err, cudaGraphInstantiate(&execs[i], graphs[i], 0) == cudaSuccess);
  });
  CheckNoErrors(errors);
  for (int r = 0; r < kRanks; ++r) {  // capturing ran nothing
    for (auto* b : {&ring, &sum, &scratch}) {
      CHECK(FirstDifference(Download(*(*b)[static_cast<size_t>(r)], bytes), Poison(bytes)) == "");
    }
  }

  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay " << replay);
    std::vector<Bytes> in;
    for (int r = 0; r < kRanks; ++r) {
      in.push_back(RandomInt32s(count, 1000000));
      Upload(*send[static_cast<size_t>(r)], in.back());
      for (auto* out : {&ring, &sum, &scratch}) Upload(*(*out)[static_cast<size_t>(r)], Poison(bytes));
    }
    LaunchGraphs(w, execs, &errors);
    const Bytes expected = Int32Sum(in, count);
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r);
      const size_t i = static_cast<size_t>(r);
      CHECK(FirstDifference(Download(*scratch[i], bytes), Bytes(bytes, 0x5a)) == "");
      CHECK(FirstDifference(Download(*ring[i], bytes), in[static_cast<size_t>((r + kRanks - 1) % kRanks)]) == "");
      CHECK(FirstDifference(Download(*sum[i], bytes), expected) == "");
    }
  }
  DestroyGraphs(graphs, execs);
}

TEST_CASE("[fake] a synchronizing call during capture invalidates it", "[fake]") {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  DeviceBuffer d(64);
  cudaGraph_t graph = nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;

  SECTION("cudaStreamSynchronize of the capturing stream") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaMemsetAsync(d.p, 1, 64, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
    CHECK((cudaStreamIsCapturing(s, &status) == cudaSuccess && status == cudaStreamCaptureStatusInvalidated));
    CHECK(cudaMemsetAsync(d.p, 2, 64, s) == cudaErrorStreamCaptureInvalidated);
    // An NCCL call on it fails too (one rank: nothing to wait for).
    ncclUniqueId id;
    ncclComm_t comm = nullptr;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    CHECK(ncclAllReduce(d.p, d.p, 16, ncclFloat32, ncclSum, comm, s) == ncclUnhandledCudaError);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  }
  SECTION("a synchronous cudaMemcpy on another thread during a global capture") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMemsetAsync(d.p, 1, 64, s) == cudaSuccess);
    char host[64];
    cudaError_t e = cudaSuccess;
    std::thread([&] { e = cudaMemcpy(host, d.p, 64, cudaMemcpyDeviceToHost); }).join();
    CHECK(e == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
  }
  SECTION("querying an event recorded in the capture") {
    cudaEvent_t ev = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaEventRecord(ev, s) == cudaSuccess);
    CHECK(cudaEventQuery(ev) == cudaErrorCapturedEvent);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaEventDestroy(ev);
  }
  SECTION("but not other threads' calls during a relaxed capture of a non-blocking stream") {
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaMemsetAsync(d.p, 7, 64, s) == cudaSuccess);
    char host[64];
    cudaError_t e = cudaErrorUnknown;
    std::thread([&] { e = cudaMemcpy(host, d.p, 64, cudaMemcpyDeviceToHost); }).join();
    CHECK(e == cudaSuccess);
    REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    REQUIRE(graph != nullptr);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaMemcpy(host, d.p, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::all_of(host, host + 64, [](char c) { return c == 7; }));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    graph = nullptr;
  }
  CHECK((cudaStreamIsCapturing(s, &status) == cudaSuccess && status == cudaStreamCaptureStatusNone));
  CHECK(cudaMemsetAsync(d.p, 0, 64, s) == cudaSuccess);  // the stream works again
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  cudaStreamDestroy(s);
}

TEST_CASE("[fake] an aborted rank releases the peers blocked in an all-reduce with ncclRemoteError", "[fake]") {
  World w(kRanks);
  const size_t count = 1024, bytes = count * 4;
  std::vector<std::unique_ptr<DeviceBuffer>> send, recv;
  for (int r = 0; r < kRanks; ++r) {
    send.push_back(std::make_unique<DeviceBuffer>(bytes));
    recv.push_back(std::make_unique<DeviceBuffer>(bytes));
    Upload(*send.back(), RandomBytes(bytes));
    Upload(*recv.back(), Poison(bytes));
  }
  const int victim = kRanks - 1;
  for (int r = 0; r < victim; ++r) {
    const size_t i = static_cast<size_t>(r);
    REQUIRE(ncclAllReduce(send[i]->p, recv[i]->p, count, ncclFloat32, ncclSum, w.comms[i], w.streams[i]) ==
            ncclSuccess);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int r = 0; r < victim; ++r) CHECK(cudaStreamQuery(w.streams[static_cast<size_t>(r)]) == cudaErrorNotReady);

  const auto start = std::chrono::steady_clock::now();
  REQUIRE(ncclCommAbort(w.comms[victim]) == ncclSuccess);
  w.comms[victim] = nullptr;
  for (int r = 0; r < victim; ++r) {
    INFO("rank " << r);
    const size_t i = static_cast<size_t>(r);
    CHECK(cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(w.comms[i], &async) == ncclSuccess);
    CHECK(async == ncclRemoteError);
    CHECK(FirstDifference(Download(*recv[i], bytes), Poison(bytes)) == "");  // gave up before writing anything
    // As with NCCL, later calls on the failed communicator return its error.
    CHECK(ncclAllReduce(send[i]->p, recv[i]->p, count, ncclFloat32, ncclSum, w.comms[i], w.streams[i]) ==
          ncclRemoteError);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("[fake] bad arguments are refused at the call", "[fake]") {
  int version = 0;
  CHECK(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == 22809);

  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 1, id, 1) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&comm, 0, id, 0) == ncclInvalidArgument);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 2;
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidArgument);
  config.blocking = 1;
  REQUIRE(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclSuccess);
  ncclComm_t again = nullptr;
  CHECK(ncclCommInitRank(&again, 1, id, 0) == ncclInvalidArgument);  // the id's communicator is complete
  int n = 0, rank = -1, device = -1;
  CHECK((ncclCommCount(comm, &n) == ncclSuccess && n == 1));
  CHECK((ncclCommUserRank(comm, &rank) == ncclSuccess && rank == 0));
  CHECK((ncclCommCuDevice(comm, &device) == ncclSuccess && device == 0));

  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const size_t count = 256;
  DeviceBuffer dev(count * 4);
  std::vector<float> host(count, 1.0f);
  CHECK(ncclAllReduce(host.data(), dev.p, count, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("not device memory") != std::string::npos);
  CHECK(ncclAllReduce(dev.p, host.data(), count, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(ncclSend(host.data(), count, ncclFloat32, 0, comm, s) == ncclInvalidArgument);
  void* pinned = nullptr;
  REQUIRE(cudaHostAlloc(&pinned, count * 4, 0) == cudaSuccess);
  CHECK(ncclRecv(pinned, count, ncclFloat32, 0, comm, s) == ncclInvalidArgument);
  cudaFreeHost(pinned);
  CHECK(ncclAllReduce(dev.p, dev.p, count + 1, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);  // too short
  CHECK(ncclAllReduce(dev.p, dev.p, count, ncclFloat8e4m3, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(ncclAllReduce(dev.p, dev.p, count, ncclFloat32, static_cast<ncclRedOp_t>(7), comm, s) == ncclInvalidArgument);
  CHECK(ncclBroadcast(dev.p, dev.p, count, ncclFloat32, 1, comm, s) == ncclInvalidArgument);  // root out of range
  CHECK(ncclSend(dev.p, count, ncclFloat32, 1, comm, s) == ncclInvalidArgument);              // peer out of range
  CHECK(ncclAllReduce(dev.p, dev.c() + 4, count - 1, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);

  // A call that fails inside a group fails the group: nothing of it runs.
  DeviceBuffer out(count * 4);
  Upload(out, Poison(count * 4));
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(dev.p, out.p, count, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
  CHECK(ncclAllReduce(host.data(), out.p, count, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);  // no group open
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(FirstDifference(Download(out, count * 4), Poison(count * 4)) == "");

  CHECK(ncclCommFinalize(comm) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  cudaStreamDestroy(s);
}

// The caller's bugs that the fake NCCL stops the process on (it prints what happened and aborts), each run in a child
// process of this binary: the hidden cases below do the wrong thing, the visible one checks how their process ended.
namespace {

// Two ranks of one communicator, driven from this thread: each call only queues.
struct Pair {
  World w{2};
  DeviceBuffer a{64}, b{64};
  void Wait() {
    for (auto s : w.streams) cudaStreamSynchronize(s);
  }
};

}  // namespace

TEST_CASE("fake_death: matched send and receive of different sizes", "[.][fake_death]") {
  Pair p;
  ncclSend(p.a.p, 4, ncclInt32, 1, p.w.comms[0], p.w.streams[0]);
  ncclRecv(p.b.p, 5, ncclInt32, 0, p.w.comms[1], p.w.streams[1]);
  p.Wait();
}

TEST_CASE("fake_death: ranks call different collectives", "[.][fake_death]") {
  Pair p;
  ncclAllReduce(p.a.p, p.a.p, 4, ncclFloat32, ncclSum, p.w.comms[0], p.w.streams[0]);
  ncclAllReduce(p.b.p, p.b.p, 4, ncclFloat32, ncclMax, p.w.comms[1], p.w.streams[1]);
  p.Wait();
}

TEST_CASE("fake_death: two ranks send to each other outside a group", "[.][fake_death]") {
  Pair p;  // rendezvous: each send waits for a receive its peer only posts after its own send
  for (int r = 0; r < 2; ++r) {
    ncclSend(p.a.p, 4, ncclInt32, 1 - r, p.w.comms[static_cast<size_t>(r)], p.w.streams[static_cast<size_t>(r)]);
    ncclRecv(p.b.p, 4, ncclInt32, 1 - r, p.w.comms[static_cast<size_t>(r)], p.w.streams[static_cast<size_t>(r)]);
  }
  p.Wait();
}

TEST_CASE("fake_death: a copy whose kind does not match its pointers", "[.][fake_death]") {
  DeviceBuffer d(64), e(64);
  char host[64] = {};
  cudaMemcpy(d.p, host, 64, cudaMemcpyHostToDevice);                          // right
  cudaMemcpyAsync(e.p, d.p, 64, cudaMemcpyDeviceToDevice, cudaStreamLegacy);  // right
  cudaMemcpyAsync(host, d.p, 0, cudaMemcpyHostToHost, cudaStreamLegacy);      // 0 bytes: not checked
  cudaMemcpyAsync(host, d.p, 64, cudaMemcpyDefault, cudaStreamLegacy);        // anything goes
  cudaStreamSynchronize(cudaStreamLegacy);
  cudaMemcpy(d.p, e.p, 64, cudaMemcpyDeviceToHost);  // dst is device memory
}

TEST_CASE("[fake] a caller's bug stops the process with a message saying what", "[fake]") {
  bool died = false;
  std::string out = RunHiddenCase("fake_death: matched send and receive of different sizes", "", &died);
  INFO(out);
  CHECK(died);
  CHECK(out.find("rank 0's ncclSend #0 to rank 1 sends 4 elements of int32 (16 bytes), but rank 1's ncclRecv #0 "
                 "from rank 0, which it matches, takes 5 elements of int32 (20 bytes)") != std::string::npos);

  out = RunHiddenCase("fake_death: ranks call different collectives", "", &died);
  INFO(out);
  CHECK(died);
  CHECK(out.find("differs between ranks") != std::string::npos);
  CHECK(out.find("op sum") != std::string::npos);
  CHECK(out.find("op max") != std::string::npos);

  out = RunHiddenCase("fake_death: two ranks send to each other outside a group", "FAKE_NCCL_TIMEOUT_S=1", &died);
  INFO(out);
  CHECK(died);
  CHECK(out.find("deadlock") != std::string::npos);
  CHECK(out.find("ncclSend #0 to rank ") != std::string::npos);  // whichever rank gives up first
  CHECK(out.find("to receive it") != std::string::npos);

  out = RunHiddenCase("fake_death: a copy whose kind does not match its pointers", "", &died);
  INFO(out);
  CHECK(died);
  CHECK(out.find(", 64 bytes, cudaMemcpyDeviceToHost): dst is device memory and src is device memory, but the kind "
                 "says device to host") != std::string::npos);
  CHECK(out.find("cudaMemcpyHostToDevice)") == std::string::npos);
}

// ---- Non-blocking communicators (config.blocking = 0): NCCL returns ncclInProgress from an init, and from a group
// that has to connect a peer first, and the caller must poll ncclCommGetAsyncError until it reads ncclSuccess before
// it calls NCCL again or queues other work on the stream.

TEST_CASE("fake_child: a non-blocking init whose peer never joins", "[.][fake_child]") {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  std::printf("init %d\n", static_cast<int>(ncclCommInitRankConfig(&comm, 2, id, 0, &config)));
  std::printf("async error %d\n", static_cast<int>(WaitAsync(comm)));
  std::printf("abort %d\n", static_cast<int>(ncclCommAbort(comm)));
}

TEST_CASE("[fake] a non-blocking init returns ncclInProgress until every rank has joined, and an abort ends it", "[fake]") {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(kRanks, nullptr);
  for (int r = 0; r + 1 < kRanks; ++r) {
    CHECK(ncclCommInitRankConfig(&comms[static_cast<size_t>(r)], kRanks, id, r, &config) == ncclInProgress);
    REQUIRE(comms[static_cast<size_t>(r)] != nullptr);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int r = 0; r + 1 < kRanks; ++r) {
    INFO("rank " << r);
    ncclResult_t async = ncclSuccess;
    CHECK(ncclCommGetAsyncError(comms[static_cast<size_t>(r)], &async) == ncclSuccess);
    CHECK(async == ncclInProgress);  // the last rank has not joined
  }
  int n = 0;
  CHECK(ncclCommCount(comms[0], &n) == ncclInvalidArgument);  // not ready: NCCL's ncclCommEnsureReady
  CHECK(std::string(ncclGetLastError(comms[0])).find("ncclInProgress") != std::string::npos);
  CHECK(ncclCommInitRankConfig(&comms[kRanks - 1], kRanks, id, kRanks - 1, &config) == ncclInProgress);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(WaitAsync(comms[static_cast<size_t>(r)]) == ncclSuccess);
  }
  CHECK((ncclCommCount(comms[0], &n) == ncclSuccess && n == kRanks));
  for (auto c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);

  // Inside a group one thread creates every rank: each init and the group end return ncclInProgress.
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    CHECK(ncclCommInitRankConfig(&comms[static_cast<size_t>(r)], kRanks, id, r, &config) == ncclInProgress);
  }
  CHECK(ncclGroupEnd() == ncclInProgress);
  for (auto c : comms) CHECK(WaitAsync(c) == ncclSuccess);
  for (auto c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);

  // An abort while the rank waits for the others returns at once, and the rank leaves: the id can form anew.
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t lone = nullptr;
  CHECK(ncclCommInitRankConfig(&lone, 2, id, 0, &config) == ncclInProgress);
  ncclResult_t async = ncclSuccess;
  CHECK((ncclCommGetAsyncError(lone, &async) == ncclSuccess && async == ncclInProgress));
  const auto start = std::chrono::steady_clock::now();
  CHECK(ncclCommAbort(lone) == ncclSuccess);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  std::vector<ncclComm_t> pair(2, nullptr);
  for (int r = 0; r < 2; ++r) {
    CHECK(ncclCommInitRankConfig(&pair[static_cast<size_t>(r)], 2, id, r, &config) == ncclInProgress);
  }
  for (auto c : pair) CHECK(WaitAsync(c) == ncclSuccess);
  for (auto c : pair) CHECK(ncclCommDestroy(c) == ncclSuccess);

  // A config without a blocking value is blocking.
  ncclConfig_t undef = NCCL_CONFIG_INITIALIZER;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK(ncclCommInitRankConfig(&lone, 1, id, 0, &undef) == ncclSuccess);
  CHECK(ncclCommDestroy(lone) == ncclSuccess);

  // The peers never join: after FAKE_NCCL_TIMEOUT_S the async error reads ncclSystemError.
  bool died = false;
  const std::string out =
      RunHiddenCase("fake_child: a non-blocking init whose peer never joins", "FAKE_NCCL_TIMEOUT_S=1", &died);
  INFO(out);
  CHECK(!died);
  CHECK(out.find("init 7\n") != std::string::npos);         // ncclInProgress
  CHECK(out.find("async error 2\n") != std::string::npos);  // ncclSystemError
  CHECK(out.find("abort 0\n") != std::string::npos);
  CHECK(out.find("waited 1 s for the other ranks to join; 1 of 2 did") != std::string::npos);
}

TEST_CASE("[fake] a non-blocking rank's first group with a peer is in progress: work queued without waiting runs first",
          "[fake]") {
  World w(kRanks, /*blocking=*/false);
  const size_t count = 1000, bytes = count * 4;
  std::vector<Bytes> in;
  std::vector<std::unique_ptr<DeviceBuffer>> send, recv, copy;
  for (int r = 0; r < kRanks; ++r) {
    in.push_back(RandomBytes(bytes));
    send.push_back(std::make_unique<DeviceBuffer>(bytes));
    recv.push_back(std::make_unique<DeviceBuffer>(bytes));
    copy.push_back(std::make_unique<DeviceBuffer>(bytes));
    Upload(*send.back(), in.back());
    Upload(*recv.back(), Poison(bytes));
    Upload(*copy.back(), Poison(bytes));
  }
  const Bytes zeros(bytes, 0);
  auto prevOf = [](int r) { return static_cast<size_t>((r + kRanks - 1) % kRanks); };
  auto nextOf = [](int r) { return static_cast<size_t>((r + 1) % kRanks); };
  std::vector<std::string> errors(kRanks);

  // The caller's bug: the memset that follows the receive (it clears the buffer once the data has been used) is
  // queued without waiting for the group, so it runs first and the data lands after it.
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
    RANK_EXPECT(err, ncclRecv(recv[i]->p, count, ncclInt32, static_cast<int>(prevOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, static_cast<int>(nextOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclGroupEnd() == ncclInProgress);
    ncclResult_t async = ncclSuccess;
    RANK_EXPECT(err, ncclCommGetAsyncError(w.comms[i], &async) == ncclSuccess && async == ncclInProgress);
    RANK_EXPECT(err, cudaMemsetAsync(recv[i]->p, 0, bytes, w.streams[i]) == cudaSuccess);  // no wait: the bug
    RANK_EXPECT(err, WaitAsync(w.comms[i]) == ncclSuccess);
    RANK_EXPECT(err, cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
  });
  CheckNoErrors(errors);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    // The memset ran before the transfer.
    CHECK(FirstDifference(Download(*recv[static_cast<size_t>(r)], bytes), in[prevOf(r)]) == "");
  }

  // The same peers again: connected, so the group is queued at once and the memset after it runs after it.
  for (auto& b : recv) Upload(*b, Poison(bytes));
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
    RANK_EXPECT(err, ncclRecv(recv[i]->p, count, ncclInt32, static_cast<int>(prevOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, static_cast<int>(nextOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclGroupEnd() == ncclSuccess);
    RANK_EXPECT(err,
                cudaMemcpyAsync(copy[i]->p, recv[i]->p, bytes, cudaMemcpyDeviceToDevice, w.streams[i]) == cudaSuccess);
    RANK_EXPECT(err, cudaMemsetAsync(recv[i]->p, 0, bytes, w.streams[i]) == cudaSuccess);
    RANK_EXPECT(err, cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
  });
  CheckNoErrors(errors);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(FirstDifference(Download(*copy[static_cast<size_t>(r)], bytes), in[prevOf(r)]) == "");
    CHECK(FirstDifference(Download(*recv[static_cast<size_t>(r)], bytes), zeros) == "");
  }

  // The other direction is a new connection, and so is the first collective; waiting as NCCL requires, the work queued
  // after each sees its result. The second collective is queued at once.
  std::vector<std::unique_ptr<DeviceBuffer>> sum;
  for (int r = 0; r < kRanks; ++r) {
    sum.push_back(std::make_unique<DeviceBuffer>(bytes));
    Upload(*recv[static_cast<size_t>(r)], Poison(bytes));
    Upload(*copy[static_cast<size_t>(r)], Poison(bytes));
  }
  std::vector<Bytes> sumCopy(kRanks);
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
    RANK_EXPECT(err, ncclRecv(recv[i]->p, count, ncclInt32, static_cast<int>(nextOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, static_cast<int>(prevOf(r)), w.comms[i], w.streams[i]) ==
                         ncclSuccess);
    RANK_EXPECT(err, ncclGroupEnd() == ncclInProgress);
    RANK_EXPECT(err, WaitAsync(w.comms[i]) == ncclSuccess);
    RANK_EXPECT(err,
                cudaMemcpyAsync(copy[i]->p, recv[i]->p, bytes, cudaMemcpyDeviceToDevice, w.streams[i]) == cudaSuccess);
    RANK_EXPECT(err, ncclAllReduce(send[i]->p, sum[i]->p, count, ncclInt32, ncclSum, w.comms[i], w.streams[i]) ==
                         ncclInProgress);
    RANK_EXPECT(err, WaitAsync(w.comms[i]) == ncclSuccess);
    RANK_EXPECT(err, cudaMemsetAsync(send[i]->p, 0, bytes, w.streams[i]) == cudaSuccess);  // after the all-reduce read
    RANK_EXPECT(
        err, ncclAllReduce(send[i]->p, send[i]->p, count, ncclInt32, ncclSum, w.comms[i], w.streams[i]) == ncclSuccess);
    RANK_EXPECT(err, cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
  });
  CheckNoErrors(errors);
  const Bytes expected = Int32Sum(in, count);
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const size_t i = static_cast<size_t>(r);
    CHECK(FirstDifference(Download(*copy[i], bytes), in[nextOf(r)]) == "");
    CHECK(FirstDifference(Download(*sum[i], bytes), expected) == "");
    CHECK(FirstDifference(Download(*send[i], bytes), zeros) == "");
  }
}

TEST_CASE("[fake] a call on a non-blocking communicator while it is in progress fails and leaves it failed", "[fake]") {
  World w(2, /*blocking=*/false);
  DeviceBuffer a(64), b(64);
  const Bytes data = RandomBytes(64);
  Upload(a, data);
  Upload(b, Poison(64));
  // One thread drives both ranks in one group: both are in progress until it is queued.
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclSend(a.p, 16, ncclInt32, 1, w.comms[0], w.streams[0]) == ncclSuccess);
  CHECK(ncclRecv(b.p, 16, ncclInt32, 0, w.comms[1], w.streams[1]) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInProgress);
  ncclResult_t async = ncclSuccess;
  CHECK((ncclCommGetAsyncError(w.comms[0], &async) == ncclSuccess && async == ncclInProgress));
  // NCCL's answer is ncclInvalidArgument ("Attempt to use communicator before the previous operation returned
  // ncclSuccess"), and the failed call leaves that as the communicator's async error.
  CHECK(ncclAllReduce(a.p, a.p, 16, ncclFloat32, ncclSum, w.comms[0], w.streams[0]) == ncclInvalidArgument);
  const std::string last = ncclGetLastError(w.comms[0]);
  CHECK(last.find("ncclAllReduce: rank 0") != std::string::npos);
  CHECK(last.find("reads ncclInProgress") != std::string::npos);
  int rank = -1;
  CHECK(ncclCommUserRank(w.comms[1], &rank) == ncclInvalidArgument);  // not ready either, but not failed by it
  CHECK(WaitAsync(w.comms[1]) == ncclSuccess);
  CHECK(WaitAsync(w.comms[0]) == ncclInvalidArgument);
  CHECK(ncclSend(a.p, 16, ncclInt32, 1, w.comms[0], w.streams[0]) == ncclInvalidArgument);  // failed for good
  for (auto s : w.streams) CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(FirstDifference(Download(b, 64), data) == "");  // the group itself went through
  CHECK((ncclCommUserRank(w.comms[1], &rank) == ncclSuccess && rank == 1));

  // Blocking and non-blocking communicators in one group: ncclInvalidArgument, as NCCL; the non-blocking one fails.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t blocking = nullptr;
  REQUIRE(ncclCommInitRank(&blocking, 1, id, 0) == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(a.p, a.p, 16, ncclFloat32, ncclSum, blocking, w.streams[0]) == ncclSuccess);
  CHECK(ncclRecv(b.p, 16, ncclInt32, 0, w.comms[1], w.streams[1]) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidArgument);
  CHECK((ncclCommGetAsyncError(w.comms[1], &async) == ncclSuccess && async == ncclInvalidArgument));
  CHECK((ncclCommGetAsyncError(blocking, &async) == ncclSuccess && async == ncclSuccess));
  CHECK(ncclCommDestroy(blocking) == ncclSuccess);
  for (auto& c : w.comms) {
    CHECK(ncclCommAbort(c) == ncclSuccess);
    c = nullptr;
  }
}

TEST_CASE("[fake] graphs captured on non-blocking communicators replay, connections made before or during capture",
          "[fake]") {
  World w(kRanks, /*blocking=*/false);
  const size_t count = 300, bytes = count * 4;
  std::vector<std::unique_ptr<DeviceBuffer>> send, ring, back, sum, scratch;
  for (int r = 0; r < kRanks; ++r) {
    for (auto* v : {&send, &ring, &back, &sum, &scratch}) {
      v->push_back(std::make_unique<DeviceBuffer>(bytes));
      Upload(*v->back(), Poison(bytes));
    }
  }
  auto prevOf = [](int r) { return (r + kRanks - 1) % kRanks; };
  auto nextOf = [](int r) { return (r + 1) % kRanks; };
  std::vector<std::string> errors(kRanks);
  // Connections to the next rank and the collectives' exist before the capture (a first group and all-reduce, waited
  // for); those to the previous rank are made during it, which the caller waits for before it ends the capture.
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
    RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, nextOf(r), w.comms[i], w.streams[i]) == ncclSuccess);
    RANK_EXPECT(err, ncclRecv(ring[i]->p, count, ncclInt32, prevOf(r), w.comms[i], w.streams[i]) == ncclSuccess);
    RANK_EXPECT(err, ncclGroupEnd() == ncclInProgress);
    RANK_EXPECT(err, WaitAsync(w.comms[i]) == ncclSuccess);
    RANK_EXPECT(err, ncclAllReduce(send[i]->p, sum[i]->p, count, ncclInt32, ncclSum, w.comms[i], w.streams[i]) ==
                         ncclInProgress);
    RANK_EXPECT(err, WaitAsync(w.comms[i]) == ncclSuccess);
    RANK_EXPECT(err, cudaStreamSynchronize(w.streams[i]) == cudaSuccess);
  });
  CheckNoErrors(errors);

  std::vector<cudaGraph_t> graphs(kRanks, nullptr);
  std::vector<cudaGraphExec_t> execs(kRanks, nullptr);
  Barrier barrier(kRanks);
  RunRanks(kRanks, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    const size_t i = static_cast<size_t>(r);
    cudaStream_t s = w.streams[i];
    ncclComm_t c = w.comms[i];
    barrier.Wait();
    RANK_EXPECT(err, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    // Connected already: the ring step and the all-reduce are recorded at once.
    QueueRingAndSum(err, r, c, s, count, scratch[i]->p, send[i]->p, ring[i]->p, sum[i]->p);
    RANK_EXPECT(err, ncclGroupStart() == ncclSuccess);
    RANK_EXPECT(err, ncclSend(send[i]->p, count, ncclInt32, prevOf(r), c, s) == ncclSuccess);
    RANK_EXPECT(err, ncclRecv(back[i]->p, count, ncclInt32, nextOf(r), c, s) == ncclSuccess);
    RANK_EXPECT(err, ncclGroupEnd() == ncclInProgress);  // connects: recorded once the async error reads ncclSuccess
    RANK_EXPECT(err, WaitAsync(c) == ncclSuccess);
    RANK_EXPECT(err, cudaMemsetAsync(send[i]->p, 0, bytes, s) == cudaSuccess);  // after every read of send
    RANK_EXPECT(err, cudaStreamEndCapture(s, &graphs[i]) == cudaSuccess && graphs[i] != nullptr);
    barrier.Wait();
    RANK_EXPECT(err, cudaGraphInstantiate(&execs[i], graphs[i], 0) == cudaSuccess);
  });
  CheckNoErrors(errors);

  for (int replay = 0; replay < 2; ++replay) {
    INFO("replay " << replay);
    std::vector<Bytes> in;
    for (int r = 0; r < kRanks; ++r) {
      const size_t i = static_cast<size_t>(r);
      in.push_back(RandomInt32s(count, 1000));
      Upload(*send[i], in.back());
      for (auto* v : {&ring, &back, &sum, &scratch}) Upload(*(*v)[i], Poison(bytes));
    }
    LaunchGraphs(w, execs, &errors);
    const Bytes expected = Int32Sum(in, count);
    for (int r = 0; r < kRanks; ++r) {
      INFO("rank " << r);
      const size_t i = static_cast<size_t>(r);
      CHECK(FirstDifference(Download(*scratch[i], bytes), Bytes(bytes, 0x5a)) == "");
      CHECK(FirstDifference(Download(*ring[i], bytes), in[static_cast<size_t>(prevOf(r))]) == "");
      CHECK(FirstDifference(Download(*back[i], bytes), in[static_cast<size_t>(nextOf(r))]) == "");
      CHECK(FirstDifference(Download(*sum[i], bytes), expected) == "");
      CHECK(FirstDifference(Download(*send[i], bytes), Bytes(bytes, 0)) == "");
    }
  }
  DestroyGraphs(graphs, execs);
}
