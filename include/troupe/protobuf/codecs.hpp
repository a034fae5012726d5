#pragma once
// Event and snapshot codecs built from Protobuf messages (target
// troupe::protobuf; troupe::persist alone never links libprotobuf).
//
// One line per event type. The manifest stored with the event is the
// message's full name ("payment.SettlementAccepted"), its version the
// message's (troupe.protobuf.version) option (troupe/protobuf/options.proto;
// 1 without it). Either the event type is a plain C++ type converted to and
// from its message:
//
//   troupe::EventCodecs<Event> codecs;
//   troupe::add_protobuf<SettlementAccepted>(codecs, accepted_to_pb, accepted_from_pb);
//
// where accepted_to_pb is `pb::SettlementAccepted(const SettlementAccepted&)`
// and accepted_from_pb is `SettlementAccepted(const pb::SettlementAccepted&)`
// or returns Result<SettlementAccepted> (an error value: the record is
// corrupt_record). Or the event type is the generated message itself:
//
//   troupe::add_protobuf<pb::OrderShipped>(codecs);
//
// Old versions are read as Protobuf reads them (fields added since are
// empty, unknown ones skipped), or upcast (troupe/persist/codec.hpp) when
// their meaning changed. Two helpers write the steps from messages:
//
//   // a v1 message kept in the .proto as payment.SettlementAcceptedV1:
//   troupe::upcast_protobuf<pb::SettlementAcceptedV1, pb::SettlementAccepted>(codecs, 1, v1_to_v2);
//   // rows written by ByteWriter codecs under the old name "SettlementAccepted":
//   troupe::upcast_from_bytes<pb::SettlementAccepted>(codecs, "SettlementAccepted", 2,
//       [](troupe::ByteReader& r) -> troupe::Result<pb::SettlementAccepted> { ...; return
//       r.finish(std::move(m)); });
//
// Snapshots: protobuf_state_codec<State>(state_to_pb, state_from_pb) is
// a StateCodec with the same manifest rules. The cluster's message codecs
// are in troupe/protobuf/messages.hpp.
//
// Like the codec tables they fill, these are used while the tables are
// set up; encoding and decoding are then safe from many threads.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "troupe/core/result.hpp"
#include "troupe/persist/codec.hpp"

