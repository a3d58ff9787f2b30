#include "report.h"

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ccperf {
namespace {

std::string ErrorText(const Row& r) {
  if (!r.checked || !r.errorMeasured) return "N/A";
  if (r.error == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2e", r.error);
  return buf;
}

// JSON has no inf or NaN: they become null.
std::string JsonNumber(double v, const char* fmt = "%.6g") {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A 64-bit hash as 16 hex digits: a JSON number cannot hold every 64-bit value exactly.
std::string HashHex(uint64_t h) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

void Report::Line(const char* fmt, ...) {
  std::fputs("# ", out_);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(out_, fmt, ap);
  va_end(ap);
  std::fputc('\n', out_);
  std::fflush(out_);
}

void Report::CommandAndArgs(int argc, char** argv, const Options& o, const std::string& algo) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    if (i) cmd += ' ';
    cmd += argv[i];
  }
  Line("command: %s", cmd.c_str());
  Line("args: minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d iters: %d validation: %d datatype: %s "
       "op: %s algo: %s codec: %s inplace: %d seed: %llu",
       o.minBytes, o.maxBytes, o.stepFactor, o.warmup, o.iters, o.check ? 1 : 0, Info(o.dtype).name, OpName(o.op),
       algo.c_str(), o.codec.c_str(), o.inplace ? 1 : 0, static_cast<unsigned long long>(o.seed));
}

void Report::ColumnHeader() {
  std::fprintf(out_, "#\n");
  std::fprintf(out_,
               "#       size         count      type   redop    algo   codec     time   algbw   busbw  wirebits     "
               "error  #wrong\n");
  std::fprintf(out_,
               "#        (B)    (elements)                                       (us)  (GB/s)  (GB/s)   (b/elt)     "
               "vNMSE        \n");
  std::fflush(out_);
}

void Report::AddRow(const Row& r) {
  rows_.push_back(r);
  std::string wrong = r.checked ? std::to_string(r.wrong) : "N/A";
  std::fprintf(out_, "%12zu  %12zu  %8s  %6s  %6s  %6s  %7.2f  %6.2f  %6.2f  %8.2f  %8s  %6s\n", r.bytes, r.count,
               r.type.c_str(), r.redop.c_str(), r.algo.c_str(), r.codec.c_str(), r.timeUs, r.algbw, r.busbw,
               r.wirebits, ErrorText(r).c_str(), wrong.c_str());
  if (r.checked && !r.identical) {
    std::fprintf(out_, "# ERROR: size %zu: the ranks' outputs are not bitwise identical\n", r.bytes);
  }
  if (r.checked && !r.sendIntact) {
    std::fprintf(out_, "# ERROR: size %zu: an out-of-place call modified sendbuff\n", r.bytes);
  }
  std::fflush(out_);
}

bool Report::Footer() {
  uint64_t wrong = 0;
  uint64_t tooLossy = 0;
  bool identical = true, intact = true, anyChecked = false, anyLossy = false;
  double busbw = 0, bound = -1;
  for (const Row& r : rows_) {
    busbw += r.busbw;
    if (!r.checked) continue;
    anyChecked = true;
    wrong += r.wrong;
    identical = identical && r.identical;
    intact = intact && r.sendIntact;
    if (r.lossy) {
      anyLossy = true;
      bound = r.vnmseBound;
      if (bound >= 0 && !(r.error <= bound)) ++tooLossy;  // a NaN error is above any bound
    }
  }
  const bool exactOk = wrong == 0 && identical && intact;
  const bool ok = exactOk && tooLossy == 0;
  if (anyChecked) {
    std::fprintf(out_, "# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
                 exactOk ? "OK" : "FAILED");
    if (anyLossy && bound >= 0) {
      std::fprintf(out_, "# vNMSE above -E %-6g: %llu rows %s\n", bound, static_cast<unsigned long long>(tooLossy),
                   tooLossy == 0 ? "OK" : "FAILED");
    } else if (anyLossy) {
      std::fprintf(out_, "# Codec accuracy       : not judged (the error column; -E <max vNMSE> fails rows above "
                   "it). Checked: finite values, the same bytes on every rank\n");
    }
    if (!identical) std::fprintf(out_, "# Ranks bitwise identical: NO (FAILED)\n");
    if (!intact) std::fprintf(out_, "# Send buffers intact    : NO (FAILED)\n");
  } else if (rows_.empty()) {
    std::fprintf(out_, "# Out of bounds values : N/A (no size ran)\n");
  } else {
    std::fprintf(out_, "# Out of bounds values : N/A (check disabled with -c 0)\n");
  }
  std::fprintf(out_, "# Avg bus bandwidth    : %g\n", rows_.empty() ? 0.0 : busbw / rows_.size());
  std::fflush(out_);
  return ok;
}

bool Report::WriteJson(const std::string& path, std::string* error) const {
  std::ostringstream js;
  js << "[\n";
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    js << "  {\"size\": " << r.bytes << ", \"count\": " << r.count << ", \"type\": " << JsonString(r.type)
       << ", \"redop\": " << JsonString(r.redop) << ", \"algo\": " << JsonString(r.algo)
       << ", \"codec\": " << JsonString(r.codec) << ", \"nranks\": " << r.nranks
       << ", \"inplace\": " << (r.inplace ? "true" : "false") << ", \"time_us\": " << JsonNumber(r.timeUs)
       << ", \"algbw_GBps\": " << JsonNumber(r.algbw) << ", \"busbw_GBps\": " << JsonNumber(r.busbw)
       << ", \"wirebits\": " << JsonNumber(r.wirebits)
       << ", \"wirebits_measured\": " << (r.wirebitsMeasured ? "true" : "false");
    if (r.checked) {
      js << ", \"error\": " << (r.errorMeasured ? JsonNumber(r.error) : std::string("null"))
         << ", \"wrong\": " << r.wrong
         << ", \"identical\": " << (r.identical ? "true" : "false")
         << ", \"send_intact\": " << (r.sendIntact ? "true" : "false")
         << ", \"result_hash\": \"" << HashHex(r.resultHash) << "\"";
    } else {
      js << ", \"error\": null, \"wrong\": null, \"identical\": null, \"send_intact\": null, \"result_hash\": null";
    }
    js << "}" << (i + 1 < rows_.size() ? "," : "") << "\n";
  }
  js << "]\n";
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  if (!f) {
    *error = "cannot open " + path + " for writing: " + std::strerror(errno);
    return false;
  }
  f << js.str();
  f.close();
  if (!f) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

uint64_t PeakRssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, 6, "VmHWM:") == 0) {
      std::istringstream in(line.substr(6));
      uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace ccperf
