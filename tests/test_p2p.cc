// ccSend, ccRecv, ccGroupStart and ccGroupEnd on thread ranks: exchanges in groups (rings, all-to-all with sends to
// the rank itself) byte for byte against what the peer sent, for every datatype; the k-th send matching the k-th
// receive; one thread driving every rank of ccCommInitAll, collectives included; point-to-point interleaved with
// collectives; and bad input refused before anything moves, mismatched sizes and missing peers failing within the
// timeout.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "core/comm.h"
#include "inputs.h"
#include "rank_harness.h"

using cctest::Bytes;
using cctest::Contains;
using cctest::FirstDifference;
using cctest::FirstFailure;
using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;
using cctest::SecondsSince;

namespace {

constexpr ccDataType_t kDtypes[] = {ccInt8,  ccUint8,   ccInt32,   ccUint32,  ccInt64,
                                    ccUint64, ccFloat16, ccFloat32, ccFloat64, ccBfloat16};

// Random bytes, different for every (seed, rank, peer).
Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  Bytes b(n);
  for (char& c : b) c = static_cast<char>(gen());
  return b;
}

}  // namespace

TEST_CASE("a ring exchange in a group delivers the previous rank's bytes, every datatype and size", "[p2p]") {
  for (int n : {1, 2, 3, 4}) {
    Group g = Group::InitAll(n);
    REQUIRE(g.status == ccSuccess);
    for (ccDataType_t dtype : kDtypes) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, (size_t{1} << 20) + 3}) {
        if (count > 4099 && dtype != ccFloat32 && dtype != ccInt8) continue;  // the large case moves bytes alike
        const size_t bytes = count * cctest::SizeOf(dtype);
        std::vector<Bytes> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), Bytes(bytes, 0));
        for (int r = 0; r < n; ++r) in[r] = RandomBytes(bytes, count * 131 + static_cast<uint64_t>(r) * 7 + dtype);
        std::vector<RankResult> results(static_cast<size_t>(n));
        RunRanks(n, [&](int r) {
          ccGroupStart();
          ccSend(in[r].data(), count, dtype, (r + 1) % n, g[r], nullptr);
          ccRecv(out[r].data(), count, dtype, (r + n - 1) % n, g[r], nullptr);
          results[r] = Record(ccGroupEnd(), g[r]);
        });
        INFO("n " << n << " dtype " << dtype << " count " << count);
        REQUIRE(FirstFailure(results) == "");
        for (int r = 0; r < n; ++r) REQUIRE(FirstDifference(out[r], in[(r + n - 1) % n]) == "");
      }
    }
  }
}

TEST_CASE("the k-th send from a rank matches the k-th receive from it, outside groups", "[p2p]") {
  Group g = Group::InitAll(3);
  REQUIRE(g.status == ccSuccess);
  const std::vector<size_t> counts = {5, 1, 300000, 64, 0, 9};
  std::vector<Bytes> sent, got(counts.size());
  for (size_t k = 0; k < counts.size(); ++k) sent.push_back(RandomBytes(counts[k] * 4, 1000 + k));
  std::vector<RankResult> results(3);
  RunRanks(3, [&](int r) {
    ccResult_t rc = ccSuccess;
    for (size_t k = 0; k < counts.size() && rc == ccSuccess; ++k) {
      if (r == 0) {  // blocking sends, one after the other, to rank 2
        rc = ccSend(sent[k].data(), counts[k], ccFloat32, 2, g[r], nullptr);
      } else if (r == 2) {
        got[k].assign(counts[k] * 4, 0);
        rc = ccRecv(got[k].data(), counts[k], ccFloat32, 0, g[r], nullptr);
      }
    }
    results[r] = Record(rc, g[r]);
  });
  REQUIRE(FirstFailure(results) == "");
  for (size_t k = 0; k < counts.size(); ++k) {
    INFO("message " << k);
    REQUIRE(FirstDifference(got[k], sent[k]) == "");
  }
  ccCommStats_t stats{};
  stats.size = sizeof(stats);
  REQUIRE(ccCommGetStats(g[0], &stats) == ccSuccess);
  REQUIRE(stats.collectives == 0);
  REQUIRE(stats.bytesSent == (5 + 1 + 300000 + 64 + 9) * 4);
}

