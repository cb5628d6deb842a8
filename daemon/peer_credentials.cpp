#include "daemon/peer_credentials.h"

#include <grp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/util/error_codes.h"

namespace car::daemon {

std::string PeerCredentials::to_string() const {
  return "pid=" + std::to_string(pid) + " uid=" + std::to_string(uid) + " gid=" + std::to_string(gid);
}

Result<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return make_error(errc::kPeerCredentials,
                      std::string("getsockopt(SO_PEERCRED): ") + std::strerror(errno));
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

bool peer_allowed(const PeerCredentials& peer, const std::vector<uid_t>& uids, const std::vector<gid_t>& gids) {
  if (uids.empty() && gids.empty()) return true;
  if (std::find(uids.begin(), uids.end(), peer.uid) != uids.end()) return true;
  return std::find(gids.begin(), gids.end(), peer.gid) != gids.end();
}

Result<gid_t> resolve_group(const std::string& group) {
  if (!group.empty() && std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    // (gid_t)-1 is chown(2)'s "leave unchanged", never a real group.
    constexpr auto kMax = static_cast<unsigned long long>(std::numeric_limits<gid_t>::max()) - 1;
    errno = 0;
    const unsigned long long n = group.size() <= 20 ? std::strtoull(group.c_str(), nullptr, 10) : kMax + 1;
    if (errno != 0 || n > kMax) return make_error(errc::kBadGroup, "group id " + group + " is out of range");
    return static_cast<gid_t>(n);
  }
  const long size_hint = ::sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> buf(static_cast<std::size_t>(size_hint > 0 ? size_hint : 16384));
  struct group gr {};
  struct group* result = nullptr;
  int rc = 0;
  while ((rc = ::getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &result)) == ERANGE &&
         buf.size() < (std::size_t{1} << 20)) {
    buf.resize(buf.size() * 2);
  }
  if (rc != 0) return make_error(errc::kBadGroup, "looking up group " + group + ": " + std::strerror(rc));
  if (result == nullptr) return make_error(errc::kBadGroup, "no such group: " + group);
  return result->gr_gid;
}

}  // namespace car::daemon
