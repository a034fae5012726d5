#pragma once
// The payment demo's service side: the payment service the crash kills
// (its journal, actor system and payment registry), the refund office it
// hands refunds to, and the journal's files on disk.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "demo.hpp"
#include "payment.hpp"
#include "troupe/core.hpp"
#include "troupe/persist.hpp"

namespace payment_demo {

using Registry = troupe::EntityRegistry<payment::Payment>;

// Takes the refunds of cancelled payments and numbers them. This demo is
// about settlement and crashes; the node's payment_service (service.cpp)
// hands its refunds to a durable job queue that pays them back through the
// gateway. Used only from its own handler.
class RefundOffice final : public troupe::Actor<payment::QueueRefund> {
 public:
  void receive(payment::QueueRefund& m) { m.reply_to.reply(++taken_); }

 private:
  std::uint64_t taken_ = 0;
};

// One life of the payment service: its journal, its actor system and the
// payment registry in it. Owned by main; not thread-safe (main drives it).
class PaymentService {
 public:
  // Opens the journal at `db` and starts the registry; throws what failed.
  static std::unique_ptr<PaymentService> start(const Options& o, const std::string& db,
                                               const troupe::ActorRef<payment::GatewayMsg>& gateway,
                                               const troupe::ActorRef<payment::QueueRefund>& refunds);

  const Registry& registry() const { return *registry_; }

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
