// load_model / generate: the engine's public face (engine.h) over Model + ForwardPass + Tokenizer + Sampler.
#include "core/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <cstdio>
#include <thread>

#include "core/engine/forward.h"
#include "core/engine/sampler.h"
#include "core/engine/scheduler.h"
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
  const uint64_t kv_bytes = options.kv_pool_bytes > 0 ? options.kv_pool_bytes : options.context_memory_bytes;
  if (kv_bytes == 0 || hp.n_ctx_train <= 0) {
    return std::min<int64_t>(hp.n_ctx_train, kDefaultMaxContext);
  }
  // The trained context, shortened (to a multiple of 256 tokens, at least 256) until the default pool's
  // full contexts fit.
  const uint64_t per_token = std::max<uint64_t>(1, ForwardPass::kv_cache_bytes_for(hp, 1));
  const uint64_t contexts = static_cast<uint64_t>(std::clamp(options.parallel, 1, kPoolContexts));
  int64_t fit = static_cast<int64_t>(kv_bytes / contexts / per_token);
  fit = std::max<int64_t>(256, fit / 256 * 256);
  return std::min<int64_t>(hp.n_ctx_train, fit);
}
int64_t max_batch(int64_t n_ctx) {
  return std::min(kMaxBatch, n_ctx);
}
/// The sequences a load with `options` runs: `parallel`, at least 1 and at most a step's rows.
int sequence_slots(const LoadOptions& options, int64_t n_ctx) {
  return std::clamp<int>(options.parallel, 1, static_cast<int>(max_batch(n_ctx)));
}
/// The KV pool's positions for a load of `hp` with `options` (LoadOptions::kv_pool_bytes).
int64_t pool_tokens(const model::Hparams& hp, const LoadOptions& options, int64_t n_ctx) {
  const int slots = sequence_slots(options, n_ctx);
  const int64_t full = static_cast<int64_t>(slots) * n_ctx;
  const uint64_t per_token = std::max<uint64_t>(1, ForwardPass::kv_cache_bytes_for(hp, 1));
  // The default: min(slots, kPoolContexts) whole contexts - and where contexts are short, up to the positions
  // of kPoolContexts contexts of the default length (fewer if the KV memory budget holds fewer), so that
  // short-context sequences run all at once rather than in waves of kPoolContexts (a daemon with a small
  // context and more sequences, `car bench --parallel`). Contexts of the default length are unchanged.
  int64_t floor = static_cast<int64_t>(kPoolContexts) * kDefaultMaxContext;
  if (options.context_memory_bytes > 0) {
    floor = std::min(floor, static_cast<int64_t>(options.context_memory_bytes / per_token));
  }
  int64_t pool = std::max(static_cast<int64_t>(std::min(slots, kPoolContexts)) * n_ctx, std::min(full, floor));
  if (options.kv_pool_tokens > 0) {
    pool = options.kv_pool_tokens;
  } else if (options.kv_pool_bytes > 0) {
    pool = static_cast<int64_t>(std::min<uint64_t>(options.kv_pool_bytes / per_token, static_cast<uint64_t>(full)));
  }
  return std::clamp<int64_t>(pool, 1, full);
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
  // Declared last: destroyed first, its thread stopped before the pool, experts and model it uses go.
  std::unique_ptr<Scheduler> scheduler;
};

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
  if (hp.is_mla() && hp.mla_cache_dim_k() > kMaxHeadDim) {  // deepseek2: one attention head of this width
    return make_error(errc::kLoadFailed, path + ": MLA cache row kv_lora_rank + rope = " +
                                             std::to_string(hp.mla_cache_dim_k()) + " larger than the supported " +
                                             std::to_string(kMaxHeadDim));
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
      lm->experts = std::make_unique<experts::ResidentExpertSource>(lm->model->expert_banks(),
                                                                    lm->model->file().fd() >= 0);
    }
  }
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  lm->pool = std::make_unique<ThreadPool>(std::max(1, threads));
  const int64_t n_ctx = context_tokens(hp, options);
  auto forward = std::make_unique<ForwardPass>(lm->model, lm->experts.get(), lm->pool.get(), max_batch(n_ctx));
  forward->set_prefetch(options.prefetch);
  SchedulerOptions so;
  so.slots = sequence_slots(options, n_ctx);
  so.n_ctx = n_ctx;
  so.pool_tokens = pool_tokens(hp, options, n_ctx);
  so.step_tokens = options.step_tokens;
  so.max_queued = std::max(0, options.max_queued);
  so.gate = options.compute_gate;
  auto scheduler = Scheduler::create(lm->model, lm->tok, lm->file, std::move(forward), so);
  if (!scheduler.ok()) return make_error(errc::kLoadFailed, path + ": " + scheduler.error().message);
  lm->scheduler = std::move(*scheduler);
  // The tokenizer and model read the mapping; a file cut or rewritten meanwhile gave them zeros.
  if (auto intact = lm->file->check_intact(); !intact) {
    return make_error(errc::kLoadFailed, path + ": changed while loading: " + intact.error().message);
  }
  return lm;
}

