#include "hf/json_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tessera/common/error.h"

namespace tessera::hf {

// parseJson is defined in safetensors_format.cpp: the fuzz target then builds from that one
// source (nlohmann's parser costs tens of seconds per translation unit under ASan).

nlohmann::json readJsonFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good() && !std::filesystem::is_directory(path), "tessera hf: cannot read '{}': {}", path,
                std::filesystem::exists(path) ? "not a readable file" : "no such file");
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  return parseJson(text.data(), text.size(), "'" + path + "'");
}

void writeJsonFile(const std::string& path, const nlohmann::json& j) {
  std::string text;
  try {
    text = j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    TESSERA_CHECK(false, "tessera hf: cannot write '{}': {}", path, e.what());
  }
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TESSERA_CHECK(fd_ >= 0, "tessera hf: cannot create '{}': {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  TESSERA_CHECK(fd_ >= 0, "tessera hf: '{}' was already committed", path_);
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t k = ::write(fd_, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    TESSERA_CHECK(k > 0, "tessera hf: writing '{}' failed after {} bytes: {}", tmp_, written_ + done,
                  k < 0 ? std::strerror(errno) : "no progress");
    done += static_cast<size_t>(k);
  }
  written_ += n;
}

void AtomicFile::commit() {
  TESSERA_CHECK(fd_ >= 0, "tessera hf: '{}' was already committed", path_);
  TESSERA_CHECK(::fsync(fd_) == 0, "tessera hf: fsync of '{}' failed: {}", tmp_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    TESSERA_CHECK(false, "tessera hf: cannot replace '{}' by '{}': {}", path_, tmp_, std::strerror(err));
  }
  const auto dir = std::filesystem::path(path_).parent_path();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tessera::hf
