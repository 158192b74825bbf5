#pragma once
// Running a call that may block for ever (a store whose host stopped) with a deadline.
#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

namespace tessera {

// Runs `fn` on a thread of its own and waits up to `d`. Returns "" when it finished, else why
// not: its exception's message, or "no answer within D s" (the thread is then left behind,
// detached: `fn` must own what it uses, e.g. capture by value). Local; never throws.
inline std::string runBounded(std::chrono::milliseconds d, std::function<void()> fn) {
  auto done = std::make_shared<std::promise<std::string>>();
  auto f = done->get_future();
  try {
    std::thread([done, fn = std::move(fn)] {
      try {
        fn();
        done->set_value("");
      } catch (const std::exception& e) {
        done->set_value(*e.what() ? e.what() : "an error without a message");
      } catch (...) {
        done->set_value("an unknown error");
      }
    }).detach();
  } catch (const std::exception& e) {
    return fmt::format("no thread to run it: {}", e.what());
  }
  if (f.wait_for(d) != std::future_status::ready) return fmt::format("no answer within {:.1f} s", d.count() / 1e3);
  return f.get();
}

}  // namespace tessera
