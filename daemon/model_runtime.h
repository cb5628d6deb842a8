// ModelRuntime: what the daemon needs from an inference engine - load a model file into a Backend and
// generate from it. The server is written against this interface, so it builds, and its protocol, cache,
// cancellation and shutdown paths are tested with a scripted runtime that loads no real model.
//
// Implementations: EngineRuntime (engine_runtime.cpp, wraps car::engine), and the tests' scripted runtimes.
//
// Thread safety: load() may run concurrently on different files. Every call on one Backend is serialized
// by the caller (the cache entry's mutex), so an implementation needs no locking of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/engine.h"
#include "core/util/result.h"
#include "core/util/stream_experts.h"
#include "daemon/protocol.h"

namespace car::daemon {

/// One generation request, already validated by the protocol layer (the `infer` request's own struct).
using GenerateParams = protocol::GenerateParams;

/// What one generation produced, typed (protocol/results.h): the handler hands it to the front inside the
/// request's InferResult as it is.
using GenerateOutput = protocol::GenerateOutput;

/// Called for each generated token on the generating thread: the token id, the text it released and, when
/// asked for, its logprob entry.
using TokenSink = std::function<void(const protocol::TokenEvent& event)>;

/// A loaded model. Destroying it releases its memory.
class Backend {
 public:
  virtual ~Backend() = default;
  /// Generate; `cancelled` is checked between tokens. Errors: context_overflow, bad_request, io_error (the
  /// model file changed or was truncated under it; the caller drops the backend), internal.
  virtual Result<GenerateOutput> generate(const GenerateParams& params, const TokenSink& on_token,
                                          const std::atomic<bool>& cancelled) = 0;
  /// Bytes the model holds (weights, KV cache, scratch, expert cache at its floor): what the cache charges
  /// it, and the `size_bytes` that `load` and `stats` report. Fixed once loaded. A streamed expert cache
  /// above its floor is not in it: it lives in the room the cache's budget leaves (share_room).
  virtual uint64_t memory_bytes() const = 0;
  /// Whether MoE experts are streamed from disk.
  virtual bool streams_experts() const = 0;
  /// The context (tokens) the model is loaded with; 0 when the runtime does not say.
  virtual int64_t context_length() const { return 0; }
  /// Persist state worth keeping across runs (the expert usage sidecar). Called at shutdown and
  /// periodically (under the model's lock); an implementation may also save when it is destroyed (eviction,
  /// invalidate). Cheap when nothing changed since the last save.
  virtual void save_state() = 0;
  /// The expert streamer's counters for `stats.experts` (docs/protocol.md), or null for a model without
  /// routed experts. Safe to call while another thread generates (no model lock needed).
  virtual nlohmann::json expert_stats() const { return nullptr; }
  /// OK when `path` still names, unchanged, the file this backend was loaded from and no read of it
  /// faulted; an error (message: what changed) tells the daemon to drop the backend and load the file
  /// again. Called WITHOUT the model lock, possibly while another request generates. Default: always OK.
  virtual Result<void> check_file(const std::filesystem::path& path) const { return {}; }
};

/// What one request may choose about the load it triggers; unset fields take the runtime's settings.
struct LoadRequest {
  std::optional<StreamExperts> stream_experts;
};

/// The daemon's settings for every load are the engine's load options themselves (threads, stream_experts,
/// expert_ram_gb, state_dir, context_length, context_memory_bytes), so no field is copied between two
/// structs on the way; a request's choices (LoadRequest) and the daemon's expert pool are applied per load.
using RuntimeOptions = engine::LoadOptions;

class ModelRuntime {
 public:
  virtual ~ModelRuntime() = default;
  /// Load `path`. Errors: not_found, load_failed (message for a person).
  virtual Result<std::shared_ptr<Backend>> load(const std::filesystem::path& path) = 0;
  /// Load `path` with per-request choices. Default: ignore them (a runtime without expert streaming).
  virtual Result<std::shared_ptr<Backend>> load_with(const std::filesystem::path& path, const LoadRequest& request) {
    (void)request;
    return load(path);
  }
  /// The memory_bytes() a load_with(path, request) will report, without loading it (read from the file's
  /// header): the cache makes room for it, or refuses a model larger than the whole budget, before loading.
  /// Errors: not_found, load_failed.
  virtual Result<uint64_t> estimate_bytes(const std::filesystem::path& path, const LoadRequest& request) = 0;
  /// One budget: memory the runtime keeps outside its backends' charges (streamed expert caches above their
  /// floor) may only use `room()` - what the model cache's budget leaves (nullopt: no limit) - and shrinks
  /// when room_changed() is called after the room shrank. Called once, before any load. Default: nothing
  /// kept outside the charges.
  virtual void share_room(std::function<std::optional<uint64_t>()> room) { (void)room; }
  virtual void room_changed() {}
  /// True when this runtime can actually run models (false: built without the engine).
  virtual bool available() const = 0;
  /// One word for logs and `health`: "engine" or "none".
  virtual std::string name() const = 0;
};

/// The runtime this binary was built with: the engine when car_engine was linked, else the refusing one.
std::unique_ptr<ModelRuntime> make_default_runtime(const RuntimeOptions& options);

}  // namespace car::daemon
