#pragma once
// A run's checkpoints under one root directory: each save is a checkpoint (checkpoint.h) of its own
// in <root>/step-<N>; <root>/latest names the newest one (written last, atomically); the oldest
// beyond the newest keepLast are removed. find() picks what to resume from: the newest *complete*
// checkpoint under the root (or the root itself, a single-directory checkpoint of older tessera),
// and refuses a root that holds checkpoint files but no complete checkpoint — never "no checkpoint".
// Local and rank-0 work: find() reads only; commitStep() runs on one rank (the one that published).
// Errors: tessera::Error naming the directory and what is missing or damaged.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace tessera::checkpoint {

// <root>/step-<step>: where the checkpoint of `step` goes.
std::string stepDir(const std::string& root, int64_t step);

struct Found {
  std::string dir;  // the complete checkpoint to read
  int64_t step = 0;
  // Non-empty when a newer checkpoint was passed over or a fallback taken (an incomplete or damaged
  // step directory, <dir>.old after an interrupted save): what happened, for a warning.
  std::string note;
};

// The checkpoint to resume from `dir`: a series root (the newest complete step-<N>), a single
// checkpoint at `dir`, or <dir>.old after a save interrupted between its renames. nullopt when `dir`
// is missing or holds no checkpoint file at all (a fresh run). Error when it holds checkpoint files
// but nothing complete: the message lists each candidate and what it lacks.
std::optional<Found> find(const std::string& dir);

// Why the checkpoint exactly at `dir` (no fallback) cannot be read: "" when it is complete
// (metadata.pt checked against metadata.sum, every shard file present at its recorded size).
std::string whyIncomplete(const std::string& dir);

// After the checkpoint of `step` is published at stepDir(root, step): writes `rootFiles` (name ->
// text, e.g. the run's config.toml) into <root>, then <root>/latest naming the step (each file
// written whole and renamed into place), then removes the complete step directories older than the newest `keepLast` (<= 0: keeps
// all) and leftover *.tmp / *.old directories of finished or failed saves. Local (one rank).
void commitStep(const std::string& root, int64_t step, int keepLast,
                const std::map<std::string, std::string>& rootFiles = {});

}  // namespace tessera::checkpoint
