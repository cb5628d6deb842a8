// `car gguf inspect FILE [--json] [--full]` and `car gguf synth ... -o FILE`.
//
// inspect prints a GGUF's version, layout (alignment, data offset), metadata (arrays longer than
// kArrayPreview items summarized as their element type, count and first items unless --full), tensors
// (name, type, shape in GGUF order, offset relative to the data section, bytes), totals per type, and for
// MoE models the expert banks per layer (blk.N.ffn_{gate,up,down}_exps.weight: experts, bytes per expert).
// Keys, strings and tensor names come from the file: control characters and bytes that are not UTF-8 are
// printed as escapes (terminal_text). Enums stored as numbers are decoded: general.file_type by its
// llama.cpp name (15 -> Q4_K_M), tokenizer.ggml.token_type as counts per type (normal, control, byte...).
// --json prints one object: {"version", "alignment", "data_offset", "file_size", "metadata": {...},
// "tensors": [{"name", "type", "shape", "offset", "bytes"}], "totals": {...}, "expert_banks": [...],
// "decoded": {"file_type", "token_types"}}; a summarized array is {"array": elem type, "count": n, "first":
// [...]}.
//
// synth writes a synthetic model (core/synth) with seeded random weights, tensor by tensor (bounded memory,
// whatever the model's size), and prints the file, its size and the write rate.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>

#include "core/gguf/gguf_file.h"
#include "core/gguf/model_info.h"
#include "core/synth/synth_model.h"
#include "tools/command_registry.h"
#include "tools/terminal_text.h"

// A namespace of its own: `car` may be compiled in unity batches (tools/CMakeLists.txt).
namespace car::tools::cmd_gguf {
namespace {

using gguf::ArrayValue;
using gguf::GgufFile;
using gguf::Value;
using gguf::ValueType;
using json = nlohmann::ordered_json;  // keeps metadata in file order

constexpr size_t kArrayPreview = 8;

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "car gguf: %s\n", msg.c_str());
  throw CommandFailed(1);
}

// ---- inspect --------------------------------------------------------------------------------------

json value_json(const Value& v, bool full) {
  switch (v.type()) {
    case ValueType::UINT8:
      return *v.get_if<uint8_t>();
    case ValueType::INT8:
      return *v.get_if<int8_t>();
    case ValueType::UINT16:
      return *v.get_if<uint16_t>();
    case ValueType::INT16:
      return *v.get_if<int16_t>();
    case ValueType::UINT32:
      return *v.get_if<uint32_t>();
    case ValueType::INT32:
      return *v.get_if<int32_t>();
    case ValueType::FLOAT32:
      return *v.get_if<float>();
    case ValueType::BOOL:
      return *v.get_if<bool>();
    case ValueType::STRING:
      return *v.get_if<std::string>();
    case ValueType::UINT64:
      return *v.get_if<uint64_t>();
    case ValueType::INT64:
      return *v.get_if<int64_t>();
    case ValueType::FLOAT64:
      return *v.get_if<double>();
    case ValueType::ARRAY: {
      const auto& a = *v.get_if<ArrayValue>();
      const bool summarize = !full && a.items.size() > kArrayPreview;
      json items = json::array();
      for (size_t i = 0; i < a.items.size() && (!summarize || i < kArrayPreview); ++i) {
        items.push_back(value_json(a.items[i], full));
      }
      if (!summarize) return items;
      return json{
          {"array", std::string(value_type_name(a.elem_type))}, {"count", a.items.size()}, {"first", items}};
    }
  }
  return nullptr;
}

