// The payment service's read side (read_side.hpp): the two projections'
// handlers, their start across the slices, the reads and the routes.

#include "read_side.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <utility>

#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_read_model.hpp"

namespace payment {

namespace {

using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;
using troupe::SqliteReadModel;
using troupe::SqliteTransaction;
using troupe::StreamEvent;
using json = nlohmann::json;
namespace http = troupe::http;

// The payment id of persistence id "payment|<id>".
std::string payment_id_of(const std::string& persistence_id) {
  auto bar = persistence_id.find('|');
  return bar == std::string::npos ? persistence_id : persistence_id.substr(bar + 1);
}

Result<std::chrono::sys_days> parse_day(std::string_view day) {
  auto bad = [&] { return Error(ErrorCode::invalid_argument, "'" + std::string(day) + "' is not a date (YYYY-MM-DD)"); };
  if (day.size() != 10 || day[4] != '-' || day[7] != '-') return bad();
  auto number = [&](std::size_t at, std::size_t n, int& out) {
    auto [end, ec] = std::from_chars(day.data() + at, day.data() + at + n, out);
    return ec == std::errc() && end == day.data() + at + n;
  };
  int y = 0, m = 0, d = 0;
  if (!number(0, 4, y) || !number(5, 2, m) || !number(8, 2, d)) return bad();
  std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(static_cast<unsigned>(m)),
                                  std::chrono::day(static_cast<unsigned>(d))};
  if (!ymd.ok()) return bad();
  return std::chrono::sys_days(ymd);
}

std::int64_t int_cell(const troupe::SqlCell& c) {
  const auto* v = std::get_if<std::int64_t>(&c);
  return v ? *v : 0;
}
std::string text_cell(const troupe::SqlCell& c) {
  const auto* v = std::get_if<std::string>(&c);
  return v ? *v : std::string();
}

Result<Event> decode(const troupe::EventCodecs<Event>& codecs, const StreamEvent& e) {
  return codecs.decode(e.event.type, e.event.version, e.event.payload);
}

// payments_by_customer: one row per payment, upserted by each event, so a
// payment whose first events are in no slice (stored before tags) still
// gets a row from its later ones.
struct ByCustomer {
  using ReadModel = SqliteReadModel;
  troupe::EventCodecs<Event> codecs = payment_codecs();

  Result<void> setup(SqliteTransaction& tx) {
    auto r = tx.exec(
        "CREATE TABLE IF NOT EXISTS payments_by_customer (payment_id TEXT PRIMARY KEY, customer TEXT NOT NULL, "
        "order_id TEXT NOT NULL, amount INTEGER NOT NULL, status TEXT NOT NULL, refunded INTEGER NOT NULL, "
        "created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL)");
    if (!r) return r;
    return tx.exec(
        "CREATE INDEX IF NOT EXISTS payments_by_customer_customer ON payments_by_customer (customer, created_ms, "
        "payment_id)");
  }

  Result<void> apply(SqliteTransaction& tx, const StreamEvent& e) {
    auto ev = decode(codecs, e);
    if (!ev) return std::move(ev).error();
    const std::string id = payment_id_of(e.persistence_id);
    const std::int64_t at = e.event.timestamp_ms;
    // (customer, order, amount) from an event that carries them; the
    // customer only replaces the stored one when it is not empty.
    auto order = [&](const std::string& customer, const std::string& order_id, std::int64_t amount, Phase p) {
      return tx.exec(
          "INSERT INTO payments_by_customer VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?6) ON CONFLICT (payment_id) DO UPDATE "
          "SET customer = CASE WHEN excluded.customer <> '' THEN excluded.customer ELSE customer END, "
          "order_id = excluded.order_id, amount = excluded.amount, status = excluded.status, "
          "updated_ms = excluded.updated_ms",
          {id, customer, order_id, amount, to_string(p), at});
    };
    auto status = [&](Phase p, std::int64_t refunded) {
      return tx.exec(
          "INSERT INTO payments_by_customer VALUES (?1, '', '', 0, ?2, ?3, ?4, ?4) ON CONFLICT (payment_id) DO UPDATE "
          "SET status = excluded.status, refunded = excluded.refunded, updated_ms = excluded.updated_ms",
          {id, to_string(p), refunded, at});
    };
    return troupe::match(
        *ev, [&](const PaymentCreated& x) { return order(x.customer, x.order_id, x.amount, Phase::waiting_for_request); },
        [&](const SettlementAccepted& x) { return order(x.customer, x.order_id, x.amount, Phase::settling); },
        [&](const SettlementSucceeded&) { return status(Phase::completed, 0); },
        [&](const SettlementDeclined&) { return status(Phase::failed, 0); },
        [&](const SettlementFailed&) { return status(Phase::failed, 0); },
        [&](const SettlementTimedOut&) { return status(Phase::failed, 0); },
        [&](const PaymentCancelled& x) { return status(Phase::cancelled, x.refunded); },
        [&](const LegacyRefundStep&) { return Result<void>{}; });
  }
};

// daily_totals: per UTC day of the event, payments settled and refunds
// stored. The amount of a payment being settled waits in
// daily_totals_open (its last Created or Accepted) until its outcome.
struct DailyTotals {
  using ReadModel = SqliteReadModel;
  troupe::EventCodecs<Event> codecs = payment_codecs();

