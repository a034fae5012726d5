// troupe side of remote_tell and remote_ask (protocol: bench/common/remote.hpp):
// two processes, each an actor system with Remoting; the server publishes a
// sink and an echo actor, the client reaches them through RemoteRefs, as a
// troupe user would. remote_tell_tls and remote_ask_tls are the same over
// mutual TLS: the client makes a CA and both nodes' certificates (openssl
// command line) in a temporary directory, which the server finds in the
// environment (kTlsDirEnv).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/remote.hpp"
#include "common/report.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/core.hpp"

namespace troupe_bench {
namespace {

using troupe::Actor;
using troupe::ActorRef;
using troupe::ActorSystem;
using troupe::ByteReader;
using troupe::ByteWriter;
using troupe::ReplyTo;
using troupe::Result;
using troupe::cluster::MessageCodecs;
using troupe::cluster::RemoteRef;
using troupe::cluster::Remoting;

constexpr const char* kClient = "bench-client";  // the smaller id dials
constexpr const char* kServer = "bench-server";
constexpr const char* kTlsDirEnv = "TROUPE_BENCH_TLS_DIR";

// --- messages ----------------------------------------------------------------------

struct Tell {
  std::uint64_t seq = 0;
  std::string tag;
};
struct Stop {};
using SinkMsg = std::variant<Tell, Stop>;

struct Ack {
  std::uint64_t count = 0;
};

struct Request {
  std::uint64_t seq = 0;
  ReplyTo<std::uint64_t> reply_to;
};
using EchoMsg = std::variant<Request, Stop>;

MessageCodecs<SinkMsg> sink_codecs() {
  MessageCodecs<SinkMsg> c;
  (void)c.add<Tell>(
      "bench.Tell", [](const Tell& t, ByteWriter& w) { w.u64(t.seq).str(t.tag); },
      [](ByteReader& r) -> Result<Tell> {
        Tell t;
        t.seq = r.u64();
        t.tag = r.str();
        return r.finish(std::move(t));
      });
  (void)c.add<Stop>(
      "bench.Stop", [](const Stop&, ByteWriter&) {}, [](ByteReader& r) -> Result<Stop> { return r.finish(Stop{}); });
  return c;
}

MessageCodecs<Ack> ack_codecs() {
  MessageCodecs<Ack> c;
  (void)c.add<Ack>(
      "bench.Ack", [](const Ack& a, ByteWriter& w) { w.u64(a.count); },
      [](ByteReader& r) -> Result<Ack> {
        Ack a;
        a.count = r.u64();
        return r.finish(a);
      });
  return c;
}

MessageCodecs<EchoMsg> echo_codecs() {
  MessageCodecs<EchoMsg> c;
  auto u64_enc = [](const std::uint64_t& v, ByteWriter& w) { w.u64(v); };
  auto u64_dec = [](ByteReader& r) -> Result<std::uint64_t> {
    std::uint64_t v = r.u64();
    return r.finish(v);
  };
  (void)c.add<Request>(
      "bench.Request", [](const Request& q, ByteWriter& w) { w.u64(q.seq); },
      [](ByteReader& r) -> Result<Request> {
        Request q;
        q.seq = r.u64();
        return r.finish(std::move(q));
      },
      u64_enc, u64_dec);
  (void)c.add<Stop>(
      "bench.Stop", [](const Stop&, ByteWriter&) {}, [](ByteReader& r) -> Result<Stop> { return r.finish(Stop{}); });
  return c;
}

troupe::SystemConfig config() {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  return cfg;
}

// For the *_tls workloads: a CA and the two nodes' certificates in a
// temporary directory named in kTlsDirEnv (so the server process finds it),
// removed when the client ends.
class BenchCertificates {
 public:
  BenchCertificates() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-bench-tls-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) fail("mkdtemp");
    dir_ = tmpl;
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=bench-ca "
        "-keyout " + dir_ + "/ca.key -out " + dir_ + "/ca.crt");
    for (const char* id : {kClient, kServer}) {
      const std::string base = dir_ + "/" + id;
      run("printf 'subjectAltName=DNS:" + std::string(id) + "\\n' > " + base + ".ext");
      run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + std::string(id) +
          " -keyout " + base + ".key -out " + base + ".csr");
      run("openssl x509 -req -in " + base + ".csr -CA " + dir_ + "/ca.crt -CAkey " + dir_ +
          "/ca.key -CAcreateserial -days 1 -extfile " + base + ".ext -out " + base + ".crt");
    }
    ::setenv(kTlsDirEnv, dir_.c_str(), 1);
  }
  ~BenchCertificates() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    std::fprintf(stderr, "bench_troupe: certificates: %s failed\n", what.c_str());
    std::exit(1);
  }
  static void run(const std::string& command) {
    if (std::system((command + " >/dev/null 2>&1").c_str()) != 0) fail(command);
  }
  std::string dir_;
};