namespace troupe {
namespace protobuf {

// The (troupe.protobuf.version) option of a message type; 1 without it.
std::uint32_t version_of(const google::protobuf::Descriptor& message);

// A message type protoc generated.
template <class PB>
concept Message = std::is_base_of_v<google::protobuf::Message, PB>;

// The manifest of PB: its full name and its version.
template <Message PB>
const std::string& manifest_name() {
  return PB::descriptor()->full_name();
}
template <Message PB>
std::uint32_t manifest_version() {
  static const std::uint32_t v = version_of(*PB::descriptor());
  return v;
}

namespace detail {

// Appends m's encoding to w. A message that cannot be encoded (a proto2
// message missing a required field) throws: an entity reports it as an
// event it cannot encode, and stores nothing.
template <Message PB>
void write(const PB& m, ByteWriter& w) {
  // Checked here, not by Protobuf, whose failed check logs and aborts.
  if (!m.IsInitialized())
    throw std::invalid_argument("cannot encode " + manifest_name<PB>() + ": missing " +
                                m.InitializationErrorString());
  (void)m.AppendPartialToString(&w.bytes());
}

// Parses every byte left in r as a PB. (The partial parse and the check
// after it keep Protobuf from logging on its own.)
template <Message PB>
Result<PB> read(ByteReader& r) {
  std::string_view bytes = r.rest();
  PB m;
  if (bytes.size() > static_cast<std::size_t>(INT_MAX) ||
      !m.ParsePartialFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(ErrorCode::corrupt_record,
                 std::to_string(bytes.size()) + " byte(s) do not parse as " + manifest_name<PB>());
  if (!m.IsInitialized())
    return Error(ErrorCode::corrupt_record, manifest_name<PB>() + " lacks " + m.InitializationErrorString());
  return Result<PB>(std::move(m));
}

// The message type a to_pb function returns (PB given: PB).
template <class T, class PB, class ToPb>
using MessageOf =
    std::conditional_t<std::is_void_v<PB>, std::remove_cvref_t<std::invoke_result_t<ToPb&, const T&>>, PB>;

// from_pb(m) as a Result<T>, whether from_pb returns T or Result<T>.
template <class T, class PB, class FromPb>
Result<T> convert(const FromPb& from_pb, const PB& m) {
  using R = std::remove_cvref_t<std::invoke_result_t<const FromPb&, const PB&>>;
  if constexpr (std::is_same_v<R, Result<T>>) {
    return from_pb(m);
  } else {
    static_assert(std::is_convertible_v<R, T>, "from_pb must return T or Result<T>");
    return Result<T>(T(from_pb(m)));
  }
}

// Encoder and decoder (in the ByteWriter / ByteReader signatures of the
// codec tables) of T through the message PB.
template <class T, Message PB, class ToPb>
auto encoder(ToPb to_pb) {
  return [to_pb = std::move(to_pb)](const T& v, ByteWriter& w) { write<PB>(to_pb(v), w); };
}
template <class T, Message PB, class FromPb>
auto reader(FromPb from_pb) {
  return [from_pb = std::move(from_pb)](ByteReader& r) -> Result<T> {
    auto m = read<PB>(r);
    if (!m.ok()) return std::move(m).error();
    return convert<T>(from_pb, *m);
  };
}
inline constexpr auto identity = [](const auto& m) -> const auto& { return m; };

}  // namespace detail
}  // namespace protobuf

// Registers event type T, encoded as the message to_pb returns (or PB).
template <class T, class PB = void, class E, class ToPb, class FromPb>
EventCodecs<E>& add_protobuf(EventCodecs<E>& codecs, ToPb to_pb, FromPb from_pb) {
  using M = protobuf::detail::MessageOf<T, PB, ToPb>;
  static_assert(protobuf::Message<M>, "to_pb must return a generated Protobuf message");
  auto read = protobuf::detail::reader<T, M>(std::move(from_pb));
  return codecs.template add<T>(protobuf::manifest_name<M>(), protobuf::manifest_version<M>(),
                                protobuf::detail::encoder<T, M>(std::move(to_pb)),
                                [read = std::move(read)](std::uint32_t, ByteReader& r) { return read(r); });
}

// Registers the generated message PB as an event type of its own.
template <protobuf::Message PB, class E>
EventCodecs<E>& add_protobuf(EventCodecs<E>& codecs) {
  return add_protobuf<PB, PB>(codecs, protobuf::detail::identity, protobuf::detail::identity);
}

// The upcasting step from message Old, stored as `type` at version `from`,
// to message New at from + 1 (stored under New's full name):
// step is `New(const Old&)` or `Result<New>(const Old&)`.
template <protobuf::Message Old, protobuf::Message New, class E, class Step>
EventCodecs<E>& upcast_protobuf(EventCodecs<E>& codecs, std::string type, std::uint32_t from, Step step) {
  auto read = protobuf::detail::reader<New, Old>(std::move(step));
  return codecs.upcast(std::move(type), from, protobuf::manifest_name<New>(),
                       [read = std::move(read)](std::string_view bytes) -> Result<std::string> {
                         ByteReader r(bytes);
                         auto m = read(r);
                         if (!m.ok()) return std::move(m).error();
                         ByteWriter w;
                         protobuf::detail::write(*m, w);
                         return w.take();
                       });
}
// The same, for Old stored under New's own full name (the message kept its
// name; its old shape is kept in the .proto under another).
template <protobuf::Message Old, protobuf::Message New, class E, class Step>
EventCodecs<E>& upcast_protobuf(EventCodecs<E>& codecs, std::uint32_t from, Step step) {
  return upcast_protobuf<Old, New>(codecs, protobuf::manifest_name<New>(), from, std::move(step));
}

// The upcasting step from other bytes (a ByteWriter codec's), stored as
// `type` at version `from`, to message New at from + 1 under New's full
// name: step is `Result<New>(ByteReader&)` and ends with r.finish(m), so
// that bytes left over are an error.
template <protobuf::Message New, class E, class Step>
EventCodecs<E>& upcast_from_bytes(EventCodecs<E>& codecs, std::string type, std::uint32_t from, Step step) {
  return codecs.upcast(std::move(type), from, protobuf::manifest_name<New>(),
                       [step = std::move(step)](std::string_view bytes) -> Result<std::string> {
                         ByteReader r(bytes);
                         Result<New> m = step(r);
                         if (!m.ok()) return std::move(m).error();
                         ByteWriter w;
                         protobuf::detail::write(*m, w);
                         return w.take();
                       });
}

// The snapshot codec of state S, encoded as the message to_pb returns.
template <class S, class ToPb, class FromPb>
StateCodec<S> protobuf_state_codec(ToPb to_pb, FromPb from_pb) {
  using M = protobuf::detail::MessageOf<S, void, ToPb>;
  static_assert(protobuf::Message<M>, "to_pb must return a generated Protobuf message");
  StateCodec<S> c;
  c.type = protobuf::manifest_name<M>();
  c.version = protobuf::manifest_version<M>();
  c.encode = protobuf::detail::encoder<S, M>(std::move(to_pb));
  c.decode = [read = protobuf::detail::reader<S, M>(std::move(from_pb))](std::uint32_t, ByteReader& r) {
    return read(r);
  };
  return c;
}
// The snapshot codec of a state that is a generated message.
template <protobuf::Message PB>
StateCodec<PB> protobuf_state_codec() {
  return protobuf_state_codec<PB>(protobuf::detail::identity, protobuf::detail::identity);
}

}  // namespace troupe
