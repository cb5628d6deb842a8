// The process-wide signals that ask a program to stop or reload (SIGTERM, SIGINT, SIGHUP) belong to the
// thread that waits for them - the daemon's io thread with its signal_set, a tool's main thread - and not to
// the compute, scheduler, reader and worker threads the project starts. Each of those calls
// block_process_signals() first thing, so the kernel never picks one of them to deliver such a signal.
//
// Why it matters: a signal's handler runs on the thread that receives it. Under ThreadSanitizer a handler
// waits until that thread next enters an intercepted call, and an idle pool worker sleeps in a raw futex
// (std::atomic::wait) that TSan does not intercept: a SIGTERM that landed there was never acted on. Without
// TSan the same delivery only costs a context switch, but the rule is the same: signals go where they are
// waited for.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace car::util {

/// Block SIGTERM, SIGINT and SIGHUP in the calling thread (threads it starts inherit the mask).
inline void block_process_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace car::util
