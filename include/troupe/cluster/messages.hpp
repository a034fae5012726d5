#pragma once
// Message codecs: how the messages of an actor or an entity type cross the
// network.
//
// A remote actor or a sharded entity accepts one message type M: a single
// type or a std::variant of types. Each alternative is registered once, by
// name, with an encoder and a decoder (the ByteWriter / ByteReader of the
// journal codecs, or anything else):
//
//   troupe::cluster::MessageCodecs<PaymentCommand> codecs;
//   codecs.add<Settle>("Settle",
//       [](const Settle& c, troupe::ByteWriter& w) { w.u64(c.amount); },
//       [](troupe::ByteReader& r) -> troupe::Result<Settle> { Settle c; c.amount = r.u64(); return r.finish(std::move(c)); });
//
// A request carries its answer target in a `ReplyTo<R> reply_to` member, as
// everywhere in troupe. Such an alternative is registered with the codec of
// its reply too, and the runtime carries the answer back to the asker:
//
//   codecs.add<GetStatus>("GetStatus", enc, dec,
//       [](const Status& s, troupe::ByteWriter& w) { w.str(s.text); },
//       [](troupe::ByteReader& r) -> troupe::Result<Status> { ... });
//
// (For ReplyTo<void>, no reply codec is needed.) The codec never sees the
// reply_to member: it is carried by the runtime.
//
// A command that may safely be handled twice (its handler answers a repeat
// with the stored outcome) is declared idempotent where it is registered:
//
//   codecs.add<GetStatus>("GetStatus", enc, dec, status_enc, status_dec, {.idempotent = true});
//
// A shard region then re-sends an ask of that type to its shard's new owner
// when the owner died or left while the ask was out, within the asker's
// timeout, instead of answering "may or may not have been handled"
// (sharding.hpp, doc/sharding.md). The flag is a property of the message
// type on every node; it does not travel on the wire.
//
// On the wire an alternative is named by a 32-bit id, the FNV-1a hash of its
// name (doc/wire.md); two names with the same id in one table are refused.
// A table is filled before use and then only read: reading from many
// threads at once is safe, adding while others read is not.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/result.hpp"
#include "troupe/persist/codec.hpp"

