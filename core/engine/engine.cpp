// load_model / generate: the engine's public face (engine.h) over Model + ForwardPass + Tokenizer + Sampler.
#include "core/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/engine/forward.h"
#include "core/engine/sampler.h"
#include "core/experts/resident_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/thread_pool.h"

namespace car::engine {

namespace {
constexpr int64_t kMaxHeadDim = 1024;    // ForwardPass's per-task stack scratch
constexpr int64_t kDefaultMaxContext = 4096;
constexpr int64_t kMaxBatch = 256;       // rows per prompt-processing batch
}  // namespace

/// Everything one loaded model holds. The forward pass scratch, KV cache and logits are reused by every
/// generate() call (callers serialize them, see engine.h).
class LoadedModel {
 public:
  std::shared_ptr<const gguf::GgufFile> file;
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::unique_ptr<experts::ExpertSource> experts;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ForwardPass> forward;
  std::unique_ptr<KvCache> kv;
  std::vector<float> logits;          // n_vocab
  std::vector<int32_t> cached;        // the ids whose K/V are in kv (a prefix the next prompt may reuse)
};

namespace {
/// The weights under the last evaluation are those the model was loaded from: no read of the mapping
/// faulted (the file shrank) and the file was not rewritten in place. Otherwise the logits were computed
/// from zeros or a mix of two files; the KV cache is dropped and the request fails with io_error.
Result<void> check_weights(LoadedModel& lm) {
  auto intact = lm.file->check_intact();
  if (intact) return {};
  lm.kv->truncate(0);
  lm.cached.clear();
  static const std::string what =
      "model file changed or was truncated while in use (replace model files by atomic rename): ";
  return make_error("io_error", what + intact.error().message);
}
}  // namespace

Result<std::shared_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& options) {
  if (options.stream_experts != "auto" && options.stream_experts != "on" && options.stream_experts != "off") {
    return make_error("load_failed", "stream_experts must be on, off or auto (got '" + options.stream_experts + "')");
  }
  if (options.context_length < 0) {
    return make_error("load_failed", "context_length must be >= 0 (got " + std::to_string(options.context_length) + ")");
  }
  auto file = gguf::GgufFile::open(path);
  if (!file.ok()) {
    if (file.error().code == "not_found") return make_error("not_found", path + ": " + file.error().message);
    return make_error("load_failed", path + ": " + file.error().message);
  }
  auto m = model::Model::load(*file);
  if (!m.ok()) return make_error("load_failed", path + ": " + m.error().message);
  const model::Hparams& hp = (*m)->hparams();
  if (hp.head_dim_k > kMaxHeadDim || hp.head_dim_v > kMaxHeadDim) {
    return make_error("load_failed", path + ": head dimension " + std::to_string(std::max(hp.head_dim_k, hp.head_dim_v)) +
                                         " larger than the supported " + std::to_string(kMaxHeadDim));
  }
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok.ok()) return make_error("load_failed", path + ": tokenizer: " + tok.error().message);
  if ((*tok)->n_vocab() > hp.n_vocab) {
    return make_error("load_failed", path + ": tokenizer has " + std::to_string((*tok)->n_vocab()) +
                                         " tokens but token_embd.weight only " + std::to_string(hp.n_vocab) + " rows");
  }
  if (hp.is_moe() && options.stream_experts == "on") {
    return make_error("load_failed", path + ": stream_experts=on: the streamed expert source is not available in this "
                                            "build (use off or auto)");
  }

  auto lm = std::make_shared<LoadedModel>();
  lm->file = *file;
  lm->model = *m;
  lm->tok = *tok;
  if (hp.is_moe()) lm->experts = std::make_unique<experts::ResidentExpertSource>(lm->model->expert_banks());
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  lm->pool = std::make_unique<ThreadPool>(std::max(1, threads));
  const int64_t n_ctx = options.context_length > 0 ? options.context_length
                                                   : std::min<int64_t>(hp.n_ctx_train, kDefaultMaxContext);
  lm->forward = std::make_unique<ForwardPass>(lm->model, lm->experts.get(), lm->pool.get(), std::min(kMaxBatch, n_ctx));
  lm->kv = std::make_unique<KvCache>(lm->forward->make_cache(n_ctx));
  lm->logits.resize(static_cast<size_t>(hp.n_vocab));
  // The tokenizer and model read the mapping; a file cut or rewritten meanwhile gave them zeros.
  if (auto intact = lm->file->check_intact(); !intact) {
    return make_error("load_failed", path + ": changed while loading: " + intact.error().message);
  }
  return lm;
}

