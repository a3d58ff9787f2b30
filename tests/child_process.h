// Hidden cases of a test binary run in a child process: for what must start in a fresh process (the first call of a
// process) or may end it (a fake's abort). The hidden case is a Catch2 case tagged [.]; the visible case runs it here
// and reads how it ended.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace cctest {

// Runs the hidden case `name` of this binary in a child process, `env` (words such as VAR=value, or a command such as
// `timeout 60`) before it on its shell command line; returns what it printed (stdout and stderr). *died: it did not
// exit with status 0 (a failed check, a signal such as the fake's SIGABRT, a sanitizer's exit code, a timeout), or
// could not be started.
inline std::string RunHiddenCase(const std::string& name, const std::string& env, bool* died) {
  *died = true;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "readlink /proc/self/exe failed";
  exe[n] = 0;
  // --warn NoTests: a name that matches no case (a renamed one, or a comma, which Catch2 takes for a separator) exits
  // with an error instead of passing.
  const std::string cmd = env + " '" + exe + "' '" + name + "' --warn NoTests 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return "popen failed: " + cmd;
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, got);
  *died = pclose(f) != 0;
  return out;
}

}  // namespace cctest
