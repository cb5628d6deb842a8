// `car bench FILE.gguf -p 128 -n 64 -r 3`: prompt-processing and generation throughput, like llama.cpp's
// llama-bench.
//
// What is measured (each repetition on a fresh sequence, after one untimed warm-up of each test):
//   pp<p>  one generate() call on p random token ids (one batch), max_tokens 1: tokens/s = p / prompt_ms.
//   tg<n>  one generate() call on 1 random id, max_tokens n, greedy, EOS ignored: n forward passes (the
//          1-token prompt plus n-1 single-token decodes; no pass follows the last sampled token), so
//          tokens/s = n / (prompt_ms + decode_ms). This is llama-bench's tg: n sequential 1-token evals
//          starting from an empty context.
//   tg<n> xN  with --parallel N,...: N requests of tg<n> submitted together, run batched by the model's
//          scheduler (one forward pass per step over every sequence, like llama.cpp's llama-batched-bench):
//          aggregate tokens/s = N * n / (wall time from submission to the last one's end), and per stream.
//          Each step reads the weights once for all its sequences: the weight bytes read per step are every
//          tensor but the expert banks (token_embd as above) plus the expert bytes the timed runs leased
//          (each chosen expert once per step: engine::model_expert_bytes_leased) over the steps they ran
//          (SchedulerStats::steps; N * n tokens over them is the tokens per step, N when every step held
//          every sequence); the batched bound is tokens per step * bandwidth / bytes per step, printed
//          with the fraction achieved.
// Reported beside them: model size and parameters (from the GGUF tensor table), the weight bytes read per
// decoded token (every tensor, except that token_embd contributes one row when a separate output matrix
// exists, and MoE expert banks count expert_used_count / expert_count of their size), the decode bound
// bandwidth / bytes-per-token, the fraction of it achieved, and the process's RSS. The bandwidth is
// --bandwidth-gbs when given, else measured here after the tests (and after the RSS figures are taken): the
// best of five timed reads of a 256 MB buffer by the compute threads (measure_read_gbs). Human output prints
// each table row as its test finishes (like llama-bench) and uses decimal units throughout (MB, GB, GB/s).
// `--json` prints one object with all of it.
// `--phases`: where each test's forward steps spend their time (engine::StepPhase: attention products,
// attention, expert products...), per step, measured on the step's own thread while the timed repetitions
// run; "outside" is the rest of the wall time (sampling, the scheduler, streaming the tokens). A clock read
// per phase and layer; the figures it prints are not those of the uninstrumented run above by more than that.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/gguf/gguf_file.h"
#include "core/tensor/kernels.h"
#include "core/util/error_codes.h"
#include "tools/command_registry.h"
#include "tools/model_path.h"
#include "tools/offline_env.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_bench {
namespace {

struct BenchFlags {
  std::string path;
  std::string models_dir;  // --models-dir: where a model id is looked up
  int n_prompt = 128;
  int n_gen = 64;
  int reps = 3;
  double bandwidth_gbs = 0;  // 0 = measure
  EngineFlags engine;        // --threads, --stream-experts, --expert-ram-gb, --state-dir, --no-prefetch
  uint64_t seed = 1;
  bool no_warmup = false;
  bool json = false;
  bool no_iq_panel = false;   // --no-iq-panel: every IQ product in the dot order (A/B of the panel)
  std::vector<int> parallel;  // --parallel: sequence counts for the batched decode test
  bool phases = false;        // --phases: the forward steps' phase breakdown per test
};

/// One test's phase totals (--phases): the forward pass's, and the test's wall time over the same steps.
struct PhaseRow {
  std::string test;
  std::string json_key;  ///< the test's object in --json ("pp", "tg"); empty: the caller places it
  engine::StepPhaseTimes times;
  double wall_s = 0;
  double forward_s() const {
    double sum = 0;
    for (double s : times.seconds) sum += s;
    return sum;
  }
  /// The wall time, at least the forward pass's (the two clocks read at different points).
  double step_wall_s() const { return std::max(wall_s, forward_s()); }
};

void print_phases(const std::vector<PhaseRow>& rows) {
  for (const PhaseRow& r : rows) {
    if (r.times.steps == 0) continue;
    const double steps = static_cast<double>(r.times.steps);
    const double forward = r.forward_s();
    const double wall = r.step_wall_s();
    std::printf(
        "\nphases of %s: %llu steps, %.3f ms a step\n| phase | ms per step | share |\n|---|---:|---:|\n",
        r.test.c_str(), static_cast<unsigned long long>(r.times.steps), wall / steps * 1e3);
    for (int p = 0; p < engine::kStepPhases; ++p) {
      const double sec = r.times.seconds[static_cast<size_t>(p)];
      if (sec <= 0) continue;
      std::printf("| %s | %.3f | %.1f%% |\n", engine::step_phase_name(static_cast<engine::StepPhase>(p)),
                  sec / steps * 1e3, sec / wall * 100.0);
    }
    std::printf("| outside | %.3f | %.1f%% |\n", (wall - forward) / steps * 1e3,
                (wall - forward) / wall * 100.0);
  }
}

nlohmann::json phases_json(const PhaseRow& r) {
  nlohmann::json j = nlohmann::json::object();
  if (r.times.steps == 0) return j;
  const double steps = static_cast<double>(r.times.steps);
  for (int p = 0; p < engine::kStepPhases; ++p) {
    j[engine::step_phase_name(static_cast<engine::StepPhase>(p))] =
        r.times.seconds[static_cast<size_t>(p)] / steps;
  }
  j["outside"] = (r.step_wall_s() - r.forward_s()) / steps;
  j["steps"] = r.times.steps;
  return j;
}

[[noreturn]] void fail(int code, const std::string& message) {
  std::fprintf(stderr, "car bench: %s\n", message.c_str());
  throw CommandFailed(code);
}

/// What the tensor table says about the model.
struct ModelFigures {
  std::string arch;
  uint64_t file_bytes = 0;
  uint64_t tensor_bytes = 0;
  uint64_t params = 0;
  uint64_t bytes_per_token = 0;  // weight bytes read per decoded token
  uint64_t expert_bytes = 0;     // the routed expert banks' bytes (all experts)
  uint64_t expert_bytes_per_token = 0;  // their share of bytes_per_token
  int64_t vocab = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
};

Result<ModelFigures> model_figures(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  if (!file) return file.error();
  const auto& f = **file;
  ModelFigures m;
  m.file_bytes = f.file_size();
  auto arch = f.get_string("general.architecture");
  if (!arch) return arch.error();
  m.arch = *arch;
  auto n_expert = f.get_uint_or(m.arch + ".expert_count", 0);
  if (!n_expert) return n_expert.error();
  auto n_used = f.get_uint_or(m.arch + ".expert_used_count", 0);
  if (!n_used) return n_used.error();
  m.n_expert = static_cast<int64_t>(*n_expert);
  m.n_expert_used = static_cast<int64_t>(*n_used);
  const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) return make_error(errc::kLoadFailed, path + ": no tensor token_embd.weight");
  m.vocab = static_cast<int64_t>(embd->rows());
  const bool tied = f.find_tensor("output.weight") == nullptr;

