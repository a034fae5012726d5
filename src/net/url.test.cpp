// The http:// URL parser every layer shares (troupe/net/url.hpp).

#include "troupe/net/url.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

using troupe::ErrorCode;
using troupe::http::parse_url;
using troupe::http::percent_encode;

// proves: X1
TEST(HttpUrl, ReadsHostPortAndTargetOfNamesIpv4AndIpv6Literals) {
  auto plain = parse_url("http://127.0.0.1:8081");
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  EXPECT_EQ(plain->host, "127.0.0.1");
  EXPECT_EQ(plain->port, 8081);
  EXPECT_EQ(plain->target, "/");
  EXPECT_FALSE(plain->has_path);

  auto named = parse_url("http://placement.example/units?group=a");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->host, "placement.example");
  EXPECT_EQ(named->port, 80);
  EXPECT_EQ(named->target, "/units?group=a");
  EXPECT_TRUE(named->has_path);

  auto v6 = parse_url("http://[::1]:9000/");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  EXPECT_EQ(v6->target, "/");
  EXPECT_TRUE(v6->has_path);

  auto v6_default = parse_url("http://[fe80::1]");
  ASSERT_TRUE(v6_default.ok());
  EXPECT_EQ(v6_default->host, "fe80::1");
  EXPECT_EQ(v6_default->port, 80);
}

// proves: X1
TEST(HttpUrl, RefusesEachMalformedUrlWithItsReason) {
  struct Case {
    const char* url;
    const char* reason;
  };
  for (const Case& c : {Case{"https://example.com/x", "only http:// is supported"},
                        Case{"127.0.0.1:8081", "expected http://host[:port][/path]"},
                        Case{"http://user@h/x", "no user information allowed"},
                        Case{"http://:8081", "no host"},
                        Case{"http:///units", "no host"},
                        Case{"http://[::1", "unclosed '[' in the host"},
                        Case{"http://[::1]x/", "expected ':' after the IPv6 address"},
                        Case{"http://h:", "the port must be a number from 1 to 65535"},
                        Case{"http://h:0", "the port must be a number from 1 to 65535"},
                        Case{"http://h:70000", "the port must be a number from 1 to 65535"},
                        Case{"http://h:+80", "the port must be a number from 1 to 65535"},
                        Case{"http://h:x", "the port must be a number from 1 to 65535"}}) {
    auto r = parse_url(c.url);
    ASSERT_FALSE(r.ok()) << c.url << " accepted";
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << c.url;
    EXPECT_EQ(r.error().message(), c.reason) << c.url;
  }
}

TEST(HttpUrl, HttpsOnlyWhereTheCallerTakesIt) {
  auto https = parse_url("https://example.com/x", /*https_too=*/true);
  ASSERT_TRUE(https.ok());
  EXPECT_TRUE(https->tls);
  EXPECT_EQ(https->port, 443);
  EXPECT_EQ(https->target, "/x");
  auto with_port = parse_url("https://[::1]:8443", true);
  ASSERT_TRUE(with_port.ok());
  EXPECT_EQ(with_port->port, 8443);
  auto plain = parse_url("http://example.com", true);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tls);
  EXPECT_EQ(plain->port, 80);
  auto other = parse_url("ftp://example.com", true);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().message(), "only http:// and https:// are supported");
  EXPECT_FALSE(parse_url("https://example.com").ok()) << "not without https_too";
}

TEST(HttpUrl, AuthorityBracketsIpv6Literals) {
  EXPECT_EQ(troupe::http::authority("127.0.0.1", 80), "127.0.0.1:80");
  EXPECT_EQ(troupe::http::authority("::1", 9000), "[::1]:9000");
}

TEST(HttpUrl, PercentEncodingLeavesOnlyUnreservedCharactersAsTheyAre) {
  EXPECT_EQ(percent_encode("a b/c"), "a%20b%2Fc");
  EXPECT_EQ(percent_encode("Az09-._~"), "Az09-._~");
  EXPECT_EQ(percent_encode("100%?#"), "100%25%3F%23");
  EXPECT_EQ(percent_encode("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(percent_encode(""), "");
}

}  // namespace
