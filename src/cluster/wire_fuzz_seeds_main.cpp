// Writes the seed corpus of wire_codecs_fuzz: real encodings of every
// message type it decodes, each behind the byte that picks its type
// (wire_fuzz_table.hpp), and remoting frames of every kind (doc/wire.md).
// Usage: wire_fuzz_seeds <dir>. The seeds in src/cluster/wire_fuzz_corpus
// were written by it; run it again after a layout changes. Inputs a fuzz
// run once failed on are kept beside them, under names of their own.

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "../node/load_wire.hpp"
#include "sharding/cluster_jobs_wire.hpp"
#include "troupe/cluster/remote.hpp"
#include "sharding/cluster_lock_wire.hpp"
#include "wire_fuzz_table.hpp"

namespace {

using namespace troupe::cluster;
using troupe::ByteWriter;
using troupe::cluster::fuzz::WireKind;

std::string dir;

void write(const std::string& name, WireKind kind, const std::string& body) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(kind));
  out << body;
}

template <class M>
std::string encode(const MessageCodecs<M>& codecs, const M& m) {
  ByteWriter w;
  if (!codecs.encode(m, w).ok()) std::abort();
  return w.take();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_fuzz_seeds <dir>\n");
    return 2;
  }
  dir = argv[1];
  namespace lw = lock_wire;
  const auto lock = lw::wire_codecs();
  write("lock_acquire", WireKind::lock_acquire, encode<lw::Wire>(lock, lw::Acquire{7, 3, "orders/42"}));
  write("lock_grant", WireKind::lock_grant,
        encode<lw::Wire>(lock, lw::Grant{7, 3, "orders/42", (std::uint64_t{2} << 40) | 5, 1'250'000}));
  write("lock_deny_retry", WireKind::lock_deny,
        encode<lw::Wire>(lock, lw::Deny{8, "orders/42", 17, "shard 3 is moving", true, "node-2"}));
  write("lock_deny_full", WireKind::lock_deny,
        encode<lw::Wire>(lock, lw::Deny{9, "k", 4, "too many waiters", false, ""}));
  write("lock_release", WireKind::lock_release,
        encode<lw::Wire>(lock, lw::Release{3, "orders/42", (std::uint64_t{2} << 40) | 5}));
  write("lock_query", WireKind::lock_query, encode<lw::Wire>(lock, lw::Query{3, 2}));
  write("lock_query_reply", WireKind::lock_query_reply,
        encode<lw::Wire>(lock, lw::QueryReply{3, 2, {{"a", (std::uint64_t{1} << 40) | 1}, {"orders/42", 9}}}));
  write("lock_query_reply_empty", WireKind::lock_query_reply, encode<lw::Wire>(lock, lw::QueryReply{0, 1, {}}));

  const auto jobs = detail::job_wire_codecs();
  detail::RemoteJob job;
  job.shard = 5;
  job.want_outcome = true;
  job.job = {"email.send", R"({"to":"a@example.com"})"};
  job.priority = -3;
  job.timeout_ns = 30'000'000'000;
  write("job_request", WireKind::job_request, encode(jobs, job));
  job.want_outcome = false;
  job.job = {"noop", ""};
  job.timeout_ns = 0;
  write("job_request_accept_only", WireKind::job_request, encode(jobs, job));

  // Answers: encoded by the serving side's reply encoder, through a sink.
  auto answer_bytes = [&](const detail::RemoteAnswer& a) {
    std::optional<ReplyBytes> sent;
    ReplySink sink = [&](ReplyBytes r) { sent.emplace(std::move(r)); };
    ByteWriter req;
    if (!jobs.encode(job, req).ok()) std::abort();
    auto m = jobs.decode(message_id("troupe.jobs.Job"), req.bytes(), &sink);
    if (!m.ok()) std::abort();
    m->reply_to.reply(a);
    if (!sent || !sent->ok()) std::abort();
    return sent->value();
  };
  detail::RemoteAnswer a;
  a.kind = detail::RemoteAnswer::accepted;
  a.id = 1001;
  a.outcome = troupe::JobSucceeded{""};
  write("job_answer_accepted", WireKind::job_answer, answer_bytes(a));
  a.kind = detail::RemoteAnswer::finished;
  a.outcome = troupe::JobSucceeded{"sent"};
  write("job_answer_succeeded", WireKind::job_answer, answer_bytes(a));
  a.outcome = troupe::JobFailed{"smtp 550"};
  write("job_answer_failed_job", WireKind::job_answer, answer_bytes(a));
  a.outcome = troupe::JobTimedOut{};
  write("job_answer_timed_out", WireKind::job_answer, answer_bytes(a));
  a.kind = detail::RemoteAnswer::moved;
  write("job_answer_moved", WireKind::job_answer, answer_bytes(a));
  a.kind = detail::RemoteAnswer::failed;
  a.code = 18;
  a.message = "queue full";
  write("job_answer_error", WireKind::job_answer, answer_bytes(a));

  ByteWriter unknown;
  unknown.u32(message_id("troupe.lock.Grant")).u64(1).u32(0).str("k").u64(3).u64(0);
  write("known_id_by_number", WireKind::unknown_id, unknown.take());
  namespace nl = troupe::node::load_wire;
  const auto load = nl::load_codecs();
  write("node_load", WireKind::node_load,
        encode(load, nl::NodeLoad{"node-2", "http://10.0.0.2:8081", 21, 1043, 7, 15250, false}));
  write("node_load_draining", WireKind::node_load, encode(load, nl::NodeLoad{"node-3", "", 0, 0, 0, 0, true}));

  ByteWriter stranger;
  stranger.u32(0xdeadbeef).str("whatever");
  write("unknown_id", WireKind::unknown_id, stranger.take());

  // Remoting frames: a byte of DATA frame type (a RemoteKind), the payload.
  auto frame = [](detail::RemoteKind kind, ByteWriter w) {
    return std::string(1, static_cast<char>(kind)) + w.take();
  };
  using K = detail::RemoteKind;
  const std::string acquire = encode<lw::Wire>(lock, lw::Acquire{7, 3, "orders/42"});
  ByteWriter w;
  w.str("lock/accounts").u32(message_id("troupe.lock.Acquire")).bytes().append(acquire);
  write("envelope_actor_tell", WireKind::remote_envelope, frame(K::actor_tell, std::move(w)));
  w = {};
  w.u64(42).str("jobs/mail").u32(message_id("troupe.jobs.Job")).bytes().append(encode(jobs, job));
  write("envelope_actor_ask", WireKind::remote_envelope, frame(K::actor_ask, std::move(w)));
  w = {};
  w.str("lock/accounts").u8(0x12).u8(0x34);
  write("envelope_actor_tell_cut_in_id", WireKind::remote_envelope, frame(K::actor_tell, std::move(w)));
  w = {};
  w.u64(42).u32(20).bytes().append("lock/");
  write("envelope_actor_ask_cut_in_name", WireKind::remote_envelope, frame(K::actor_ask, std::move(w)));
  // An entity frame: the region's name, then what the region reads itself.
  w = {};
  w.str("region/account").u32(17).u8(0).str("acct-42").u32(message_id("Deposit")).u64(100);
  write("envelope_entity_tell", WireKind::remote_envelope, frame(K::entity_tell, std::move(w)));
  w = {};
  w.u64(43).str("region/account").u32(17).u8(1).str("acct-42").u32(message_id("Balance"));
  write("envelope_entity_ask", WireKind::remote_envelope, frame(K::entity_ask, std::move(w)));
  w = {};
  w.u64(42).u8(0).u64(1250);
  write("envelope_reply", WireKind::remote_envelope, frame(K::reply, std::move(w)));
  w = {};
  w.u64(42).u8(1).u32(static_cast<std::uint32_t>(troupe::ErrorCode::dead_letter)).str("nothing is published as 'jobs/mail' on node 'node-2'");
  write("envelope_reply_error", WireKind::remote_envelope, frame(K::reply, std::move(w)));
  w = {};
  w.u64(42).u8(2);
  write("envelope_reply_bad_status", WireKind::remote_envelope, frame(K::reply, std::move(w)));
  w = {};
  w.bytes() = "leaving";
  write("envelope_control", WireKind::remote_envelope, frame(K::shard_control, std::move(w)));
  w = {};
  w.str("lock/accounts").u32(0);
  write("envelope_unknown_kind", WireKind::remote_envelope, frame(static_cast<K>(9), std::move(w)));

  // Entity frames after their envelope, for a region of 128 shards: two
  // bytes of shard count minus one, then the header and the command.
  auto region = [](ByteWriter w) { return std::string("\x7f\x00", 2) + w.take(); };
  w = {};
  w.u32(17).u8(0).str("acct-42").u32(message_id("Deposit")).u64(100);
  write("shard_header", WireKind::shard_header, region(std::move(w)));
  w = {};
  w.u32(127).u8(3).str("acct-7").u32(message_id("Balance"));
  write("shard_header_forwarded_no_body", WireKind::shard_header, region(std::move(w)));
  w = {};
  w.u32(128).u8(0).str("acct-42").u32(message_id("Deposit"));
  write("shard_header_shard_out_of_range", WireKind::shard_header, region(std::move(w)));
  w = {};
  w.u32(5).u8(0).str("").u32(message_id("Deposit"));
  write("shard_header_empty_id", WireKind::shard_header, region(std::move(w)));
  w = {};
  w.u32(5).u8(0).u32(40).bytes().append("acct");
  write("shard_header_cut_in_id", WireKind::shard_header, region(std::move(w)));
  return 0;
}
