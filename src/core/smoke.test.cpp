#include <gtest/gtest.h>

#include <variant>

#include "troupe/core.hpp"

namespace {

struct Inc {};
struct Get {
  troupe::ReplyTo<int> reply;
};
using CounterMsg = std::variant<Inc, Get>;

struct Counter : troupe::Actor<CounterMsg> {
  int n = 0;
  void receive(CounterMsg& m) {
    troupe::match(m, [&](Inc&) { ++n; }, [&](Get& g) { g.reply(n); });
  }
};

TEST(Smoke, counter_counts_and_answers_an_ask) {
  troupe::ActorSystem sys;
  auto c = sys.spawn<Counter>();
  for (int i = 0; i < 1000; ++i) c.tell(Inc{});
  auto f = sys.ask<int>(c, [](troupe::ReplyTo<int> r) { return Get{std::move(r)}; }, std::chrono::seconds(5));
  auto r = f.get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 1000);
}

}  // namespace
