#pragma once
// The payment demo's service side: the payment service the crash kills
// (its journal, actor system, payment registry and outbox dispatcher), the
// refund office its refunds are paid back through, and the journal's files
// on disk.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "demo.hpp"
#include "payment.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace payment_demo {

using Registry = troupe::EntityRegistry<payment::Payment>;

// The outside world's refund desk, as the gateway's /refund is in the
// payment_service: it pays a refund back once per idempotency key (a
// repeated key is answered as the first was, and pays nothing) and counts
// what it paid per payment. It outlives the crash, as a gateway would.
// Shared by the service's outbox handler and main; thread-safe.
class RefundOffice {
 public:
  // Pays `amount` back to `payment` under `key` (once per key).
  void refund(const std::string& payment, std::int64_t amount, const std::string& key) {
    std::lock_guard lk(mu_);
    if (!keys_.insert(key).second) {
      ++repeated_;
      return;
    }
    ++paid_[payment];
    total_ += amount;
  }
  // Refunds paid per payment id.
  std::map<std::string, std::uint64_t> paid() const {
    std::lock_guard lk(mu_);
    return paid_;
  }
  std::uint64_t repeated() const {
    std::lock_guard lk(mu_);
    return repeated_;
  }

 private:
  mutable std::mutex mu_;
  std::set<std::string> keys_;
  std::map<std::string, std::uint64_t> paid_;
  std::uint64_t repeated_ = 0;
  std::int64_t total_ = 0;
};

// One life of the payment service: its journal, its actor system, the
// payment registry in it and the outbox dispatcher that pays the refunds
// back through the office. Owned by main; not thread-safe (main drives it).
class PaymentService {
 public:
  // Opens the journal at `db` and starts the registry; throws what failed.
  static std::unique_ptr<PaymentService> start(const Options& o, const std::string& db,
                                               const troupe::ActorRef<payment::GatewayMsg>& gateway,
                                               std::shared_ptr<RefundOffice> refunds);

  const Registry& registry() const { return *registry_; }
  // Refunds stored and not yet paid back, as the journal says now.
  std::uint64_t refunds_pending() const;

  // Dies as a crashed process would: no graceful stop of the entities (an
  // episode in progress is simply cut off), every request in flight fails.
  // The journal keeps exactly what it had committed.
  troupe::EntityStats kill();

  // The orderly end: entities stop (after any episode in progress), then
  // the actor system, then the journal.
  troupe::EntityStats stop();

 private:
  PaymentService() = default;
  std::shared_ptr<troupe::SqliteJournal> journal_;
  std::unique_ptr<troupe::ActorSystem> system_;
  std::optional<Registry> registry_;
  std::optional<troupe::OutboxDispatcher> outbox_;
};

// The journal's files: the given path, or a fresh temporary directory.
// Removed when this goes out of scope, on every way out of run(), unless
// keep() was called. Declared before the service so that the journal is
// closed first. Owned by run(); not thread-safe.
class JournalFiles {
 public:
  explicit JournalFiles(const std::string& path);
  JournalFiles(const JournalFiles&) = delete;
  JournalFiles& operator=(const JournalFiles&) = delete;
  ~JournalFiles();

  const std::string& db() const { return db_; }
  void keep() { keep_ = true; }

 private:
  std::string db_;
  std::filesystem::path temp_dir_;
  bool keep_ = false;
};

}  // namespace payment_demo
