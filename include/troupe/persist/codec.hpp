#pragma once
// Codecs: how events and snapshots become bytes in the journal and back.
//
// The journal stores an event as a manifest (a type name and a version) plus
// the bytes its codec wrote. The user registers one codec per event type:
//
//   troupe::EventCodecs<PaymentEvent> codecs;
//   codecs.add<SettlementAccepted>("SettlementAccepted", 1,
//       [](const SettlementAccepted& e, troupe::ByteWriter& w) { w.u64(e.amount); w.str(e.order); },
//       [](std::uint32_t version, troupe::ByteReader& r) -> troupe::Result<SettlementAccepted> {
//         SettlementAccepted e;
//         e.amount = r.u64();
//         e.order = r.str();
//         return r.finish(std::move(e));
//       });
//
// The decoder receives the stored version, so a type can evolve: register
// the new version for writing and keep reading the old ones. Bytes that do
// not decode, or a manifest nobody registered, give ErrorCode::corrupt_record
// — never an exception, never a skipped event.
//
// Or the old versions are upcast: a step registered for (type, n) turns a
// stored event of version n into version n + 1 before it is decoded, and
// steps chain (n -> n + 1 -> n + 2 ...) until no step is registered for the
// version reached. A step may also move the event to a new type name (the
// versions continue across the rename), e.g. from ByteWriter bytes under an
// old name to a Protobuf message (troupe/protobuf/codecs.hpp):
//
//   codecs.upcast("SettlementAccepted", 1, [](std::string_view v1) -> troupe::Result<std::string> {
//     troupe::ByteReader r(v1);
//     std::string order = r.str();
//     std::int64_t amount = r.i64(), at = r.i64();
//     troupe::ByteWriter w;
//     w.str(order).i64(amount).i64(at).str("");  // v2 adds the customer
//     return r.finish(w.take());
//   });
//
// A step that fails or throws gives corrupt_record naming the type and the
// versions; an entity's recovery adds its persistence id and sequence
// number.
//
// ByteWriter/ByteReader are a small, fixed little-endian format (integers,
// length-prefixed strings) that codecs may use; any other encoding works too.
// Codec tables are filled before use and then only read: reading from many
// threads at once is safe, adding while others read is not.

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/result.hpp"

namespace troupe {

// Appends little-endian fixed-width integers and length-prefixed strings to
// a byte string. Value type; not thread-safe.
class ByteWriter {
 public:
  ByteWriter& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  ByteWriter& u32(std::uint32_t v) { return fixed(v); }
  ByteWriter& u64(std::uint64_t v) { return fixed(v); }
  ByteWriter& i64(std::int64_t v) { return fixed(static_cast<std::uint64_t>(v)); }
  ByteWriter& f64(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return fixed(bits);
  }
  ByteWriter& boolean(bool v) { return u8(v ? 1 : 0); }
  // A u32 length, then the bytes.
  ByteWriter& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s.data(), s.size());
    return *this;
  }
  std::string& bytes() noexcept { return buf_; }
  std::string take() noexcept { return std::move(buf_); }

 private:
  template <class U>
  ByteWriter& fixed(U v) {
    char b[sizeof(U)];
    for (std::size_t i = 0; i < sizeof(U); ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    buf_.append(b, sizeof(U));
    return *this;
  }
  std::string buf_;
};

