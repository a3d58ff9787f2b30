// ccCommSplit on thread ranks: who lands in which group and at which rank, exact and compressed calls on the new
// communicators (against fp64 references, and the same bytes on every member), the parent left usable, inherited and
// overridden configuration, non-blocking splits, and bad input on one rank failing every rank without a hang.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ccoll.h"
#include "core/comm.h"
#include "rank_harness.h"

using cctest::Contains;
using cctest::Group;
using cctest::RankResult;
using cctest::Record;
using cctest::RunRanks;
using cctest::SecondsSince;

namespace {

// Rank r's input at element i, the same function every test uses: distinct per rank, exact in float64 sums.
double Input(int parentRank, size_t i) { return parentRank * 1000.0 + static_cast<double>(i % 97) - 48.0; }

// Each parent rank's split result.
struct Split {
  std::vector<ccComm_t> sub;
  std::vector<RankResult> results;
  explicit Split(size_t n) : sub(n, nullptr), results(n) {}
  Split(const Split&) = delete;
  Split& operator=(const Split&) = delete;
  ~Split() {
    for (ccComm_t c : sub) ccCommDestroy(c);
  }
};

// The parent ranks of `color`, in the order the split ranks them: by key, then by parent rank.
std::vector<int> Expected(const std::vector<int>& colors, const std::vector<int>& keys, int color) {
  std::vector<int> m;
  for (size_t r = 0; r < colors.size(); ++r) {
    if (colors[r] == color) m.push_back(static_cast<int>(r));
  }
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  return m;
}

// Splits g by colors/keys (config for every rank, may be null) and checks every rank's place.
void SplitAndCheckPlaces(const Group& g, const std::vector<int>& colors, const std::vector<int>& keys,
                         ccConfig_t* config, Split* s) {
  const int n = g.size();
  RunRanks(n, [&](int r) {
    s->results[r] = Record(ccCommSplit(g[r], colors[r], keys[r], &s->sub[r], config), g[r]);
  });
  for (int r = 0; r < n; ++r) {
    INFO("parent rank " << r << ": " << s->results[r].error);
    REQUIRE(s->results[r].rc == ccSuccess);
    if (colors[r] == CC_SPLIT_NOCOLOR) {
      CHECK(s->sub[r] == nullptr);
      continue;
    }
    REQUIRE(s->sub[r] != nullptr);
    const std::vector<int> members = Expected(colors, keys, colors[r]);
    int count = -1, rank = -1;
    REQUIRE(ccCommCount(s->sub[r], &count) == ccSuccess);
    REQUIRE(ccCommUserRank(s->sub[r], &rank) == ccSuccess);
    CHECK(count == static_cast<int>(members.size()));
    CHECK(rank == static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
  }
}

// An exact float64 sum of `count` elements on every communicator of comms at once (one per parent rank; a NULL one
// takes no part); "" when each holds the sum of its group's inputs, its group being the parent ranks of its color.
std::string SumsWithinGroups(const std::vector<ccComm_t>& comms, const std::vector<int>& colors,
                             const std::vector<int>& keys, size_t count) {
  const int n = static_cast<int>(colors.size());
  std::vector<std::vector<double>> out(n, std::vector<double>(count, -1.0));
  std::vector<RankResult> results(n);
  RunRanks(n, [&](int r) {
    if (comms[r] == nullptr) return;
    std::vector<double> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = Input(r, i);
    results[r] = Record(ccAllReduce(in.data(), out[r].data(), count, ccFloat64, ccSum, nullptr, comms[r], nullptr),
                        comms[r]);
  });
  for (int r = 0; r < n; ++r) {
    if (comms[r] == nullptr) continue;
    if (results[r].rc != ccSuccess) return "parent rank " + std::to_string(r) + ": " + results[r].error;
    const std::vector<int> members = Expected(colors, keys, colors[r]);
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int m : members) want += Input(m, i);
      if (out[r][i] != want) {
        return "parent rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
               std::to_string(out[r][i]) + " instead of " + std::to_string(want);
      }
    }
  }
  return "";
}

std::string SumsWithinGroups(const Split& s, const std::vector<int>& colors, const std::vector<int>& keys,
                             size_t count) {
  return SumsWithinGroups(s.sub, colors, keys, count);
}

// The parent's own exact sum still works: one group of every rank, in the parent's order.
std::string ParentWorks(const Group& g, size_t count = 513) {
  const std::vector<int> one(static_cast<size_t>(g.size()), 0);
  return SumsWithinGroups(g.comms, one, one, count);
}

}  // namespace

