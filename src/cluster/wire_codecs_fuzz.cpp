// libFuzzer target for the message codecs troupe registers (scripts/fuzz
// runs it): the cluster lock's messages, the cluster job service's job and
// answer, and the node's load report, as a peer could send them; the
// envelope of the remoting frames that carry them (remote_envelope.hpp);
// and the header of an entity frame (cluster/detail/shard_header.hpp).
//
// Input: the first byte picks a message type (wire_fuzz_table.hpp), the
// rest is its encoded body. The body is decoded through the MessageCodecs
// table exactly as remoting does (by wire id, with a reply sink for a
// request); a job answer is decoded the way an asker's reply target is
// completed. Beyond "no crash, no undefined behaviour, no leak, no
// exception" under ASan/UBSan, it checks:
//   - a body that does not decode is protocol_error (a request's reply
//     sink is then untouched), an unknown id likewise;
//   - a body that decodes is stable: encode(decode(x)) decodes again to
//     the same bytes, and it is x itself (but for a job answer's timed out
//     outcome, which drops its text, and a load report's draining flag
//     other than 0 or 1): nothing is lost or invented;
//   - a decoded request whose reply target is answered sends back bytes
//     that the asker's side decodes to the same answer;
//   - an envelope that parses points into its frame and, written again
//     field by field as doc/wire.md lays it out, gives the frame back
//     (what follows an error reply's message aside); one that does not is
//     protocol_error, and only a kind that has a header to cut short fails;
//   - an entity frame's header that parses names a shard below the shard
//     count and a non-empty id, its body is the rest of the input, and
//     written again it gives the input back; one that does not is
//     protocol_error naming the node.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "../node/load_wire.hpp"
#include "remote_envelope.hpp"
#include "sharding/cluster_jobs_wire.hpp"
#include "sharding/cluster_lock_wire.hpp"
#include "troupe/cluster/detail/shard_header.hpp"
#include "wire_fuzz_table.hpp"

