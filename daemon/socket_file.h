// The Unix socket files car-inferenced binds: the NDJSON socket and `--http unix:PATH` claim their path the
// same way. A path another process listens on is refused (never replaced); a stale socket file, left by a
// daemon that died, is removed; anything that is not a socket is refused. At exit a daemon removes the
// file only while it is still the one it bound (same device and inode), so it never deletes a socket
// another daemon made at the same path since.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "core/util/result.h"

namespace car::daemon {

/// Is a process accepting connections on the socket at `path`? (A stale file refuses the connect.)
bool socket_is_live(const std::string& path);

/// A socket file this process bound: its path, device and inode.
struct OwnedSocketFile {
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
  bool owned() const { return !path.empty(); }
};

/// Listen on a new socket file at `path`, mode 0660 from its first moment (and group `gid` when given):
/// refuses a path that exists and is not a socket or that another process listens on, removes a stale
/// socket file, then binds, sets the mode and group and listens. `what` names the socket in messages ("the
/// socket", "the HTTP socket"). Returns the listening fd (close-on-exec) and fills `file`; on failure
/// nothing is left behind. Errors: listen_failed.
Result<int> listen_unix(const std::string& path, std::optional<gid_t> gid, std::string_view what,
                        OwnedSocketFile& file);

/// Remove the socket file if it is still the one bound (device and inode); otherwise leave it (another
/// process replaced it). Clears `file`. Logs a failure other than the file being gone.
void remove_owned_socket_file(OwnedSocketFile& file);

}  // namespace car::daemon