bool is_tls(const std::string& workload) {
  return workload.size() > 4 && workload.compare(workload.size() - 4, 4, "_tls") == 0;
}

std::unique_ptr<Remoting> start_remoting(ActorSystem& sys, const char* id, bool tls) {
  Remoting::Settings rs;
  if (const char* dir = std::getenv(kTlsDirEnv); tls && dir) {
    const std::string base = std::string(dir) + "/" + id;
    rs.security.tls = {.cert_file = base + ".crt", .key_file = base + ".key", .ca_file = std::string(dir) + "/ca.crt"};
  } else {
    rs.security.insecure = true;
  }
  rs.node_id = id;
  auto r = Remoting::start(sys, rs);
  if (!r.ok()) {
    std::fprintf(stderr, "bench_troupe: remoting: %s\n", r.error().to_string().c_str());
    std::exit(1);
  }
  return std::move(r.value());
}

// Server actors: stop ends the process (its main thread waits on `done`).
struct Done {
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
  void set() {
    std::lock_guard lk(mu);
    stopped = true;
    cv.notify_all();
  }
  void wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return stopped; });
  }
};

struct Sink : Actor<SinkMsg> {
  Sink(RemoteRef<Ack> a, Done* d) : acker(std::move(a)), done(d) {}
  RemoteRef<Ack> acker;
  Done* done;
  std::uint64_t expected = 0;
  void receive(SinkMsg& m) {
    if (auto* t = std::get_if<Tell>(&m)) {
      if (t->seq != expected) {
        std::fprintf(stderr, "bench_troupe: remote sink: got seq %llu, expected %llu\n",
                     static_cast<unsigned long long>(t->seq), static_cast<unsigned long long>(expected));
        std::_Exit(1);
      }
      ++expected;
      if (expected % bench::remote::kTellAckEvery == 0) (void)acker.tell(Ack{expected});
    } else {
      done->set();
    }
  }
};

struct Echo : Actor<EchoMsg> {
  explicit Echo(Done* d) : done(d) {}
  Done* done;
  void receive(EchoMsg& m) {
    if (auto* q = std::get_if<Request>(&m)) {
      q->reply_to.reply(q->seq);
    } else {
      done->set();
    }
  }
};

// Client side of remote_tell: acks land here.
struct AckState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t acked = 0;
};
struct Acker : Actor<Ack> {
  explicit Acker(AckState* s) : st(s) {}
  AckState* st;
  void receive(Ack& a) {
    std::lock_guard lk(st->mu);
    st->acked = a.count;
    st->cv.notify_all();
  }
};

}  // namespace

int remote_server(const std::string& workload, const char* fd_arg) {
  ActorSystem sys(config());
  auto remoting = start_remoting(sys, kServer, is_tls(workload));
  Done done;
  if (workload == "remote_tell" || workload == "remote_tell_tls") {
    auto acker = remoting->remote<Ack>(kClient, "acker", std::make_shared<const MessageCodecs<Ack>>(ack_codecs()));
    auto sink = sys.spawn<Sink>(acker, &done);
    (void)remoting->publish<SinkMsg>("sink", sink, sink_codecs());
  } else if (workload == "remote_ask" || workload == "remote_ask_tls") {
    auto echo = sys.spawn<Echo>(&done);
    (void)remoting->publish<EchoMsg>("echo", echo, echo_codecs());
  } else {
    std::fprintf(stderr, "bench_troupe: no remote workload '%s'\n", workload.c_str());
    return 2;
  }
  if (!bench::remote::announce_port(fd_arg, remoting->port())) return 1;
  done.wait();
  remoting->stop();
  sys.shutdown();
  return 0;
}

