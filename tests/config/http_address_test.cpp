// CAR_INFERENCE_HTTP's one parser (config/http_address.h): what the settings check and the daemon binds.
#include "config/http_address.h"

#include <gtest/gtest.h>

#include <string>

namespace car::config {
namespace {

TEST(HttpAddress, ParsesTheThreeForms) {
  auto a = parse_http_address("127.0.0.1:8080");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->unix_socket);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  EXPECT_TRUE(a->loopback());
  auto b = parse_http_address("[::1]:9");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_TRUE(b->loopback());
  EXPECT_EQ(b->to_string(), "[::1]:9");
  auto u = parse_http_address("unix:/run/x.sock");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->unix_socket);
  EXPECT_EQ(u->path, "/run/x.sock");
  EXPECT_TRUE(u->loopback());
  EXPECT_EQ(parse_http_address("0.0.0.0:0")->port, 0) << "0: any free port";
}

TEST(HttpAddress, LoopbackIsOnlyTheLoopbackNetworks) {
  EXPECT_TRUE(parse_http_address("127.1.2.3:80")->loopback());
  EXPECT_TRUE(parse_http_address("[::ffff:127.0.0.1]:80")->loopback());
  EXPECT_FALSE(parse_http_address("0.0.0.0:80")->loopback());
  EXPECT_FALSE(parse_http_address("[::]:80")->loopback());
  EXPECT_FALSE(parse_http_address("192.168.1.1:80")->loopback());
  EXPECT_FALSE(parse_http_address("[::ffff:10.0.0.1]:80")->loopback());
}

TEST(HttpAddress, ToStringReadsBackToTheSameAddress) {
  for (const char* text : {"127.0.0.1:8080", "[::1]:9", "[fe80::1]:65535", "unix:/run/car/http.sock"}) {
    auto a = parse_http_address(text);
    ASSERT_TRUE(a.ok()) << text;
    EXPECT_EQ(a->to_string(), text);
    EXPECT_EQ(*parse_http_address(a->to_string()), *a);
  }
}

TEST(HttpAddress, RefusesWhatCannotBeBound) {
  for (const char* text : {"localhost:80", "127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:8o", "127.0.0.1",
                           "::1:80", "[::1:80", "[127.0.0.1]:80", "unix:relative", "unix:", ""}) {
    auto a = parse_http_address(text);
    EXPECT_FALSE(a.ok()) << text;
    if (!a.ok()) {
      EXPECT_EQ(a.error().code, "invalid_setting") << text;
    }
  }
  EXPECT_FALSE(parse_http_address("unix:/" + std::string(107, 'x')).ok())
      << "past the Unix socket path limit";
  EXPECT_TRUE(parse_http_address("unix:/" + std::string(106, 'x')).ok());
}

}  // namespace
}  // namespace car::config
