#pragma once
// How the multi-process harness (multiprocess.h) starts its workers.
//
// A worker is this test binary run as one rank. Starting it by fork + exec costs about a second of
// CPU per process (LibTorch's static initialisation), which on our 2-core CI machine was most of
// a multi-process test's time. So main() first forks a zygote: a single-threaded copy of the
// binary with LibTorch initialised and nothing else (no gtest state, no threads, no CUDA). Each
// worker is then a fork of the zygote with the environment runWorkers computed, which runs the
// named worker function exactly as an exec'd worker would (runWorkerFromEnv) and exits.
//
// Contract:
// - startWorkerZygote(): call first thing in main() of a test binary (not in a worker). Local.
//   Skipped (exec is used) when TESSERA_TEST_EXEC=1 or when the process already has more than one
//   thread (forking a multi-threaded process is not safe).
// - spawnWorker(env, logPath): starts one worker with exactly `env` as its environment and its
//   stdout and stderr in logPath (created). Returns its pid. Throws on failure. Thread-safe.
// - reapWorker(pid, block, status): true and *status (waitpid's encoding) once `pid` has exited;
//   with block = false it returns false at once if it has not. Every spawned pid must be reaped.
// - A worker is killed with SIGKILL when its starter (the zygote or the test) dies.
#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::testing {

void startWorkerZygote();
pid_t spawnWorker(const std::vector<std::string>& env, const std::string& logPath);
bool reapWorker(pid_t pid, bool block, int* status);

}  // namespace tessera::testing
