// libFuzzer target: the bootstrap root reading hellos and rounds from connections anyone can open (its port is
// reachable by every process that can reach the machine). Each input describes up to 6 connections; their bytes are
// written into socketpairs whose other ends go to the root (BootstrapServeConnections, the code the listener thread
// runs), then the write side is shut so the root sees the end of each stream. The root must drop what is malformed
// without reading or writing outside its buffers, and return.
//
// Input: records of [flags u8][length u16 little-endian][length bytes]. flags bit 0: the fuzzer first writes a valid
// magic, version and the unique id's secret (the fuzzer cannot guess 16 random bytes; the root must also be robust
// past the secret check, against a buggy or hostile rank that knows it).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/bootstrap.h"
#include "fuzz_input.h"

namespace {

const uint8_t kSecret[ccoll::kSecretBytes] = {0x73, 0x65, 0x63, 0x72, 0x65, 0x74, 0x21, 0x00,
                                              0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04};

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CC_DEBUG", "NONE", 0);  // every dropped connection is a WARN
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ccoll_fuzz::Input in(data, size);
  std::vector<int> rootEnds, ourEnds;
  for (int c = 0; c < 6 && in.left() > 0; ++c) {
    const uint8_t flags = in.U8();
    std::vector<uint8_t> bytes(in.U16());
    bytes.resize(in.Bytes(bytes.data(), bytes.size()));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
    if (flags & 1) {
      uint8_t pre[8 + ccoll::kSecretBytes];
      const uint32_t magic = ccoll::kBootstrapMagic, version = ccoll::kBootstrapVersion;
      std::memcpy(pre, &magic, 4);
      std::memcpy(pre + 4, &version, 4);
      std::memcpy(pre + 8, kSecret, sizeof(kSecret));
      WriteAll(sv[0], pre, sizeof(pre));
    }
    WriteAll(sv[0], bytes.data(), bytes.size());  // at most 64 KiB: fits the socket buffer
    shutdown(sv[0], SHUT_WR);
    ourEnds.push_back(sv[0]);
    rootEnds.push_back(sv[1]);
  }
  // A short timeout: the replies of many rounds may fill a socket buffer nobody reads; the root then gives up.
  ccoll::BootstrapServeConnections(rootEnds, kSecret, 100);
  for (int fd : ourEnds) close(fd);
  return 0;
}
