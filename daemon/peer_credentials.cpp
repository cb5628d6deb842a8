#include "daemon/peer_credentials.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace car::daemon {

std::string PeerCredentials::to_string() const {
  return "pid=" + std::to_string(pid) + " uid=" + std::to_string(uid) + " gid=" + std::to_string(gid);
}

Result<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return make_error("peer_credentials", std::string("getsockopt(SO_PEERCRED): ") + std::strerror(errno));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

bool peer_allowed(const PeerCredentials& peer, const std::vector<uid_t>& uids, const std::vector<gid_t>& gids) {
  if (uids.empty() && gids.empty()) return true;
  if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) return true;
  return std::find(gids.begin(), gids.end(), peer.gid) != gids.end();
}

}  // namespace car::daemon
