// What the perf binaries print: nccl-tests-style '#' header lines, one row per size, the footer, and the same rows as
// JSON. Only rank 0 of a run owns a Report.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "options.h"

namespace ccperf {

struct Row {
  size_t bytes = 0;
  size_t count = 0;
  std::string type, redop, algo, codec;
  int nranks = 1;
  bool inplace = false;
  double timeUs = 0;
  double algbw = 0;  // GB/s (1e9) of logical, uncompressed bytes
  double busbw = 0;
  double wirebits = 0;  // bits each rank sent per element
  bool wirebitsMeasured = true;  // false: nominal (the implementation cannot count its bytes)
  bool checked = false;  // the fields below are meaningful
  double error = 0;      // vNMSE against the fp64 reference
  bool errorMeasured = true;  // false: no reference to measure against (sendrecv, all-to-all: #wrong only)
  uint64_t wrong = 0;    // elements outside tolerance, plus elements written past the end
  bool identical = true;     // every rank's output had the same bits
  bool sendIntact = true;    // out of place: sendbuff was not modified
  uint64_t resultHash = 0;   // HashBytes of rank 0's output of the check (fresh state, fresh inputs): the same bits
                             // give the same hash, so two builds of the library can be compared (compare_builds.sh)
  bool lossy = false;        // a codec's row: error is judged only against vnmseBound
  double vnmseBound = -1;    // -E; negative: not judged
};

class Report {
 public:
  explicit Report(FILE* out) : out_(out) {}
  // "# <text>"
  void Line(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  // "# command: argv...", and "# args: ..." with every option.
  void CommandAndArgs(int argc, char** argv, const Options& opts, const std::string& algo);
  void ColumnHeader();
  void AddRow(const Row& row);  // printed at once: long runs show progress
  // "# Out of bounds values", "# Avg bus bandwidth", a line on codecs' accuracy and a line per failure kind; false
  // when a check failed.
  bool Footer();
  // The rows as a JSON array of objects; false (with *error) when the file cannot be written.
  bool WriteJson(const std::string& path, std::string* error) const;

 private:
  FILE* out_;
  std::vector<Row> rows_;
};

// This process's peak resident set (VmHWM from /proc/self/status) in bytes, or 0 when it cannot be read.
uint64_t PeakRssBytes();

}  // namespace ccperf
