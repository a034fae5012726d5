// The payment service's read side (read_side.hpp): the two projections'
// handlers (one template over the SQLite and the PostgreSQL read model),
// their start across the slices, the reads and the routes.

#include "read_side.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>

#include "troupe/persist/postgres_read_model.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_read_model.hpp"

namespace payment {

namespace {

using troupe::Error;
using troupe::ErrorCode;
using troupe::PostgresReadModel;
using troupe::Result;
using troupe::SqliteReadModel;
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

// The statements are written once, with SQLite's ?N placeholders;
// PostgreSQL's are $N (no statement here has a '?' anywhere else). Upserts
// name the stored row's columns by their table, as PostgreSQL wants.
template <class Model>
auto sql(std::string_view s) {
  if constexpr (std::is_same_v<Model, SqliteReadModel>) {
    return s;
  } else {
    std::string out(s);
    for (auto& c : out)
      if (c == '?') c = '$';
    return out;
  }
}

// The tables' creation, serialised across the nodes sharing a PostgreSQL
// database (CREATE TABLE IF NOT EXISTS run at once by two sessions may fail
// one of them), without a NOTICE per table that exists; SQLite's write lock
// serialises it already.
template <class Model>
Result<void> lock_setup(typename Model::Transaction& tx) {
  if constexpr (std::is_same_v<Model, PostgresReadModel>) {
    if (auto r = tx.exec("SET LOCAL client_min_messages = warning"); !r) return r;
    auto r = tx.query("SELECT pg_advisory_xact_lock(hashtext('payment read side tables'))");
    if (!r) return std::move(r).error();
  }
  (void)tx;
  return {};
}

// payments_by_customer: one row per payment. A page's events are folded
// per payment first (one upsert each, whatever its events in the page), so
// a payment whose first events are in no slice (stored before tags) still
// gets a row from its later ones.
template <class Model>
struct ByCustomer {
  using ReadModel = Model;
  troupe::EventCodecs<Event> codecs = payment_codecs();

  Result<void> setup(typename Model::Transaction& tx) {
    if (auto r = lock_setup<Model>(tx); !r) return r;
    auto r = tx.exec(
        "CREATE TABLE IF NOT EXISTS payments_by_customer (payment_id TEXT PRIMARY KEY, customer TEXT NOT NULL, "
        "order_id TEXT NOT NULL, amount BIGINT NOT NULL, status TEXT NOT NULL, refunded BIGINT NOT NULL, "
        "created_ms BIGINT NOT NULL, updated_ms BIGINT NOT NULL)");
    if (!r) return r;
    return tx.exec(
        "CREATE INDEX IF NOT EXISTS payments_by_customer_customer ON payments_by_customer (customer, created_ms, "
        "payment_id)");
  }

  // What a page's events do to one payment's row, in their order: the
  // last (customer, order, amount) an event carried (the customer only when
  // not empty), the last status, the refund of the last status event.
  struct Row {
    const std::string* id = nullptr;  // the key of `index` below
    std::size_t last = 0;             // its last event's index in the page
    std::string customer, order_id;
    bool has_order = false, has_refunded = false;
    std::int64_t amount = 0, refunded = 0, created_ms = 0, updated_ms = 0;
    Phase status = Phase::waiting_for_request;
  };