TEST_CASE("an all-to-all in one group, sends to the rank itself included, in any order", "[p2p]") {
  const int n = 4;
  const size_t count = 1001;
  Group g = Group::InitAll(n);
  REQUIRE(g.status == ccSuccess);
  // in[r][p]: what rank r sends to rank p (a different size per pair, so that a mixed-up match fails).
  auto countOf = [&](int from, int to) { return count + static_cast<size_t>(from * n + to); };
  std::vector<std::vector<Bytes>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      in[r].push_back(RandomBytes(countOf(r, p) * 8, static_cast<uint64_t>(r * 100 + p)));
      out[r].push_back(Bytes(countOf(p, r) * 8, 0));
    }
  }
  std::vector<RankResult> results(n);
  RunRanks(n, [&](int r) {
    ccGroupStart();
    for (int k = 0; k < n; ++k) {
      const int p = (r % 2 == 0) ? k : n - 1 - k;  // even ranks post in one order, odd ranks in the other
      if (r % 2 == 0) {
        ccRecv(out[r][p].data(), countOf(p, r), ccFloat64, p, g[r], nullptr);
        ccSend(in[r][p].data(), countOf(r, p), ccFloat64, p, g[r], nullptr);
      } else {
        ccSend(in[r][p].data(), countOf(r, p), ccFloat64, p, g[r], nullptr);
        ccRecv(out[r][p].data(), countOf(p, r), ccFloat64, p, g[r], nullptr);
      }
    }
    results[r] = Record(ccGroupEnd(), g[r]);
  });
  REQUIRE(FirstFailure(results) == "");
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) {
      INFO("rank " << r << " from " << p);
      REQUIRE(FirstDifference(out[r][p], in[p][r]) == "");
    }
  }
}

TEST_CASE("one thread drives every rank of ccCommInitAll through a group: transfers and collectives", "[p2p]") {
  const int n = 4;
  const size_t count = 70000;
  Group g = Group::InitAll(n);
  REQUIRE(g.status == ccSuccess);
  std::vector<Bytes> in(n), out(n, Bytes(count * 4, 0));
  std::vector<std::vector<float>> sums(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    in[r] = RandomBytes(count * 4, 77 + r);
    for (size_t i = 0; i < count; ++i) sums[r][i] = static_cast<float>(r * 10 + static_cast<int>(i % 13));
  }
  REQUIRE(ccGroupStart() == ccSuccess);
  for (int r = 0; r < n; ++r) {
    // Each rank sends to the rank before it and receives from the one after; then an in-place all-reduce.
    REQUIRE(ccRecv(out[r].data(), count * 4, ccUint8, (r + 1) % n, g[r], nullptr) == ccSuccess);
    REQUIRE(ccAllReduce(sums[r].data(), sums[r].data(), count, ccFloat32, ccSum, nullptr, g[r], nullptr) ==
            ccSuccess);
    REQUIRE(ccSend(in[r].data(), count * 4, ccUint8, (r + n - 1) % n, g[r], nullptr) == ccSuccess);
  }
  // Nothing has moved yet: the calls are recorded.
  REQUIRE(cctest::FirstDifference(out[0], Bytes(count * 4, 0)) == "");
  REQUIRE(sums[0][1] == 1.0f);
  INFO(ccGetLastError(nullptr));
  REQUIRE(ccGroupEnd() == ccSuccess);
  for (int r = 0; r < n; ++r) {
    REQUIRE(FirstDifference(out[r], in[(r + 1) % n]) == "");
    for (size_t i = 0; i < count; i += 997) {
      REQUIRE(sums[r][i] == static_cast<float>(60 + 4 * static_cast<int>(i % 13)));
    }
  }
}

