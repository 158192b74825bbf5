#pragma once
// What this host can tell of a peer's process from its pid, for the board's failure reports
// (board.h): gone (no such process), stopped (SIGSTOP), exited or killed (a zombie's exit status
// from /proc/<pid>/stat), or alive but silent. Local (no communication), Linux; never throws.
#include <string>

namespace tessera::board {

struct ProcessState {
  std::string text;      // "its process is gone (killed?)", ...
  bool certain = false;  // gone, exited or stopped: not merely slow, or blocked behind another rank
};

// Process `pid` of this host, looked at once.
ProcessState processStateNow(long pid);

// Process `pid` on `host`: of another host nothing is known ("dead or stalled (host h is not this
// one)"); of this one, looked at again every 10 ms for up to 300 ms while it is not certain (a
// killed process closes its sockets before the kernel has made it a zombie).
ProcessState processState(const std::string& host, long pid);

}  // namespace tessera::board