// Reads what a ByteWriter wrote. Reading past the end does not throw: it
// returns zero values and marks the reader failed; finish() then reports
// corrupt_record. Value type over borrowed bytes; not thread-safe.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) noexcept : in_(bytes) {}

  std::uint8_t u8() {
    if (!need(1)) return 0;
    auto v = static_cast<std::uint8_t>(in_[pos_]);
    pos_ += 1;
    return v;
  }
  std::uint32_t u32() { return fixed<std::uint32_t>(); }
  std::uint64_t u64() { return fixed<std::uint64_t>(); }
  std::int64_t i64() { return static_cast<std::int64_t>(fixed<std::uint64_t>()); }
  double f64() {
    std::uint64_t bits = fixed<std::uint64_t>();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  bool boolean() {
    std::uint8_t b = u8();
    if (b > 1) failed_ = true;
    return b == 1;
  }
  std::string str() {
    std::uint32_t n = u32();
    if (!need(n)) return {};
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }

  bool failed() const noexcept { return failed_; }
  std::size_t remaining() const noexcept { return in_.size() - pos_; }
  // Every byte not read yet, consumed: for a codec that hands its bytes to
  // another parser (Protobuf). A view into the reader's borrowed bytes.
  std::string_view rest() noexcept {
    std::string_view r = in_.substr(pos_);
    pos_ = in_.size();
    return r;
  }

  // The decoded value if every read was in bounds and every byte was used;
  // corrupt_record otherwise.
  template <class T>
  Result<T> finish(T value) const {
    if (failed_) return Error(ErrorCode::corrupt_record, "bytes end before the value is complete");
    if (pos_ != in_.size())
      return Error(ErrorCode::corrupt_record, std::to_string(in_.size() - pos_) + " unexpected trailing byte(s)");
    return Result<T>(std::move(value));
  }

 private:
  bool need(std::size_t n) {
    if (failed_ || in_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    return true;
  }
  template <class U>
  U fixed() {
    if (!need(sizeof(U))) return 0;
    U v = 0;
    for (std::size_t i = 0; i < sizeof(U); ++i)
      v |= static_cast<U>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += sizeof(U);
    return v;
  }
  std::string_view in_;
  std::size_t pos_ = 0;
  bool failed_ = false;
};

// An encoded value: its manifest and bytes.
struct Encoded {
  std::string type;
  std::uint32_t version = 0;
  std::string payload;
};

namespace detail {

template <class T, class V>
struct VariantIndex;
template <class T, class... Ts>
struct VariantIndex<T, std::variant<Ts...>> {
  static constexpr std::size_t value = [] {
    std::size_t i = 0;
    bool found = false;
    ((found || (std::is_same_v<T, Ts> ? (found = true) : (++i, false))), ...);
    return found ? i : sizeof...(Ts);
  }();
};

// Hashes std::string keys and finds them by string_view, without a copy.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <class E>
struct IsVariant : std::false_type {};
template <class... Ts>
struct IsVariant<std::variant<Ts...>> : std::true_type {};

}  // namespace detail

// The codecs of one event type `E`: either a single type or a std::variant
// of event types, each alternative registered once with add<T>().
template <class E>
class EventCodecs {
 public:
  template <class T>
  using Encoder = std::function<void(const T&, ByteWriter&)>;
  template <class T>
  using Decoder = std::function<Result<T>(std::uint32_t version, ByteReader&)>;

  // Registers T under `type` with the version new events are written with.
  // Returns *this for chaining. A second registration of T or of `type`
  // replaces the first.
  template <class T>
  EventCodecs& add(std::string type, std::uint32_t version, Encoder<T> enc, Decoder<T> dec) {
    std::size_t idx = index_of<T>();
    if (writers_.size() <= idx) writers_.resize(idx + 1);
    writers_[idx] = Writer{type, version, [enc = std::move(enc)](const E& e, ByteWriter& w) {
                             enc(get_alt<T>(e), w);
                           }};
    readers_[std::move(type)] = [dec = std::move(dec)](std::uint32_t v, ByteReader& r) -> Result<E> {
      auto t = dec(v, r);
      if (!t.ok()) return std::move(t).error();
      return Result<E>(E(std::move(*t)));
    };
    return *this;
  }

  // One upcasting step: the bytes of a stored event at version n, as the
  // bytes of version n + 1; an error if they cannot be converted.
  using Upcaster = std::function<Result<std::string>(std::string_view payload)>;

  // Registers the step from `type` version `from` to version from + 1,
  // under the same type name or under `to_type`. A second step for the same
  // (type, from) replaces the first.
  EventCodecs& upcast(std::string type, std::uint32_t from, Upcaster step) {
    std::string to = type;
    return upcast(std::move(type), from, std::move(to), std::move(step));
  }
  EventCodecs& upcast(std::string type, std::uint32_t from, std::string to_type, Upcaster step) {
    upcasters_[std::move(type)][from] = UpcastStep{std::move(to_type), std::move(step)};
    return *this;
  }

  // The manifest and bytes for `e`; invalid_argument if its type has no codec.
  Result<Encoded> encode(const E& e) const {
    std::size_t idx = index_of_value(e);
    if (idx >= writers_.size() || !writers_[idx].write)
      return Error(ErrorCode::invalid_argument, "no codec registered for event alternative " + std::to_string(idx));
    const Writer& w = writers_[idx];
    ByteWriter out;
    w.write(e, out);
    return Encoded{w.type, w.version, out.take()};
  }

  // The event stored as (type, version, bytes); corrupt_record if the type is
  // unknown or the bytes do not decode.
  Result<E> decode(std::string_view type, std::uint32_t version, std::string_view payload) const {
    if (!upcasters_.empty()) {
      auto first = find_step(type, version);
      if (first) return decode_upcast(std::string(type), version, payload, *first);
    }
    return decode_current(type, version, payload);
  }

  bool empty() const noexcept { return readers_.empty(); }

 private:
  struct Writer {
    std::string type;
    std::uint32_t version = 0;
    std::function<void(const E&, ByteWriter&)> write;
  };
  struct UpcastStep {
    std::string to_type;
    Upcaster step;
  };

  const UpcastStep* find_step(std::string_view type, std::uint32_t version) const {
    auto t = upcasters_.find(type);
    if (t == upcasters_.end()) return nullptr;
    auto v = t->second.find(version);
    return v == t->second.end() ? nullptr : &v->second;
  }

  // Runs the chain of steps from (type, version), then decodes what it
  // reached. Each step raises the version by one, so the chain ends.
  Result<E> decode_upcast(std::string type, std::uint32_t version, std::string_view payload,
                          const UpcastStep& first) const {
    std::string bytes(payload);
    for (const UpcastStep* s = &first; s != nullptr; s = find_step(type, version)) {
      std::string where = "'" + type + "' v" + std::to_string(version);
      if (version == UINT32_MAX)
        return Error(ErrorCode::corrupt_record, "cannot upcast " + where + ": no version follows it");
      Result<std::string> next = [&]() -> Result<std::string> {
        try {
          return s->step(bytes);
        } catch (const std::exception& ex) {
          return Error(ErrorCode::corrupt_record, std::string("the upcaster threw: ") + ex.what());
        } catch (...) {
          return Error(ErrorCode::corrupt_record, "the upcaster threw");
        }
      }();
      if (!next.ok())
        return Error(ErrorCode::corrupt_record, "cannot upcast " + where + " to '" + s->to_type + "' v" +
                                                    std::to_string(version + 1) + ": " + next.error().message());
      bytes = std::move(*next);
      type = s->to_type;
      ++version;
    }
    return decode_current(type, version, bytes);
  }

  Result<E> decode_current(std::string_view type, std::uint32_t version, std::string_view payload) const {
    auto it = readers_.find(type);
    if (it == readers_.end())
      return Error(ErrorCode::corrupt_record, "unknown event manifest '" + std::string(type) + "' v" +
                                                  std::to_string(version));
    ByteReader r(payload);
    Result<E> out = [&]() -> Result<E> {
      try {
        return it->second(version, r);
      } catch (const std::exception& ex) {
        return Error(ErrorCode::corrupt_record, std::string("decoder threw: ") + ex.what());
      }
    }();
    if (!out.ok()) {
      const Error& err = out.error();
      return Error(ErrorCode::corrupt_record, "cannot decode '" + std::string(type) + "' v" +
                                                  std::to_string(version) + ": " + err.message());
    }
    return out;
  }

  template <class T>
  static constexpr std::size_t index_of() {
    if constexpr (detail::IsVariant<E>::value) {
      constexpr std::size_t i = detail::VariantIndex<T, E>::value;
      static_assert(i < std::variant_size_v<E>, "T is not an alternative of the event variant");
      return i;
    } else {
      static_assert(std::is_same_v<T, E>, "T must be the event type");
      return 0;
    }
  }
  static std::size_t index_of_value(const E& e) {
    if constexpr (detail::IsVariant<E>::value) {
      return e.index();
    } else {
      return 0;
    }
  }
  template <class T>
  static const T& get_alt(const E& e) {
    if constexpr (detail::IsVariant<E>::value) {
      return std::get<T>(e);
    } else {
      return e;
    }
  }

  std::vector<Writer> writers_;
  std::unordered_map<std::string, std::function<Result<E>(std::uint32_t, ByteReader&)>, detail::StringHash,
                     std::equal_to<>>
      readers_;
  std::unordered_map<std::string, std::map<std::uint32_t, UpcastStep>, detail::StringHash, std::equal_to<>> upcasters_;
};

// The codec of a state type, for snapshots. Optional: without one an entity
// never snapshots and always recovers from its events.
template <class S>
struct StateCodec {
  std::string type;
  std::uint32_t version = 1;
  std::function<void(const S&, ByteWriter&)> encode;
  std::function<Result<S>(std::uint32_t version, ByteReader&)> decode;
};

}  // namespace troupe
