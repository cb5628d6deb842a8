// load_model / generate: the engine's public face (engine.h) over Model + ForwardPass + Tokenizer + Sampler.
#include "core/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "core/engine/forward.h"
#include "core/engine/sampler.h"
#include "core/experts/resident_source.h"
#include "core/experts/streamed_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/error_codes.h"
#include "core/util/thread_pool.h"

namespace car::engine {

namespace {
constexpr int64_t kDefaultMaxContext = 4096;
constexpr int64_t kMaxBatch = 256;       // rows per prompt-processing batch

std::string gb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GB", static_cast<double>(bytes) / 1e9);
  return buf;
}

/// Bytes of the routed-expert banks in the file (what streaming keeps out of the mapping's resident set).
uint64_t expert_bank_bytes(const std::vector<experts::ExpertBankInfo>& banks) {
  auto bytes = [](const tensor::MatrixView& v) { return static_cast<uint64_t>(v.rows) * v.row_bytes; };
  uint64_t total = 0;
  for (const auto& b : banks) {
    if (b.n_expert > 0) total += bytes(b.gate_bank) + bytes(b.up_bank) + bytes(b.down_bank);
  }
  return total;
}

/// The KV cache length a load with `options` gives a model of `hp`.
int64_t context_tokens(const model::Hparams& hp, const LoadOptions& options) {
  if (options.context_length > 0) return options.context_length;
  if (options.context_memory_bytes == 0 || hp.n_ctx_train <= 0) {
    return std::min<int64_t>(hp.n_ctx_train, kDefaultMaxContext);
  }
  // The trained context, shortened (to a multiple of 256 tokens, at least 256) until its KV cache fits.
  const uint64_t per_token = std::max<uint64_t>(1, ForwardPass::kv_cache_bytes_for(hp, 1024) / 1024);
  int64_t fit = static_cast<int64_t>(options.context_memory_bytes / per_token);
  fit = std::max<int64_t>(256, fit / 256 * 256);
  return std::min<int64_t>(hp.n_ctx_train, fit);
}
int64_t max_batch(int64_t n_ctx) {
  return std::min(kMaxBatch, n_ctx);
}
}  // namespace

StreamDecision decide_streaming(StreamExperts mode, bool has_experts, uint64_t file_bytes,
                                const experts::MemoryProbe& memory) {
  if (!has_experts) return {false, "no routed experts"};
  if (mode == StreamExperts::on) return {true, "stream_experts=on"};
  if (mode == StreamExperts::off) return {false, "stream_experts=off"};
  const uint64_t avail = memory.effective_available;
  std::string where = memory.cgroup_remaining && *memory.cgroup_remaining <= memory.mem_available
                          ? "available (memory cgroup " + memory.cgroup_version + " limit)"
                          : "available (MemAvailable)";
  if (avail == 0) return {false, "auto: available memory unknown, experts resident"};
  if (file_bytes > avail)
    return {true, "auto: model file " + gb(file_bytes) + " > " + gb(avail) + " " + where};
  return {false, "auto: model file " + gb(file_bytes) + " fits in " + gb(avail) + " " + where};
}

/// Everything one loaded model holds. The forward pass scratch, KV cache and logits are reused by every
/// generate() call (callers serialize them, see engine.h).
class LoadedModel {
 public:
  std::shared_ptr<const gguf::GgufFile> file;
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  std::unique_ptr<experts::ExpertSource> experts;
  experts::StreamedExpertSource* streamed = nullptr;  // == experts when it streams; non-owning
  std::string stream_reason;       // decide_streaming's reason (+ the pool's sizing); empty when dense
  uint64_t expert_bank_bytes = 0;  // the file's routed-expert banks
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
  return make_error(errc::kIoError, what + intact.error().message);
}
}  // namespace