  double read = 0, experts = 0;
  for (const auto& t : f.tensors()) {
    m.tensor_bytes += t.n_bytes;
    m.params += t.n_elements;
    if (&t == embd && !tied) {
      read += static_cast<double>(t.n_bytes) / static_cast<double>(std::max<uint64_t>(1, t.rows()));
    } else if (m.n_expert > 0 && t.name.find("_exps.") != std::string::npos) {
      const double share = static_cast<double>(t.n_bytes) * static_cast<double>(m.n_expert_used) /
                           static_cast<double>(m.n_expert);
      read += share;
      experts += share;
      m.expert_bytes += t.n_bytes;
    } else {
      read += static_cast<double>(t.n_bytes);
    }
  }
  m.bytes_per_token = static_cast<uint64_t>(read);
  m.expert_bytes_per_token = static_cast<uint64_t>(experts);
  return m;
}

struct Stats {
  double mean = 0;
  double stdev = 0;  // sample standard deviation (n - 1), as llama-bench reports
};

Stats stats_of(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stdev = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return s;
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t vocab, int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

/// One timed generate() call; returns tokens/s by the rules at the top of the file.
double run_once(engine::LoadedModel& model, std::vector<int32_t> prompt, int max_tokens, bool is_pp) {
  engine::GenerateRequest req;
  req.prompt_ids = std::move(prompt);
  req.add_bos = false;
  req.max_tokens = max_tokens;
  req.sampling.temperature = 0;
  req.sampling.repeat_penalty = 1.0f;
  req.ignore_eos = true;
  auto r = engine::generate(model, req, {}, nullptr);
  if (!r) fail(1, r.error().code + ": " + r.error().message);
  if (is_pp) {
    return r->prompt_ms > 0 ? static_cast<double>(r->prompt_tokens.size()) * 1000.0 / r->prompt_ms : 0.0;
  }
  if (static_cast<int>(r->tokens.size()) != max_tokens) {
    fail(1, "generation stopped after " + std::to_string(r->tokens.size()) + " of " +
                std::to_string(max_tokens) + " tokens (finish_reason " + r->finish_reason +
                "); the engine must honour ignore_eos");
  }
  const double ms = r->prompt_ms + r->decode_ms;
  return ms > 0 ? static_cast<double>(max_tokens) * 1000.0 / ms : 0.0;
}

/// N tg<n> requests submitted at once; returns aggregate tokens/s (N * n / wall time to the last one's end).
double run_parallel(engine::LoadedModel& model, std::mt19937_64& rng, int64_t vocab, int n_seq, int max_tokens) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n_seq; ++i) {
    engine::GenerateRequest req;
    req.prompt_ids = random_ids(rng, vocab, 1);
    req.add_bos = false;
    req.max_tokens = max_tokens;
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    engine::GenerateCallbacks cb;
    cb.on_done = [&](Result<engine::GenerateResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      if (!r) {
        error = r.error().code + ": " + r.error().message;
      } else if (static_cast<int>(r->tokens.size()) != max_tokens) {
        error = "generation stopped after " + std::to_string(r->tokens.size()) + " tokens";
      }
      ++done;
      cv.notify_all();
    };
    engine::submit(model, req, std::move(cb), nullptr);
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == n_seq; });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!error.empty()) fail(1, error);
  return s > 0 ? static_cast<double>(n_seq) * static_cast<double>(max_tokens) / s : 0.0;
}

