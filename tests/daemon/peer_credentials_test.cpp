// Who may use the daemon (daemon/peer_credentials.h): SO_PEERCRED on a real socket pair, the allow-list
// rule the server applies to every connection, and the socket group lookup.
#include "daemon/peer_credentials.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace car::daemon {
namespace {

TEST(PeerCredentialsTest, ReadsTheOtherEndOfASocketPair) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto creds = peer_credentials(fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_TRUE(creds.ok()) << creds.error().message;
  EXPECT_EQ(creds->pid, ::getpid());
  EXPECT_EQ(creds->uid, ::geteuid());
  EXPECT_EQ(creds->gid, ::getegid());
  EXPECT_EQ(creds->to_string(), "pid=" + std::to_string(::getpid()) + " uid=" + std::to_string(::geteuid()) +
                                    " gid=" + std::to_string(::getegid()));
  auto bad = peer_credentials(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, "peer_credentials");
}

TEST(PeerCredentialsTest, AllowListIsUidOrGid) {
  const PeerCredentials peer{1, 1001, 5};
  EXPECT_TRUE(peer_allowed(peer, {}, {})) << "no lists: everyone who can open the socket";
  EXPECT_TRUE(peer_allowed(peer, {0, 1001}, {}));
  EXPECT_FALSE(peer_allowed(peer, {0, 1000}, {}));
  EXPECT_TRUE(peer_allowed(peer, {1000}, {5})) << "the gid alone admits";
  EXPECT_FALSE(peer_allowed(peer, {1000}, {6}));
  EXPECT_FALSE(peer_allowed(peer, {}, {6})) << "a gid list alone still restricts";
  EXPECT_TRUE(peer_allowed(peer, {1001, 0}, {})) << "lists need not be sorted";
}

TEST(PeerCredentialsTest, ResolveGroupByNameOrNumber) {
  auto root = resolve_group("0");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root.value(), 0u);
  auto named = resolve_group("root");
  ASSERT_TRUE(named.ok()) << named.error().message;
  EXPECT_EQ(named.value(), 0u);
  auto number = resolve_group("4242");
  ASSERT_TRUE(number.ok()) << "a numeric gid needs no group entry";
  EXPECT_EQ(number.value(), 4242u);
  auto missing = resolve_group("no-such-group-car");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "bad_group");
  EXPECT_EQ(missing.error().message, "no such group: no-such-group-car");
  for (const char* out_of_range : {"4294967295", "99999999999999999999999"}) {
    auto big = resolve_group(out_of_range);
    ASSERT_FALSE(big.ok()) << out_of_range;
    EXPECT_EQ(big.error().message, std::string("group id ") + out_of_range + " is out of range");
  }
}

}  // namespace
}  // namespace car::daemon
