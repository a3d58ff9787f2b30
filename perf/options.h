// Command-line options of the perf binaries: nccl-tests' flags where they apply, plus ccoll's algorithm and codec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "datatype.h"

namespace ccperf {

struct Options {
  size_t minBytes = 8;
  size_t maxBytes = 64u << 20;
  size_t stepFactor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  DType dtype = DType::kFloat32;
  Op op = Op::kSum;
  std::string algo;           // "ring", "tree", "auto"; empty: not set (the library's environment/default applies)
  std::string codec = "none";
  int threads = 4;            // ranks as threads of this process
  bool threadsGiven = false;  // -t was on the command line (allreduce_perf: thread ranks even under a launcher)
  bool inplace = false;
  bool device = false;        // -G: buffers in GPU memory (allreduce_perf built with CUDA)
  uint64_t seed = 0x5eedu;
  std::string dist = "iid";   // -D: input distribution of float data (iid, corr, heavy)
  std::string jsonPath;       // empty: no JSON
  double maxVnmse = -1;       // -E: a codec row whose vNMSE is above it fails; negative: not judged
  unsigned splitMask = 0;     // -M: ranks split by color = rank & mask (ccCommSplit); 0: no split
  int root = 0;               // -r: the root of a rooted collective (reduce_perf)
};

// Which of the optional flags a program takes; the common ones (-b -e -f -n -w -c -d -o -I -S -J -E -h) always apply.
enum OptionFlags : unsigned {
  kFlagAlgo = 1u << 0,     // -a
  kFlagCodec = 1u << 1,    // -z
  kFlagThreads = 1u << 2,  // -t
  kFlagDevice = 1u << 3,   // -G
  kFlagSplit = 1u << 4,    // -M
  kFlagRoot = 1u << 5,     // -r
};

struct ProgramInfo {
  const char* name;     // for usage and the header
  unsigned flags;       // OptionFlags
  const char* notes;    // extra lines for -h, may be NULL
};

// What the caller does after parsing.
enum class ParseResult { kRun, kExitOk, kExitUsage };

// Parses argv into *opts. Messages (usage, errors) go to stderr/stdout only when `speak` (rank 0 of a launch).
ParseResult ParseOptions(int argc, char** argv, const ProgramInfo& prog, bool speak, Options* opts);

// "8", "64K", "256M", "1G" (K = 1024). False on anything else.
bool ParseBytes(const char* text, size_t* out);
// 1048576 -> "1M", 1536 -> "1536": the largest exact suffix.
std::string FormatBytes(size_t bytes);

}  // namespace ccperf
