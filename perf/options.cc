#include "options.h"

#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace ccperf {
namespace {

bool ParseInt(const char* text, long lo, long hi, long* out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

void PrintUsage(const ProgramInfo& prog, FILE* f) {
  std::fprintf(f, "Usage: %s [options]\n", prog.name);
  std::fprintf(f,
               "  -b, --minbytes <size>      smallest message in bytes, K/M/G suffixes (1024-based); default 8\n"
               "  -e, --maxbytes <size>      largest message in bytes; default 64M\n"
               "  -f, --stepfactor <n>       multiply the size by n each step (>= 2, or 1 when -b == -e); default 2\n"
               "  -n, --iters <n>            timed iterations per size; default 20\n"
               "  -w, --warmup_iters <n>     untimed iterations before each size's timed ones; default 5\n"
               "  -c, --check <0|1>          check every result against an fp64 reference (after timing); "
               "default 1\n"
               "  -d, --datatype <type>      float, half, bfloat16, double, int8, uint8, int32, uint32, int64,\n"
               "                             uint64; default float\n"
               "  -o, --op <op>              sum, prod, max, min, avg; default sum\n");
  if (prog.flags & kFlagAlgo) {
    std::fprintf(f, "  -a, --algo <algo>          ring, tree or auto (ccConfig_t.algorithm); default: not set, "
                    "so CC_ALGO or the library's default applies\n");
  }
  if (prog.flags & kFlagCodec) {
    std::fprintf(f, "  -z, --codec <spec>         compressor spec for ccCompressorCreateFromString, or none; "
                    "default none\n");
  }
  if (prog.flags & kFlagThreads) {
    std::fprintf(f, "  -t, --nthreads <n>         ranks, each a thread of this process; default 4 (not 1 as in "
                    "nccl-tests: a 1-rank all-reduce is a copy)\n");
  }
  if (prog.flags & kFlagDevice) {
    std::fprintf(f, "  -G, --device <0|1>         1: buffers in GPU memory (device 0), each rank on its own stream;\n"
                    "                             the inputs are copied in and the outputs out around the timed "
                    "calls; default 0\n");
  }
  if (prog.flags & kFlagRoot) {
    std::fprintf(f, "  -r, --root <r>             the root rank (of the communicator under test); default 0\n");
  }
  if (prog.flags & kFlagSplit) {
    std::fprintf(f,
                 "  -M, --split_mask <m>       split the ranks with ccCommSplit by color = rank & m (as nccl-tests'\n"
                 "                             NCCL_TESTS_SPLIT_MASK; 0x1 makes two halves; m < 0x10000): every\n"
                 "                             communicator runs the benchmark at once, the rows are rank 0's;\n"
                 "                             default 0\n");
  }
  std::fprintf(f,
               "  -I, --inplace <0|1>        1: sendbuff == recvbuff (timed iterations reduce the previous result,\n"
               "                             as in nccl-tests; the check starts from fresh inputs); default 0\n"
               "  -S, --seed <n>             seed of the deterministic inputs; default %llu\n"
               "  -D, --dist <d>             float inputs: iid (independent N(0,1) per rank), corr (g + 0.5 noise_r,\n"
               "                             shared g), heavy (corr, every 4096-element block scaled by exp(N(0,1.5^2)),\n"
               "                             0.01%% outliers x100); default iid\n"
               "  -J, --json <file>          also write the rows as a JSON array of objects\n"
               "  -E, --max_vnmse <x>        a lossy row (codec) whose vNMSE is above x fails, as an exact row with\n"
               "                             wrong elements does; default: not judged (only non-finite values and\n"
               "                             ranks that differ fail a codec row)\n"
               "  -h, --help                 this text\n",
               static_cast<unsigned long long>(Options().seed));
  if (prog.notes) std::fprintf(f, "%s", prog.notes);
}

}  // namespace

bool ParseBytes(const char* text, size_t* out) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0) return false;
  unsigned long long mult = 1;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': mult = 1ull << 10; ++end; break;
    case 'm': case 'M': mult = 1ull << 20; ++end; break;
    case 'g': case 'G': mult = 1ull << 30; ++end; break;
    default: return false;
  }
  if (*end == 'B' || *end == 'b') ++end;  // "64MB"
  if (*end != '\0') return false;
  if (v > (~0ull >> 2) / mult) return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

std::string FormatBytes(size_t bytes) {
  const char* suffix[] = {"", "K", "M", "G"};
  int i = 0;
  while (i < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++i;
  }
  return std::to_string(bytes) + suffix[i];
}