namespace troupe::cluster {

// The wire id of a message name: FNV-1a, 32 bits. Stable across builds,
// machines and versions of troupe.
constexpr std::uint32_t message_id(std::string_view name) noexcept {
  std::uint32_t h = 2166136261u;
  for (char c : name) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

// An answer on its way back: the reply's bytes, or the error the target
// answered with. Completes the asker's reply target on the asking node.
using ReplyBytes = Result<std::string>;
// Completes a pending remote ask with what came back over the wire.
using PendingReply = troupe::detail::UniqueFunction<void(Result<std::string_view>)>;
// Receives the encoded answer of a request decoded on this node.
using ReplySink = troupe::detail::UniqueFunction<void(ReplyBytes)>;

namespace detail {

template <class T>
struct ReplyTypeOf {
  using type = void;
  static constexpr bool has = false;
};
template <class T>
  requires requires(T& t) { t.reply_to; }
struct ReplyTypeOf<T> {
  template <class X>
  struct Unwrap;
  template <class R>
  struct Unwrap<ReplyTo<R>> {
    using type = R;
  };
  using type = typename Unwrap<std::remove_cvref_t<decltype(std::declval<T&>().reply_to)>>::type;
  static constexpr bool has = true;
};

// Answers m's reply target, if it has a pending one, with `e`.
template <class M>
void fail_reply_target(M& m, const Error& e) {
  auto one = [&](auto& alt) {
    if constexpr (ReplyTypeOf<std::remove_cvref_t<decltype(alt)>>::has) {
      if (alt.reply_to.pending()) alt.reply_to.fail(e);
    }
  };
  if constexpr (troupe::detail::IsVariant<M>::value) {
    std::visit(one, m);
  } else {
    one(m);
  }
}

}  // namespace detail

// What a registration says about its message beyond the codec.
struct MessageOptions {
  // Handling it twice has the effect of handling it once, and a repeat is
  // answered as the first was: a shard region may re-send it after its
  // owner was lost (see the file comment).
  bool idempotent = false;
};

// The codecs of one message type M. Value type (copyable); see the file
// comment for thread safety.
template <class M>
class MessageCodecs {
 public:
  template <class T>
  using Encoder = std::function<void(const T&, ByteWriter&)>;
  template <class T>
  using Decoder = std::function<Result<T>(ByteReader&)>;

  // Registers a message without a reply target (or with ReplyTo<void>).
  // invalid_argument if the name is empty or its id collides with another
  // registered name.
  template <class T>
    requires(!detail::ReplyTypeOf<T>::has || std::is_void_v<typename detail::ReplyTypeOf<T>::type>)
  Result<void> add(std::string name, Encoder<T> enc, Decoder<T> dec, MessageOptions options = {}) {
    return add_entry<T>(std::move(name), std::move(enc), std::move(dec), nullptr, nullptr, options);
  }
  // Registers a request whose `reply_to` is a ReplyTo<R>, with R's codec.
  template <class T, class R = typename detail::ReplyTypeOf<T>::type>
    requires(detail::ReplyTypeOf<T>::has && !std::is_void_v<R>)
  Result<void> add(std::string name, Encoder<T> enc, Decoder<T> dec, std::type_identity_t<Encoder<R>> reply_enc,
                   std::type_identity_t<Decoder<R>> reply_dec, MessageOptions options = {}) {
    if (!reply_enc || !reply_dec)
      return Error(ErrorCode::invalid_argument, "message '" + name + "' needs a reply encoder and decoder");
    return add_entry<T>(std::move(name), std::move(enc), std::move(dec),
                        std::make_shared<Encoder<R>>(std::move(reply_enc)),
                        std::make_shared<Decoder<R>>(std::move(reply_dec)), options);
  }

  // Writes m's id and bytes; takes its reply target (if any) out into
  // `reply` so the runtime can complete it when the answer comes back.
  // invalid_argument if m's alternative has no codec.
  Result<std::uint32_t> encode(M& m, ByteWriter& out, std::optional<PendingReply>& reply) const {
    std::size_t idx = index_of_value(m);
    if (idx >= writers_.size() || !writers_[idx])
      return Error(ErrorCode::invalid_argument, "no codec registered for message alternative " + std::to_string(idx));
    const Entry& e = *writers_[idx];
    e.write(m, out);
    if (e.take_reply) reply.emplace(e.take_reply(m));
    return e.id;
  }
  // Writes m's bytes and returns its id, leaving its reply target in m: for
  // a sender that keeps the message to answer it, or to send it again, with
  // answer(). invalid_argument if m's alternative has no codec.
  Result<std::uint32_t> encode(const M& m, ByteWriter& out) const {
    std::size_t idx = index_of_value(m);
    if (idx >= writers_.size() || !writers_[idx])
      return Error(ErrorCode::invalid_argument, "no codec registered for message alternative " + std::to_string(idx));
    writers_[idx]->write(m, out);
    return writers_[idx]->id;
  }
  // Completes m's reply target, if it has a pending one, with what came
  // back for it over the wire: the reply's bytes, decoded, or the error.
  void answer(M& m, Result<std::string_view> reply) const {
    std::size_t idx = index_of_value(m);
    if (idx < writers_.size() && writers_[idx] && writers_[idx]->answer) {
      writers_[idx]->answer(m, std::move(reply));
    } else if (!reply.ok()) {
      detail::fail_reply_target(m, reply.error());
    }
  }
  // Whether m's alternative was registered idempotent (MessageOptions).
  bool idempotent(const M& m) const noexcept {
    std::size_t idx = index_of_value(m);
    return idx < writers_.size() && writers_[idx] && writers_[idx]->idempotent;
  }
  // Rebuilds a message from its id and bytes; for a request, `sink` gets
  // its answer. protocol_error if the id is unknown or the bytes do not
  // decode.
  Result<M> decode(std::uint32_t id, std::string_view bytes, ReplySink* sink) const {
    auto it = readers_.find(id);
    if (it == readers_.end())
      return Error(ErrorCode::protocol_error, "unknown message id " + std::to_string(id));
    const Entry& e = *it->second;
    ByteReader r(bytes);
    Result<M> m = [&]() -> Result<M> {
      try {
        return e.read(r);
      } catch (const std::exception& ex) {
        return Error(ErrorCode::protocol_error, std::string("decoder threw: ") + ex.what());
      }
    }();
    if (!m.ok())
      return Error(ErrorCode::protocol_error, "cannot decode message '" + e.name + "': " + m.error().message());
    if (e.attach_reply && sink) e.attach_reply(m.value(), std::move(*sink));
    return m;
  }
  // The name registered for an id (for logs), or empty.
  std::string_view name_of(std::uint32_t id) const {
    auto it = readers_.find(id);
    return it == readers_.end() ? std::string_view() : std::string_view(it->second->name);
  }
  bool empty() const noexcept { return readers_.empty(); }

 private:
  struct Entry {
    std::string name;
    std::uint32_t id = 0;
    std::function<void(const M&, ByteWriter&)> write;
    std::function<Result<M>(ByteReader&)> read;
    std::function<PendingReply(M&)> take_reply;
    std::function<void(M&, Result<std::string_view>)> answer;
    std::function<void(M&, ReplySink)> attach_reply;
    bool idempotent = false;
  };

  // Completes `rt` with a reply's bytes (decoded with `rdec`) or an error.
  template <class R, class RD>
  static void complete_target(ReplyTo<R>& rt, const std::shared_ptr<RD>& rdec, Result<std::string_view> bytes) {
    if (!bytes.ok()) {
      rt.fail(std::move(bytes).error());
      return;
    }
    if constexpr (std::is_void_v<R>) {
      (void)rdec;
      rt.reply();
    } else {
      ByteReader r(bytes.value());
      Result<R> v = [&]() -> Result<R> {
        try {
          return (*rdec)(r);
        } catch (const std::exception& ex) {
          return Error(ErrorCode::protocol_error, std::string("reply decoder threw: ") + ex.what());
        }
      }();
      if (v.ok()) {
        rt.reply(std::move(v.value()));
      } else {
        rt.fail(Error(ErrorCode::protocol_error, "cannot decode the reply: " + v.error().message()));
      }
    }
  }

  // renc / rdec: the reply's Encoder<R> / Decoder<R>, for a request.
  template <class T>
  Result<void> add_entry(std::string name, Encoder<T> enc, Decoder<T> dec, std::shared_ptr<void> renc_any,
                         std::shared_ptr<void> rdec_any, MessageOptions options) {
    if (name.empty()) return Error(ErrorCode::invalid_argument, "message name is empty");
    if (!enc || !dec) return Error(ErrorCode::invalid_argument, "message '" + name + "' needs an encoder and a decoder");
    std::uint32_t id = message_id(name);
    std::size_t idx = index_of<T>();
    auto existing = readers_.find(id);
    if (existing != readers_.end() && existing->second->name != name)
      return Error(ErrorCode::invalid_argument, "message names '" + existing->second->name + "' and '" + name +
                                                    "' have the same wire id; rename one");
    auto e = std::make_shared<Entry>();
    e->name = std::move(name);
    e->id = id;
    e->idempotent = options.idempotent;
    e->write = [enc = std::move(enc)](const M& m, ByteWriter& w) { enc(get_alt<T>(m), w); };
    e->read = [dec = std::move(dec)](ByteReader& r) -> Result<M> {
      auto t = dec(r);
      if (!t.ok()) return std::move(t).error();
      return Result<M>(M(std::move(t.value())));
    };
    using RT = detail::ReplyTypeOf<T>;
    if constexpr (RT::has) {
      using R = typename RT::type;
      using RE = std::conditional_t<std::is_void_v<R>, int, Encoder<std::conditional_t<std::is_void_v<R>, int, R>>>;
      using RD = std::conditional_t<std::is_void_v<R>, int, Decoder<std::conditional_t<std::is_void_v<R>, int, R>>>;
      auto renc = std::static_pointer_cast<RE>(renc_any);
      auto rdec = std::static_pointer_cast<RD>(rdec_any);
      e->take_reply = [rdec](M& m) -> PendingReply {
        return [rt = std::move(get_alt_mut<T>(m).reply_to), rdec](Result<std::string_view> bytes) mutable {
          complete_target(rt, rdec, std::move(bytes));
        };
      };
      e->answer = [rdec](M& m, Result<std::string_view> bytes) {
        complete_target(get_alt_mut<T>(m).reply_to, rdec, std::move(bytes));
      };
      e->attach_reply = [renc](M& m, ReplySink sink) {
        Promise<R> p;
        Future<R> f = p.future();
        get_alt_mut<T>(m).reply_to = std::move(p).into_reply_to();
        std::move(f).then([renc, sink = std::move(sink)](Result<R> r) mutable {
          if (!r.ok()) {
            sink(ReplyBytes(std::move(r).error()));
            return;
          }
          if constexpr (std::is_void_v<R>) {
            sink(ReplyBytes(std::string()));
          } else {
            ByteWriter w;
            (*renc)(r.value(), w);
            sink(ReplyBytes(w.take()));
          }
        });
      };
    } else {
      (void)renc_any;
      (void)rdec_any;
    }
    if (writers_.size() <= idx) writers_.resize(idx + 1);
    if (writers_[idx]) readers_.erase(writers_[idx]->id);
    writers_[idx] = e;
    readers_[id] = std::move(e);
    return {};
  }

  template <class T>
  static constexpr std::size_t index_of() {
    if constexpr (troupe::detail::IsVariant<M>::value) {
      constexpr std::size_t i = troupe::detail::VariantIndex<T, M>::value;
      static_assert(i < std::variant_size_v<M>, "T is not an alternative of the message variant");
      return i;
    } else {
      static_assert(std::is_same_v<T, M>, "T must be the message type");
      return 0;
    }
  }
  static std::size_t index_of_value(const M& m) {
    if constexpr (troupe::detail::IsVariant<M>::value) {
      return m.index();
    } else {
      return 0;
    }
  }
  template <class T>
  static const T& get_alt(const M& m) {
    if constexpr (troupe::detail::IsVariant<M>::value) {
      return std::get<T>(m);
    } else {
      return m;
    }
  }
  template <class T>
  static T& get_alt_mut(M& m) {
    if constexpr (troupe::detail::IsVariant<M>::value) {
      return std::get<T>(m);
    } else {
      return m;
    }
  }

  std::vector<std::shared_ptr<Entry>> writers_;
  std::unordered_map<std::uint32_t, std::shared_ptr<Entry>> readers_;
};

}  // namespace troupe::cluster
