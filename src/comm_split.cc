// C API entry point ccCommSplit: the ranks of a communicator agree, over that communicator, on who goes with whom,
// then each new group forms as one made with ccGetUniqueId and ccCommInitRankConfig would, its id handed out by the
// same exchange. Two exact all-gathers on the parent: first every rank's color, key and verdict on its own
// arguments (so that a bad argument on one rank fails every rank at once instead of leaving the others in the
// bootstrap until the timeout), then the new groups' ids, made by each group's first rank.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api_guard.h"
#include "ccoll.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/error.h"
#include "group.h"

using ccoll::Fail;

namespace {

// A rank's verdict on its own arguments, in the first exchange.
enum Verdict : int64_t { kArgsOk = 0, kBadColor = 1, kNullNewcomm = 2, kBadConfig = 3 };

// What the first exchange carries per rank, as int64s, after kSplitMagic: a rank that made another all-gather of the
// same size there (a mismatch the call check cannot see) is caught by its missing magic.
struct Proposal {
  int64_t color;
  int64_t key;
  int64_t verdict;
};
constexpr int64_t kSplitMagic = 0x53504c4954434321;  // "SPLITCC!"
constexpr size_t kProposalWords = 4;

// The second exchange: a group's first rank says whether it could open the group's bootstrap root, and the id.
enum IdState : int64_t { kNotFirst = 0, kIdMade = 1, kIdFailed = 2 };
constexpr size_t kIdWords = 1 + CC_UNIQUE_ID_BYTES / sizeof(int64_t);
static_assert(CC_UNIQUE_ID_BYTES % sizeof(int64_t) == 0, "the id travels as int64 words");

// The ranks of comm with this color, in their new order: by key, then by rank in comm.
std::vector<int> Members(const std::vector<Proposal>& all, int64_t color) {
  std::vector<int> members;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].color == color) members.push_back(static_cast<int>(r));
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
  return members;
}

// config over comm's: the caller's fields where set, comm's resolved ones where not.
ccConfig_t Inherit(const ccComm* comm, const ccConfig_t* config) {
  ccConfig_t merged = CC_CONFIG_INITIALIZER;
  if (config != nullptr && config->size >= offsetof(ccConfig_t, transport) && config->magic == CC_CONFIG_MAGIC) {
    std::memcpy(&merged, config, std::min(config->size, sizeof(merged)));
    merged.size = sizeof(merged);
  }
  const ccoll::CommConfig& parent = comm->config;
  if (merged.transport == CC_CONFIG_UNDEF_INT) merged.transport = parent.transport;
  if (merged.algorithm == CC_CONFIG_UNDEF_INT) merged.algorithm = parent.algorithm;
  if (merged.timeoutMs == CC_CONFIG_UNDEF_INT) merged.timeoutMs = parent.timeoutMs;
  if (merged.blocking == CC_CONFIG_UNDEF_INT) merged.blocking = parent.blocking;
  if (merged.cudaDev == CC_CONFIG_UNDEF_INT && parent.cudaDev >= 0) merged.cudaDev = parent.cudaDev;
  return merged;
}

// The exact all-gather of `words` int64s per rank on comm; a failure is the split's, with the all-gather's reason.
ccResult_t Exchange(ccComm* comm, const int64_t* mine, size_t words, std::vector<int64_t>* all, const char* what) {
  all->assign(words * static_cast<size_t>(comm->nranks), 0);
  ccResult_t r = ccAllGather(mine, all->data(), words, ccInt64, comm, nullptr);
  if (r != ccSuccess) {
    return Fail(r, "ccCommSplit: rank %d: the exchange of %s on the parent communicator failed: %s", comm->rank, what,
                ccoll::LastError().c_str());
  }
  return ccSuccess;
}

const char* VerdictText(int64_t v) {
  switch (v) {
    case kBadColor: return "a color that is neither >= 0 nor CC_SPLIT_NOCOLOR";
    case kNullNewcomm: return "newcomm == NULL";
    case kBadConfig: return "a config that was refused";
    default: return "arguments it refused";
  }
}

// What a rank of a new group needs for ccCommInitRankConfig once the ranks have agreed.
struct Joining {
  bool member = false;  // false: CC_SPLIT_NOCOLOR
  ccUniqueId id;
  int nranks = 0;
  int rank = 0;
  ccConfig_t config;
};