/// The machine's memory read bandwidth in GB/s as `threads` threads see it: each thread sums its share of a
/// 256 MB buffer (written first, so its pages exist), five passes, the fastest counts. The threads are
/// started once and meet at a barrier before and after each pass, so a pass times the reads alone: with a
/// thread started per pass (the first version), a late start counted against a ~3 ms read and the figure
/// swung between 28 and 68 GB/s from one run to the next. About 0.2-0.4 s.
double measure_read_gbs(int threads) {
  constexpr size_t kBytes = 256u << 20;
  constexpr int kPasses = 5;
  const size_t words = kBytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  const int n = std::max(1, threads);
  std::vector<uint64_t> sums(static_cast<size_t>(n));
  std::barrier sync(n);
  std::chrono::steady_clock::time_point t0, t1;
  double best = 0;
  auto worker = [&](int t) {
    const size_t lo = words * static_cast<size_t>(t) / static_cast<size_t>(n);
    const size_t hi = words * static_cast<size_t>(t + 1) / static_cast<size_t>(n);
    for (int pass = 0; pass < kPasses; ++pass) {
      sync.arrive_and_wait();
      if (t == 0) t0 = std::chrono::steady_clock::now();
      uint64_t a = 0, b = 0, c = 0, d = 0;
      size_t i = lo;
      for (; i + 4 <= hi; i += 4) {
        a += buf[i];
        b += buf[i + 1];
        c += buf[i + 2];
        d += buf[i + 3];
      }
      for (; i < hi; ++i) a += buf[i];
      sums[static_cast<size_t>(t)] += a + b + c + d;
      sync.arrive_and_wait();
      if (t == 0) {
        t1 = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(t1 - t0).count();
        if (s > 0) best = std::max(best, static_cast<double>(kBytes) / s / 1e9);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  uint64_t total = 0;
  for (const auto v : sums) total += v;
  if (total == 1) std::fprintf(stderr, " ");  // keeps the sums observable so the reads are not optimized away
  return best;
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void bench(const BenchFlags& f) {
  auto load_or = f.engine.load_options(std::max(f.n_prompt, f.n_gen) + 16);
  if (!load_or) fail(2, load_or.error().message);
  engine::LoadOptions load = std::move(*load_or);
  // The default pool holds every sequence's whole context at car bench's short contexts (engine.h
  // LoadOptions::kv_pool_tokens), so the batched test runs steps of all N sequences.
  if (!f.parallel.empty()) load.parallel = *std::max_element(f.parallel.begin(), f.parallel.end());
  auto figures = model_figures(f.path);
  if (!figures) fail(1, f.path + ": " + figures.error().code + ": " + figures.error().message);
  const ModelFigures& m = *figures;
  if (m.vocab <= 0) fail(1, f.path + ": empty vocabulary");

  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = engine::load_model(f.path, load);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!loaded) fail(1, loaded.error().code + ": " + loaded.error().message);  // the message names the file
  engine::LoadedModel& model = **loaded;

  std::mt19937_64 rng(f.seed);
  if (!f.no_warmup) {
    if (f.n_prompt > 0) run_once(model, random_ids(rng, m.vocab, f.n_prompt), 1, true);
    if (f.n_gen > 0) run_once(model, random_ids(rng, m.vocab, 1), 1, false);
  }
  const int threads = load.threads > 0 ? load.threads : static_cast<int>(std::thread::hardware_concurrency());
  const std::string name = base_name(f.path);
  const double size_mb = static_cast<double>(m.tensor_bytes) / 1e6;
  const bool billions = m.params >= 1000000000ULL;
  const double params = static_cast<double>(m.params) / (billions ? 1e9 : 1e6);
  const char* unit = billions ? "B" : "M";
  const auto print_row = [&](const char* test, int n, const Stats& s) {
    std::printf("| %s | %.2f MB | %.2f %s | %d | %s%d | %.2f ± %.2f |\n", name.c_str(), size_mb, params, unit,
                threads, test, n, s.mean, s.stdev);
    std::fflush(stdout);
  };
  if (!f.json) {
    std::printf("| model | size | params | threads | test | t/s |\n|---|---:|---:|---:|---|---:|\n");
    std::fflush(stdout);
  }
  std::vector<double> pp;
  std::vector<double> tg;
  // --phases: the steps of the timed repetitions (samples: tokens/s of `tokens` each) as one row.
  std::vector<PhaseRow> phase_rows;
  const auto phases_begin = [&] {
    if (f.phases) engine::model_set_phase_timing(model, true);
  };
  const auto phases_end = [&](std::string test, std::string json_key, const std::vector<double>& samples,
                              double tokens) {
    if (!f.phases) return;
    PhaseRow r{std::move(test), std::move(json_key), engine::model_phase_times(model), 0};
    engine::model_set_phase_timing(model, false);
    for (double tps : samples) r.wall_s += tps > 0 ? tokens / tps : 0;
    phase_rows.push_back(std::move(r));
  };
  phases_begin();
  for (int i = 0; i < f.reps && f.n_prompt > 0; ++i) {
    pp.push_back(run_once(model, random_ids(rng, m.vocab, f.n_prompt), 1, true));
  }
  phases_end("pp" + std::to_string(f.n_prompt), "pp", pp, f.n_prompt);
  const Stats pps = stats_of(pp);
  if (!f.json && !pp.empty()) print_row("pp", f.n_prompt, pps);
  phases_begin();
  for (int i = 0; i < f.reps && f.n_gen > 0; ++i) {
    tg.push_back(run_once(model, random_ids(rng, m.vocab, 1), f.n_gen, false));
  }
  phases_end("tg" + std::to_string(f.n_gen), "tg", tg, f.n_gen);
  const Stats tgs = stats_of(tg);
  if (!f.json && !tg.empty()) print_row("tg", f.n_gen, tgs);
  // Batched decode: N sequences at once.
  nlohmann::json parallel_json = nlohmann::json::array();
  struct StepBytes {
    int n_seq = 0;
    double tokens_per_s = 0;
    double bytes = 0;         // weight bytes read per step
    double tokens = 0;        // tokens per step (n_seq when every step held every sequence)
    double expert_share = 0;  // of the expert banks, read per step
  };
  std::vector<StepBytes> step_bytes;
  const uint64_t dense_bytes = m.bytes_per_token - m.expert_bytes_per_token;
  for (int n_seq : f.parallel) {
    if (f.n_gen <= 0) break;
    if (!f.no_warmup) run_parallel(model, rng, m.vocab, n_seq, 2);
    const uint64_t leased0 = engine::model_expert_bytes_leased(model);
    const uint64_t steps0 = engine::model_scheduler_stats(model).steps;
    std::vector<double> agg;
    phases_begin();
    for (int i = 0; i < f.reps; ++i) agg.push_back(run_parallel(model, rng, m.vocab, n_seq, f.n_gen));
    phases_end("tg" + std::to_string(f.n_gen) + " x" + std::to_string(n_seq), "", agg,
               static_cast<double>(n_seq) * f.n_gen);
    const Stats as = stats_of(agg);
    // At least n steps per run (the 1-token prompts' step, then one per token but the last); more when the
    // sequences did not all start in the same step.
    const double steps =
        static_cast<double>(std::max<uint64_t>(1, engine::model_scheduler_stats(model).steps - steps0));
    const double leased = static_cast<double>(engine::model_expert_bytes_leased(model) - leased0) / steps;
    const double tokens = static_cast<double>(n_seq) * f.reps * f.n_gen / steps;
    step_bytes.push_back({n_seq, as.mean, static_cast<double>(dense_bytes) + leased, tokens,
                          m.expert_bytes > 0 ? leased / static_cast<double>(m.expert_bytes) : 0});
    if (!f.json) {
      std::printf("| %s | %.2f MB | %.2f %s | %d | tg%d x%d | %.2f ± %.2f (%.2f per stream) |\n", name.c_str(),
                  size_mb, params, unit, threads, f.n_gen, n_seq, as.mean, as.stdev, as.mean / n_seq);
      std::fflush(stdout);
    }
    parallel_json.push_back({{"n_seq", n_seq},
                             {"n_tokens", f.n_gen},
                             {"samples", agg},
                             {"tokens_per_s", {{"mean", as.mean}, {"stdev", as.stdev}}},
                             {"per_stream_tokens_per_s", as.mean / n_seq},
                             {"weight_bytes_per_step", step_bytes.back().bytes},
                             {"tokens_per_step", step_bytes.back().tokens},
                             {"expert_banks_read_per_step", step_bytes.back().expert_share}});
    if (f.phases) parallel_json.back()["phases"] = phases_json(phase_rows.back());
  }
  save_expert_usage(model, "car bench");
  // The memory figures first: the bandwidth probe's buffer must not count as the model's peak.
  const uint64_t rss = proc_status_bytes("VmRSS");
  const uint64_t hwm = proc_status_bytes("VmHWM");
  const bool measured = f.bandwidth_gbs <= 0;
  const double bandwidth_gbs = measured ? measure_read_gbs(threads) : f.bandwidth_gbs;
  const double bound =
      m.bytes_per_token > 0 ? bandwidth_gbs * 1e9 / static_cast<double>(m.bytes_per_token) : 0;
  const double fraction = bound > 0 && !tg.empty() ? tgs.mean / bound : 0;

  if (f.json) {
    nlohmann::json out;
    out["model"] = f.path;
    out["arch"] = m.arch;
    out["file_bytes"] = m.file_bytes;
    out["tensor_bytes"] = m.tensor_bytes;
    out["params"] = m.params;
    out["n_expert"] = m.n_expert;
    out["n_expert_used"] = m.n_expert_used;
    out["threads"] = threads;
    out["isa"] = std::string(tensor::isa_name(tensor::current_isa()));
    out["streams_experts"] = engine::model_streams_experts(model);
    out["load_ms"] = load_ms;
    auto test = [](int n, int reps, const std::vector<double>& samples, const Stats& s) {
      return nlohmann::json{{"n_tokens", n},
                            {"reps", reps},
                            {"samples", samples},
                            {"tokens_per_s", {{"mean", s.mean}, {"stdev", s.stdev}}}};
    };
    if (!pp.empty()) out["pp"] = test(f.n_prompt, f.reps, pp, pps);
    if (!tg.empty()) out["tg"] = test(f.n_gen, f.reps, tg, tgs);
    for (const PhaseRow& r : phase_rows) {
      if (!r.json_key.empty() && out.contains(r.json_key)) out[r.json_key]["phases"] = phases_json(r);
    }
    if (!parallel_json.empty()) out["parallel"] = parallel_json;
    out["weight_bytes_per_token"] = m.bytes_per_token;
    out["bandwidth_gbs"] = bandwidth_gbs;
    out["bandwidth_source"] = measured ? "measured" : "given";
    out["decode_bound_tokens_per_s"] = bound;
    out["decode_fraction_of_bound"] = fraction;
    for (size_t i = 0; i < step_bytes.size() && i < out["parallel"].size(); ++i) {
      const double b = step_bytes[i].tokens * bandwidth_gbs * 1e9 / step_bytes[i].bytes;
      out["parallel"][i]["bound_tokens_per_s"] = b;
      out["parallel"][i]["fraction_of_bound"] = step_bytes[i].tokens_per_s / b;
    }
    out["model_memory_bytes"] = engine::model_memory_bytes(model);
    out["rss_bytes"] = rss;
    out["peak_rss_bytes"] = hwm;
    out["experts"] = experts_json(model);
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("\nweight bytes read per decoded token: %.1f MB; decode bound at %.1f GB/s (%s): %.1f tok/s",
              static_cast<double>(m.bytes_per_token) / 1e6, bandwidth_gbs,
              measured ? "measured read rate" : "given", bound);
  if (!tg.empty()) std::printf("; achieved %.0f%%", fraction * 100.0);
  for (const StepBytes& sb : step_bytes) {
    const double b = sb.tokens * bandwidth_gbs * 1e9 / sb.bytes;
    std::printf("\ntg%d x%d: weight bytes read per step %.1f MB", f.n_gen, sb.n_seq, sb.bytes / 1e6);
    if (m.expert_bytes > 0) std::printf(" (%.0f%% of the expert banks)", sb.expert_share * 100.0);
    std::printf("; %.2f tokens per step; bound %.1f tok/s; achieved %.0f%%", sb.tokens, b,
                sb.tokens_per_s / b * 100.0);
  }
  if (auto e = engine::model_expert_stats(model); e && engine::model_streams_experts(model)) {
    std::printf(
        "\nexperts streamed (%s): cap %d/bank, pinned %d, hit rate %.1f%%, %.1f MB read, read p50 %.0f us "
        "p99 %.0f us, prefetch recall %.1f%%, precision %.1f%% (%d/%d layers reading ahead, %llu issued, %llu "
        "scored only)",
        engine::model_stream_reason(model).c_str(), e->cap, e->pinned, e->hit_rate * 100.0,
        static_cast<double>(e->bytes_read) / 1e6, e->read_p50_us, e->read_p99_us, e->prefetch_recall * 100.0,
        e->prefetch_precision * 100.0, e->prefetch_layers_on, e->banks,
        static_cast<unsigned long long>(e->prefetch_issued), static_cast<unsigned long long>(e->prefetch_scored));
  }
  print_phases(phase_rows);
  std::printf("\nisa %s; load %.1f ms; RSS %.1f MB (peak %.1f MB); file %.1f MB\n",
              std::string(tensor::isa_name(tensor::current_isa())).c_str(), load_ms,
              static_cast<double>(rss) / 1e6, static_cast<double>(hwm) / 1e6,
              static_cast<double>(m.file_bytes) / 1e6);
}

void setup_bench(CLI::App& root) {
  auto flags = std::make_shared<BenchFlags>();
  auto* cmd = root.add_subcommand("bench", "Prompt-processing and generation tokens/s (like llama-bench)");
  cmd->add_option("file", flags->path, "GGUF model file, or a model id in the models directory")->required();
  cmd->add_option("--models-dir", flags->models_dir,
                  "Where model ids are looked up (default: CAR_INFERENCE_MODELS_DIR, else a running daemon's, else "
                  "the daemon's default)");
  cmd->add_option("-p,--n-prompt", flags->n_prompt, "Prompt tokens processed in one batch; 0 = skip")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", flags->n_gen, "Tokens generated one at a time; 0 = skip")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("-r,--repetitions", flags->reps, "Repetitions of each test")->check(CLI::Range(1, 1000));
  flags->engine.add_to(cmd);
  cmd->add_option("--bandwidth-gbs", flags->bandwidth_gbs,
                  "Memory bandwidth for the decode bound, GB/s; 0 = measure this machine's read rate")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Seed for the random prompt ids");
  cmd->add_flag("--no-warmup", flags->no_warmup, "Skip the untimed warm-up runs");
  cmd->add_flag("--json", flags->json, "Print one JSON object");
  cmd->add_flag("--no-iq-panel", flags->no_iq_panel,
                "Multiply the IQ types in ggml_vec_dot's order in every batch, not llama.cpp's IQ panel order for "
                "batches of 8+ (its GGML_NO_IQ_PANEL), to compare the two");
  cmd->add_option("--parallel", flags->parallel,
                  "Batched decode: run tg<n> with N sequences at once for each N given (e.g. 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_flag(
      "--phases", flags->phases,
      "Print where each test's forward steps spend their time (attention, expert products, ...), per "
      "step");
  cmd->callback([flags] {
    flags->path = resolve_model_path(flags->path, flags->models_dir, "car bench");
    if (flags->no_iq_panel) tensor::set_iq_panel_enabled(false);
    bench(*flags);
  });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup_bench);

}  // namespace car::tools::cmd_bench