TEST_CASE("sends and receives interleave with collectives, in a group in any order and between groups", "[p2p]") {
  const int n = 3;
  const size_t count = 50000;
  Group g = Group::InitAll(n);
  REQUIRE(g.status == ccSuccess);
  std::vector<Bytes> in(n), out(n, Bytes(count * 4, 0));
  std::vector<std::vector<int32_t>> x(n, std::vector<int32_t>(count));
  std::vector<RankResult> results(n);
  std::vector<std::string> wrong(n);
  RunRanks(n, [&](int r) {
    ccResult_t rc = ccSuccess;
    for (int round = 0; round < 4 && rc == ccSuccess; ++round) {
      in[r] = RandomBytes(count * 4, static_cast<uint64_t>(round * 10 + r));
      for (size_t i = 0; i < count; ++i) x[r][i] = r * round + static_cast<int32_t>(i);
      if (round % 2 == 0) {  // one group: rank 0 records the all-reduce first, the others last
        ccGroupStart();
        if (r == 0) ccAllReduce(x[r].data(), x[r].data(), count, ccInt32, ccMax, nullptr, g[r], nullptr);
        ccSend(in[r].data(), count, ccInt32, (r + 1) % n, g[r], nullptr);
        ccRecv(out[r].data(), count, ccInt32, (r + n - 1) % n, g[r], nullptr);
        if (r != 0) ccAllReduce(x[r].data(), x[r].data(), count, ccInt32, ccMax, nullptr, g[r], nullptr);
        rc = ccGroupEnd();
      } else {  // the exchange, then the all-reduce
        ccGroupStart();
        ccSend(in[r].data(), count, ccInt32, (r + 1) % n, g[r], nullptr);
        ccRecv(out[r].data(), count, ccInt32, (r + n - 1) % n, g[r], nullptr);
        rc = ccGroupEnd();
        if (rc == ccSuccess) rc = ccAllReduce(x[r].data(), x[r].data(), count, ccInt32, ccMax, nullptr, g[r], nullptr);
      }
      // The previous rank's bytes of this round (its in[] is rewritten only after the barrier-like all-reduce).
      if (rc == ccSuccess && wrong[r].empty()) {
        const Bytes expect = RandomBytes(count * 4, static_cast<uint64_t>(round * 10 + (r + n - 1) % n));
        wrong[r] = FirstDifference(out[r], expect);
        for (size_t i = 0; i < count && wrong[r].empty(); ++i) {
          if (x[r][i] != (n - 1) * round + static_cast<int32_t>(i)) wrong[r] = "all-reduce at " + std::to_string(i);
        }
      }
    }
    results[r] = Record(rc, g[r]);
  });
  REQUIRE(FirstFailure(results) == "");
  for (int r = 0; r < n; ++r) REQUIRE(wrong[r] == "");
}

TEST_CASE("point-to-point tags never meet a collective's, also where UCX keeps 24 bits of the call number",
          "[p2p]") {
  ccComm c;
  c.seq = 0xfffffd;
  REQUIRE(c.NextSeq() == 0xfffffe);
  REQUIRE(c.NextSeq() == 0x1000000);  // 0xffffff is point-to-point's
  c.seq = 0x4fffffe;
  REQUIRE(c.NextSeq() == 0x5000000);
  REQUIRE((c.NextSeq() & 0xffffff) != ccComm::kPointToPointSeq);
}