Result<GenerateResult> generate(LoadedModel& lm, const GenerateRequest& req,
                                const std::function<void(const TokenEvent&)>& on_token,
                                const std::atomic<bool>* cancelled) {
  using clock = std::chrono::steady_clock;
  const int64_t n_vocab = lm.model->hparams().n_vocab;
  if (req.max_tokens < 0) return make_error("bad_request", "max_tokens must be >= 0");
  if (req.top_logprobs < 0) return make_error("bad_request", "top_logprobs must be >= 0");

  GenerateResult res;
  if (!req.prompt_ids.empty()) {
    res.prompt_tokens = req.prompt_ids;
  } else {
    res.prompt_tokens = lm.tok->encode(req.prompt, req.add_bos, req.parse_special);
  }
  if (res.prompt_tokens.empty()) return make_error("bad_request", "the prompt is empty (no tokens)");
  for (int32_t id : res.prompt_tokens) {
    if (id < 0 || id >= n_vocab) {
      return make_error("bad_request", "prompt token id " + std::to_string(id) + " outside [0, " +
                                           std::to_string(n_vocab) + ")");
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(res.prompt_tokens.size());
  const int64_t n_ctx = lm.kv->n_ctx();
  if (n_prompt + req.max_tokens > n_ctx) {
    return make_error("context_overflow", "prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                                              std::to_string(req.max_tokens) + ") exceeds the context of " +
                                              std::to_string(n_ctx) + " tokens");
  }

  // Reuse the cached prefix; at least the last prompt token is evaluated again for its logits.
  int64_t common = 0;
  const int64_t max_common = std::min<int64_t>(static_cast<int64_t>(lm.cached.size()), n_prompt - 1);
  while (common < max_common && lm.cached[static_cast<size_t>(common)] == res.prompt_tokens[static_cast<size_t>(common)]) {
    ++common;
  }
  lm.kv->truncate(std::min(common, lm.kv->n_past()));
  common = lm.kv->n_past();
  lm.cached.resize(static_cast<size_t>(common));

  if (cancelled != nullptr && cancelled->load()) {
    res.finish_reason = "cancelled";
    return res;
  }
  const auto t0 = clock::now();
  std::span<const int32_t> rest(res.prompt_tokens.data() + common, static_cast<size_t>(n_prompt - common));
  lm.forward->eval(rest, *lm.kv, lm.logits.data(), false);
  if (auto ok = check_weights(lm); !ok) return ok.error();
  lm.cached.insert(lm.cached.end(), rest.begin(), rest.end());
  const auto t1 = clock::now();
  res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

  Sampler sampler(req.sampling);
  StopMatcher stops(req.stop);
  tokenizer::StreamDecoder decoder(lm.tok);
  std::vector<int32_t> history = res.prompt_tokens;
  history.reserve(history.size() + static_cast<size_t>(req.max_tokens));
  res.finish_reason = "length";
  const std::span<const float> logits(lm.logits.data(), lm.logits.size());

  for (int i = 0; i < req.max_tokens; ++i) {
    if (cancelled != nullptr && cancelled->load()) {
      res.finish_reason = "cancelled";
      break;
    }
    const int32_t id = sampler.sample(logits, history);
    if (!req.ignore_eos && lm.tok->is_eog(id)) {
      res.finish_reason = "eos";
      break;
    }
    if (req.top_logprobs > 0) res.top_logprobs.push_back(Sampler::top_logprobs(logits, req.top_logprobs));
    res.tokens.push_back(id);
    history.push_back(id);
    const StopMatcher::Step step = stops.push(decoder.push(id));
    res.text += step.text;
    if (on_token) on_token(TokenEvent{id, step.text});
    if (step.stopped) {
      res.finish_reason = "stop";
      break;
    }
    if (i + 1 < req.max_tokens) {
      lm.forward->eval(std::span<const int32_t>(&id, 1), *lm.kv, lm.logits.data(), false);
      if (auto ok = check_weights(lm); !ok) return ok.error();
      lm.cached.push_back(id);
    }
  }
  if (!stops.stopped()) {
    // Text held back at the end: an incomplete UTF-8 tail (as U+FFFD) and a possible stop-string prefix.
    std::string tail = stops.push(decoder.finish()).text;
    if (!stops.stopped()) tail += stops.flush();
    if (!tail.empty()) {
      res.text += tail;
      if (on_token) on_token(TokenEvent{-1, tail});
    }
  }
  res.decode_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
  return res;
}

uint64_t model_memory_bytes(const LoadedModel& lm) {
  return lm.file->file_size() + lm.kv->size_bytes() + lm.forward->scratch_bytes() +
         lm.logits.size() * sizeof(float) + (lm.experts ? lm.experts->resident_bytes() : 0);
}

Result<void> model_check_file(const LoadedModel& lm, const std::string& path) {
  return lm.file->check_current(path);
}

bool model_streams_experts(const LoadedModel& lm) { return lm.experts != nullptr && lm.experts->streams(); }

void model_save_state(LoadedModel& lm) {
  // The resident expert source keeps no state worth saving; the streamed source (a later issue) writes its
  // usage sidecar here.
  (void)lm;
}

}  // namespace car::engine