  Result<void> apply(typename Model::Transaction& tx, std::span<const StreamEvent> page, std::size_t& failed_at) {
    std::vector<Row> rows;
    std::map<std::string, std::size_t> index;  // payment id -> rows
    for (std::size_t i = 0; i < page.size(); ++i) {
      auto ev = decode(codecs, page[i]);
      if (!ev) {
        failed_at = i;
        return std::move(ev).error();
      }
      const std::int64_t at = page[i].event.timestamp_ms;
      auto row = [&]() -> Row& {
        auto [it, fresh] = index.try_emplace(payment_id_of(page[i].persistence_id), rows.size());
        if (fresh) {
          Row& fresh_row = rows.emplace_back();
          fresh_row.id = &it->first;
          fresh_row.created_ms = at;
        }
        Row& r = rows[it->second];
        r.last = i;
        r.updated_ms = at;
        return r;
      };
      auto order = [&](const std::string& customer, const std::string& order_id, std::int64_t amount, Phase p) {
        Row& r = row();
        if (!customer.empty()) r.customer = customer;
        r.has_order = true;
        r.order_id = order_id;
        r.amount = amount;
        r.status = p;
      };
      auto status = [&](Phase p, std::int64_t refunded) {
        Row& r = row();
        r.status = p;
        r.has_refunded = true;
        r.refunded = refunded;
      };
      troupe::match(
          *ev, [&](const PaymentCreated& x) { order(x.customer, x.order_id, x.amount, Phase::waiting_for_request); },
          [&](const SettlementAccepted& x) { order(x.customer, x.order_id, x.amount, Phase::settling); },
          [&](const SettlementSucceeded&) { status(Phase::completed, 0); },
          [&](const SettlementDeclined&) { status(Phase::failed, 0); },
          [&](const SettlementFailed&) { status(Phase::failed, 0); },
          [&](const SettlementTimedOut&) { status(Phase::failed, 0); },
          [&](const PaymentCancelled& x) { status(Phase::cancelled, x.refunded); },
          [&](const LegacyRefundStep&) {});
    }
    // A new row takes what the page gave (the rest empty or 0); a stored
    // one keeps what the page did not give.
    for (const Row& r : rows) {
      auto done = tx.exec(
          sql<Model>("INSERT INTO payments_by_customer VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (payment_id) "
                     "DO UPDATE SET customer = CASE WHEN excluded.customer <> '' THEN excluded.customer "
                     "ELSE payments_by_customer.customer END, "
                     "order_id = CASE WHEN ?9 = 1 THEN excluded.order_id ELSE payments_by_customer.order_id END, "
                     "amount = CASE WHEN ?9 = 1 THEN excluded.amount ELSE payments_by_customer.amount END, "
                     "status = excluded.status, "
                     "refunded = CASE WHEN ?10 = 1 THEN excluded.refunded ELSE payments_by_customer.refunded END, "
                     "updated_ms = excluded.updated_ms"),
          {*r.id, r.customer, r.order_id, r.amount, to_string(r.status), r.refunded, r.created_ms, r.updated_ms,
           std::int64_t{r.has_order ? 1 : 0}, std::int64_t{r.has_refunded ? 1 : 0}});
      if (!done) {
        failed_at = r.last;
        return done;
      }
    }
    return {};
  }
};

// daily_totals: per UTC day of the event, payments settled and refunds
// stored. The amount of a payment being settled waits in
// daily_totals_open (its last Created or Accepted) until its outcome. A
// page is folded first: one write per payment (its open amount, or its
// removal) and one upsert per day.
template <class Model>
struct DailyTotals {
  using ReadModel = Model;
  troupe::EventCodecs<Event> codecs = payment_codecs();

  Result<void> setup(typename Model::Transaction& tx) {
    if (auto r = lock_setup<Model>(tx); !r) return r;
    auto r = tx.exec(
        "CREATE TABLE IF NOT EXISTS daily_totals (day TEXT PRIMARY KEY, settled_count BIGINT NOT NULL, "
        "settled_amount BIGINT NOT NULL, refunded_count BIGINT NOT NULL, refunded_amount BIGINT NOT NULL)");
    if (!r) return r;
    return tx.exec(
        "CREATE TABLE IF NOT EXISTS daily_totals_open (payment_id TEXT PRIMARY KEY, amount BIGINT NOT NULL)");
  }

  // One payment's open amount as the page leaves it.
  struct Open {
    enum class State : std::uint8_t { untouched, open, closed } state = State::untouched;
    std::int64_t amount = 0;
    std::optional<std::int64_t> stored;  // read from daily_totals_open when needed
    std::size_t last = 0;                // its last event's index in the page
  };
  struct Day {
    std::int64_t settled = 0, settled_amount = 0, refunds = 0, refunded = 0;
    std::size_t last = 0;
  };

