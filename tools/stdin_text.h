// The text a command reads from standard input when its TEXT/PROMPT argument is "-" (`car tokenize`,
// `car run`, `car infer`).
#pragma once

#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/util/error_codes.h"
#include "core/util/result.h"

namespace car::tools {

/// All of standard input, read with read(2) itself so that a closed descriptor (EBADF) or a directory
/// (EISDIR) is an error rather than the empty text iostreams would report. Call it before opening any file:
/// with descriptor 0 closed, the next open() would return 0. Error code: bad_request.
inline Result<std::string> read_stdin_text() {
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      return text;
    } else if (errno != EINTR) {
      return make_error(errc::kBadRequest,
                        std::string("cannot read standard input: ") + std::strerror(errno));
    }
  }
}

}  // namespace car::tools