std::string value_text(const Value& v, bool full) {
  switch (v.type()) {
    case ValueType::STRING:
      return terminal_text(*v.get_if<std::string>(), true, full ? std::string::npos : 200);
    case ValueType::BOOL:
      return *v.get_if<bool>() ? "true" : "false";
    case ValueType::FLOAT32: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(*v.get_if<float>()));
      return buf;
    }
    case ValueType::FLOAT64: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", *v.get_if<double>());
      return buf;
    }
    case ValueType::ARRAY: {
      const auto& a = *v.get_if<ArrayValue>();
      const bool summarize = !full && a.items.size() > kArrayPreview;
      std::string out = "[";
      for (size_t i = 0; i < a.items.size() && (!summarize || i < kArrayPreview); ++i) {
        if (i > 0) out += ", ";
        out += value_text(a.items[i], full);
      }
      if (summarize) out += ", ... (" + std::to_string(a.items.size()) + " items)";
      return out + "]";
    }
    case ValueType::UINT64:
      return std::to_string(*v.get_if<uint64_t>());
    default:
      return std::to_string(*v.as_int());
  }
}

std::string type_label(const Value& v) {
  std::string s(value_type_name(v.type()));
  if (const auto* a = v.get_if<ArrayValue>()) {
    s += "[" + std::string(value_type_name(a->elem_type)) + "; " + std::to_string(a->items.size()) + "]";
  }
  return s;
}