ParseResult ParseOptions(int argc, char** argv, const ProgramInfo& prog, bool speak, Options* opts) {
  static const struct option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},  {"maxbytes", required_argument, nullptr, 'e'},
      {"stepfactor", required_argument, nullptr, 'f'}, {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'}, {"check", required_argument, nullptr, 'c'},
      {"datatype", required_argument, nullptr, 'd'},   {"op", required_argument, nullptr, 'o'},
      {"algo", required_argument, nullptr, 'a'},       {"codec", required_argument, nullptr, 'z'},
      {"nthreads", required_argument, nullptr, 't'},   {"inplace", required_argument, nullptr, 'I'},
      {"seed", required_argument, nullptr, 'S'},       {"json", required_argument, nullptr, 'J'},
      {"dist", required_argument, nullptr, 'D'},       {"device", required_argument, nullptr, 'G'},
      {"max_vnmse", required_argument, nullptr, 'E'},  {"split_mask", required_argument, nullptr, 'M'},
      {"root", required_argument, nullptr, 'r'},      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  auto fail = [&](const char* what, const char* value) {
    if (speak) {
      std::fprintf(stderr, "%s: invalid value \"%s\" for %s\n", prog.name, value ? value : "", what);
      std::fprintf(stderr, "Run %s -h for the options.\n", prog.name);
    }
    return ParseResult::kExitUsage;
  };
  optind = 1;
  opterr = speak ? 1 : 0;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, "b:e:f:n:w:c:d:o:a:z:t:I:S:J:D:G:E:M:r:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'b':
        if (!ParseBytes(optarg, &opts->minBytes)) return fail("-b (minbytes)", optarg);
        break;
      case 'e':
        if (!ParseBytes(optarg, &opts->maxBytes)) return fail("-e (maxbytes)", optarg);
        break;
      case 'f':
        if (!ParseInt(optarg, 1, 1 << 20, &v)) return fail("-f (stepfactor)", optarg);
        opts->stepFactor = static_cast<size_t>(v);
        break;
      case 'n':
        if (!ParseInt(optarg, 1, 1 << 30, &v)) return fail("-n (iters)", optarg);
        opts->iters = static_cast<int>(v);
        break;
      case 'w':
        if (!ParseInt(optarg, 0, 1 << 30, &v)) return fail("-w (warmup_iters)", optarg);
        opts->warmup = static_cast<int>(v);
        break;
      case 'c':
        if (!ParseInt(optarg, 0, 1, &v)) return fail("-c (check)", optarg);
        opts->check = v != 0;
        break;
      case 'd':
        if (!ParseDType(optarg, &opts->dtype)) return fail("-d (datatype)", optarg);
        break;
      case 'o':
        if (!ParseOp(optarg, &opts->op)) return fail("-o (op)", optarg);
        break;
      case 'a':
        if (!(prog.flags & kFlagAlgo)) return fail("-a (not taken by this program)", optarg);
        opts->algo = optarg;
        if (opts->algo != "ring" && opts->algo != "tree" && opts->algo != "auto") return fail("-a (algo)", optarg);
        break;
      case 'z':
        if (!(prog.flags & kFlagCodec)) return fail("-z (not taken by this program)", optarg);
        opts->codec = optarg;
        if (opts->codec.empty()) return fail("-z (codec)", optarg);
        break;
      case 't':
        if (!(prog.flags & kFlagThreads)) return fail("-t (not taken by this program)", optarg);
        if (!ParseInt(optarg, 1, 4096, &v)) return fail("-t (nthreads)", optarg);
        opts->threads = static_cast<int>(v);
        opts->threadsGiven = true;
        break;
      case 'G':
        if (!(prog.flags & kFlagDevice)) return fail("-G (not taken by this program)", optarg);
        if (!ParseInt(optarg, 0, 1, &v)) return fail("-G (device)", optarg);
        opts->device = v != 0;
        break;
      case 'I':
        if (!ParseInt(optarg, 0, 1, &v)) return fail("-I (inplace)", optarg);
        opts->inplace = v != 0;
        break;
      case 'S': {
        errno = 0;
        char* end = nullptr;
        unsigned long long s = std::strtoull(optarg, &end, 0);
        if (errno != 0 || *end != '\0' || *optarg == '\0') return fail("-S (seed)", optarg);
        opts->seed = s;
        break;
      }
      case 'J':
        opts->jsonPath = optarg;
        break;
      case 'D':
        opts->dist = optarg;
        if (opts->dist != "iid" && opts->dist != "corr" && opts->dist != "heavy") return fail("-D (dist)", optarg);
        break;
      case 'E': {
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(optarg, &end);
        if (errno != 0 || *end != '\0' || *optarg == '\0' || !(x >= 0)) return fail("-E (max_vnmse)", optarg);
        opts->maxVnmse = x;
        break;
      }
      case 'M': {
        if (!(prog.flags & kFlagSplit)) return fail("-M (not taken by this program)", optarg);
        errno = 0;
        char* end = nullptr;
        const unsigned long long m = std::strtoull(optarg, &end, 0);
        if (errno != 0 || *end != '\0' || *optarg == '\0' || *optarg == '-' || m > 0xffffu) {
          return fail("-M (split_mask)", optarg);
        }
        opts->splitMask = static_cast<unsigned>(m);
        break;
      }
      case 'r':
        if (!(prog.flags & kFlagRoot)) return fail("-r (not taken by this program)", optarg);
        if (!ParseInt(optarg, 0, 4095, &v)) return fail("-r (root)", optarg);
        opts->root = static_cast<int>(v);
        break;
      case 'h':
        if (speak) PrintUsage(prog, stdout);
        return ParseResult::kExitOk;
      default:
        if (speak) std::fprintf(stderr, "Run %s -h for the options.\n", prog.name);
        return ParseResult::kExitUsage;
    }
  }
  if (optind < argc) return fail("a positional argument (none are taken)", argv[optind]);
  if (opts->minBytes > opts->maxBytes) {
    if (speak) std::fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog.name, opts->minBytes, opts->maxBytes);
    return ParseResult::kExitUsage;
  }
  if (opts->stepFactor < 2 && opts->minBytes != opts->maxBytes) {
    if (speak) std::fprintf(stderr, "%s: -f must be at least 2 unless -b equals -e\n", prog.name);
    return ParseResult::kExitUsage;
  }
  return ParseResult::kRun;
}

}  // namespace ccperf