void remote_tell(const std::string& workload) {
  const bool tls = is_tls(workload);
  std::optional<BenchCertificates> certificates;
  if (tls) certificates.emplace();
  bench::remote::ServerProcess server(workload.c_str());
  ActorSystem sys(config());
  auto remoting = start_remoting(sys, kClient, tls);
  remoting->set_peer(kServer, "127.0.0.1", server.port());
  AckState acks;
  auto acker = sys.spawn<Acker>(&acks);
  (void)remoting->publish<Ack>("acker", acker, ack_codecs());
  auto sink = remoting->remote<SinkMsg>(kServer, "sink", std::make_shared<const MessageCodecs<SinkMsg>>(sink_codecs()));
  const std::string tag = bench::remote::tell_tag();
  std::uint64_t seq = 0;
  auto run = [&](long count) {
    const std::uint64_t end = seq + static_cast<std::uint64_t>(count);
    while (seq < end) {
      std::uint64_t acked;
      {
        std::unique_lock lk(acks.mu);
        acks.cv.wait(lk, [&] { return seq - acks.acked < static_cast<std::uint64_t>(bench::remote::kTellWindow); });
        acked = acks.acked;
      }
      // Send the whole open window before looking at acks again.
      std::uint64_t until = std::min<std::uint64_t>(end, acked + bench::remote::kTellWindow);
      for (; seq < until; ++seq) {
        auto r = sink.tell(Tell{seq, tag});
        if (!r.ok()) {
          std::fprintf(stderr, "bench_troupe: remote tell: %s\n", r.error().to_string().c_str());
          std::exit(1);
        }
      }
    }
    std::unique_lock lk(acks.mu);
    acks.cv.wait(lk, [&] { return acks.acked >= end; });
  };
  run(bench::remote::tell_warmup());
  auto t0 = std::chrono::steady_clock::now();
  run(bench::remote::tell_messages());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bench::remote::report_tell(s, bench::remote::tell_messages(), workload);
  (void)sink.tell(Stop{});
  if (!server.wait_exit()) std::fprintf(stderr, "bench_troupe: remote server did not exit cleanly\n");
  remoting->stop();
  sys.shutdown();
}

void remote_ask(const std::string& workload) {
  const bool tls = is_tls(workload);
  std::optional<BenchCertificates> certificates;
  if (tls) certificates.emplace();
  bench::remote::ServerProcess server(workload.c_str());
  ActorSystem sys(config());
  auto remoting = start_remoting(sys, kClient, tls);
  remoting->set_peer(kServer, "127.0.0.1", server.port());
  auto echo = remoting->remote<EchoMsg>(kServer, "echo", std::make_shared<const MessageCodecs<EchoMsg>>(echo_codecs()));
  auto one = [&](std::uint64_t seq) {
    auto r = echo.ask<std::uint64_t>([seq](ReplyTo<std::uint64_t> rt) { return Request{seq, std::move(rt)}; },
                                     std::chrono::seconds(10))
                 .get();
    if (!r.ok() || r.value() != seq) {
      std::fprintf(stderr, "bench_troupe: remote ask: %s\n", r.ok() ? "wrong answer" : r.error().to_string().c_str());
      std::exit(1);
    }
  };
  for (long i = 0; i < bench::remote::ask_warmup(); ++i) one(static_cast<std::uint64_t>(i));
  std::vector<std::int64_t> lat;
  lat.reserve(static_cast<std::size_t>(bench::remote::ask_round_trips()));
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < bench::remote::ask_round_trips(); ++i) {
    auto a = std::chrono::steady_clock::now();
    one(static_cast<std::uint64_t>(i));
    lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - a).count());
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bench::remote::report_ask(s, lat, workload);
  (void)echo.tell(Stop{});
  if (!server.wait_exit()) std::fprintf(stderr, "bench_troupe: remote server did not exit cleanly\n");
  remoting->stop();
  sys.shutdown();
}

}  // namespace troupe_bench