  Result<void> setup(SqliteTransaction& tx) {
    auto r = tx.exec(
        "CREATE TABLE IF NOT EXISTS daily_totals (day TEXT PRIMARY KEY, settled_count INTEGER NOT NULL, "
        "settled_amount INTEGER NOT NULL, refunded_count INTEGER NOT NULL, refunded_amount INTEGER NOT NULL)");
    if (!r) return r;
    return tx.exec(
        "CREATE TABLE IF NOT EXISTS daily_totals_open (payment_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)");
  }

  Result<void> apply(SqliteTransaction& tx, const StreamEvent& e) {
    auto ev = decode(codecs, e);
    if (!ev) return std::move(ev).error();
    const std::string id = payment_id_of(e.persistence_id);
    const std::string day = utc_day(e.event.timestamp_ms);
    auto open = [&](std::int64_t amount) {
      return tx.exec(
          "INSERT INTO daily_totals_open VALUES (?1, ?2) ON CONFLICT (payment_id) DO UPDATE SET amount = excluded.amount",
          {id, amount});
    };
    auto close = [&] { return tx.exec("DELETE FROM daily_totals_open WHERE payment_id = ?1", {id}); };
    auto add = [&](std::int64_t settled, std::int64_t settled_amount, std::int64_t refunds, std::int64_t refunded) {
      return tx.exec(
          "INSERT INTO daily_totals VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (day) DO UPDATE SET "
          "settled_count = settled_count + excluded.settled_count, settled_amount = settled_amount + "
          "excluded.settled_amount, refunded_count = refunded_count + excluded.refunded_count, "
          "refunded_amount = refunded_amount + excluded.refunded_amount",
          {day, settled, settled_amount, refunds, refunded});
    };
    return troupe::match(
        *ev, [&](const PaymentCreated& x) { return open(x.amount); },
        [&](const SettlementAccepted& x) { return open(x.amount); },
        [&](const SettlementSucceeded&) -> Result<void> {
          auto rows = tx.query("SELECT amount FROM daily_totals_open WHERE payment_id = ?1", {id});
          if (!rows) return std::move(rows).error();
          // Loud, never a guess: the projection stops on this event.
          if (rows->empty())
            return Error(ErrorCode::corrupt_record, "payment '" + id +
                                                        "' settled without an earlier SettlementAccepted in its slice");
          if (auto r = add(1, int_cell((*rows)[0][0]), 0, 0); !r) return r;
          return close();
        },
        [&](const SettlementDeclined&) { return close(); }, [&](const SettlementFailed&) { return close(); },
        [&](const SettlementTimedOut&) { return close(); },
        [&](const PaymentCancelled& x) -> Result<void> {
          if (auto r = close(); !r) return r;
          return x.refunded > 0 ? add(0, 0, 1, x.refunded) : Result<void>{};
        },
        [&](const LegacyRefundStep&) { return Result<void>{}; });
  }
};

// A projection of one slice, as the node watches it.
struct Running {
  std::string key;
  std::function<troupe::ProjectionStatus()> status;
  std::function<void()> stop;
};

template <class H>
Result<Running> start_slice(troupe::node::Node& node, const std::shared_ptr<troupe::Journal>& journal,
                            const std::shared_ptr<SqliteReadModel>& model, std::string name, std::string tag) {
  troupe::ProjectionSettings s;
  s.name = std::move(name);
  s.source = troupe::EventSelector::with_tag(std::move(tag));
  s.poll_interval = std::chrono::milliseconds(500);
  // The read model shares the journal's file and its write lock: a few ms
  // of commits per page keeps the projections' transactions few.
  s.linger = std::chrono::milliseconds(5);
  auto p = troupe::Projection<H>::start(node.system(), journal, model, std::move(s));
  if (!p) return std::move(p).error();
  node.watch_projection(*p);
  return Running{p->status().key, [p = *p] { return p.status(); }, [p = *p] { p.stop(); }};
}

}  // namespace

