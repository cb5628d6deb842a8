// The inference engine's public face: load a GGUF model (weights mmapped, tokenizer from its metadata) and
// generate from it. Knows nothing of sockets: tokens go out through a callback and cancellation comes in
// through an atomic flag checked between tokens.
//
// Thread safety: a LoadedModel may be used from any number of threads: generate() and submit() queue
// requests on the model's scheduler, which runs them batched on its own thread (core/engine/scheduler.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine/generate_request.h"
#include "core/engine/sampler.h"
#include "core/engine/scheduler.h"
#include "core/experts/streamed_source.h"
#include "core/util/result.h"
#include "core/util/stream_experts.h"

namespace car::gguf {
class GgufFile;
}
namespace car::tokenizer {
class Tokenizer;
}

namespace car::engine {

/// Full contexts the default KV pool holds when a model runs at least this many sequences.
inline constexpr int kPoolContexts = 4;

struct LoadOptions {
  int threads = 0;                       ///< compute threads; 0 = hardware concurrency
  /// MoE experts: `on` streams them from disk into a bounded cache (StreamedExpertSource), `off` serves
  /// them from the mapping, `auto` streams when the model file is larger than the memory the process may
  /// use (MemAvailable and the memory cgroup's remaining limit; see decide_streaming). Dense models ignore
  /// it.
  StreamExperts stream_experts = StreamExperts::automatic;
  /// Forced expert cache budget in GB (1e9 bytes) for a private pool; 0 = from the memory limits. Ignored
  /// when expert_pool is set (the pool has its own budget).
  double expert_ram_gb = 0;
  std::string state_dir;                 ///< usage sidecars live in <state_dir>/experts/; empty = none
  /// Context in tokens (the most one sequence holds); 0 = the default: with kv_pool_bytes or
  /// context_memory_bytes, the model's trained context shortened until min(parallel, kPoolContexts) full
  /// contexts fit in that many bytes (a multiple of 256, at least 256); without, min(model's, 4096).
  int context_length = 0;
  uint64_t context_memory_bytes = 0;  ///< see context_length; 0 = the fixed 4096 cap
  /// The model's KV pool (positions over all its sequences; see core/engine/scheduler.h): kv_pool_tokens
  /// when set, else kv_pool_bytes / bytes per position when set, else min(parallel, kPoolContexts) full
  /// contexts or, if more, the positions of kPoolContexts contexts of the default 4096 (fewer if
  /// context_memory_bytes holds fewer), so that sequences of a short context all fit - in every case at most parallel
  /// full contexts and at least one position. The pool's bytes are what estimate_memory charges for KV.
  uint64_t kv_pool_bytes = 0;
  int64_t kv_pool_tokens = 0;
  /// The budget and readers shared by every streamed model of the process (the daemon's); null = a
  /// private pool for this model.
  std::shared_ptr<experts::ExpertPool> expert_pool;
  bool prefetch = true;            ///< prefetch the next MoE layer's guessed experts when streaming
  bool direct_io = true;           ///< O_DIRECT expert reads where the filesystem allows them
  experts::PreadFn expert_reader;  ///< test seam: the streamed source's positional reads; null = pread
  /// Sequences the model runs at once (continuous batching; see core/engine/scheduler.h): each maps a KV
  /// cache of the model's context, holding only the pages it writes; together they hold at most the pool.
  int parallel = 1;
  /// Tokens per batched step (decode rows + prompt chunks); 0 = the forward pass's batch size.
  int64_t step_tokens = 0;
  /// Requests that may wait for a sequence slot; one more is refused with `busy`. 0 = no limit.
  int max_queued = 0;
  /// The compute turns shared by every model of the process (the daemon's; see compute_gate.h): models
  /// busy at once take turns step by step instead of oversubscribing the cores. Null = none.
  std::shared_ptr<ComputeGate> compute_gate;
};

/// Whether to stream a model's experts, and why (for the caller's log).
struct StreamDecision {
  bool stream = false;
  std::string
      reason;  ///< "stream_experts=on", "auto: model file 80.0 GB > 31.2 GB available (cgroup v2)", ...
};
/// The stream_experts rule: `on`/`off` as asked; `auto` streams when `file_bytes` exceeds
/// memory.effective_available (resident when that is unknown, i.e. 0). A model without routed experts is
/// never streamed.
StreamDecision decide_streaming(StreamExperts mode, bool has_experts, uint64_t file_bytes,
                                const experts::MemoryProbe& memory);


class LoadedModel;

/// Load a model. Errors: not_found, load_failed (message names the key/tensor/field), io_error (streamed
/// experts: the file could not be opened for reading or a pinned expert could not be read).
Result<std::shared_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& options);

/// Generate, waiting for the result: submit() and wait. `on_token` (may be empty) is called for each
/// generated token, on the model's scheduler thread while the caller waits;
/// `cancelled` (may be null) is checked before each token. Errors: context_overflow, bad_request, io_error
/// (the model's file was truncated or rewritten in place while it computed: the results would come from
/// zeros or a mix of two files; checked after every forward evaluation - the caller should drop the model).
///
/// Errors also: io_error when a streamed expert cannot be read; the model stays usable (the KV cache
/// keeps only what was computed before the failure) and the next call retries the read.
///
/// Details (engine.cpp): context_overflow when prompt tokens + max_tokens exceed the context; bad_request for
/// a prompt that tokenizes to nothing or an id outside the vocabulary. An end-of-generation token (unless
/// ignore_eos) ends with "eos" and is not included in `tokens`. Text held back at the end (an incomplete
/// UTF-8 tail, or a possible stop-string prefix that never completed) is appended to `text` and reported by
/// one last on_token event with token = -1. The KV cache is kept between calls and the longest common prefix
/// with the previous call's sequence is reused.
Result<GenerateResult> generate(LoadedModel& model, const GenerateRequest& request,
                                const std::function<void(const TokenEvent&)>& on_token,
                                const std::atomic<bool>* cancelled);

