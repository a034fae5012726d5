// The pieces of HTTP syntax troupe checks itself around Boost.Beast:
// tokens, field values, comma-separated lists, percent-decoding, target
// paths and the Date header.

#include "syntax.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::http::detail {
namespace {

using namespace std::chrono_literals;

TEST(HttpSyntax, ComparesAsciiCaseInsensitivelyAndNeverAcrossLengths) {
  EXPECT_TRUE(iequals("Content-Length", "content-LENGTH"));
  EXPECT_TRUE(iequals("", ""));
  EXPECT_FALSE(iequals("close", "closed"));
  EXPECT_FALSE(iequals("a", "b"));
  EXPECT_FALSE(iequals("\xC3\xBC", "\xC3\x9C")) << "only ASCII letters fold";
}

TEST(HttpSyntax, KnowsATokenAndAFieldThatCannotBreakTheFraming) {
  EXPECT_TRUE(is_token("GET"));
  EXPECT_TRUE(is_token("!#$%&'*+-.^_`|~09azAZ"));
  EXPECT_FALSE(is_token(""));
  EXPECT_FALSE(is_token("G T"));
  EXPECT_FALSE(is_token("G(T"));
  EXPECT_FALSE(is_token("X:"));
  EXPECT_FALSE(is_token("\xC3\xA9"));

  EXPECT_TRUE(field_ok("X-Id", "any value, \t with \x7f and \xff"));
  EXPECT_TRUE(field_ok("X-Empty", ""));
  EXPECT_FALSE(field_ok("Bad Name", "v"));
  EXPECT_FALSE(field_ok("", "v"));
  EXPECT_FALSE(field_ok("X", "a\r\nInjected: yes"));
  EXPECT_FALSE(field_ok("X", "a\nb"));
  EXPECT_FALSE(field_ok("X", "a\rb"));
  EXPECT_FALSE(field_ok("X", std::string("a\0b", 3)));
}

TEST(HttpSyntax, FindsTheFirstFieldOfANameWhateverItsCase) {
  const Fields fields = {{"Host", "h"}, {"X-Id", "1"}, {"x-id", "2"}};
  EXPECT_EQ(find_field(fields, "X-ID"), "1");
  EXPECT_EQ(find_field(fields, "host"), "h");
  EXPECT_EQ(find_field(fields, "missing"), "");
  EXPECT_EQ(find_field({}, "host"), "");
}

TEST(HttpSyntax, FindsATokenInACommaSeparatedListButNotAPartOfOne) {
  EXPECT_TRUE(has_token("close", "close"));
  EXPECT_TRUE(has_token("Upgrade, Close", "close"));
  EXPECT_TRUE(has_token("keep-alive,close", "close"));
  EXPECT_TRUE(has_token(" \tclose\t , x", "close"));
  EXPECT_FALSE(has_token("closed", "close"));
  EXPECT_FALSE(has_token("keep-alive; close", "close"));
  EXPECT_FALSE(has_token("", "close"));
  EXPECT_FALSE(has_token(",,", "close"));
}

TEST(HttpSyntax, SplitsAListTrimmingBlanksAndDroppingEmptyItems) {
  EXPECT_EQ(split_list(" gzip ,, chunked\t"), (std::vector<std::string_view>{"gzip", "chunked"}));
  EXPECT_EQ(split_list("chunked"), (std::vector<std::string_view>{"chunked"}));
  EXPECT_EQ(split_list("a b, c"), (std::vector<std::string_view>{"a b", "c"}));
  EXPECT_TRUE(split_list("").empty());
  EXPECT_TRUE(split_list(" , ,\t,").empty());
}

TEST(HttpSyntax, PercentDecodesAndRefusesATruncatedOrNonHexEscape) {
  std::string out;
  ASSERT_TRUE(percent_decode("/pay%20ments/a%2Fb", out, false));
  EXPECT_EQ(out, "/pay ments/a/b");
  ASSERT_TRUE(percent_decode("J%c3%BCrgen+M", out, false));
  EXPECT_EQ(out, "J\xC3\xBCrgen+M") << "'+' is a space only in a query";
  ASSERT_TRUE(percent_decode("J%C3%BCrgen+M", out, true));
  EXPECT_EQ(out, "J\xC3\xBCrgen M");
  ASSERT_TRUE(percent_decode("", out, false));
  EXPECT_EQ(out, "");
  ASSERT_TRUE(percent_decode("%25zz", out, false));
  EXPECT_EQ(out, "%zz") << "decoded once, not again";

  EXPECT_FALSE(percent_decode("/a%zz", out, false));
  EXPECT_FALSE(percent_decode("/a%4", out, false));
  EXPECT_FALSE(percent_decode("/a%", out, false));
  EXPECT_FALSE(percent_decode("/a%g1", out, false));
}

TEST(HttpSyntax, RefusesAnEncodedNulUnlessAllowed) {
  std::string out;
  EXPECT_FALSE(percent_decode("/a%00b", out, false));
  ASSERT_TRUE(percent_decode("/a%00b", out, false, true));
  EXPECT_EQ(out, std::string("/a\0b", 4));
}

TEST(HttpSyntax, TakesThePathOfAnOriginOrAbsoluteFormTarget) {
  EXPECT_EQ(target_path("/p?q=1"), "/p");
  EXPECT_EQ(target_path("/"), "/");
  EXPECT_EQ(target_path("/a/b"), "/a/b");
  EXPECT_EQ(target_path("/?q"), "/");
  EXPECT_EQ(target_path("http://example.com:8080/a/b?q=1"), "/a/b");
  EXPECT_EQ(target_path("HTTPS://example.com/x"), "/x");
  EXPECT_EQ(target_path("http://example.com"), "/");
  EXPECT_EQ(target_path("http://example.com?q=1"), "/");

  EXPECT_EQ(target_path(""), std::nullopt);
  EXPECT_EQ(target_path("a/b"), std::nullopt);
  EXPECT_EQ(target_path("*"), std::nullopt);
  EXPECT_EQ(target_path("ftp://example.com/x"), std::nullopt);
  EXPECT_EQ(target_path("http:///x"), std::nullopt) << "no host";
  EXPECT_EQ(target_path("http://"), std::nullopt);
}

TEST(HttpSyntax, WritesAnImfFixdateForTheDateHeader) {
  EXPECT_EQ(http_date(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
  EXPECT_EQ(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(http_date(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");
  EXPECT_EQ(http_date(1709164799), "Wed, 28 Feb 2024 23:59:59 GMT");
}

TEST(HttpSyntax, ReadsADurationInWholeMilliseconds) {
  EXPECT_EQ(millis(250ms), "250 ms");
  EXPECT_EQ(millis(1999us), "1 ms");
  EXPECT_EQ(millis(2s), "2000 ms");
  EXPECT_EQ(millis(Duration::zero()), "0 ms");
}

}  // namespace
}  // namespace troupe::http::detail
