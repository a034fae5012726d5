#pragma once
// Wire codecs of the cluster's messages built from Protobuf messages (target
// troupe::protobuf, with troupe::cluster).
//
// One line per message type; its name on the wire (and so its wire id) is
// the Protobuf message's full name. A request's reply is converted the same
// way; the reply_to member stays out of the message, carried by the runtime:
//
//   troupe::cluster::MessageCodecs<Command> codecs;
//   auto ok = troupe::add_protobuf<Settle>(codecs, settle_to_pb, settle_from_pb,
//                                          status_to_pb, status_from_pb, {.idempotent = true});
//   ok = troupe::add_protobuf<pb::Ping>(codecs);  // the message is the generated type
//
// to_pb returns the message; from_pb returns T or Result<T> (an error: the
// message does not decode, protocol_error). The wire carries no version:
// a message evolves by Protobuf's rules (fields added or left unused).
// Registrations are errors as values, as MessageCodecs::add's are. Thread
// safety: that of the table filled (troupe/cluster/messages.hpp).

#include <type_traits>
#include <utility>

#include "troupe/cluster/messages.hpp"
#include "troupe/protobuf/codecs.hpp"

namespace troupe {
namespace protobuf::detail {

// The encoder of a wire message: never throws (the runtime encodes on its
// own threads). A proto2 message missing a required field is sent as it
// is, and the receiver's parse refuses it as a protocol_error.
template <class T, Message PB, class ToPb>
auto wire_encoder(ToPb to_pb) {
  return [to_pb = std::move(to_pb)](const T& v, ByteWriter& w) {
    (void)to_pb(v).AppendPartialToString(&w.bytes());
  };
}

}  // namespace protobuf::detail

// Registers T (no reply, or ReplyTo<void>) as the message to_pb returns.
template <class T, class M, class ToPb, class FromPb>
requires(!cluster::detail::ReplyTypeOf<T>::has ||
         std::is_void_v<typename cluster::detail::ReplyTypeOf<T>::type>)
    Result<void> add_protobuf(cluster::MessageCodecs<M>& codecs, ToPb to_pb, FromPb from_pb,
                              cluster::MessageOptions options = {}) {
  using PB = protobuf::detail::MessageOf<T, void, ToPb>;
  static_assert(protobuf::Message<PB>, "to_pb must return a generated Protobuf message");
  return codecs.template add<T>(protobuf::manifest_name<PB>(),
                                protobuf::detail::wire_encoder<T, PB>(std::move(to_pb)),
                                protobuf::detail::reader<T, PB>(std::move(from_pb)), options);
}

// Registers the request T, whose reply_to is a ReplyTo<R>, as the message
// to_pb returns, and its reply R as the message reply_to_pb returns.
template <class T, class M, class ToPb, class FromPb, class ReplyToPb, class ReplyFromPb,
          class R = typename cluster::detail::ReplyTypeOf<T>::type>
requires(cluster::detail::ReplyTypeOf<T>::has &&
         !std::is_void_v<R>) Result<void> add_protobuf(cluster::MessageCodecs<M>& codecs, ToPb to_pb,
                                                       FromPb from_pb, ReplyToPb reply_to_pb,
                                                       ReplyFromPb reply_from_pb,
                                                       cluster::MessageOptions options = {}) {
  using PB = protobuf::detail::MessageOf<T, void, ToPb>;
  using RPB = protobuf::detail::MessageOf<R, void, ReplyToPb>;
  static_assert(protobuf::Message<PB> && protobuf::Message<RPB>,
                "to_pb and reply_to_pb must return generated Protobuf messages");
  return codecs.template add<T>(protobuf::manifest_name<PB>(),
                                protobuf::detail::wire_encoder<T, PB>(std::move(to_pb)),
                                protobuf::detail::reader<T, PB>(std::move(from_pb)),
                                protobuf::detail::wire_encoder<R, RPB>(std::move(reply_to_pb)),
                                protobuf::detail::reader<R, RPB>(std::move(reply_from_pb)), options);
}

// Registers the generated message PB as a message type of its own.
template <protobuf::Message PB, class M>
Result<void> add_protobuf(cluster::MessageCodecs<M>& codecs, cluster::MessageOptions options = {}) {
  return add_protobuf<PB>(codecs, protobuf::detail::identity, protobuf::detail::identity, options);
}

}  // namespace troupe