/// generate() without waiting: the request joins the model's scheduler queue (first come, first served)
/// and runs batched with the model's other sequences; `callbacks` run on the scheduler's thread and must
/// not block (core/engine/scheduler.h). Checks and errors as generate()'s; a request refused before
/// queueing gets its on_done before submit returns. `cancelled` (may be null) must outlive the request.
void submit(LoadedModel& model, const GenerateRequest& request, GenerateCallbacks callbacks,
            const std::atomic<bool>* cancelled);

/// The model's scheduler now: running sequences, queued requests, KV use. Thread-safe.
SchedulerStats model_scheduler_stats(const LoadedModel& model);
/// Time the phases of the model's forward steps (StepPhase; car bench --phases): on clears the totals.
/// Thread-safe; changes no result.
void model_set_phase_timing(LoadedModel& model, bool on);
/// The phase totals since timing was switched on. Thread-safe.
StepPhaseTimes model_phase_times(const LoadedModel& model);

/// What a model holds, by part: the same terms for the estimate made before loading and the figure read
/// after it, so the two can be compared term by term.
struct MemoryBreakdown {
  uint64_t weights = 0;   ///< the mapped file: header (read at load) and the tensors the forward pass reads
  uint64_t kv_cache = 0;  ///< fp16 K and V: the KV pool (positions x bytes per position)
  uint64_t scratch = 0;   ///< the forward pass's activation buffers
  uint64_t logits = 0;    ///< one row of n_vocab floats
  uint64_t experts = 0;   ///< bytes an expert source keeps beyond the mapping (0 for resident experts)
  /// The part of `experts` that cannot shrink: a streamed model's cache at one slot per bank. The rest
  /// grows and shrinks with the expert pool's budget (ExpertPool::set_room).
  uint64_t experts_floor = 0;
  uint64_t total() const { return weights + kv_cache + scratch + logits + experts; }
  /// What a budget that shares its room with the expert pool charges the model: everything but the
  /// streamed expert cache above its floor. Equal to total() for resident experts.
  uint64_t charged() const { return total() - experts + experts_floor; }
};

/// The memory load_model(path, options) will report in model_memory(), from the GGUF header alone (the
/// file is mapped and its header parsed; no tensor data is read and no buffer allocated). Equal to the
/// loaded figure for a model whose experts are resident. Errors: not_found, load_failed.
Result<MemoryBreakdown> estimate_memory(const std::string& path, const LoadOptions& options);
/// The model's GGUF file and tokenizer, for what builds on generation (chat prompts: core/chat/model_chat.h).
/// Valid as long as the model; safe to read while another thread generates.
const gguf::GgufFile& model_file(const LoadedModel& model);
const tokenizer::Tokenizer& model_tokenizer(const LoadedModel& model);

/// The context (KV cache length, tokens) the model was loaded with.
int64_t model_context_length(const LoadedModel& model);
/// The KV pool's positions (over all the model's sequences).
int64_t model_kv_pool_tokens(const LoadedModel& model);
/// Bytes of the model's KV caches resident now as the kernel reports them (mincore of every sequence's
/// mapping; SchedulerStats::kv_bytes_resident counts the same pages from the rows written). Thread-safe.
uint64_t model_kv_resident_bytes(const LoadedModel& model);
/// What a loaded model holds now.
MemoryBreakdown model_memory(const LoadedModel& model);
/// OK when `path` still names, unchanged, the file the model was loaded from and no read of it faulted.
/// Safe to call while another thread generates. Errors: not_found, io_error (the message says what changed).
Result<void> model_check_file(const LoadedModel& model, const std::string& path);

/// model_memory(model).charged(): the bytes the daemon charges the model against its cache budget. A
/// streamed model's expert banks are not counted (never touched through the mapping), nor its expert cache
/// above one slot per bank: the pool grows that into the room the cache leaves (ExpertPool::set_room).
/// estimate_memory(...).charged() gives the same figure before loading, from the header alone.
uint64_t model_memory_bytes(const LoadedModel& model);
/// True when the model's experts are streamed from disk.
bool model_streams_experts(const LoadedModel& model);
/// Why the experts are (or are not) streamed, and the pool's sizing when they are; empty for a dense model.
const std::string& model_stream_reason(const LoadedModel& model);
/// The expert source's counters; nullopt for a dense model. Thread-safe (may run beside generate()).
std::optional<experts::ExpertStats> model_expert_stats(const LoadedModel& model);
/// The routed experts' weight bytes the forward passes have leased so far: over every (layer, expert), its
/// leases (ExpertSource::use_count) times its gate + up + down bytes. A step leases each expert its rows
/// chose once, so the growth over a run is what its steps read of the expert banks (car bench --parallel).
/// 0 for a dense model. Thread-safe (may run beside generate()).
uint64_t model_expert_bytes_leased(const LoadedModel& model);
/// Warnings of the expert source since the last call (sidecar lines skipped, O_DIRECT fallback).
std::vector<std::string> model_take_warnings(LoadedModel& model);
/// Save persistent state (the expert usage sidecar; nothing for a resident or dense model). Thread-safe.
/// Errors: io_error (the sidecar could not be written).
Result<void> model_save_state(LoadedModel& model);

}  // namespace car::engine
