// The ModelRuntime of a daemon built without car_engine: every load is refused with an honest error, so
// the protocol, cache and systemd plumbing run and can be tested while inference is unavailable.
#include "daemon/model_runtime.h"

namespace car::daemon {

namespace {

class NoEngineRuntime final : public ModelRuntime {
 public:
  Result<std::shared_ptr<Backend>> load(const std::filesystem::path& path) override {
    return make_error("load_failed", "cannot load " + path.filename().string() +
                                         ": this car-inferenced was built without the inference engine "
                                         "(car_engine), so it cannot run models");
  }
  /// The file's size: nothing will be loaded (load() refuses), so the figure only orders the refusal.
  Result<uint64_t> estimate_bytes(const std::filesystem::path& path, const LoadRequest&) override {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(path, ec);
    if (ec) return make_error("not_found", path.string() + ": " + ec.message());
    return static_cast<uint64_t>(bytes);
  }
  bool available() const override { return false; }
  std::string name() const override { return "none"; }
};

}  // namespace

std::unique_ptr<ModelRuntime> make_default_runtime(const RuntimeOptions&) {
  return std::make_unique<NoEngineRuntime>();
}

}  // namespace car::daemon