std::string utc_day(std::int64_t ms) {
  using namespace std::chrono;
  year_month_day ymd{floor<days>(sys_time<milliseconds>(milliseconds(ms)))};
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02u", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()));
  return buf;
}

std::string slice_tag(std::string_view payment_id, std::uint32_t slices) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : payment_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return "payment-slice-" + std::to_string(h % (slices == 0 ? 1 : slices));
}

Result<void> validate_day(std::string_view day) {
  auto d = parse_day(day);
  if (!d) return std::move(d).error();
  return {};
}

struct ReadSide::Impl {
  troupe::node::Node* node = nullptr;
  std::shared_ptr<SqliteReadModel> model;
  std::vector<Running> running;
};

ReadSide::ReadSide(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReadSide::~ReadSide() {
  for (auto& r : impl_->running) {
    impl_->node->unwatch_projection(r.key);
    r.stop();
  }
}

Result<std::unique_ptr<ReadSide>> ReadSide::start(troupe::node::Node& node, std::uint32_t slices) {
  if (node.config().journal.backend != "sqlite")
    return Error(ErrorCode::invalid_argument, "the read side keeps its read models in the SQLite journal's file; "
                                              "journal.backend is \"" + node.config().journal.backend + "\"");
  return open(node, node.journal(), node.config().sqlite_path().string(), slices);
}

Result<std::unique_ptr<ReadSide>> ReadSide::open(troupe::node::Node& node, std::shared_ptr<troupe::Journal> journal,
                                                 const std::string& model_path, std::uint32_t slices) {
  if (!journal || !journal->supports_queries())
    return Error(ErrorCode::invalid_argument, "the journal does not answer queries across entities");
  if (slices == 0 || slices > kMaxReadSlices)
    return Error(ErrorCode::invalid_argument, "payment.read_slices: 1 to " + std::to_string(kMaxReadSlices));
  auto model = SqliteReadModel::open({.path = model_path});
  if (!model) return Error(model.error().code(), "the read model: " + model.error().message());
  // The tables first, so that a read before the projections' first page
  // finds them (empty) rather than failing.
  auto tables = (*model)->transact([](SqliteTransaction& tx) -> Result<void> {
    if (auto r = ByCustomer{}.setup(tx); !r) return r;
    return DailyTotals{}.setup(tx);
  });
  if (!tables) return Error(tables.error().code(), "the read model's tables: " + tables.error().message());
  auto impl = std::make_unique<Impl>();
  impl->node = &node;
  impl->model = *model;
  auto side = std::unique_ptr<ReadSide>(new ReadSide(std::move(impl)));
  for (std::uint32_t k = 0; k < slices; ++k) {
    std::string tag = "payment-slice-" + std::to_string(k);
    auto a = start_slice<ByCustomer>(node, journal, side->impl_->model, "payments_by_customer", tag);
    if (!a) return std::move(a).error();  // ~ReadSide stops those started
    side->impl_->running.push_back(std::move(*a));
    auto b = start_slice<DailyTotals>(node, journal, side->impl_->model, "daily_totals", tag);
    if (!b) return std::move(b).error();
    side->impl_->running.push_back(std::move(*b));
  }
  return side;
}

Result<std::vector<CustomerPayment>> ReadSide::customer_payments(std::string_view customer, std::size_t limit) const {
  if (customer.empty() || customer.size() > kMaxCustomerLength)
    return Error(ErrorCode::invalid_argument,
                 "a customer id is 1 to " + std::to_string(kMaxCustomerLength) + " bytes");
  for (unsigned char c : customer)
    if (c < 0x20 || c == 0x7f) return Error(ErrorCode::invalid_argument, "a customer id holds no control character");
  if (limit == 0 || limit > 1000) return Error(ErrorCode::invalid_argument, "limit: 1 to 1000");
  auto rows = impl_->model->query(
      "SELECT payment_id, order_id, amount, status, refunded, created_ms, updated_ms FROM payments_by_customer "
      "WHERE customer = ?1 ORDER BY created_ms, payment_id LIMIT ?2",
      {customer, static_cast<std::int64_t>(limit)});
  if (!rows) return std::move(rows).error();
  std::vector<CustomerPayment> out;
  out.reserve(rows->size());
  for (const auto& r : *rows)
    out.push_back({text_cell(r[0]), text_cell(r[1]), int_cell(r[2]), text_cell(r[3]), int_cell(r[4]), int_cell(r[5]),
                   int_cell(r[6])});
  return out;
}

Result<std::vector<DayTotals>> ReadSide::daily_totals(std::string_view from, std::string_view to) const {
  auto f = parse_day(from);
  if (!f) return Error(ErrorCode::invalid_argument, "from: " + f.error().message());
  auto t = parse_day(to);
  if (!t) return Error(ErrorCode::invalid_argument, "to: " + t.error().message());
  if (*f > *t) return Error(ErrorCode::invalid_argument, "from is after to");
  if (*t - *f > std::chrono::days(365)) return Error(ErrorCode::invalid_argument, "at most 366 days at once");
  auto rows = impl_->model->query(
      "SELECT day, settled_count, settled_amount, refunded_count, refunded_amount FROM daily_totals "
      "WHERE day >= ?1 AND day <= ?2 ORDER BY day",
      {from, to});
  if (!rows) return std::move(rows).error();
  std::vector<DayTotals> out;
  for (const auto& r : *rows)
    out.push_back({text_cell(r[0]), int_cell(r[1]), int_cell(r[2]), int_cell(r[3]), int_cell(r[4])});
  return out;
}

std::vector<troupe::ProjectionStatus> ReadSide::statuses() const {
  std::vector<troupe::ProjectionStatus> out;
  for (const auto& r : impl_->running) out.push_back(r.status());
  return out;
}

std::int64_t ReadSide::max_lag_ms() const {
  std::int64_t lag = 0;
  for (const auto& s : statuses()) lag = std::max(lag, s.lag_ms);
  return lag;
}

void ReadSide::add_routes(http::Router& r, const ReadSide* side, std::string unavailable) {
  auto error = [](const Error& e) {
    int code = e.code() == ErrorCode::invalid_argument ? 400 : 503;
    return http::Response::error(code, std::string(troupe::to_string(e.code())), e.message());
  };
  auto off = [unavailable] {
    return http::Response::error(503, "not_ready", "the read side is not running: " + unavailable);
  };
  r.add("GET", "/customers/{id}/payments", [side, error, off](http::Request& req, http::Responder out) {
    if (!side) return out.respond(off());
    std::size_t limit = 100;
    if (auto v = req.query_param("limit")) {
      auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), limit);
      if (ec != std::errc() || end != v->data() + v->size())
        return out.respond(http::Response::error(400, "invalid_argument", "limit: 1 to 1000"));
    }
    const std::string& customer = req.params["id"];
    auto rows = side->customer_payments(customer, limit);
    if (!rows) return out.respond(error(rows.error()));
    json list = json::array();
    for (const auto& p : *rows)
      list.push_back({{"id", p.id}, {"order_id", p.order_id}, {"amount", p.amount}, {"status", p.status},
                      {"refunded", p.refunded}, {"created_ms", p.created_ms}, {"updated_ms", p.updated_ms}});
    out.respond(http::Response::json(200, json{{"customer", customer}, {"payments", list},
                                               {"lag_ms", side->max_lag_ms()}}.dump()));
  });
  r.add("GET", "/totals/daily", [side, error, off](http::Request& req, http::Responder out) {
    if (!side) return out.respond(off());
    auto from = req.query_param("from");
    if (!from) return out.respond(http::Response::error(400, "invalid_argument", "from=YYYY-MM-DD is required"));
    std::string to_day = req.query_param("to").value_or(*from);
    auto rows = side->daily_totals(*from, to_day);
    if (!rows) return out.respond(error(rows.error()));
    json days = json::array();
    for (const auto& d : *rows)
      days.push_back({{"day", d.day}, {"settled_count", d.settled_count}, {"settled_amount", d.settled_amount},
                      {"refunded_count", d.refunded_count}, {"refunded_amount", d.refunded_amount}});
    out.respond(http::Response::json(200, json{{"from", *from}, {"to", to_day}, {"days", days},
                                               {"lag_ms", side->max_lag_ms()}}.dump()));
  });
}

}  // namespace payment