  Result<void> apply(typename Model::Transaction& tx, std::span<const StreamEvent> page, std::size_t& failed_at) {
    std::vector<Event> events;
    events.reserve(page.size());
    std::map<std::string, Open> open;
    // Decoded, and the payments whose first use of the open amount in the
    // page is a settlement read it from the table (once, together).
    std::vector<std::string> lookups;
    for (std::size_t i = 0; i < page.size(); ++i) {
      auto ev = decode(codecs, page[i]);
      if (!ev) {
        failed_at = i;
        return std::move(ev).error();
      }
      events.push_back(std::move(*ev));
      if (std::holds_alternative<LegacyRefundStep>(events.back())) continue;
      auto [it, fresh] = open.try_emplace(payment_id_of(page[i].persistence_id));
      if (fresh && std::holds_alternative<SettlementSucceeded>(events.back())) lookups.push_back(it->first);
    }
    if (auto r = read_open(tx, lookups, open); !r) return r;
    std::map<std::string, Day> days;
    for (std::size_t i = 0; i < page.size(); ++i) {
      if (std::holds_alternative<LegacyRefundStep>(events[i])) continue;
      const std::string id = payment_id_of(page[i].persistence_id);
      Open& o = open[id];
      o.last = i;
      auto day = [&]() -> Day& {
        Day& d = days[utc_day(page[i].event.timestamp_ms)];
        d.last = i;
        return d;
      };
      auto set_open = [&](std::int64_t amount) {
        o.state = Open::State::open;
        o.amount = amount;
      };
      auto close = [&] { o.state = Open::State::closed; };
      Result<void> r = troupe::match(
          events[i],
          [&](const PaymentCreated& x) -> Result<void> {
            set_open(x.amount);
            return {};
          },
          [&](const SettlementAccepted& x) -> Result<void> {
            set_open(x.amount);
            return {};
          },
          [&](const SettlementSucceeded&) -> Result<void> {
            const std::optional<std::int64_t> amount = o.state == Open::State::open       ? std::optional(o.amount)
                                                       : o.state == Open::State::untouched ? o.stored
                                                                                           : std::nullopt;
            // Loud, never a guess: the projection stops on this event.
            if (!amount)
              return Error(ErrorCode::corrupt_record, "payment '" + id +
                                                          "' settled without an earlier SettlementAccepted in its slice");
            Day& d = day();
            ++d.settled;
            d.settled_amount += *amount;
            close();
            return {};
          },
          [&](const SettlementDeclined&) -> Result<void> {
            close();
            return {};
          },
          [&](const SettlementFailed&) -> Result<void> {
            close();
            return {};
          },
          [&](const SettlementTimedOut&) -> Result<void> {
            close();
            return {};
          },
          [&](const PaymentCancelled& x) -> Result<void> {
            close();
            if (x.refunded > 0) {
              Day& d = day();
              ++d.refunds;
              d.refunded += x.refunded;
            }
            return {};
          },
          [&](const LegacyRefundStep&) -> Result<void> { return {}; });
      if (!r) {
        failed_at = i;
        return r;
      }
    }
    for (const auto& [id, o] : open) {
      Result<void> r;
      if (o.state == Open::State::open)
        r = tx.exec(sql<Model>("INSERT INTO daily_totals_open VALUES (?1, ?2) ON CONFLICT (payment_id) DO UPDATE "
                               "SET amount = excluded.amount"),
                    {id, o.amount});
      else if (o.state == Open::State::closed)
        r = tx.exec(sql<Model>("DELETE FROM daily_totals_open WHERE payment_id = ?1"), {id});
      if (!r) {
        failed_at = o.last;
        return r;
      }
    }
    // Last, and in the days' order: the day's row is the one slices share,
    // so it is locked for the least time and always in the same order.
    for (const auto& [when, d] : days) {
      auto r = tx.exec(
          sql<Model>("INSERT INTO daily_totals VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (day) DO UPDATE SET "
                     "settled_count = daily_totals.settled_count + excluded.settled_count, "
                     "settled_amount = daily_totals.settled_amount + excluded.settled_amount, "
                     "refunded_count = daily_totals.refunded_count + excluded.refunded_count, "
                     "refunded_amount = daily_totals.refunded_amount + excluded.refunded_amount"),
          {when, d.settled, d.settled_amount, d.refunds, d.refunded});
      if (!r) {
        failed_at = d.last;
        return r;
      }
    }
    return {};
  }