Result<GenerateResult> generate(LoadedModel& lm, const GenerateRequest& req,
                                const std::function<void(const TokenEvent&)>& on_token,
                                const std::atomic<bool>* cancelled) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<GenerateResult>> out;
  GenerateCallbacks cb;
  if (on_token) cb.on_token = [&on_token](const TokenEvent& e) { on_token(e); };
  cb.on_done = [&](Result<GenerateResult> r) {
    std::lock_guard<std::mutex> lock(mu);
    out.emplace(std::move(r));
    cv.notify_all();
  };
  lm.scheduler->submit(req, std::move(cb), cancelled);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return out.has_value(); });
  return std::move(*out);
}

void submit(LoadedModel& lm, const GenerateRequest& request, GenerateCallbacks callbacks,
            const std::atomic<bool>* cancelled) {
  lm.scheduler->submit(request, std::move(callbacks), cancelled);
}

SchedulerStats model_scheduler_stats(const LoadedModel& lm) { return lm.scheduler->stats(); }
void model_set_phase_timing(LoadedModel& lm, bool on) {
  lm.scheduler->set_phase_timing(on);
}
StepPhaseTimes model_phase_times(const LoadedModel& lm) {
  return lm.scheduler->phase_times();
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
  const int slots = sequence_slots(options, n_ctx);
  m.kv_cache = static_cast<uint64_t>(pool_tokens(*hp, options, n_ctx)) * ForwardPass::kv_cache_bytes_for(*hp, 1);
  m.scratch = ForwardPass::scratch_bytes_for(*hp, max_batch(n_ctx));
  m.logits = static_cast<uint64_t>(slots) * static_cast<uint64_t>(hp->n_vocab) * sizeof(float);
  return m;
}

const gguf::GgufFile& model_file(const LoadedModel& model) { return *model.file; }
const tokenizer::Tokenizer& model_tokenizer(const LoadedModel& model) { return *model.tok; }

int64_t model_context_length(const LoadedModel& lm) {
  return lm.scheduler->n_ctx();
}

int64_t model_kv_pool_tokens(const LoadedModel& lm) { return lm.scheduler->pool_tokens(); }

uint64_t model_kv_resident_bytes(const LoadedModel& lm) { return lm.scheduler->kv_bytes_mapped_resident(); }

MemoryBreakdown model_memory(const LoadedModel& lm) {
  MemoryBreakdown m;
  m.weights = mapped_weight_bytes(lm);
  m.kv_cache = lm.scheduler->kv_bytes();  // the pool in full: charged before any position is written
  m.scratch = lm.scheduler->forward().scratch_bytes();
  m.logits = lm.scheduler->logits_bytes();
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

uint64_t model_expert_bytes_leased(const LoadedModel& lm) {
  if (lm.experts == nullptr) return 0;
  const experts::ExpertSource& src = *lm.experts;
  uint64_t bytes = 0;
  for (int l = 0; l < src.n_layers(); ++l) {
    const experts::ExpertBankInfo& b = src.bank(l);
    if (b.n_expert <= 0) continue;
    const uint64_t per_expert = b.expert_bytes();
    for (int e = 0; e < b.n_expert; ++e) bytes += src.use_count(l, e) * per_expert;
  }
  return bytes;
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
