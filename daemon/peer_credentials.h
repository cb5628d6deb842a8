// Who may use the daemon: the identity of the process on the other end of a Unix socket (SO_PEERCRED), the
// allow-list check made on every new connection, and the group the socket file is given. Pure apart from
// the getsockopt and group-database calls; thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "core/util/result.h"

namespace car::daemon {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  std::string to_string() const;  ///< "pid=123 uid=1000 gid=1000"
};

/// SO_PEERCRED of a connected Unix socket. Error peer_credentials naming errno.
Result<PeerCredentials> peer_credentials(int fd);

/// Whether a peer may use the daemon. Both lists empty: everyone who can open the socket (the socket's
/// 0660 mode is the gate). Otherwise the peer's uid must be listed in `uids` or its primary gid in `gids`.
bool peer_allowed(const PeerCredentials& peer, const std::vector<uid_t>& uids, const std::vector<gid_t>& gids);

/// The gid of a socket group given as a name (looked up in the group database) or a decimal gid
/// (CAR_INFERENCE_SOCKET_GROUP). Error "bad_group": "no such group: NAME", a gid out of range, or the
/// lookup's own failure.
Result<gid_t> resolve_group(const std::string& group);

}  // namespace car::daemon