Result<std::shared_ptr<LoadedModel>> load_model(const std::string& path, const LoadOptions& options) {
  if (options.context_length < 0) {
    return make_error(errc::kLoadFailed,
                      "context_length must be >= 0 (got " + std::to_string(options.context_length) + ")");
  }
  auto file = gguf::GgufFile::open(path);
  if (!file.ok()) {
    if (file.error().code == errc::kNotFound)
      return make_error(errc::kNotFound, path + ": " + file.error().message);
    return make_error(errc::kLoadFailed, path + ": " + file.error().message);
  }
  auto m = model::Model::load(*file);
  if (!m.ok()) return make_error(errc::kLoadFailed, path + ": " + m.error().message);
  const model::Hparams& hp = (*m)->hparams();
  if (hp.head_dim_k > kMaxHeadDim || hp.head_dim_v > kMaxHeadDim) {
    return make_error(errc::kLoadFailed, path + ": head dimension " +
                                             std::to_string(std::max(hp.head_dim_k, hp.head_dim_v)) +
                                             " larger than the supported " + std::to_string(kMaxHeadDim));
  }
  auto tok = tokenizer::Tokenizer::from_gguf(**file);
  if (!tok.ok()) return make_error(errc::kLoadFailed, path + ": tokenizer: " + tok.error().message);
  if ((*tok)->n_vocab() > hp.n_vocab) {
    return make_error(errc::kLoadFailed, path + ": tokenizer has " + std::to_string((*tok)->n_vocab()) +
                                             " tokens but token_embd.weight only " +
                                             std::to_string(hp.n_vocab) + " rows");
  }
  auto lm = std::make_shared<LoadedModel>();
  lm->file = *file;
  lm->model = *m;
  lm->tok = *tok;
  if (hp.is_moe()) {
    lm->expert_bank_bytes = expert_bank_bytes(lm->model->expert_banks());
    experts::MemoryProbe memory;
    if (options.stream_experts == StreamExperts::automatic) {
      memory = experts::probe_memory("/proc", "/sys/fs/cgroup");
    }
    StreamDecision d = decide_streaming(options.stream_experts, true, lm->file->file_size(), memory);
    lm->stream_reason = d.reason;
    if (d.stream) {
      experts::StreamOptions so;
      so.ram_gb = options.expert_ram_gb;
      so.pool = options.expert_pool;
      so.direct_io = options.direct_io;
      so.reader = options.expert_reader;
      if (!options.state_dir.empty()) {
        auto sidecar = experts::sidecar_path(options.state_dir, path);
        if (!sidecar.ok())
          return make_error(errc::kLoadFailed, path + ": usage sidecar: " + sidecar.error().message);
        so.sidecar_path = *sidecar;
      }
      auto src = experts::StreamedExpertSource::open(path, lm->model->expert_banks(), std::move(so));
      if (!src.ok()) {
        const char* code = src.error().code == errc::kIoError ? errc::kIoError : errc::kLoadFailed;
        return make_error(code, path + ": streamed experts: " + src.error().message);
      }
      lm->streamed = src->get();
      lm->stream_reason += "; " + lm->streamed->join_layout().line();
      lm->experts = std::move(*src);
    } else {
      lm->experts = std::make_unique<experts::ResidentExpertSource>(lm->model->expert_banks());
    }
  }
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  lm->pool = std::make_unique<ThreadPool>(std::max(1, threads));
  const int64_t n_ctx = context_tokens(hp, options);
  lm->forward = std::make_unique<ForwardPass>(lm->model, lm->experts.get(), lm->pool.get(), max_batch(n_ctx));
  lm->forward->set_prefetch(options.prefetch);
  lm->kv = std::make_unique<KvCache>(lm->forward->make_cache(n_ctx));
  lm->logits.resize(static_cast<size_t>(hp.n_vocab));
  // The tokenizer and model read the mapping; a file cut or rewritten meanwhile gave them zeros.
  if (auto intact = lm->file->check_intact(); !intact) {
    return make_error(errc::kLoadFailed, path + ": changed while loading: " + intact.error().message);
  }
  return lm;
}

