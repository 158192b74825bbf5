#include "checkpoint/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <ftw.h>
#include <sys/stat.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "tessera/common/error.h"
#include "data/mapped_file.h"

namespace tessera::checkpoint::files {

// rm -r with POSIX nftw instead of std::filesystem::remove_all: on the GPU image (CUDA LibTorch
// 2.11) remove_all of a non-empty directory crashed the process (SIGSEGV, 2026-11-22: every save
// that replaced an existing checkpoint), presumably a second std::filesystem implementation
// interposed by a loaded library. A missing path is fine; other failures are tessera::Error.
void removeTree(const fs::path& p) {
  struct stat st{};
  if (::lstat(p.c_str(), &st) != 0) return;  // nothing there
  auto rm = [](const char* path, const struct stat*, int, FTW*) { return ::remove(path); };
  TESSERA_CHECK(::nftw(p.c_str(), rm, 16, FTW_DEPTH | FTW_PHYS) == 0, "checkpoint: cannot remove {}: {}", p.string(),
                std::strerror(errno));
}

uint64_t fnv1a(const std::vector<char>& b) {
  uint64_t h = 1469598103934665603ull;
  for (char c : b) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

void writeDurably(const fs::path& p, const std::vector<char>& bytes) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TESSERA_CHECK(fd >= 0, "checkpoint: cannot create {}: {}", p.string(), std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      throw Error(fmt::format("checkpoint: writing {} failed after {} of {} bytes: {}", p.string(), done,
                              bytes.size(), std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  TESSERA_CHECK(ok, "checkpoint: fsync of {} failed: {}", p.string(), std::strerror(errno));
}

void syncDir(const fs::path& d) {
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::vector<char> readAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  TESSERA_CHECK(f.good(), "checkpoint: cannot open {}", p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

c10::IValue unpickle(const fs::path& p, const std::vector<char>& bytes) {
  try {
    return torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {} is corrupted or truncated ({} bytes): {}", p.string(), bytes.size(),
                            std::string(e.what()).substr(0, 300)));
  }
}

namespace {

// The zip reader's view of a mapped file.
class MappedAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit MappedAdapter(std::shared_ptr<const data::MappedFile> m) : m_(std::move(m)) {}
  size_t size() const override { return m_->size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char*) const override {
    if (pos >= m_->size()) return 0;
    n = std::min<size_t>(n, m_->size() - pos);
    std::memcpy(buf, m_->data() + pos, n);
    return n;
  }

 private:
  std::shared_ptr<const data::MappedFile> m_;
};

// FNV-1a of the file's bytes and its size, read in blocks (no mapping: its pages do not stay).
std::pair<uint64_t, uint64_t> fnv1aFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  TESSERA_CHECK(f.good(), "checkpoint: cannot open {}", p.string());
  std::vector<char> block(16 << 20);
  uint64_t h = 1469598103934665603ull, size = 0;
  while (f) {
    f.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<size_t>(f.gcount());
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(block[i]);
      h *= 1099511628211ull;
    }
    size += n;
  }
  return {h, size};
}

}  // namespace

c10::IValue mapShard(const fs::path& p, int64_t bytes, int64_t fnv) {
  TESSERA_CHECK(fs::exists(p), "checkpoint: {} is missing", p.string());
  const auto [h, size] = fnv1aFile(p);
  TESSERA_CHECK(static_cast<int64_t>(size) == bytes,
                "checkpoint: {} is truncated or corrupted: {} bytes, the metadata says {}", p.string(), size, bytes);
  TESSERA_CHECK(static_cast<int64_t>(h) == fnv, "checkpoint: {} is corrupted: its checksum differs from the one saved",
                p.string());
  auto map = std::make_shared<const data::MappedFile>(p.string(), data::MapMode::CopyOnWrite);
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MappedAdapter>(map));
    auto [pkl, n] = reader.getRecord("data.pkl");
    const char* src = static_cast<const char*>(pkl.get());
    size_t pos = 0;
    auto readPickle = [&, n = n](char* buf, size_t len) {
      len = std::min(len, n - pos);
      std::memcpy(buf, src + pos, len);
      pos += len;
      return len;
    };
    auto readRecord = [&](const std::string& key) {
      const size_t off = reader.getRecordOffset("data/" + key);
      auto* keep = new std::shared_ptr<const data::MappedFile>(map);  // the tensor's storage holds the mapping
      return at::DataPtr(const_cast<uint8_t*>(map->data()) + off, keep,
                         [](void* k) { delete static_cast<std::shared_ptr<const data::MappedFile>*>(k); }, at::kCPU);
    };
    torch::jit::Unpickler unpickler(readPickle, nullptr, nullptr, readRecord, c10::nullopt);
    unpickler.set_version(reader.version());
    return unpickler.parse_ivalue();
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint: {} is corrupted or truncated ({} bytes): {}", p.string(), size,
                            std::string(e.what()).substr(0, 300)));
  }
}

std::vector<int64_t> ints(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const auto& e : v.toListRef()) out.push_back(e.toInt());
  return out;
}

std::string sumLine(const std::vector<char>& metadataBytes) {
  return fmt::format("fnv1a64 {:016x} bytes {}\n", fnv1a(metadataBytes), metadataBytes.size());
}

void checkSum(const fs::path& metadataPath, const std::vector<char>& metadataBytes, const fs::path& sumPath,
              const std::string& sumText) {
  std::istringstream in(sumText);
  std::string algo, hex, bytesWord;
  uint64_t bytes = 0;
  in >> algo >> hex >> bytesWord >> bytes;
  TESSERA_CHECK(in && algo == "fnv1a64" && bytesWord == "bytes" && hex.size() == 16,
                "checkpoint: {} is malformed (expected 'fnv1a64 <hex> bytes <n>', got '{}')", sumPath.string(),
                sumText.substr(0, 80));
  TESSERA_CHECK(metadataBytes.size() == bytes,
                "checkpoint: {} is truncated or corrupted: {} bytes, {} says {}", metadataPath.string(),
                metadataBytes.size(), sumPath.filename().string(), bytes);
  TESSERA_CHECK(sumLine(metadataBytes) == sumText,
                "checkpoint: {} is corrupted: its checksum differs from the one in {}", metadataPath.string(),
                sumPath.filename().string());
}

}  // namespace tessera::checkpoint::files
