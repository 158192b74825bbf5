#pragma once
// JSON and file helpers of src/hf (internal; local, no communication): strict JSON parsing, JSON
// files read and written, and files replaced atomically.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace tessera::hf {

// Parses [text, text + n). Not valid JSON, or a key given twice in one object (nlohmann would
// keep the last) -> tessera::Error starting with `what` ("'x.json'", "'m.safetensors': the
// header"); a duplicate key of the outermost object is called a `topKey` ("tensor", "field").
nlohmann::json parseJson(const char* text, size_t n, const std::string& what, const char* topKey = "key");

// Reads and parses a whole JSON file. Errors: missing or unreadable file, invalid JSON.
nlohmann::json readJsonFile(const std::string& path);
// Writes `j` with 2-space indents and a final newline, atomically (AtomicFile).
void writeJsonFile(const std::string& path, const nlohmann::json& j);

// A file written to "<path>.tmp" and renamed onto `path` by commit() after an fsync (then the
// directory is fsynced): readers see the old file or the whole new one. Destroyed without
// commit() (an error, an exception), it removes the temporary file. One writer per path.
// Errors: create, write, fsync or rename failures, naming the path and the system's reason.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void commit();
  uint64_t written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace tessera::hf