TEST_CASE("bad point-to-point arguments are refused before anything moves, and the communicator stays usable",
          "[p2p][errors]") {
  Group g = Group::InitAll(2);
  REQUIRE(g.status == ccSuccess);
  float buf[4] = {1, 2, 3, 4};
  int stream = 0;
  REQUIRE(ccSend(buf, 4, ccFloat32, 1, nullptr, nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(nullptr), "comm is NULL"));
  REQUIRE(ccSend(nullptr, 4, ccFloat32, 1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "sendbuff is NULL"));
  REQUIRE(ccRecv(nullptr, 4, ccFloat32, 1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "recvbuff is NULL"));
  REQUIRE(ccSend(buf, 4, ccFloat32, 2, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "peer 2 is out of range for 2 ranks"));
  REQUIRE(ccRecv(buf, 4, ccFloat32, -1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(ccSend(buf, 4, static_cast<ccDataType_t>(99), 1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "datatype 99"));
  REQUIRE(ccRecv(buf, 4, CC_DATATYPE_REFUSED, 1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "ccRecv: refused by its caller on rank 0"));
  REQUIRE(ccSend(buf, SIZE_MAX / 2, ccFloat32, 1, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(g[0]), "overflows"));
  REQUIRE(ccSend(buf, 4, ccFloat32, 1, g[0], reinterpret_cast<ccStream_t>(&stream)) == ccInvalidUsage);
  REQUIRE(Contains(ccGetLastError(g[0]), "stream must be NULL for host buffers"));
  // A send to this rank itself cannot complete on its own.
  REQUIRE(ccSend(buf, 4, ccFloat32, 0, g[0], nullptr) == ccInvalidUsage);
  REQUIRE(Contains(ccGetLastError(g[0]), "both must be in one ccGroupStart/ccGroupEnd"));
  REQUIRE(ccGroupEnd() == ccInvalidUsage);
  REQUIRE(Contains(ccGetLastError(nullptr), "no open ccGroupStart"));
  // Nothing was sent: a fresh exchange gets the fresh bytes.
  float out[4] = {0, 0, 0, 0};
  std::vector<RankResult> results(2);
  RunRanks(2, [&](int r) {
    results[r] = Record(r == 0 ? ccSend(buf, 4, ccFloat32, 1, g[r], nullptr)
                               : ccRecv(out, 4, ccFloat32, 0, g[r], nullptr), g[r]);
  });
  REQUIRE(FirstFailure(results) == "");
  REQUIRE(std::memcmp(out, buf, sizeof(buf)) == 0);
}

TEST_CASE("a group with a refused call issues none of its calls", "[p2p][errors]") {
  Group g = Group::InitAll(2);
  REQUIRE(g.status == ccSuccess);
  float a[3] = {1, 2, 3}, b[3] = {7, 8, 9}, self[3] = {0, 0, 0}, out[3] = {0, 0, 0};
  // One thread, rank 0: a good send, a good self pair, then a refused call; the group issues nothing.
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccSend(a, 3, ccFloat32, 1, g[0], nullptr) == ccSuccess);
  REQUIRE(ccSend(a, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccRecv(self, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccRecv(out, 3, ccFloat32, 5, g[0], nullptr) == ccInvalidArgument);
  REQUIRE(ccGroupEnd() == ccInvalidArgument);
  REQUIRE(Contains(ccGetLastError(nullptr), "none was issued"));
  REQUIRE(Contains(ccGetLastError(nullptr), "peer 5 is out of range"));
  REQUIRE(self[0] == 0.0f);
  // A self pair of different sizes: refused at ccGroupEnd before anything moves.
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccSend(a, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccRecv(self, 2, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccGroupEnd() == ccInvalidUsage);
  REQUIRE(Contains(ccGetLastError(nullptr), "has 12 bytes but its receive expects 8"));
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccRecv(self, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccGroupEnd() == ccInvalidUsage);
  REQUIRE(Contains(ccGetLastError(nullptr), "receive 1 to this rank itself has no matching send"));
  REQUIRE(self[0] == 0.0f);
  // Rank 1's first receive from rank 0 gets b, sent now: nothing of the refused groups reached it.
  std::vector<RankResult> results(2);
  RunRanks(2, [&](int r) {
    results[r] = Record(r == 0 ? ccSend(b, 3, ccFloat32, 1, g[r], nullptr)
                               : ccRecv(out, 3, ccFloat32, 0, g[r], nullptr), g[r]);
  });
  REQUIRE(FirstFailure(results) == "");
  REQUIRE(std::memcmp(out, b, sizeof(b)) == 0);
  // A refusal at ccGroupEnd on one communicator (rank 0's send to itself has no receive) issues nothing on the
  // others either: rank 1's receive is not posted, so it does not wait out the timeout.
  {
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(ccGroupStart() == ccSuccess);
    REQUIRE(ccRecv(out, 3, ccFloat32, 0, g[1], nullptr) == ccSuccess);
    REQUIRE(ccSend(a, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
    REQUIRE(ccGroupEnd() == ccInvalidUsage);
    REQUIRE(Contains(ccGetLastError(nullptr), "no call of the group was issued"));
    REQUIRE(SecondsSince(start) < 5.0);
    ccResult_t async = ccSuccess;
    REQUIRE(ccCommGetAsyncError(g[1], &async) == ccSuccess);
    REQUIRE(async == ccSuccess);
  }
  // Nested groups issue at the outermost end.
  float self2[3] = {0, 0, 0};
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccGroupStart() == ccSuccess);
  REQUIRE(ccSend(a, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(ccGroupEnd() == ccSuccess);
  REQUIRE(ccRecv(self2, 3, ccFloat32, 0, g[0], nullptr) == ccSuccess);
  REQUIRE(self2[0] == 0.0f);
  REQUIRE(ccGroupEnd() == ccSuccess);
  REQUIRE(std::memcmp(self2, a, sizeof(a)) == 0);
}

TEST_CASE("a group refused on one rank refuses its collectives in the call check so the peers stay in step",
          "[p2p][errors]") {
  if (!cctest::CallCheckOn()) return;  // refusals travel in the call check
  // Each rank drives its own group holding an all-reduce; rank 0's group also holds a refused send (a NULL buffer,
  // refused as made, or a send to itself without its receive, refused at ccGroupEnd), so it issues nothing. Rank 1's
  // all-reduce used to pair with rank 0's next all-reduce, an unrelated one: both returned ccSuccess with data mixed
  // from the two calls, and rank 1's next call timed out. "receive": rank 1's group also holds the receive of the
  // refused send, which waits until its timeout; then both groups fail, and no later call succeeds with wrong data.
  const std::string mode = GENERATE(std::string("as made"), std::string("at group end"), std::string("receive"));
  CAPTURE(mode);
  const bool receive = mode == "receive";
  const int timeoutMs = receive ? cctest::ScaledMs(1500) : 60000;
  Group g = Group::InitConfig(2, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, timeoutMs));
  REQUIRE(g.status == ccSuccess);
  std::vector<RankResult> grouped(2), next(2);
  std::vector<std::vector<float>> d(2, std::vector<float>(4, -1.0f)), d2(2, std::vector<float>(4, -1.0f));
  std::vector<double> seconds(2);
  RunRanks(2, [&](int r) {
    std::vector<float> s(4, r == 0 ? 1.0f : 10.0f), s2(4, r == 0 ? 1.0f : 100.0f), got(4, -1.0f);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(ccGroupStart() == ccSuccess);
    ccAllReduce(s.data(), d[r].data(), 4, ccFloat32, ccSum, nullptr, g[r], nullptr);
    const bool self = mode == "at group end";
    if (r == 0) ccSend(self ? s.data() : nullptr, 4, ccFloat32, self ? 0 : 1, g[r], nullptr);
    if (r == 1 && receive) ccRecv(got.data(), 4, ccFloat32, 0, g[r], nullptr);
    grouped[r] = Record(ccGroupEnd(), g[r]);
    seconds[r] = SecondsSince(start);
    next[r] = Record(ccAllReduce(s2.data(), d2[r].data(), 4, ccFloat32, ccSum, nullptr, g[r], nullptr), g[r]);
  });
  INFO("rank 0's group: " << grouped[0].error << "; rank 1's: " << grouped[1].error);
  CHECK(grouped[0].rc == (mode == "at group end" ? ccInvalidUsage : ccInvalidArgument));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << "'s next all-reduce: " << next[r].error);
    CHECK(d[r] == std::vector<float>(4, -1.0f));  // the refused all-reduce wrote nothing
    if (!receive) {
      CHECK(next[r].rc == ccSuccess);
      CHECK(d2[r] == std::vector<float>(4, 101.0f));
    } else if (next[r].rc == ccSuccess) {
      CHECK(d2[r] == std::vector<float>(4, 101.0f));
    }
  }
  if (!receive) {
    CHECK(grouped[1].rc == ccInvalidUsage);
    CHECK(Contains(grouped[1].error, "rank 0 refused the call"));
  } else {
    // Rank 1's receive times out, or rank 0's wait for rank 1's call check times out first and aborts the
    // communicator, which ends that receive.
    CHECK((grouped[1].rc == ccTimeout || grouped[1].rc == ccRemoteError));
    CHECK(seconds[0] < 30.0 * cctest::TimeScale());  // rank 0 waited for rank 1's call check, within its timeout
  }
}

TEST_CASE("a send and a receive of different sizes fail both ranks, and a missing peer is a timeout",
          "[p2p][errors]") {
  SECTION("a message of no elements is one of the matches") {
    Group g = Group::InitAll(2);
    REQUIRE(g.status == ccSuccess);
    int32_t a[5] = {1, 2, 3, 4, 5}, b[5] = {0, 0, 0, 0, 0};
    std::vector<RankResult> results(2);
    RunRanks(2, [&](int r) {  // rank 0 sends 0 then 5 elements; rank 1 receives 5 first
      ccResult_t rc = r == 0 ? ccSend(nullptr, 0, ccInt32, 1, g[r], nullptr) : ccRecv(b, 5, ccInt32, 0, g[r], nullptr);
      if (rc == ccSuccess) {
        rc = r == 0 ? ccSend(a, 5, ccInt32, 1, g[r], nullptr) : ccRecv(b, 5, ccInt32, 0, g[r], nullptr);
      }
      results[r] = Record(rc, g[r]);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << results[r].error);
      REQUIRE(results[r].rc == ccInvalidUsage);
      REQUIRE(Contains(results[r].error, "rank 0 sent 0 bytes but rank 1 expects 20 bytes"));
    }
    REQUIRE(b[0] == 0);
  }
  SECTION("sizes") {
    Group g = Group::InitAll(2);
    REQUIRE(g.status == ccSuccess);
    std::vector<float> a(100, 1.0f), b(100, 0.0f);
    std::vector<RankResult> results(2);
    RunRanks(2, [&](int r) {
      results[r] = Record(r == 0 ? ccSend(a.data(), 100, ccFloat32, 1, g[r], nullptr)
                                 : ccRecv(b.data(), 50, ccFloat32, 0, g[r], nullptr), g[r]);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << results[r].error);
      REQUIRE(results[r].rc == ccInvalidUsage);
      REQUIRE(Contains(results[r].error, "rank 0 sent 400 bytes but rank 1 expects 200 bytes"));
    }
    // The communicator failed: later calls say so at once.
    ccResult_t async = ccSuccess;
    REQUIRE(ccCommGetAsyncError(g[0], &async) == ccSuccess);
    REQUIRE(async == ccInvalidUsage);
    REQUIRE(ccSend(a.data(), 1, ccFloat32, 1, g[0], nullptr) == ccInvalidUsage);
    REQUIRE(Contains(ccGetLastError(g[0]), "failed earlier"));
  }
  SECTION("timeout") {
    ccConfig_t config = cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 300);
    // 300 ms is the wait checked below, and it bounds each round of the init too: on a slow machine (a TSan run is
    // 5-15x slower) the init may not make it, so it is tried again (a broken init fails every time).
    Group g = Group::InitConfig(2, config);
    for (int tries = 1; g.status != ccSuccess && tries < 5; ++tries) g = Group::InitConfig(2, config);
    INFO(g.error);
    REQUIRE(g.status == ccSuccess);
    float b[2];
    const auto start = std::chrono::steady_clock::now();
    const ccResult_t rc = ccRecv(b, 2, ccFloat32, 1, g[0], nullptr);  // rank 1 never sends
    REQUIRE(rc == ccTimeout);
    REQUIRE(Contains(ccGetLastError(g[0]), "ccRecv: rank 0 timed out after 300 ms waiting for data from rank 1"));
    REQUIRE(SecondsSince(start) < 5.0);
  }
}