TEST_CASE("ccCommSplit groups ranks by color, orders them by key, and the new communicators reduce within their "
          "group while the parent stays usable", "[split]") {
  const int n = GENERATE(1, 2, 5);
  CAPTURE(n);
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 30000));
  REQUIRE(g.status == ccSuccess);
  std::vector<int> colors(n), keys(n);
  SECTION("parity, keys reversed") {
    for (int r = 0; r < n; ++r) {
      colors[r] = r % 2;
      keys[r] = -r;
    }
  }
  SECTION("one color, equal keys: the parent's order") {
    for (int r = 0; r < n; ++r) colors[r] = 7;
  }
  SECTION("rank 0 takes no part; the rest in pairs") {
    for (int r = 0; r < n; ++r) {
      colors[r] = r == 0 ? CC_SPLIT_NOCOLOR : (r - 1) / 2;
      keys[r] = r % 3;
    }
  }
  SECTION("a group of its own for every rank") {
    for (int r = 0; r < n; ++r) colors[r] = 1000 + r;
  }
  Split s(static_cast<size_t>(n));
  SplitAndCheckPlaces(g, colors, keys, nullptr, &s);
  // Counts through the tree and the ring, odd lengths.
  for (size_t count : {size_t{1}, size_t{1023}, size_t{(1 << 17) + 5}}) {
    CAPTURE(count);
    CHECK(SumsWithinGroups(s, colors, keys, count) == "");
  }
  CHECK(ParentWorks(g) == "");
}

TEST_CASE("a compressed all-reduce on a split communicator gives its members the same bytes", "[split]") {
  const int n = 4;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 30000));
  REQUIRE(g.status == ccSuccess);
  const std::vector<int> colors = {0, 1, 0, 1}, keys = {0, 0, 0, 0};
  Split s(n);
  SplitAndCheckPlaces(g, colors, keys, nullptr, &s);
  const size_t count = (1 << 16) + 3;
  std::vector<std::vector<float>> out(n, std::vector<float>(count));
  std::vector<RankResult> results(n);
  cctest::Compressors comps("quant:bits=4,mode=requant", n);
  REQUIRE(comps.status == ccSuccess);
  RunRanks(n, [&](int r) {
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(Input(r, i) / 1000.0);
    results[r] = Record(ccAllReduce(in.data(), out[r].data(), count, ccFloat32, ccAvg, comps[r], s.sub[r], nullptr),
                        s.sub[r]);
  });
  for (int r = 0; r < n; ++r) {
    INFO("parent rank " << r << ": " << results[r].error);
    REQUIRE(results[r].rc == ccSuccess);
  }
  for (int color : {0, 1}) {
    const std::vector<int> m = Expected(colors, keys, color);
    CHECK(std::memcmp(out[m[0]].data(), out[m[1]].data(), count * sizeof(float)) == 0);
    double num = 0, den = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = (Input(m[0], i) + Input(m[1], i)) / 2000.0;
      num += (out[m[0]][i] - want) * (out[m[0]][i] - want);
      den += want * want;
    }
    CAPTURE(color, num / den);
    CHECK(num / den < 0.02);
  }
}

TEST_CASE("a split communicator can be split again", "[split]") {
  const int n = 4;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 30000));
  REQUIRE(g.status == ccSuccess);
  const std::vector<int> colors = {0, 0, 0, 1}, keys = {0, 0, 0, 0};
  Split s(n);
  SplitAndCheckPlaces(g, colors, keys, nullptr, &s);
  // The three of color 0 split again: parent ranks 0 and 2 together, 1 alone.
  Group first;
  first.comms = {s.sub[0], s.sub[1], s.sub[2]};
  s.sub[0] = s.sub[1] = s.sub[2] = nullptr;  // `first` destroys them
  Split again(3);
  SplitAndCheckPlaces(first, {5, 6, 5}, {0, 0, 0}, nullptr, &again);
  CHECK(SumsWithinGroups(again, {5, 6, 5}, {0, 0, 0}, 1000) == "");
  // The first split's communicators, destroyed before the second's, leave those working.
  first.Destroy();
  CHECK(SumsWithinGroups(again, {5, 6, 5}, {0, 0, 0}, 100) == "");
}

