// The inference engine's public face: load a GGUF model (weights mmapped, tokenizer from its metadata) and
// generate from it. Knows nothing of sockets: tokens go out through a callback and cancellation comes in
// through an atomic flag checked between tokens.
//
// Thread safety: a LoadedModel is immutable after load except for its KV cache / scratch, which generate()
// uses; callers serialize generate() calls on one model (the daemon's per-model lock does).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/util/result.h"

namespace car::engine {

struct LoadOptions {
  int threads = 0;                       ///< compute threads; 0 = hardware concurrency
  std::string stream_experts = "auto";   ///< "on" | "off" | "auto"
  double expert_ram_gb = 0;              ///< expert cache budget when streaming; 0 = from MemAvailable
  std::string state_dir;                 ///< where usage sidecars live; empty = none
  int context_length = 0;                ///< KV cache size in tokens; 0 = min(model's, 4096)
};

struct SamplingParams {
  float temperature = 0.8f;  ///< 0 = greedy
  int top_k = 40;            ///< 0 = off
  float top_p = 0.95f;       ///< 1 = off
  float min_p = 0.05f;       ///< 0 = off
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

struct GenerateRequest {
  std::string prompt;                 ///< tokenized with the model's tokenizer unless prompt_ids is set
  std::vector<int32_t> prompt_ids;    ///< used as-is when non-empty
  bool add_bos = true;                ///< add BOS (when the model's vocabulary asks for it)
  bool parse_special = false;         ///< let special-token text in the prompt become special tokens
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;      ///< stop strings (not included in the output)
  int top_logprobs = 0;               ///< K most likely ids per generated position
  /// Keep generating past EOS until max_tokens (finish_reason "length"). Added for `car bench`, which
  /// prefills random ids and must decode exactly max_tokens tokens; generate() should skip its EOS check
  /// when set. Sampling and stop strings: core/engine/sampler.h (Sampler, StopMatcher).
  bool ignore_eos = false;
};

struct TokenEvent {
  int32_t token;
  std::string text;  ///< decoded bytes released by this token (never a partial UTF-8 character)
};

struct TopLogprob {
  int32_t token;
  double logprob;
};

struct GenerateResult {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;
  std::string text;
  std::string finish_reason;  ///< "length" | "stop" | "eos" | "cancelled"
  double prompt_ms = 0;
  double decode_ms = 0;
  std::vector<std::vector<TopLogprob>> top_logprobs;
};

class LoadedModel;

/// Load a model. Errors: not_found, load_failed (message names the key/tensor/field).
Result<std::shared_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& options);

/// Generate. `on_token` (may be empty) is called for each generated token on the calling thread;
/// `cancelled` (may be null) is checked before each token. Errors: context_overflow, bad_request, io_error
/// (the model's file was truncated or rewritten in place while it computed: the results would come from
/// zeros or a mix of two files; checked after every forward evaluation - the caller should drop the model).
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

/// OK when `path` still names, unchanged, the file the model was loaded from and no read of it faulted.
/// Safe to call while another thread generates. Errors: not_found, io_error (the message says what changed).
Result<void> model_check_file(const LoadedModel& model, const std::string& path);

/// Bytes the model holds (weights mapped + KV cache + scratch), for the cache budget and reporting.
uint64_t model_memory_bytes(const LoadedModel& model);
/// True when the model's experts are streamed from disk.
bool model_streams_experts(const LoadedModel& model);
/// Save persistent state (expert usage sidecar) - the daemon calls it at shutdown.
void model_save_state(LoadedModel& model);

}  // namespace car::engine
