// The Ollama API's routes on an HTTP connection (/api/*): listings from the models directory and the cache,
// /api/show from the file's header, and generate/chat as `infer` requests through the same handler, queue
// and cancellation as the OpenAI front, written as Ollama's newline-delimited JSON (daemon/http/ollama.h).
#include <sys/stat.h>

// g++ 12 inlines Asio's awaitable frame allocator into some of these coroutines and then reports its
// recycling operator delete as mismatched with the frame's operator new - a known false positive (GCC
// bug 109224); the two are Asio's matched pair.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "core/gguf/gguf_file.h"
#include "core/gguf/model_info.h"
#include "daemon/http/http_connection.h"
#include "daemon/model_resolver.h"
#include "daemon/protocol.h"

namespace car::daemon::http {

namespace {

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t mtime_ns(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

ollama::ModelFacts facts(ModelCatalog& catalog, const ListedModel& m) {
  ollama::ModelFacts f;
  f.id = m.id;
  f.file_bytes = m.file_bytes;
  f.modified_unix_ns = mtime_ns(m.path);
  if (auto info = catalog.describe(m.path)) f.info = *info;
  return f;
}

json models_object(json list) {
  json o = json::object();
  o["models"] = std::move(list);
  return o;
}

json version_object(const std::string& version) {
  json o = json::object();
  o["version"] = version;
  return o;
}

/// A GGUF metadata value for /api/show's model_info: scalars as they are; arrays (the vocabulary's, some
/// thousands of entries) as null, as Ollama shows them unless asked to be verbose.
json info_value(const gguf::Value& v) {
  using gguf::ValueType;
  switch (v.type()) {
    case ValueType::STRING:
      return *v.get_if<std::string>();
    case ValueType::BOOL:
      return *v.get_if<bool>();
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return *v.as_double();
    case ValueType::UINT64:
      return *v.get_if<uint64_t>();
    case ValueType::ARRAY:
      return nullptr;
    default:
      if (auto i = v.as_int()) return *i;
      return nullptr;
  }
}

/// The body of /api/show for the file at `path`.
json show_object(const gguf::GgufFile& file, const ollama::ModelFacts& facts, const std::filesystem::path& path) {
  json o = json::object();
  auto license = file.get_string_or("general.license", "");
  o["license"] = license ? *license : std::string();
  o["modelfile"] = "# car-inferenced serves this model from its GGUF file; there is no Modelfile\nFROM " +
                   path.string() + "\n";
  o["parameters"] = "";
  auto tpl = file.get_string_or("tokenizer.chat_template", "");
  o["template"] = tpl ? *tpl : std::string();
  o["details"] = ollama::details(facts);
  json info = json::object();
  for (const auto& kv : file.metadata()) {
    if (kv.key == "tokenizer.chat_template") continue;  // `template`
    info[kv.key] = info_value(kv.value);
  }
  if (facts.info) info["general.parameter_count"] = facts.info->parameters;
  o["model_info"] = std::move(info);
  json caps = json::array();
  caps.push_back("completion");
  o["capabilities"] = std::move(caps);
  o["modified_at"] = ollama::rfc3339(facts.modified_unix_ns);
  return o;
}

}  // namespace

awaitable<bool> Connection::serve_ollama(Request& req, std::string_view target) {
  const bool keep = req.keep_alive();
  const bool get = req.method() == bhttp::verb::get || req.method() == bhttp::verb::head;
  const bool post = req.method() == bhttp::verb::post;
  const openai::ApiError not_allowed =
      api_error(405, "method " + std::string(req.method_string()) + " not allowed on " + std::string(target));
  if (target == "/api/version") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await send_json(bhttp::status::ok, version_object(front_.handler().options().build.version), keep);
  }
  if (target == "/api/tags") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await ollama_tags(req);
  }
  if (target == "/api/ps") {
    if (!get) co_return co_await send_error(not_allowed, keep);
    co_return co_await ollama_ps(req);
  }
  if (target == "/api/show") {
    if (!post) co_return co_await send_error(not_allowed, keep);
    co_return co_await ollama_show(req);
  }
  if (target == "/api/generate" || target == "/api/chat") {
    if (!post) co_return co_await send_error(not_allowed, keep);
    co_return co_await ollama_complete(
        target == "/api/chat" ? ollama::Endpoint::kChat : ollama::Endpoint::kGenerate, req);
  }
  // Ollama's model management and embeddings: car serves the GGUF files of its models directory.
  for (std::string_view own : {"/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete",
                               "/api/blobs", "/api/embed", "/api/embeddings"}) {
    if (target == own || target.starts_with(std::string(own) + "/")) {
      const bool embeddings = own.starts_with("/api/embed");
      co_return co_await send_error(
          api_error(501, std::string(target) + " is not supported by car-inferenced: " +
                             (embeddings ? "it serves text generation only"
                                         : "it serves the GGUF files of its models directory (copy a file "
                                           "there; `car invalidate ID` after replacing one)")),
          keep);
    }
  }
  co_return co_await send_error(
      api_error(404, "no such endpoint: " + std::string(req.method_string()) + " " + std::string(target)), keep);
}

awaitable<bool> Connection::ollama_tags(const Request& req) {
  const bool keep = req.keep_alive();
  auto listed = list_models(front_.options().models_dir);
  if (!listed) co_return co_await send_error(api_error(500, listed.error().message), keep);
  json list = json::array();
  for (const auto& m : *listed) list.push_back(ollama::tags_entry(facts(front_.handler().catalog(), m)));
  co_return co_await send_json(bhttp::status::ok, models_object(std::move(list)), keep);
}