TEST_CASE("ccCommSplit inside a group is ccInvalidUsage there and at ccGroupEnd, and the parent stays usable",
          "[split][group]") {
  // A group records calls for its end, while a split's exchanges must run at once: recorded, the split's all-gather
  // used to run at ccGroupEnd into the split's freed vector (a heap corruption) and ccGroupEnd returned ccSuccess.
  const int n = 3;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 20000));
  REQUIRE(g.status == ccSuccess);
  std::vector<ccComm_t> sub(n, reinterpret_cast<ccComm_t>(0x1));
  std::vector<RankResult> inGroup(n), atEnd(n);
  RunRanks(n, [&](int r) {
    REQUIRE(ccGroupStart() == ccSuccess);
    inGroup[r] = Record(ccCommSplit(g[r], 0, r, &sub[r], nullptr), g[r]);
    atEnd[r].rc = ccGroupEnd();
    atEnd[r].error = ccGetLastError(nullptr);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << inGroup[r].error << " / at ccGroupEnd: " << atEnd[r].error);
    CHECK(inGroup[r].rc == ccInvalidUsage);
    CHECK(Contains(inGroup[r].error, "between ccGroupStart and ccGroupEnd"));
    CHECK(sub[r] == nullptr);
    CHECK(atEnd[r].rc == ccInvalidUsage);
    CHECK(Contains(atEnd[r].error, "ccCommSplit"));
  }
  CHECK(SumsWithinGroups(g.comms, {0, 0, 0}, {0, 1, 2}, 1000) == "");
  Split s(n);  // outside a group it works
  SplitAndCheckPlaces(g, {0, 1, 0}, {0, 0, 0}, nullptr, &s);
  CHECK(SumsWithinGroups(s.sub, {0, 1, 0}, {0, 0, 0}, 100) == "");
}

TEST_CASE("a split communicator takes the parent's configuration, and the fields a config sets", "[split][config]") {
  const int n = 2;
  ccConfig_t parentConfig = cctest::MakeConfig(ccAlgoTree, 12345);
  Group g = Group::InitConfig(n, parentConfig);
  REQUIRE(g.status == ccSuccess);
  Split inherited(n);
  SplitAndCheckPlaces(g, {0, 0}, {0, 0}, nullptr, &inherited);
  ccConfig_t override = cctest::MakeConfig(ccAlgoRing);
  Split overridden(n);
  SplitAndCheckPlaces(g, {0, 0}, {0, 0}, &override, &overridden);
  for (int r = 0; r < n; ++r) {
    CHECK(inherited.sub[r]->config.algorithm == ccAlgoTree);
    CHECK(inherited.sub[r]->config.timeoutMs == 12345);
    CHECK(overridden.sub[r]->config.algorithm == ccAlgoRing);
    CHECK(overridden.sub[r]->config.timeoutMs == 12345);
  }
}

TEST_CASE("a non-blocking split returns ccInProgress and finishes in the background", "[split][config]") {
  const int n = 3;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 30000));
  REQUIRE(g.status == ccSuccess);
  ccConfig_t config = CC_CONFIG_INITIALIZER;
  config.blocking = 0;
  Split s(n);
  RunRanks(n, [&](int r) { s.results[r] = Record(ccCommSplit(g[r], 0, 0, &s.sub[r], &config), g[r]); });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << s.results[r].error);
    CHECK(s.results[r].rc == ccInProgress);
    REQUIRE(s.sub[r] != nullptr);
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<ccResult_t> state(n, ccInProgress);
  while (SecondsSince(start) < 20) {
    bool pending = false;
    for (int r = 0; r < n; ++r) {
      REQUIRE(ccCommGetAsyncError(s.sub[r], &state[r]) == ccSuccess);
      pending = pending || state[r] == ccInProgress;
    }
    if (!pending) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r) CHECK(state[r] == ccSuccess);
  CHECK(SumsWithinGroups(s, {0, 0, 0}, {0, 0, 0}, 777) == "");
}

