#include "tessera/checkpoint/stream_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>

#include "checkpoint/files.h"
#include "checkpoint/save_steps.h"
#include "tessera/common/error.h"

namespace tessera::checkpoint {

StreamWriter::StreamWriter(std::string dir, StreamWriterOptions o) : dir_(std::move(dir)), o_(o) {
  const std::filesystem::path tmp(dir_ + ".tmp");
  files::removeTree(tmp);
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  TESSERA_CHECK(!ec, "checkpoint: cannot create {}: {}", tmp.string(), ec.message());
}

void StreamWriter::add(const std::string& name, const at::Tensor& t) {
  TESSERA_CHECK(!done_, "checkpoint: {}: tensor '{}' added after finish()", dir_, name);
  TESSERA_CHECK(names_.insert(name).second, "checkpoint: {}: tensor '{}' is given twice", dir_, name);
  TESSERA_CHECK(t.defined(), "checkpoint: {}: tensor '{}' is undefined", dir_, name);
  // No copy of a host tensor that is its whole storage (import-hf's are fresh, and as large as an
  // 8B model's embedding); a view is copied, or its file would hold the whole storage.
  const bool keep = t.is_cpu() && t.is_contiguous() && t.storage_offset() == 0 &&
                    t.storage().nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
  auto host = keep ? t.detach() : t.detach().to(at::kCPU).contiguous().clone();
  group_.push_back(whole(name, host));
  host_.push_back(host);
  groupBytes_ += static_cast<uint64_t>(host.numel()) * host.element_size();
  if (groupBytes_ >= o_.maxFileBytes) flush();
}

void StreamWriter::flush() {
  if (group_.empty()) return;
  detail::ShardPlan p{dir_, files_, 1, group_};
  detail::writeShard(p, host_);
  ++files_;
  group_.clear();
  host_.clear();
  groupBytes_ = 0;
}

void StreamWriter::finish(int64_t step, const std::map<std::string, std::string>& extra) {
  TESSERA_CHECK(!done_, "checkpoint: {}: finish() twice", dir_);
  if (group_.empty() && files_ == 0) {  // no tensors: one empty file keeps the format's invariant
    detail::ShardPlan p{dir_, 0, 1, {}};
    detail::writeShard(p, {});
    files_ = 1;
  }
  flush();
  detail::publish(dir_, 1, step, extra, {}, files_);
  done_ = true;
}

}  // namespace tessera::checkpoint
