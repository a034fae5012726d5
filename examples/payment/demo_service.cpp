// The payment demo's service side: see demo_service.hpp.

#include "demo_service.hpp"

#include <stdlib.h>

#include <charconv>
#include <cstdio>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace payment_demo {

using namespace std::chrono_literals;

std::unique_ptr<PaymentService> PaymentService::start(const Options& o, const std::string& db,
                                                      const troupe::ActorRef<payment::GatewayMsg>& gateway,
                                                      std::shared_ptr<RefundOffice> refunds) {
  auto s = std::unique_ptr<PaymentService>(new PaymentService);
  auto j = troupe::SqliteJournal::open(troupe::SqliteJournalOptions{.path = db, .durability = troupe::Durability::full});
  if (!j.ok()) throw std::runtime_error("cannot open the journal: " + j.error().to_string());
  s->journal_ = std::move(*j);

  troupe::SystemConfig cfg;
  cfg.log_dead_letters = false;  // the crash leaves many, by design
  cfg.shutdown_drain_timeout = 2s;
  s->system_ = std::make_unique<troupe::ActorSystem>(std::move(cfg));

  troupe::EntitySettings settings;
  settings.type_name = "payment";
  settings.idle_timeout = 10s;  // finished payments passivate at once; this catches the rest
  troupe::Duration timeout = std::chrono::milliseconds(o.timeout_ms);
  auto reg = Registry::start(*s->system_, s->journal_, settings, payment::payment_codecs(),
                             [gateway, timeout](const std::string&) { return payment::Payment(gateway, timeout); });
  if (!reg.ok()) throw std::runtime_error("cannot start the payment registry: " + reg.error().to_string());
  s->registry_.emplace(std::move(*reg));

  // The refunds the cancelled payments stored: paid back through the office.
  // After the crash the next life's dispatcher (same owner) takes them up.
  troupe::OutboxSettings os;
  os.owner = "payment_demo";
  os.poll_interval = 50ms;
  auto pay_back = [refunds](const troupe::OutboxEntry& e) {
    troupe::Promise<void> done;
    auto f = done.future();
    std::int64_t amount = 0;
    const std::string& t = e.record.payload;
    if (std::from_chars(t.data(), t.data() + t.size(), amount).ec != std::errc()) {
      done.set_error(troupe::Error(troupe::ErrorCode::invalid_argument, "refund amount '" + t + "'"));
      return f;
    }
    refunds->refund(e.entity_id(), amount, e.record.key);
    done.set_value();
    return f;
  };
  auto outbox = troupe::OutboxDispatcher::start(*s->system_, s->journal_, os, {{payment::kRefundEffect, pay_back}});
  if (!outbox.ok()) throw std::runtime_error("cannot start the refunds' outbox: " + outbox.error().to_string());
  s->outbox_.emplace(std::move(*outbox));
  return s;
}

std::uint64_t PaymentService::refunds_pending() const {
  auto v = outbox_->read(troupe::OutboxQuery{}).get();
  return v.ok() ? v->pending + v->failed : ~std::uint64_t{0};
}

troupe::EntityStats PaymentService::kill() {
  auto stats = registry_->stats();
  registry_->abandon();
  registry_.reset();
  outbox_.reset();
  system_.reset();  // stops every actor where it stands
  std::weak_ptr<troupe::SqliteJournal> gone = journal_;
  journal_.reset();
  // The next life opens the same file, which only works once this journal is closed.
  if (!gone.expired()) throw std::runtime_error("the journal is still referenced after its actor system was destroyed");
  return stats;
}

troupe::EntityStats PaymentService::stop() {
  if (auto r = registry_->stop(); !r.ok()) std::fprintf(stderr, "payment_demo: %s\n", r.error().to_string().c_str());
  auto stats = registry_->stats();
  registry_.reset();
  outbox_.reset();
  system_->shutdown();
  system_.reset();
  journal_.reset();
  return stats;
}

JournalFiles::JournalFiles(const std::string& path) : db_(path) {
  if (!db_.empty()) return;
  std::string tmpl = (std::filesystem::temp_directory_path() / "payment_demo.XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot create a temporary directory");
  temp_dir_ = tmpl;
  db_ = (temp_dir_ / "journal.db").string();
}

JournalFiles::~JournalFiles() {
  if (keep_) return;
  std::error_code ec;  // best effort: nothing to do about a file that will not go
  if (!temp_dir_.empty()) {
    std::filesystem::remove_all(temp_dir_, ec);
  } else {
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::filesystem::remove(db_ + suffix, ec);
  }
}

}  // namespace payment_demo
