#pragma once
// Internal to src/checkpoint: durable file writes, whole-file reads, checksums, unpickling with
// errors that name the file, and removing a directory tree. Local; errors are tessera::Error
// naming the path.
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::checkpoint::files {

namespace fs = std::filesystem;

// rm -r (nothing when the path is missing).
void removeTree(const fs::path& p);
uint64_t fnv1a(const std::vector<char>& bytes);
// Writes `bytes` to `p` (created or truncated) and fsyncs it.
void writeDurably(const fs::path& p, const std::vector<char>& bytes);
// fsyncs a directory (its entries: renames, new files). Best effort.
void syncDir(const fs::path& d);
std::vector<char> readAll(const fs::path& p);
// torch::jit::pickle_load of `bytes`; a failure names `p` as corrupted or truncated.
c10::IValue unpickle(const fs::path& p, const std::vector<char>& bytes);
// An unpickled list of ints (a shape, an offset) as a vector, whichever list type it came back as.
std::vector<int64_t> ints(const c10::IValue& v);

// Shard file `p` (rank-<r>.pt) checked against its metadata entry (size, FNV-1a of its bytes, read
// in 16 MiB blocks) and unpickled over a memory mapping of it: the dict {key: tensor} whose
// tensors are views of the mapped pages (copy-on-write; each holds the mapping alive), so
// nothing of the file is copied into memory until a tensor is. Errors name `p`: missing,
// truncated, corrupted (checksum, unpickling).
c10::IValue mapShard(const fs::path& p, int64_t bytes, int64_t fnv);

// metadata.sum: "fnv1a64 <16 hex digits> bytes <n>\n", the checksum of metadata.pt written beside it.
std::string sumLine(const std::vector<char>& metadataBytes);
// Checks `metadataBytes` (read from `metadataPath`) against the sum file's text; an error names
// the metadata file as corrupted, or the sum file as malformed.
void checkSum(const fs::path& metadataPath, const std::vector<char>& metadataBytes, const fs::path& sumPath,
              const std::string& sumText);

}  // namespace tessera::checkpoint::files