// The exchanges on the parent (the caller holds its use and has set *newcomm to NULL), up to the new group's id; the
// init comes after, without the parent, so that aborting the parent does not wait for the new group to form.
ccResult_t Agree(ccComm* comm, int color, int key, ccComm_t* newcomm, ccConfig_t* config, Joining* join) {
  // This rank's own arguments first; whatever is wrong is still taken to the exchange, so that every rank fails.
  std::string mineWrong;
  ccResult_t mineResult = ccSuccess;
  int64_t verdict = kArgsOk;
  const ccConfig_t merged = Inherit(comm, config);
  ccoll::CommConfig resolved;
  if (newcomm == nullptr) {
    verdict = kNullNewcomm;
    mineResult = Fail(ccInvalidArgument, "ccCommSplit: newcomm (the output pointer) is NULL on rank %d", comm->rank);
  } else if (color < 0 && color != CC_SPLIT_NOCOLOR) {
    verdict = kBadColor;
    mineResult = Fail(ccInvalidArgument, "ccCommSplit: color %d on rank %d is negative and not CC_SPLIT_NOCOLOR (-1)",
                      color, comm->rank);
  } else {
    // The caller's struct as given (Inherit skips one without CC_CONFIG_INITIALIZER's size and magic), then merged,
    // then what the new communicator's setup would refuse on this rank alone (its peers would wait for it).
    ccResult_t r = config != nullptr ? ccoll::ResolveConfig(config, &resolved) : ccSuccess;
    if (r == ccSuccess) r = ccoll::ResolveConfig(&merged, &resolved);
    if (r != ccSuccess) {
      mineResult = Fail(r, "ccCommSplit: rank %d: %s", comm->rank, ccoll::LastError().c_str());
    } else if ((r = ccoll::CheckTransportUsable(resolved, comm->rank)) != ccSuccess) {
      mineResult = Fail(r, "ccCommSplit: %s", ccoll::LastError().c_str());  // the sentence names the rank
    }
    if (r != ccSuccess) verdict = kBadConfig;
  }
  if (verdict != kArgsOk) mineWrong = ccoll::LastError();

  const int64_t proposal[kProposalWords] = {kSplitMagic, color, key, verdict};
  std::vector<int64_t> words;
  CC_CHECK(Exchange(comm, proposal, kProposalWords, &words, "colors and keys"));
  std::vector<Proposal> all(static_cast<size_t>(comm->nranks));
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t* w = &words[r * kProposalWords];
    if (w[0] != kSplitMagic) {
      return Fail(ccInvalidUsage, "ccCommSplit: rank %zu of the parent communicator made another call (an all-gather "
                  "of %zu int64, not ccCommSplit) where rank %d called ccCommSplit; every rank must call it", r,
                  kProposalWords, comm->rank);
    }
    all[r] = Proposal{w[1], w[2], w[3]};
  }
  if (verdict != kArgsOk) {
    ccoll::SetLastError(mineWrong);
    return mineResult;
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].verdict == kArgsOk) continue;
    return Fail(ccInvalidArgument, "ccCommSplit: rank %zu of the parent communicator passed %s (its ccGetLastError "
                "says more); no communicator was made (rank %d)", r, VerdictText(all[r].verdict), comm->rank);
  }

  // The first rank of each color makes the group's id; everyone learns all of them.
  const std::vector<int> members = color == CC_SPLIT_NOCOLOR ? std::vector<int>() : Members(all, color);
  int64_t idWords[kIdWords] = {kNotFirst};
  std::string idFailure;
  if (!members.empty() && members[0] == comm->rank) {
    ccUniqueId id;
    // The new group's root waits for its ranks as long as they will wait for it (the new communicator's timeout).
    if (ccoll::BootstrapStartRoot(nullptr, nullptr, resolved.timeoutMs, &id) == ccSuccess) {
      idWords[0] = kIdMade;
      std::memcpy(&idWords[1], id.internal, CC_UNIQUE_ID_BYTES);
    } else {
      idWords[0] = kIdFailed;
      idFailure = ccoll::LastError();
    }
  }
  CC_CHECK(Exchange(comm, idWords, kIdWords, &words, "the new groups' ids"));
  for (size_t r = 0; r < all.size(); ++r) {
    if (words[r * kIdWords] != kIdFailed) continue;
    if (static_cast<int>(r) == comm->rank) {
      return Fail(ccSystemError, "ccCommSplit: rank %d could not open the bootstrap root of color %d: %s", comm->rank,
                  color, idFailure.c_str());
    }
    return Fail(ccSystemError, "ccCommSplit: rank %zu could not open the bootstrap root of color %lld (its "
                "ccGetLastError says why); no communicator was made (rank %d)", r,
                static_cast<long long>(all[r].color), comm->rank);
  }
  if (color == CC_SPLIT_NOCOLOR) return ccSuccess;

  join->member = true;
  std::memcpy(join->id.internal, &words[static_cast<size_t>(members[0]) * kIdWords + 1], CC_UNIQUE_ID_BYTES);
  join->nranks = static_cast<int>(members.size());
  join->rank = static_cast<int>(std::find(members.begin(), members.end(), comm->rank) - members.begin());
  join->config = merged;
  return ccSuccess;
}

}  // namespace

extern "C" {

CC_API ccResult_t ccCommSplit(ccComm_t comm, int color, int key, ccComm_t* newcomm, ccConfig_t* config) {
  return ccoll::Guarded("ccCommSplit", [&]() -> ccResult_t {
    if (newcomm != nullptr) *newcomm = nullptr;
    if (ccoll::InGroup()) {
      // Its exchanges on comm must run now, while a group only records calls for ccGroupEnd.
      const ccResult_t r = Fail(ccInvalidUsage, "ccCommSplit: called between ccGroupStart and ccGroupEnd; a split "
                                "runs its exchanges on comm at once, so call it outside the group");
      ccoll::GroupFail(r);
      return r;
    }
    Joining join;
    {
      ccoll::CommUse use(comm);
      if (comm == nullptr) return Fail(ccInvalidArgument, "ccCommSplit: comm is NULL");
      if (!use.ok()) {
        return Fail(ccInvalidArgument, "ccCommSplit: comm %p is not a live communicator (destroyed, aborted or never "
                    "initialized)", static_cast<void*>(comm));
      }
      CC_CHECK(Agree(comm, color, key, newcomm, config, &join));
    }
    if (!join.member) return ccSuccess;
    return ccCommInitRankConfig(newcomm, join.nranks, join.id, join.rank, &join.config);
  });
}

}  // extern "C"