 private:
  // The stored open amounts of `ids` into `open`: one query on PostgreSQL
  // (the ids hex-encoded, so any id passes), one indexed read each on
  // SQLite (in-process: no round trip to save).
  static Result<void> read_open(typename Model::Transaction& tx, const std::vector<std::string>& ids,
                                std::map<std::string, Open>& open) {
    if (ids.empty()) return {};
    if constexpr (std::is_same_v<Model, PostgresReadModel>) {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string list;
      for (const std::string& id : ids) {
        if (!list.empty()) list += ',';
        for (unsigned char c : id) {
          list += kHex[c >> 4];
          list += kHex[c & 15];
        }
      }
      auto rows = tx.query(
          "SELECT payment_id, amount FROM daily_totals_open WHERE payment_id IN (SELECT convert_from(decode(h, 'hex'), "
          "'UTF8') FROM unnest(string_to_array($1::text, ',')) AS h)",
          {list});
      if (!rows) return std::move(rows).error();
      for (const auto& row : *rows)
        if (row.size() == 2) open[text_cell(row[0])].stored = int_cell(row[1]);
    } else {
      for (const std::string& id : ids) {
        auto rows = tx.query("SELECT amount FROM daily_totals_open WHERE payment_id = ?1", {id});
        if (!rows) return std::move(rows).error();
        if (!rows->empty()) open[id].stored = int_cell((*rows)[0][0]);
      }
    }
    return {};
  }
};

// The slices of both projections running on this node, by status key.
// Shared with the node's serve_projection callbacks in a cluster, which may
// outlive the ReadSide. Thread-safe (mu).
struct LocalSlices {
  std::mutex mu;
  std::map<std::string, troupe::node::RunningSlice> running;
};

using AnyModel = std::variant<std::shared_ptr<SqliteReadModel>, std::shared_ptr<PostgresReadModel>>;

template <template <class> class H, class Model>
Result<troupe::node::RunningSlice> start_slice(troupe::ActorSystem& system, const std::shared_ptr<troupe::Journal>& journal,
                                               const std::shared_ptr<Model>& model, std::string name, std::string tag) {
  troupe::ProjectionSettings s;
  s.name = std::move(name);
  s.source = troupe::EventSelector::with_tag(std::move(tag));
  s.poll_interval = std::chrono::milliseconds(500);
  // A few ms of commits per page keep the projections' transactions few: a
  // read model in the journal's SQLite file shares its write lock, one in
  // PostgreSQL pays a round trip or two per page.
  s.linger = std::chrono::milliseconds(10);
  auto p = troupe::Projection<H<Model>>::start(system, journal, model, std::move(s));
  if (!p) return std::move(p).error();
  return troupe::node::RunningSlice::of(*p);
}

}  // namespace

struct ReadSide::Impl {
  troupe::node::Node* node = nullptr;
  AnyModel model;
  std::shared_ptr<LocalSlices> local = std::make_shared<LocalSlices>();
  bool node_runs_slices = false;  // served by the node (a cluster): it stops them when it stops

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (node_runs_slices) return;
    std::map<std::string, troupe::node::RunningSlice> running;
    {
      std::lock_guard lk(local->mu);
      running.swap(local->running);
    }
    for (auto& [key, r] : running) {
      node->unwatch_projection(key);
      r.stop();
    }
  }

  // A read on the model's reading connection; `text` as sql() takes it.
  Result<std::vector<troupe::SqlRow>> query(std::string_view text, std::initializer_list<troupe::SqlParam> params) const {
    return std::visit(
        [&](const auto& m) { return m->query(sql<typename std::decay_t<decltype(m)>::element_type>(text), params); },
        model);
  }

  // Creates the tables, then runs both projections over every slice: all
  // here, or (`clustered`) each slice on one node of the cluster.
  template <class Model>
  Result<void> run(const std::shared_ptr<troupe::Journal>& journal, const std::shared_ptr<Model>& m,
                   std::uint32_t slices, bool clustered) {
    model = m;
    // The tables first, so that a read before the projections' first page
    // finds them (empty) rather than failing.
    auto tables = m->transact([](typename Model::Transaction& tx) -> Result<void> {
      if (auto r = ByCustomer<Model>{}.setup(tx); !r) return r;
      return DailyTotals<Model>{}.setup(tx);
    });
    if (!tables) return Error(tables.error().code(), "the read model's tables: " + tables.error().message());
    using Start = Result<troupe::node::RunningSlice> (*)(troupe::ActorSystem&, const std::shared_ptr<troupe::Journal>&,
                                                         const std::shared_ptr<Model>&, std::string, std::string);
    const std::pair<const char*, Start> projections[] = {{"payments_by_customer", &start_slice<ByCustomer, Model>},
                                                         {"daily_totals", &start_slice<DailyTotals, Model>}};
    troupe::ActorSystem* system = &node->system();
    // Starts one slice and keeps it in `local` until it stops.
    auto starter = [system, journal, m, shared = local](std::string name, Start start) {
      return [=](const std::string& tag) -> Result<troupe::node::RunningSlice> {
        auto r = start(*system, journal, m, name, tag);
        if (!r) return r;
        std::string key = r->status().key;
        {
          std::lock_guard lk(shared->mu);
          shared->running[key] = *r;
        }
        return troupe::node::RunningSlice{r->status, [shared, key, stop = r->stop] {
                                            {
                                              std::lock_guard lk(shared->mu);
                                              shared->running.erase(key);
                                            }
                                            stop();
                                          }};
      };
    };
    if (clustered) {
      node_runs_slices = true;
      for (const auto& [name, start] : projections) {
        troupe::node::ProjectionSlices ps;
        ps.name = name;
        for (std::uint32_t k = 0; k < slices; ++k) ps.slices.push_back("payment-slice-" + std::to_string(k));
        ps.start = starter(name, start);
        if (auto r = node->serve_projection(std::move(ps)); !r) return r;
      }
      return {};
    }
    for (std::uint32_t k = 0; k < slices; ++k) {
      for (const auto& [name, start] : projections) {
        auto r = starter(name, start)("payment-slice-" + std::to_string(k));
        if (!r) return std::move(r).error();  // ~Impl stops those started
        node->watch_projection(r->status);
      }
    }
    return {};
  }
};


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

