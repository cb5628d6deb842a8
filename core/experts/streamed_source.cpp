#include "core/experts/streamed_source.h"

// Interface first: the streamed source and the pool are filled in by the following commits. Until then
// open() fails with a clear error, so a caller wiring it in gets "io_error" rather than a crash.

namespace car::experts {

struct StreamedExpertSource::Impl {};

std::string PoolLayout::line() const {
  return "expert stream: not implemented yet";
}

ExpertPool::ExpertPool(const StreamOptions& options) : options_(options) {}
ExpertPool::~ExpertPool() = default;
PoolLayout ExpertPool::layout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_;
}
uint64_t ExpertPool::budget_bytes() const {
  return layout().budget_bytes;
}
void ExpertPool::join(StreamedExpertSource*) {}
void ExpertPool::leave(StreamedExpertSource*) {}
void ExpertPool::resize_locked() {}
void ExpertPool::submit(const void*, bool, std::function<void()> run) {
  run();
}
void ExpertPool::cancel(const void*) {}
void ExpertPool::reader_loop() {}

MemoryProbe probe_memory(const std::string&, const std::string&) {
  return {};
}
uint64_t budget_from_available(uint64_t) {
  return 0;
}

Result<std::string> sidecar_path(const std::string&, const std::string&) {
  return make_error("io_error", "expert streaming: sidecar_path not implemented yet");
}

Result<std::unique_ptr<StreamedExpertSource>> StreamedExpertSource::open(const std::string& path,
                                                                         std::vector<ExpertBankInfo>,
                                                                         StreamOptions) {
  return make_error("io_error", path + ": expert streaming is not implemented yet");
}

StreamedExpertSource::StreamedExpertSource(std::vector<ExpertBankInfo> banks, std::unique_ptr<Impl> impl)
    : ExpertSource(std::move(banks)), impl_(std::move(impl)) {}
StreamedExpertSource::~StreamedExpertSource() = default;
Result<ExpertLease> StreamedExpertSource::acquire(int, int) {
  return make_error("io_error", "expert streaming is not implemented yet");
}
Result<void> StreamedExpertSource::acquire_many(int, std::span<const int>, std::vector<ExpertLease>& out) {
  out.clear();
  return make_error("io_error", "expert streaming is not implemented yet");
}
void StreamedExpertSource::prefetch(int, std::span<const int>) {}
int StreamedExpertSource::slots(int) const {
  return 1;
}
ExpertStats StreamedExpertSource::stats() const {
  ExpertStats s;
  s.mode = "streamed";
  return s;
}
Result<void> StreamedExpertSource::save_usage() {
  return {};
}
uint64_t StreamedExpertSource::resident_bytes() const {
  return 0;
}
bool StreamedExpertSource::direct_io() const {
  return false;
}
uint64_t StreamedExpertSource::use_count(int, int) const {
  return 0;
}
std::vector<std::string> StreamedExpertSource::take_warnings() {
  return {};
}
void StreamedExpertSource::release(int, int, uint64_t) {}
std::vector<StreamedExpertSource::BankShape> StreamedExpertSource::bank_shapes() const {
  return {};
}
int StreamedExpertSource::apply_cap(int) {
  return 0;
}

}  // namespace car::experts