std::string shape_text(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

struct ExpertBank {
  uint32_t layer;
  std::string kind;  // gate | up | down
  const gguf::TensorInfo* tensor;
  uint64_t n_expert;
  uint64_t bytes_per_expert;
};

std::vector<ExpertBank> expert_banks(const GgufFile& f) {
  static const std::regex re(R"(blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight)");
  std::vector<ExpertBank> banks;
  for (const auto& t : f.tensors()) {
    std::smatch m;
    if (!std::regex_match(t.name, m, re) || t.n_dims < 3) continue;
    const uint64_t n_expert = t.ne[t.n_dims - 1];
    banks.push_back(
        {static_cast<uint32_t>(std::stoul(m[1].str())), m[2].str(), &t, n_expert, t.n_bytes / n_expert});
  }
  std::sort(banks.begin(), banks.end(), [](const ExpertBank& a, const ExpertBank& b) {
    auto rank = [](const std::string& k) { return k == "gate" ? 0 : k == "up" ? 1 : 2; };
    return a.layer != b.layer ? a.layer < b.layer : rank(a.kind) < rank(b.kind);
  });
  return banks;
}

// The enums a GGUF stores as numbers, by name: general.file_type (llama_ftype) and the count of each
// tokenizer.ggml.token_type value. Empty strings / maps when the file has neither.
struct DecodedEnums {
  std::string file_type;                        // "Q4_K_M", or "unknown (N)"
  std::map<std::string, uint64_t> token_types;  // "normal" -> count, in name order
};

DecodedEnums decode_enums(const GgufFile& f) {
  DecodedEnums d;
  if (const Value* v = f.find("general.file_type")) {
    if (const auto n = v->as_int(); n && *n >= 0) {
      const auto name = gguf::file_type_name(static_cast<uint64_t>(*n));
      d.file_type = name ? *name : "unknown (" + std::to_string(*n) + ")";
    }
  }
  if (const Value* v = f.find("tokenizer.ggml.token_type")) {
    if (const auto* a = v->get_if<ArrayValue>()) {
      for (const auto& item : a->items) {
        const auto n = item.as_int();
        const auto name = n ? gguf::token_type_name(*n) : std::nullopt;
        d.token_types[name ? std::string(*name) : "unknown (" + (n ? std::to_string(*n) : "?") + ")"] += 1;
      }
    }
  }
  return d;
}

std::string token_types_text(const std::map<std::string, uint64_t>& counts) {
  std::string s;
  for (const auto& [name, n] : counts) s += (s.empty() ? "" : ", ") + name + " " + std::to_string(n);
  return s;
}

void inspect(const std::string& path, bool as_json, bool full) {
  auto opened = GgufFile::open(path);
  if (!opened) fail(terminal_text(opened.error().message, false) + " [" + opened.error().code + "]");
  const GgufFile& f = **opened;

  uint64_t total_bytes = 0;
  uint64_t total_elements = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // name -> (count, bytes)
  for (const auto& t : f.tensors()) {
    total_bytes += t.n_bytes;
    total_elements += t.n_elements;
    auto& e = by_type[std::string(ggml_type_name(t.type))];
    e.first += 1;
    e.second += t.n_bytes;
  }
  const auto banks = expert_banks(f);
  const DecodedEnums decoded = decode_enums(f);

  if (as_json) {
    json out;
    out["file"] = path;
    out["version"] = f.version();
    out["alignment"] = f.alignment();
    out["data_offset"] = f.data_offset();
    out["file_size"] = f.file_size();
    json md = json::object();
    for (const auto& kv : f.metadata()) md[kv.key] = value_json(kv.value, full);
    out["metadata"] = md;
    json tensors = json::array();
    for (const auto& t : f.tensors()) {
      tensors.push_back({{"name", t.name},
                         {"type", std::string(ggml_type_name(t.type))},
                         {"shape", std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)},
                         {"offset", t.offset},
                         {"bytes", t.n_bytes}});
    }
    out["tensors"] = tensors;
    json types = json::object();
    for (const auto& [name, e] : by_type) types[name] = {{"count", e.first}, {"bytes", e.second}};
    out["totals"] = {{"tensors", f.tensors().size()},
                     {"elements", total_elements},
                     {"bytes", total_bytes},
                     {"by_type", types}};
    json jb = json::array();
    for (const auto& b : banks) {
      jb.push_back({{"layer", b.layer},
                    {"kind", b.kind},
                    {"tensor", b.tensor->name},
                    {"type", std::string(ggml_type_name(b.tensor->type))},
                    {"n_expert", b.n_expert},
                    {"bytes_per_expert", b.bytes_per_expert},
                    {"bytes", b.tensor->n_bytes}});
    }
    out["expert_banks"] = jb;
    json dec = json::object();
    if (!decoded.file_type.empty()) dec["file_type"] = decoded.file_type;
    if (!decoded.token_types.empty()) dec["token_types"] = decoded.token_types;
    out["decoded"] = dec;
    std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return;
  }

  // Human output: every string that comes from the file (or the command line) goes through terminal_text.
  std::printf("%s: GGUF version %u, alignment %" PRIu64 ", data offset %" PRIu64 ", file size %" PRIu64 "\n",
              terminal_text(path, false).c_str(), f.version(), f.alignment(), f.data_offset(), f.file_size());
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  size_t key_width = 0;
  for (const auto& kv : f.metadata()) key_width = std::max(key_width, terminal_text(kv.key, false).size());
  for (const auto& kv : f.metadata()) {
    std::string text = value_text(kv.value, full);
    if (kv.key == "general.file_type" && !decoded.file_type.empty()) text += " (" + decoded.file_type + ")";
    if (kv.key == "tokenizer.ggml.token_type" && !decoded.token_types.empty()) {
      text += " {" + token_types_text(decoded.token_types) + "}";
    }
    std::printf("  %-*s %-20s %s\n", static_cast<int>(key_width), terminal_text(kv.key, false).c_str(),
                type_label(kv.value).c_str(), text.c_str());
  }
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, terminal_text(t.name, false).size());
  std::printf("  %-*s %-7s %-20s %12s %12s\n", static_cast<int>(name_width), "name", "type", "shape",
              "offset", "bytes");
  for (const auto& t : f.tensors()) {
    std::printf("  %-*s %-7s %-20s %12" PRIu64 " %12" PRIu64 "\n", static_cast<int>(name_width),
                terminal_text(t.name, false).c_str(), std::string(ggml_type_name(t.type)).c_str(),
                shape_text(t).c_str(), t.offset, t.n_bytes);
  }
  std::printf("\ntotals: %zu tensors, %" PRIu64 " elements, %" PRIu64 " bytes of tensor data (%.2f MiB)\n",
              f.tensors().size(), total_elements, total_bytes, static_cast<double>(total_bytes) / (1 << 20));
  for (const auto& [name, e] : by_type) {
    std::printf("  %-7s %4" PRIu64 " tensors %14" PRIu64 " bytes\n", name.c_str(), e.first, e.second);
  }
  if (!banks.empty()) {
    std::printf("\nexpert banks (%zu):\n", banks.size());
    for (const auto& b : banks) {
      std::printf("  blk.%-3u %-4s %-6s %3" PRIu64 " experts x %10" PRIu64 " bytes = %12" PRIu64 " bytes\n",
                  b.layer, b.kind.c_str(), std::string(ggml_type_name(b.tensor->type)).c_str(), b.n_expert,
                  b.bytes_per_expert, b.tensor->n_bytes);
    }
  }
}

