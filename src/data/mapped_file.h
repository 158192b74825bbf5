#pragma once
// A memory mapping of a whole file (local, no communication), read-only by default. The bytes
// stay mapped for the object's lifetime; reads from several threads are safe. Move-only.
// CopyOnWrite maps it private and writable: writes through a const_cast of data() land in this
// process's own pages and never reach the file (src/hf hands such pages out as tensors).
// Errors: a missing, unreadable or non-regular file is a tessera::Error naming the path and the
// system's reason. An empty file maps to size() 0 and data() nullptr (nothing to read).
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::data {

enum class MapMode { ReadOnly, CopyOnWrite };

class MappedFile {
 public:
  explicit MappedFile(const std::string& path, MapMode mode = MapMode::ReadOnly);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tessera::data
