#pragma once
// The account of the Protobuf codec tests: its events (plain structs and a
// generated message), their codecs built from test_messages.proto, the
// upcasters that read the rows older builds wrote, those rows, and the
// snapshot codec of its state.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "test_messages.pb.h"
#include "troupe/protobuf/codecs.hpp"

namespace troupe::test {

namespace pb = troupe::testpb;

struct Deposit {
  std::int64_t cents = 0;
  std::string memo;
};
struct Transfer {
  std::int64_t cents = 0;
  std::string to;
};
using AccountEvent = std::variant<Deposit, Transfer, pb::Withdrawn>;

inline pb::Money eur(std::int64_t cents) {
  pb::Money m;
  m.set_units(cents);
  m.set_currency("EUR");
  return m;
}
inline Result<std::int64_t> cents_of(const pb::Money& m) {
  if (m.currency() != "EUR")
    return Error(ErrorCode::invalid_argument, "currency '" + m.currency() + "' is not EUR");
  return m.units();
}

inline pb::Deposited deposit_to_pb(const Deposit& d) {
  pb::Deposited m;
  *m.mutable_amount() = eur(d.cents);
  m.set_memo(d.memo);
  return m;
}
inline Result<Deposit> deposit_from_pb(const pb::Deposited& m) {
  auto cents = cents_of(m.amount());
  if (!cents.ok()) return std::move(cents).error();
  return Deposit{*cents, m.memo()};
}
inline pb::Transferred transfer_to_pb(const Transfer& t) {
  pb::Transferred m;
  *m.mutable_amount() = eur(t.cents);
  m.set_to(t.to);
  return m;
}
inline Result<Transfer> transfer_from_pb(const pb::Transferred& m) {
  auto cents = cents_of(m.amount());
  if (!cents.ok()) return std::move(cents).error();
  return Transfer{*cents, m.to()};
}

// Today's codecs, with the steps from every older row: "Deposited" v1 ->
// v2 (ByteWriter to ByteWriter) -> troupe.testpb.Deposited v3 (ByteWriter
// to Protobuf), and troupe.testpb.Transferred v1 -> v2 (Protobuf to
// Protobuf).
inline EventCodecs<AccountEvent> account_codecs() {
  EventCodecs<AccountEvent> c;
  add_protobuf<Deposit>(c, deposit_to_pb, deposit_from_pb);
  add_protobuf<Transfer>(c, transfer_to_pb, transfer_from_pb);
  add_protobuf<pb::Withdrawn>(c);
  c.upcast("Deposited", 1, [](std::string_view v1) -> Result<std::string> {
    ByteReader r(v1);
    std::int64_t cents = r.i64();
    ByteWriter w;
    w.i64(cents).str("");  // v2 added the memo
    return r.finish(w.take());
  });
  upcast_from_bytes<pb::Deposited>(c, "Deposited", 2, [](ByteReader& r) -> Result<pb::Deposited> {
    Deposit d;
    d.cents = r.i64();
    d.memo = r.str();
    return r.finish(deposit_to_pb(d));
  });
  upcast_protobuf<pb::TransferredV1, pb::Transferred>(c, 1, [](const pb::TransferredV1& v1) {
    pb::Transferred m;
    *m.mutable_amount() = eur(v1.cents());
    m.set_to(v1.to());
    return m;
  });
  return c;
}

// The account's state and its snapshot codec.
struct AccountState {
  std::int64_t balance = 0;
  std::uint64_t deposits = 0;
};
inline StateCodec<AccountState> account_snapshots() {
  return protobuf_state_codec<AccountState>(
      [](const AccountState& s) {
        pb::AccountSnapshot m;
        m.set_balance_cents(s.balance);
        m.set_deposits(s.deposits);
        return m;
      },
      [](const pb::AccountSnapshot& m) {
        return AccountState{m.balance_cents(), m.deposits()};
      });
}

// Rows as older builds wrote them.
inline std::string deposited_v1(std::int64_t cents) {
  ByteWriter w;
  w.i64(cents);
  return w.take();
}
inline std::string deposited_v2(std::int64_t cents, std::string_view memo) {
  ByteWriter w;
  w.i64(cents).str(memo);
  return w.take();
}
inline std::string transferred_v1(std::int64_t cents, const std::string& to) {
  pb::TransferredV1 m;
  m.set_cents(cents);
  m.set_to(to);
  return m.SerializeAsString();
}

}  // namespace troupe::test