Result<GenerateResult> generate(LoadedModel& lm, const GenerateRequest& req,
                                const std::function<void(const TokenEvent&)>& on_token,
                                const std::atomic<bool>* cancelled) {
  using clock = std::chrono::steady_clock;
  const int64_t n_vocab = lm.model->hparams().n_vocab;
  if (req.max_tokens < 0) return make_error(errc::kBadRequest, "max_tokens must be >= 0");
  if (req.top_logprobs < 0) return make_error(errc::kBadRequest, "top_logprobs must be >= 0");

  GenerateResult res;
  if (!req.prompt_ids.empty()) {
    res.prompt_tokens = req.prompt_ids;
  } else {
    res.prompt_tokens = lm.tok->encode(req.prompt, req.add_bos, req.parse_special);
  }
  if (res.prompt_tokens.empty()) return make_error(errc::kBadRequest, "the prompt is empty (no tokens)");
  for (int32_t id : res.prompt_tokens) {
    if (id < 0 || id >= n_vocab) {
      return make_error(errc::kBadRequest, "prompt token id " + std::to_string(id) + " outside [0, " +
                                               std::to_string(n_vocab) + ")");
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(res.prompt_tokens.size());
  const int64_t loaded_ctx = lm.kv->n_ctx();
  if (req.num_ctx < 0) return make_error(errc::kBadRequest, "num_ctx must be >= 0");
  if (req.num_ctx > loaded_ctx) {
    return make_error(errc::kBadRequest, "num_ctx " + std::to_string(req.num_ctx) +
                                             " exceeds the context the model is loaded with (" +
                                             std::to_string(loaded_ctx) + " tokens)");
  }
  const int64_t n_ctx = req.num_ctx > 0 ? req.num_ctx : loaded_ctx;
  if (n_prompt + req.max_tokens > n_ctx) {
    return make_error(errc::kContextOverflow, "prompt (" + std::to_string(n_prompt) +
                                                  " tokens) + max_tokens (" + std::to_string(req.max_tokens) +
                                                  ") exceeds the context of " + std::to_string(n_ctx) +
                                                  " tokens");
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
  // A failed eval (io_error) may leave the cache past lm.cached: forget those positions, so the model
  // serves the next request from a consistent prefix.
  auto failed = [&lm](const Error& e) -> Error {
    lm.kv->truncate(std::min(static_cast<int64_t>(lm.cached.size()), lm.kv->n_past()));
    lm.cached.resize(static_cast<size_t>(lm.kv->n_past()));
    return e;
  };
  const auto t0 = clock::now();
  std::span<const int32_t> rest(res.prompt_tokens.data() + common, static_cast<size_t>(n_prompt - common));
  if (Result<void> r = lm.forward->eval(rest, *lm.kv, lm.logits.data(), false); !r) return failed(r.error());
  if (auto ok = check_weights(lm); !ok) return ok.error();
  lm.cached.insert(lm.cached.end(), rest.begin(), rest.end());
  const auto t1 = clock::now();
  res.prompt_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

  Sampler sampler(req.sampling);
  const bool want_logprobs = req.logprobs || req.top_logprobs > 0;
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
    TokenEvent event;
    event.token = id;
    if (req.top_logprobs > 0) {
      res.top_logprobs.push_back(Sampler::top_logprobs(logits, req.top_logprobs));
      event.top_logprobs = res.top_logprobs.back();
    }
    if (want_logprobs) {
      event.logprob = Sampler::logprob_of(logits, id);
      res.logprobs.push_back(event.logprob);
    }
    res.tokens.push_back(id);
    history.push_back(id);
    const StopMatcher::Step step = stops.push(decoder.push(id));
    res.text += step.text;
    if (on_token) {
      event.text = step.text;
      on_token(event);
    }
    if (step.stopped) {
      res.finish_reason = "stop";
      break;
    }
    if (i + 1 < req.max_tokens) {
      if (Result<void> r =
              lm.forward->eval(std::span<const int32_t>(&id, 1), *lm.kv, lm.logits.data(), false);
          !r) {
        return failed(r.error());
      }
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
      if (on_token) {
        TokenEvent last;
        last.token = -1;
        last.text = tail;
        on_token(last);
      }
    }
  }
  res.decode_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
  return res;
}

namespace {
/// Bytes of the file the mapping may bring in: all of it, less the expert banks a streamed model never
/// reads through the mapping.
uint64_t mapped_weight_bytes(const LoadedModel& lm) {
  return lm.file->file_size() - (lm.streamed != nullptr ? lm.expert_bank_bytes : 0);
}
/// A streamed model's expert cache: its share of the pool's budget (or the slots it holds, when leases
/// briefly over-commit). 0 for resident experts.
uint64_t expert_cache_bytes(const LoadedModel& lm) {
  if (lm.streamed == nullptr) return 0;
  return std::max(lm.streamed->stats().cache_bytes, lm.streamed->resident_bytes());
}
/// Bytes of the routed-expert banks named in the file's tensor table.
uint64_t expert_bank_bytes(const gguf::GgufFile& file) {
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const std::string_view name = t.name;
    if (name.ends_with("_exps.weight")) total += t.n_bytes;
  }
  return total;
}
/// A streamed model's expert cache at one slot per bank, from the tensor table: what its source reports as
/// ExpertStats::floor_bytes once open (the same slot arithmetic, experts::expert_slot_bytes).
uint64_t expert_floor_bytes(const gguf::GgufFile& file, int64_t n_layer, int64_t n_expert) {
  if (n_expert <= 0) return 0;
  uint64_t total = 0;
  for (int64_t l = 0; l < n_layer; ++l) {
    uint64_t proj[3] = {0, 0, 0};
    const char* names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    bool bank = true;
    for (int p = 0; p < 3; ++p) {
      const gguf::TensorInfo* t = file.find_tensor("blk." + std::to_string(l) + "." + names[p] + ".weight");
      if (t == nullptr) {
        bank = false;
        break;
      }
      proj[p] = t->n_bytes / static_cast<uint64_t>(n_expert);
    }
    if (bank) total += experts::expert_slot_bytes(proj);
  }
  return total;
}
}  // namespace

Result<MemoryBreakdown> estimate_memory(const std::string& path, const LoadOptions& options) {
  if (options.context_length < 0) {
    return make_error(errc::kLoadFailed,
                      "context_length must be >= 0 (got " + std::to_string(options.context_length) + ")");
  }
  auto file = gguf::GgufFile::open(path);
  if (!file.ok()) {
    if (file.error().code == errc::kNotFound)
      return make_error(errc::kNotFound, path + ": " + file.error().message);
    return make_error(errc::kLoadFailed, path + ": " + file.error().message);
  }
  auto hp = model::read_hparams(**file);
  if (!hp.ok()) return make_error(errc::kLoadFailed, path + ": " + hp.error().message);
  // n_vocab is token_embd's row count, as Model::load takes it.
  const gguf::TensorInfo* embd = (*file)->find_tensor("token_embd.weight");
  if (embd == nullptr || embd->n_dims != 2) {
    return make_error(errc::kLoadFailed, path + ": tensor token_embd.weight missing or not 2-D");
  }
  hp->n_vocab = static_cast<int64_t>(embd->ne[1]);
  const int64_t n_ctx = context_tokens(*hp, options);
  MemoryBreakdown m;
  // A streamed model maps its expert banks but reads them through the expert cache: the streamer's term
  // (its share of the expert budget) goes in `experts`, and its banks come off `weights`.
  m.weights = (*file)->file_size();
  if (hp->is_moe()) {
    // The same decision load_model makes; a streamed model holds at most its banks or the pool's budget.
    experts::MemoryProbe memory;
    if (options.stream_experts == StreamExperts::automatic) {
      memory = experts::probe_memory("/proc", "/sys/fs/cgroup");
    }
    if (decide_streaming(options.stream_experts, true, (*file)->file_size(), memory).stream) {
      const uint64_t banks = expert_bank_bytes(**file);
      const uint64_t budget = options.expert_pool != nullptr ? options.expert_pool->budget_bytes()
                              : options.expert_ram_gb > 0
                                  ? static_cast<uint64_t>(options.expert_ram_gb * 1e9)
                                  : experts::budget_from_available(
                                        experts::probe_memory("/proc", "/sys/fs/cgroup").effective_available);
      m.weights -= std::min(m.weights, banks);
      m.experts_floor = expert_floor_bytes(**file, hp->n_layer, hp->n_expert);
      m.experts = std::max(m.experts_floor, std::min(banks, budget));
    }
  }
  m.kv_cache = ForwardPass::kv_cache_bytes_for(*hp, n_ctx);
  m.scratch = ForwardPass::scratch_bytes_for(*hp, max_batch(n_ctx));
  m.logits = static_cast<uint64_t>(hp->n_vocab) * sizeof(float);
  return m;
}

const gguf::GgufFile& model_file(const LoadedModel& model) { return *model.file; }
const tokenizer::Tokenizer& model_tokenizer(const LoadedModel& model) { return *model.tok; }

int64_t model_context_length(const LoadedModel& lm) {
  return lm.kv->n_ctx();
}

MemoryBreakdown model_memory(const LoadedModel& lm) {
  MemoryBreakdown m;
  m.weights = mapped_weight_bytes(lm);
  m.kv_cache = lm.kv->size_bytes();
  m.scratch = lm.forward->scratch_bytes();
  m.logits = lm.logits.size() * sizeof(float);
  m.experts = expert_cache_bytes(lm);
  if (lm.streamed != nullptr) m.experts_floor = std::min(m.experts, lm.streamed->stats().floor_bytes);
  return m;
}

Result<void> model_check_file(const LoadedModel& lm, const std::string& path) {
  return lm.file->check_current(path);
}

uint64_t model_memory_bytes(const LoadedModel& lm) {
  return model_memory(lm).charged();
}

bool model_streams_experts(const LoadedModel& lm) {
  return lm.streamed != nullptr;
}

const std::string& model_stream_reason(const LoadedModel& lm) {
  return lm.stream_reason;
}

std::optional<experts::ExpertStats> model_expert_stats(const LoadedModel& lm) {
  if (lm.experts == nullptr) return std::nullopt;
  return lm.experts->stats();
}

std::vector<std::string> model_take_warnings(LoadedModel& lm) {
  if (lm.streamed == nullptr) return {};
  return lm.streamed->take_warnings();
}

Result<void> model_save_state(LoadedModel& lm) {
  if (lm.experts == nullptr) return {};
  return lm.experts->save_usage();
}

}  // namespace car::engine
