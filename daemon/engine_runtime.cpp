// The ModelRuntime backed by car::engine (compiled only when the car_engine target exists).
#include <chrono>

#include "core/engine/engine.h"
#include "daemon/model_runtime.h"

namespace car::daemon {

namespace {

class EngineBackend final : public Backend {
 public:
  explicit EngineBackend(std::shared_ptr<engine::LoadedModel> model) : model_(std::move(model)) {}

  Result<GenerateOutput> generate(const GenerateParams& params, const TokenSink& on_token,
                                  const std::atomic<bool>& cancelled) override {
    engine::GenerateRequest req;
    req.prompt = params.prompt;
    req.max_tokens = params.max_tokens;
    if (params.temperature) req.sampling.temperature = static_cast<float>(*params.temperature);
    if (params.top_k) req.sampling.top_k = *params.top_k;
    if (params.top_p) req.sampling.top_p = static_cast<float>(*params.top_p);
    if (params.seed) req.sampling.seed = *params.seed;
    req.stop = params.stop;
    req.ignore_eos = params.ignore_eos;
    std::function<void(const engine::TokenEvent&)> sink;
    if (on_token) sink = [&](const engine::TokenEvent& ev) { on_token(ev.token, ev.text); };
    auto res = engine::generate(*model_, req, sink, &cancelled);
    if (!res) return res.error();
    GenerateOutput out;
    out.text = std::move(res->text);
    out.tokens = std::move(res->tokens);
    out.finish_reason = std::move(res->finish_reason);
    out.prompt_tokens = static_cast<int>(res->prompt_tokens.size());
    out.prompt_ms = res->prompt_ms;
    out.decode_ms = res->decode_ms;
    return out;
  }

  uint64_t memory_bytes() const override { return engine::model_memory_bytes(*model_); }
  bool streams_experts() const override { return engine::model_streams_experts(*model_); }
  void save_state() override { engine::model_save_state(*model_); }
  Result<void> check_file(const std::filesystem::path& path) const override {
    return engine::model_check_file(*model_, path.string());
  }

 private:
  std::shared_ptr<engine::LoadedModel> model_;
};

class EngineRuntime final : public ModelRuntime {
 public:
  explicit EngineRuntime(const RuntimeOptions& options) {
    options_.threads = options.threads;
    options_.stream_experts = options.stream_experts;
    options_.expert_ram_gb = options.expert_ram_gb;
    options_.state_dir = options.state_dir;
  }

  Result<std::shared_ptr<Backend>> load(const std::filesystem::path& path) override {
    auto model = engine::load_model(path.string(), options_);
    if (!model) {
      const auto& e = model.error();
      // The engine's own codes (gguf_truncated, ...) are details; the wire code is load_failed.
      if (e.code == "not_found") return e;
      return make_error("load_failed", e.message.empty() ? e.code : e.code + ": " + e.message);
    }
    return std::shared_ptr<Backend>(std::make_shared<EngineBackend>(std::move(*model)));
  }
  bool available() const override { return true; }
  std::string name() const override { return "engine"; }

 private:
  engine::LoadOptions options_;
};

}  // namespace

std::unique_ptr<ModelRuntime> make_default_runtime(const RuntimeOptions& options) {
  return std::make_unique<EngineRuntime>(options);
}

}  // namespace car::daemon