awaitable<bool> Connection::ollama_ps(const Request& req) {
  const bool keep = req.keep_alive();
  auto listed = list_models(front_.options().models_dir);
  if (!listed) co_return co_await send_error(api_error(500, listed.error().message), keep);
  const CacheStats stats = front_.handler().cache().stats();
  const int64_t now = unix_now_ns();
  json list = json::array();
  for (const CacheEntryInfo& e : stats.items) {  // most recently used first, as Ollama lists them
    ollama::ModelFacts f;
    f.id = e.key;
    // list_models sorts by id.
    const auto m = std::lower_bound(listed->begin(), listed->end(), e.key,
                                    [](const ListedModel& l, const std::string& id) { return l.id < id; });
    if (m != listed->end() && m->id == e.key) f = facts(front_.handler().catalog(), *m);
    std::optional<int64_t> expires;
    if (e.idle_ttl) {
      const double left_s =
          std::chrono::duration<double>(*e.idle_ttl).count() - (e.in_use ? 0.0 : e.idle_seconds);
      expires = now + static_cast<int64_t>(std::max(0.0, left_s) * 1e9);
    }
    list.push_back(ollama::ps_entry(f, e.size_bytes, expires));
  }
  co_return co_await send_json(bhttp::status::ok, models_object(std::move(list)), keep);
}

awaitable<bool> Connection::ollama_show(Request& req) {
  const bool keep = req.keep_alive();
  json body;
  if (auto e = openai::parse_body(req.body(), body)) co_return co_await send_error(*e, keep);
  for (const auto& [key, value] : body.items()) {
    (void)value;
    if (key != "model" && key != "name" && key != "verbose") {
      co_return co_await send_error(api_error(400, "unknown field " + protocol::dump(json(key)) +
                                                       " (/api/show takes 'model' and 'verbose')"),
                                    keep);
    }
  }
  const json* name = body.contains("model") ? &body.at("model") : body.contains("name") ? &body.at("name") : nullptr;
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    co_return co_await send_error(api_error(400, "'model' is required"), keep);
  }
  const std::string id = ollama::model_id(name->get_ref<const std::string&>());
  auto resolved = resolve_model(front_.options().models_dir, id);
  if (!resolved) {
    co_return co_await send_error(car_error(resolved.error().code, resolved.error().message), keep);
  }
  // The header and tensor index only (no tensor data): what `car show` reads.
  auto file = gguf::GgufFile::open(resolved->path.string());
  if (!file) {
    co_return co_await send_error(api_error(500, "model '" + id + "': " + file.error().message), keep);
  }
  ListedModel listed;
  listed.id = id;
  listed.path = resolved->path;
  listed.file_bytes = (*file)->file_size();
  co_return co_await send_json(bhttp::status::ok,
                               show_object(**file, facts(front_.handler().catalog(), listed), resolved->path),
                               keep);
}

awaitable<bool> Connection::ollama_complete(ollama::Endpoint endpoint, Request& req) {
  const bool keep = req.keep_alive();
  const auto received = std::chrono::steady_clock::now();
  ollama::Mapped m;
  if (auto e = ollama::map_request(endpoint, req.body(), m)) co_return co_await send_error(*e, keep);
  req.body() = std::string();
  if (m.load_only) co_return co_await ollama_load(m, endpoint, keep, received);
  Stream st;
  st.api = Api::kOllama;
  st.stream = m.stream;
  st.ollama_endpoint = endpoint;
  st.model = m.name;
  st.created_at = ollama::rfc3339(unix_now_ns());
  stream_ = std::move(st);
  auto infer = std::move(m.infer).finish();
  if (infer) {
    infer->raw_without_template = m.raw_without_template;
    if (m.raw_without_template) infer->generate.prompt = m.raw_prompt;
    infer->generate.max_tokens_to_context = m.to_context;
    infer->no_template_hint = endpoint == ollama::Endpoint::kChat
                                  ? "send the text to /api/generate as a prompt instead"
                                  : "";
  }
  co_return co_await run_completion(std::move(infer), keep, req.version() >= 11, received,
                                    [&](protocol::InferResult& r) {
                                      return ollama::final_object(endpoint, stream_->model, stream_->created_at, r,
                                                                  r.output.text, false);
                                    });
}

awaitable<bool> Connection::ollama_load(const ollama::Mapped& m, ollama::Endpoint endpoint, bool keep,
                                        std::chrono::steady_clock::time_point received) {
  // Loading is the socket's `load` (with the request's keep_alive); unloading its `invalidate`, which
  // leaves a model a running request holds to that request and frees it afterwards.
  protocol::Request r;
  r.id = next_id();
  r.op = m.unload ? "invalidate" : "load";
  r.body = json::object();
  r.body["id"] = r.id;
  r.body["op"] = r.op;
  r.body["model"] = m.model;
  if (!m.unload && m.keep_alive_s) r.body["keep_alive"] = *m.keep_alive_s;
  final_.reset();
  front_.handler().handle(shared_from_this(), std::move(r), received);
  while (!final_ && !closed_) co_await wait_signal();
  if (closed_) co_return false;
  Reply reply = std::move(*final_);
  final_.reset();
  if (!reply.ok) co_return co_await send_error(car_error(reply.code, reply.message), keep);
  Response res{bhttp::status::ok, 11};
  res.set(bhttp::field::content_type, "application/json; charset=utf-8");
  res.body() = ollama::load_object(endpoint, m.name, ollama::rfc3339(unix_now_ns()), m.unload);
  co_return co_await send(std::move(res), keep);
}

}  // namespace car::daemon::http
