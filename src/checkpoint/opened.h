#pragma once
// Internal to src/checkpoint: a checkpoint's metadata opened and checked at exactly one directory
// (no fallback to <dir>.old: series.h's find() chooses the directory). Local; errors are
// tessera::Error naming the file: missing, checksum mismatch, unknown version, missing fields.
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <filesystem>

namespace tessera::checkpoint::detail {

struct Opened {
  std::filesystem::path dir;
  c10::impl::GenericDict meta = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
};

Opened openExact(const std::filesystem::path& dir);

}  // namespace tessera::checkpoint::detail
