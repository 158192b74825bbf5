#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "tessera/common/error.h"

namespace tessera::data {

MappedFile::MappedFile(const std::string& path, MapMode mode) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, "tessera data: cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    TESSERA_CHECK(false, "tessera data: '{}' is not a regular file{}", path,
                  err ? std::string(": ") + std::strerror(err) : "");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    // Copy-on-write reserves no swap for the pages it may copy (MAP_NORESERVE): a multi-GB file
    // maps even where the kernel's overcommit heuristic would refuse an equal allocation.
    const bool cow = mode == MapMode::CopyOnWrite;
    void* p = ::mmap(nullptr, size_, cow ? PROT_READ | PROT_WRITE : PROT_READ,
                     cow ? MAP_PRIVATE | MAP_NORESERVE : MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    TESSERA_CHECK(p != MAP_FAILED, "tessera data: cannot map '{}' ({} bytes): {}", path, size_, std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace tessera::data