// ---- synth ----------------------------------------------------------------------------------------

struct SynthOptions {
  synth::SynthSpec spec;
  std::string out;
  std::string chat_template_file;
};

void run_synth(const SynthOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  auto w = synth::build_synth_model(o.spec);
  if (!w) fail(w.error().message + " [" + w.error().code + "]");
  if (auto r = w->write(o.out); !r) fail(r.error().message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto f = GgufFile::open(o.out);
  if (!f) fail("wrote " + o.out + " but cannot read it back: " + f.error().message);
  const uint64_t size = (*f)->file_size();
  std::printf("wrote %s: %s, %zu tensors, %" PRIu64 " bytes in %.1f s (%.1f MB/s)\n", o.out.c_str(),
              (*f)->get_string("general.name").value().c_str(), (*f)->tensors().size(), size, seconds,
              seconds > 0 ? static_cast<double>(size) / seconds / 1e6 : 0.0);
}

void setup(CLI::App& root) {
  auto* g = root.add_subcommand("gguf", "Inspect GGUF files and write synthetic models");
  g->require_subcommand(1);

  auto* ins = g->add_subcommand("inspect", "Print a GGUF file's metadata and tensors");
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto full = std::make_shared<bool>(false);
  ins->add_option("file", *path, "GGUF file")->required();
  ins->add_flag("--json", *as_json, "One JSON object (CONTRACT.md)");
  ins->add_flag("--full", *full, "Print long arrays and strings whole");
  ins->callback([path, as_json, full] { inspect(*path, *as_json, *full); });

  auto* syn = g->add_subcommand("synth", "Write a synthetic model with seeded random weights");
  auto o = std::make_shared<SynthOptions>();
  auto& s = o->spec;
  syn->add_option("-o,--output", o->out, "Output .gguf file")->required();
  syn->add_option("--arch", s.arch,
                  "llama | qwen2 | qwen2moe | qwen3 | qwen3moe | gemma2 | gemma3 | gpt-oss | deepseek2")
      ->capture_default_str();
  syn->add_option("--layers", s.n_layer, "Number of blocks")->capture_default_str();
  syn->add_option("--embd", s.n_embd, "Embedding width")->capture_default_str();
  syn->add_option("--ff", s.n_ff, "Dense FFN width (qwen3moe, qwen2moe: feed_forward_length)")->capture_default_str();
  syn->add_option("--ff-expert", s.n_ff_expert, "Expert FFN width (0 = --ff)")->capture_default_str();
  syn->add_option("--ff-shared", s.n_ff_shared, "qwen2moe: the shared expert's FFN width (0 = --ff)")
      ->capture_default_str();
  syn->add_option("--heads", s.n_head, "Attention heads")->capture_default_str();
  syn->add_option("--kv-heads", s.n_head_kv, "KV heads")->capture_default_str();
  syn->add_option("--head-dim", s.head_dim, "Head dimension (0 = embd / heads)")->capture_default_str();
  syn->add_option("--experts", s.n_expert, "Experts (llama: > 0 makes it a Mixtral-style MoE)")
      ->capture_default_str();
  syn->add_option("--experts-used", s.n_expert_used, "Experts used per token (0 = min(2, experts))")
      ->capture_default_str();
  syn->add_option("--vocab", s.n_vocab, "Vocabulary size (>= 260)")->capture_default_str();
  syn->add_option("--ctx", s.n_ctx, "Context length")->capture_default_str();
  syn->add_option("--rope-base", s.rope_freq_base, "RoPE base (0 = arch default)")->capture_default_str();
  syn->add_option("--yarn-factor", s.rope_scaling_factor,
                  "gpt-oss: YaRN rope.scaling.factor (0 = 32); deepseek2: 0 = no YaRN")
      ->capture_default_str();
  syn->add_option("--yarn-orig-ctx", s.rope_orig_ctx,
                  "gpt-oss, deepseek2: rope.scaling.original_context_length (0 = 4096)")
      ->capture_default_str();
  syn->add_option("--yarn-log-mul", s.yarn_log_multiplier,
                  "deepseek2: rope.scaling.yarn_log_multiplier with --yarn-factor (0 = not written)")
      ->capture_default_str();
  syn->add_option("--q-lora-rank", s.q_lora_rank, "deepseek2: attention.q_lora_rank (0 = a plain attn_q)")
      ->capture_default_str();
  syn->add_option("--kv-lora-rank", s.kv_lora_rank, "deepseek2: attention.kv_lora_rank (0 = embd / 2)")
      ->capture_default_str();
  syn->add_option("--rope-dim", s.rope_dim, "deepseek2: the rope part of a head (0 = head dim / 2)")
      ->capture_default_str();
  syn->add_option("--v-head-dim", s.v_head_dim, "deepseek2: value_length_mla (0 = head dim)")
      ->capture_default_str();
  syn->add_option("--dense-lead", s.n_dense_lead, "deepseek2: leading_dense_block_count")
      ->capture_default_str();
  syn->add_option("--shared-experts", s.n_expert_shared, "deepseek2: expert_shared_count")
      ->capture_default_str();
  syn->add_option("--expert-groups", s.n_expert_groups, "deepseek2: expert_group_count (0 = not written)")
      ->capture_default_str();
  syn->add_option("--expert-groups-used", s.n_group_used, "deepseek2: expert_group_used_count")
      ->capture_default_str();
  syn->add_option("--expert-weights-scale", s.expert_weights_scale, "deepseek2: expert_weights_scale")
      ->capture_default_str();
  syn->add_option("--expert-weights-norm", s.expert_weights_norm,
                  "deepseek2: expert_weights_norm (true/false)")
      ->capture_default_str();
  syn->add_option("--sigmoid-gating", s.sigmoid_gating,
                  "deepseek2: sigmoid router with exp_probs_b (true) or softmax (false)")
      ->capture_default_str();
  syn->add_option("--seed", s.seed, "Random seed")->capture_default_str();
  syn->add_option("--sliding-window", s.sliding_window,
                  "gemma2, gemma3, gpt-oss: attention.sliding_window (0 = gemma: not written, gpt-oss: 128)")
      ->capture_default_str();
  syn->add_option("--final-softcap", s.final_logit_softcap,
                  "gemma2, gemma3: final_logit_softcapping (0 = not written)")
      ->capture_default_str();
  syn->add_option("--attn-softcap", s.attn_logit_softcap, "gemma2: attn_logit_softcapping (0 = not written)")
      ->capture_default_str();
  syn->add_option("--type", s.weight_type,
                  "f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q6_k | q4_k_m | q5_k_m | mxfp4_moe | ...")
      ->capture_default_str();
  syn->add_option("--threads", s.threads, "Threads quantizing rows (0 = all cores; same bytes for any)")
      ->capture_default_str();
  syn->add_flag("--tied", s.tied_embeddings, "No output.weight (tied to token_embd)");
  syn->add_option("--name", s.name, "general.name (default: derived from the shape)");
  syn->add_option("--vocab-from", s.vocab_file,
                  "A GGUF (e.g. vocab-only) whose tokenizer.* keys replace the embedded vocabulary; --vocab becomes "
                  "its token count");
  syn->add_option("--chat-template", o->chat_template_file,
                  "A Jinja file written as tokenizer.chat_template (default: no template)");
  syn->callback([o] {
    if (!o->chat_template_file.empty()) {
      std::ifstream in(o->chat_template_file, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty()) fail("--chat-template: cannot read " + o->chat_template_file);
      o->spec.chat_template = text.str();
    }
    run_synth(*o);
  });
}

}  // namespace

CAR_REGISTER_COMMANDS(setup);

}  // namespace car::tools::cmd_gguf
