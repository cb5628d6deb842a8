// daemon/connection_limits.h: the connection cap fitted to the open-file limit.
#include <gtest/gtest.h>

#include "daemon/connection_limits.h"

namespace car {
namespace {

TEST(DaemonConnectionLimits, TheCapFitsTheOpenFileLimit) {
  EXPECT_EQ(daemon::fit_connection_cap(256, 8192), 256u);
  EXPECT_EQ(daemon::fit_connection_cap(100000, 8192), 8192u - 1024u) << "an eighth is kept back";
  EXPECT_EQ(daemon::fit_connection_cap(256, 1024), 256u);
  EXPECT_EQ(daemon::fit_connection_cap(2000, 1024), 1024u - 128u) << "at least 128 are kept back";
  EXPECT_EQ(daemon::fit_connection_cap(256, 100), 1u);
  EXPECT_EQ(daemon::fit_connection_cap(256, UINT64_MAX), 256u);

  daemon::LiveSettings live;
  live.max_connections = 3;
  live.max_connections_per_uid = 2;
  daemon::ConnectionLimits limits(live, 1024);
  EXPECT_EQ(limits.refusal(1000), "");
  limits.opened(1000);
  limits.opened(1000);
  EXPECT_NE(limits.refusal(1000).find("MAX_CONNECTIONS_PER_UID=2"), std::string::npos);
  EXPECT_EQ(limits.refusal(1001), "");
  limits.opened(1001);
  EXPECT_NE(limits.refusal(1002).find("MAX_CONNECTIONS=3"), std::string::npos);
  limits.closed(1000);
  EXPECT_EQ(limits.refusal(1000), "");
  EXPECT_EQ(limits.stats()["open"], 2);
  EXPECT_EQ(limits.stats()["uids"], 2);
  EXPECT_EQ(limits.take_closed(), 1u);
  EXPECT_EQ(limits.take_closed(), 0u);
  live.max_connections = 5000;
  limits.apply(live);
  EXPECT_EQ(limits.max_connections(), 1024u - 128u) << "a reload is fitted too";
}

}  // namespace
}  // namespace car