TEST_CASE("bad input to ccCommSplit on one rank fails every rank at once, names that rank, and makes nothing",
          "[split][args]") {
  const int n = 3;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 20000));
  REQUIRE(g.status == ccSuccess);
  enum Bad { kColor, kNewcomm, kConfigMagic, kConfigValue, kConfigNccl };
  const Bad bad = GENERATE(kColor, kNewcomm, kConfigMagic, kConfigValue, kConfigNccl);
  CAPTURE(bad);
  if (bad == kConfigNccl) {
    // Transport nccl passes ResolveConfig, but without NCCL or a CUDA device the new communicator's setup refuses it
    // on that rank alone; the split must see that before the others wait for it in the new group's bootstrap.
    ccConfig_t nccl = CC_CONFIG_INITIALIZER;
    nccl.transport = ccTransportNccl;
    ccoll::CommConfig resolved;
    REQUIRE(ccoll::ResolveConfig(&nccl, &resolved) == ccSuccess);
    if (ccoll::CheckTransportUsable(resolved, 0) == ccSuccess) return;  // NCCL and a device: a valid config here
  }
  const int culprit = 1;
  Split s(n);
  std::vector<double> seconds(n);
  RunRanks(n, [&](int r) {
    int color = 0;
    ccComm_t* out = &s.sub[r];
    ccConfig_t config = CC_CONFIG_INITIALIZER;
    if (r == culprit && bad == kColor) color = -2;
    if (r == culprit && bad == kNewcomm) out = nullptr;
    if (r == culprit && bad == kConfigMagic) config.magic = 0x1234;
    if (r == culprit && bad == kConfigValue) config.timeoutMs = -5;
    if (r == culprit && bad == kConfigNccl) config.transport = ccTransportNccl;
    auto start = std::chrono::steady_clock::now();
    s.results[r] = Record(ccCommSplit(g[r], color, 0, out, &config), g[r]);
    seconds[r] = SecondsSince(start);
  });
  const char* own = bad == kColor         ? "color -2"
                    : bad == kNewcomm       ? "newcomm"
                    : bad == kConfigMagic   ? "CC_CONFIG_INITIALIZER"
                    : bad == kConfigValue   ? "timeout -5"
                                            : "transport nccl";
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << s.results[r].error);
    CHECK(s.results[r].rc == (r == culprit && bad == kConfigNccl ? ccInvalidUsage : ccInvalidArgument));
    CHECK(s.sub[r] == nullptr);
    CHECK(seconds[r] < 5.0);  // not the 20 s timeout
    CHECK(Contains(s.results[r].error, r == culprit ? own : "rank 1 of the parent communicator passed"));
  }
  CHECK(ParentWorks(g) == "");
}

TEST_CASE("a rank whose all-gather has the split's size where the others split: the others fail at once",
          "[split][mismatch]") {
  const int n = 3;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 20000));
  REQUIRE(g.status == ccSuccess);
  Split s(n);
  std::vector<double> seconds(n);
  RunRanks(n, [&](int r) {
    auto start = std::chrono::steady_clock::now();
    if (r == 1) {  // the same call as the split's first exchange: the call check cannot tell them apart
      std::vector<int64_t> mine(4, 7), all(4 * n);
      s.results[r] = Record(ccAllGather(mine.data(), all.data(), 4, ccInt64, g[r], nullptr), g[r]);
    } else {
      s.results[r] = Record(ccCommSplit(g[r], 0, 0, &s.sub[r], nullptr), g[r]);
    }
    seconds[r] = SecondsSince(start);
  });
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << s.results[r].error);
    CHECK(s.results[r].rc == ccInvalidUsage);
    CHECK(Contains(s.results[r].error, "rank 1 of the parent communicator made another call"));
    CHECK(s.sub[r] == nullptr);
    CHECK(seconds[r] < 5.0);
  }
}

TEST_CASE("ccCommSplit of a NULL or destroyed communicator is refused at once", "[split][args]") {
  ccComm_t out = reinterpret_cast<ccComm_t>(0x1);
  CHECK(ccCommSplit(nullptr, 0, 0, &out, nullptr) == ccInvalidArgument);
  CHECK(out == nullptr);
  CHECK(Contains(ccGetLastError(nullptr), "comm is NULL"));
  Group g = Group::InitAll(1);
  REQUIRE(g.status == ccSuccess);
  ccComm_t dead = g[0];
  g.Destroy();
  CHECK(ccCommSplit(dead, 0, 0, &out, nullptr) == ccInvalidArgument);
  CHECK(Contains(ccGetLastError(nullptr), "not a live communicator"));
}

TEST_CASE("a rank that calls ccCommSplit while the others call ccAllReduce: every rank gets an error, no hang",
          "[split][mismatch]") {
  if (!cctest::CallCheckOn()) return;  // without the call check the ranks wait for each other until the timeout
  const int n = 3;
  Group g = Group::InitConfig(n, cctest::MakeConfig(CC_CONFIG_UNDEF_INT, 20000));
  REQUIRE(g.status == ccSuccess);
  Split s(n);
  std::vector<double> seconds(n);
  RunRanks(n, [&](int r) {
    auto start = std::chrono::steady_clock::now();
    if (r == 0) {
      s.results[r] = Record(ccCommSplit(g[r], 0, 0, &s.sub[r], nullptr), g[r]);
    } else {
      std::vector<double> x(8, 1.0);
      s.results[r] = Record(ccAllReduce(x.data(), x.data(), 8, ccFloat64, ccSum, nullptr, g[r], nullptr), g[r]);
    }
    seconds[r] = SecondsSince(start);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << s.results[r].error);
    CHECK(s.results[r].rc == ccInvalidUsage);
    CHECK(seconds[r] < 5.0);
  }
  CHECK(s.sub[0] == nullptr);
}