ReadSide::ReadSide(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReadSide::~ReadSide() = default;

Result<std::unique_ptr<ReadSide>> ReadSide::start(troupe::node::Node& node, std::uint32_t slices) {
  const auto& j = node.config().journal;
  if (j.backend == "sqlite") return open(node, node.journal(), node.config().sqlite_path().string(), slices);
  if (j.backend != "postgres")
    return Error(ErrorCode::invalid_argument, "the read side keeps its read models in the journal's database "
                                              "(SQLite or PostgreSQL); journal.backend is \"" + j.backend + "\"");
  if (auto r = check(node.journal(), slices); !r) return std::move(r).error();
  auto model = PostgresReadModel::open({j.postgres, j.schema});
  if (!model) return Error(model.error().code(), "the read model: " + model.error().message());
  auto impl = std::make_unique<Impl>();
  impl->node = &node;
  if (auto r = impl->run(node.journal(), *model, slices, node.config().cluster.enabled); !r) return std::move(r).error();
  return std::unique_ptr<ReadSide>(new ReadSide(std::move(impl)));
}

Result<std::unique_ptr<ReadSide>> ReadSide::open(troupe::node::Node& node, std::shared_ptr<troupe::Journal> journal,
                                                 const std::string& model_path, std::uint32_t slices) {
  if (auto r = check(journal, slices); !r) return std::move(r).error();
  auto model = SqliteReadModel::open({.path = model_path});
  if (!model) return Error(model.error().code(), "the read model: " + model.error().message());
  auto impl = std::make_unique<Impl>();
  impl->node = &node;
  // Each node's SQLite file holds its own journal: its read side runs
  // every slice, in a cluster too.
  if (auto r = impl->run(journal, *model, slices, false); !r) return std::move(r).error();
  return std::unique_ptr<ReadSide>(new ReadSide(std::move(impl)));
}

Result<void> ReadSide::check(const std::shared_ptr<troupe::Journal>& journal, std::uint32_t slices) {
  if (!journal || !journal->supports_queries())
    return Error(ErrorCode::invalid_argument, "the journal does not answer queries across entities");
  if (slices == 0 || slices > kMaxReadSlices)
    return Error(ErrorCode::invalid_argument, "payment.read_slices: 1 to " + std::to_string(kMaxReadSlices));
  return {};
}

Result<std::vector<CustomerPayment>> ReadSide::customer_payments(std::string_view customer, std::size_t limit) const {
  if (customer.empty() || customer.size() > kMaxCustomerLength)
    return Error(ErrorCode::invalid_argument,
                 "a customer id is 1 to " + std::to_string(kMaxCustomerLength) + " bytes");
  for (unsigned char c : customer)
    if (c < 0x20 || c == 0x7f) return Error(ErrorCode::invalid_argument, "a customer id holds no control character");
  if (limit == 0 || limit > 1000) return Error(ErrorCode::invalid_argument, "limit: 1 to 1000");
  auto rows = impl_->query(
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
  auto rows = impl_->query(
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
  std::vector<std::function<troupe::ProjectionStatus()>> running;
  {
    std::lock_guard lk(impl_->local->mu);
    for (const auto& [key, r] : impl_->local->running) running.push_back(r.status);
  }
  std::vector<troupe::ProjectionStatus> out;
  for (const auto& status : running) out.push_back(status());
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
