#include "daemon/protocol/framing.h"

namespace car::protocol {

void LineFramer::feed(std::string_view bytes, std::vector<Item>& out) {
  while (!bytes.empty()) {
    std::size_t nl = bytes.find('\n');
    std::string_view chunk = bytes.substr(0, nl);  // npos -> all
    if (discarding_) {
      if (nl == std::string_view::npos) return;  // still inside the over-long line
      discarding_ = false;
    } else if (partial_.size() + chunk.size() > max_line_) {
      partial_.clear();
      partial_.shrink_to_fit();
      out.push_back({Item::Kind::kOversized, {}});
      if (nl == std::string_view::npos) {
        discarding_ = true;
        return;
      }
    } else {
      partial_.append(chunk);
      if (nl == std::string_view::npos) return;
      out.push_back({Item::Kind::kLine, std::move(partial_)});
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

}  // namespace car::protocol