namespace {

using troupe::ByteWriter;
using troupe::ErrorCode;
using troupe::cluster::message_id;
using troupe::cluster::ReplyBytes;
using troupe::cluster::ReplySink;
using troupe::cluster::detail::Envelope;
using troupe::cluster::detail::RemoteAnswer;
using troupe::cluster::detail::RemoteKind;
using troupe::cluster::detail::RemoteJob;
using troupe::cluster::fuzz::kWireNames;
using troupe::cluster::fuzz::WireKind;

void check(bool ok) {
  if (!ok) std::abort();
}

const auto& lock_codecs() {
  static const auto c = troupe::cluster::lock_wire::wire_codecs();
  return c;
}
const auto& job_codecs() {
  static const auto c = troupe::cluster::detail::job_wire_codecs();
  return c;
}
const auto& load_codecs() {
  static const auto c = troupe::node::load_wire::load_codecs();
  return c;
}

// Decodes `body` as message `id` of `codecs`; on success re-encodes it
// and checks stability (and identity if `canonical`). Returns the message.
template <class Codecs>
auto decode_stable(const Codecs& codecs, std::uint32_t id, std::string_view body, bool canonical, ReplySink* sink) {
  auto m = codecs.decode(id, body, sink);
  if (!m.ok()) {
    check(m.error().code() == ErrorCode::protocol_error && !m.error().message().empty());
    return m;
  }
  const auto& decoded = m.value();
  ByteWriter once;
  auto id1 = codecs.encode(decoded, once);
  check(id1.ok() && *id1 == id);
  if (canonical) check(once.bytes() == body);
  auto again = codecs.decode(id, once.bytes(), nullptr);
  check(again.ok());
  const auto& redecoded = again.value();
  ByteWriter twice;
  check(codecs.encode(redecoded, twice).ok());
  check(twice.bytes() == once.bytes());
  return m;
}

// The answer's bytes as an asker completes its reply target with them.
troupe::Result<RemoteAnswer> decode_answer(std::string_view bytes) {
  troupe::Promise<RemoteAnswer> p;
  auto f = p.future();
  RemoteJob carrier;
  carrier.reply_to = std::move(p).into_reply_to();
  job_codecs().answer(carrier, troupe::Result<std::string_view>(bytes));
  check(f.ready());
  return f.get();
}

bool same(const RemoteAnswer& a, const RemoteAnswer& b) {
  return a.kind == b.kind && a.id == b.id && a.outcome.index() == b.outcome.index() && a.code == b.code &&
         a.message == b.message;
}

void job_request(std::string_view body) {
  std::optional<ReplyBytes> sent;
  ReplySink sink = [&](ReplyBytes r) { sent.emplace(std::move(r)); };
  auto m = decode_stable(job_codecs(), message_id("troupe.jobs.Job"), body, true, &sink);
  if (!m.ok()) {
    check(!sent.has_value());
    return;
  }
  // Answer it as the serving node would; the bytes must read back the same.
  RemoteAnswer a;
  a.kind = RemoteAnswer::finished;
  a.id = m->shard + 1;
  a.outcome = troupe::JobSucceeded{m->job.payload};
  check(m->reply_to.pending());
  m->reply_to.reply(a);
  check(sent.has_value() && sent->ok());
  auto back = decode_answer(sent->value());
  check(back.ok() && same(*back, a));
}

void job_answer(std::string_view body) {
  auto a = decode_answer(body);
  if (!a.ok()) {
    check(a.error().code() == ErrorCode::protocol_error && !a.error().message().empty());
    return;
  }
  check(a->kind <= RemoteAnswer::failed);
  // What the serving node would send for this answer decodes the same.
  std::optional<ReplyBytes> sent;
  ReplySink sink = [&](ReplyBytes r) { sent.emplace(std::move(r)); };
  ByteWriter req;
  req.u32(0).boolean(false).str("k").str("p").i64(0).i64(0);
  auto m = job_codecs().decode(message_id("troupe.jobs.Job"), req.bytes(), &sink);
  check(m.ok());
  m->reply_to.reply(*a);
  check(sent.has_value() && sent->ok());
  auto back = decode_answer(sent->value());
  check(back.ok() && same(*back, *a));
}

// Input: a byte of DATA frame type, then the frame's payload.
void remote_envelope(std::string_view body) {
  const std::uint32_t type = body.empty() ? 0 : static_cast<std::uint8_t>(body[0]);
  const std::string_view payload = body.substr(body.empty() ? 0 : 1);
  const auto kind = static_cast<RemoteKind>(type);
  const bool known = type >= static_cast<std::uint32_t>(RemoteKind::actor_tell) &&
                     type <= static_cast<std::uint32_t>(RemoteKind::shard_control);
  auto parsed = troupe::cluster::detail::parse_envelope(type, payload);
  if (!parsed.ok()) {
    check(parsed.error().code() == ErrorCode::protocol_error && !parsed.error().message().empty());
    check(kind != RemoteKind::shard_control);
    return;
  }
  check(known);
  const Envelope& e = parsed.value();
  check(e.kind == kind);
  auto inside = [&](std::string_view v) {
    return v.empty() || (v.data() >= payload.data() && v.data() + v.size() <= payload.data() + payload.size());
  };
  check(inside(e.name) && inside(e.body));
  const bool ask = kind == RemoteKind::actor_ask || kind == RemoteKind::entity_ask;
  if (ask || kind == RemoteKind::reply) check(troupe::cluster::detail::ask_request_id(payload) == e.req);
  ByteWriter w;
  switch (kind) {
    case RemoteKind::actor_tell:
    case RemoteKind::actor_ask:
    case RemoteKind::entity_tell:
    case RemoteKind::entity_ask: {
      check(!e.failed);
      if (ask) w.u64(e.req);
      w.str(e.name);
      const bool actor = kind == RemoteKind::actor_tell || kind == RemoteKind::actor_ask;
      if (!actor) check(!e.msg_id);
      if (actor && !e.msg_id) {
        // The frame ends at or inside the message id: at most three bytes after the name.
        check(e.body.empty() && payload.size() >= w.bytes().size() && payload.size() - w.bytes().size() < 4 &&
              payload.substr(0, w.bytes().size()) == w.bytes());
        return;
      }
      if (e.msg_id) w.u32(*e.msg_id);
      w.bytes().append(e.body);
      check(w.bytes() == payload);
      return;
    }
    case RemoteKind::reply:
      check(e.name.empty() && !e.msg_id);
      w.u64(e.req);
      if (!e.failed) {
        w.u8(0).bytes().append(e.body);
        check(w.bytes() == payload);
        return;
      }
      check(e.body.empty() && inside(e.message));
      w.u8(1).u32(static_cast<std::uint32_t>(e.code)).str(e.message);
      check(payload.substr(0, w.bytes().size()) == w.bytes());
      return;
    case RemoteKind::shard_control:
      check(e.name.empty() && !e.msg_id && !e.failed && e.body.data() == payload.data() && e.body.size() == payload.size());
      return;
  }
  check(false);
}

// Input: two bytes of shard count (little-endian, plus one), then the bytes
// after an entity frame's envelope.
void shard_header(std::string_view body) {
  std::uint32_t shard_count = 1;
  if (body.size() >= 2)
    shard_count += static_cast<std::uint8_t>(body[0]) | (std::uint32_t{static_cast<std::uint8_t>(body[1])} << 8);
  const std::string_view frame = body.substr(std::min<std::size_t>(2, body.size()));
  auto h = troupe::cluster::detail::parse_shard_header(frame, shard_count, "node-2");
  if (!h.ok()) {
    check(h.error().code() == ErrorCode::protocol_error && h.error().message().find("'node-2'") != std::string::npos);
    return;
  }
  check(h->shard < shard_count && !h->id.empty());
  check(h->body.data() + h->body.size() == frame.data() + frame.size());
  ByteWriter w;
  w.u32(h->shard).u8(h->hops).str(h->id).u32(h->msg_id).bytes().append(h->body);
  check(w.bytes() == frame);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto kind = static_cast<WireKind>(data[0] % static_cast<std::uint8_t>(WireKind::count));
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string_view name = kWireNames[static_cast<std::size_t>(kind)];
  switch (kind) {
    case WireKind::job_request:
      job_request(body);
      break;
    case WireKind::job_answer:
      job_answer(body);
      break;
    case WireKind::unknown_id: {
      std::uint32_t id = 0;
      for (std::size_t i = 0; i < 4 && i < body.size(); ++i) id |= std::uint32_t{static_cast<std::uint8_t>(body[i])} << (8 * i);
      const std::string_view rest = body.substr(std::min<std::size_t>(4, body.size()));
      // Known ids decode or not as above; the others are refused by name.
      (void)decode_stable(lock_codecs(), id, rest, true, nullptr);
      if (job_codecs().name_of(id).empty()) check(!job_codecs().decode(id, rest, nullptr).ok());
      if (load_codecs().name_of(id).empty()) check(!load_codecs().decode(id, rest, nullptr).ok());
      break;
    }
    case WireKind::remote_envelope:
      remote_envelope(body);
      break;
    case WireKind::shard_header:
      shard_header(body);
      break;
    case WireKind::node_load: {
      // The draining flag is a u64 read as "not 0": only 0 and 1 come back.
      std::uint64_t flag = 0;
      for (std::size_t i = 0; i < 8 && body.size() >= 8; ++i)
        flag |= std::uint64_t{static_cast<std::uint8_t>(body[body.size() - 8 + i])} << (8 * i);
      const bool canonical = body.size() >= 8 && flag <= 1;
      (void)decode_stable(load_codecs(), message_id(name), body, canonical, nullptr);
      break;
    }
    default:
      check(lock_codecs().name_of(message_id(name)) == name);
      (void)decode_stable(lock_codecs(), message_id(name), body, true, nullptr);
      break;
  }
  return 0;
}
