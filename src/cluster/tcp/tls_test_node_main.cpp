// One transport in a process of its own, for the tests that attack a node
// from outside (tls_process.test.cpp): it listens (TLS or plain), dials the
// peers it is given, sends a numbered frame to one of them every 10 ms, and
// rewrites a stats file every 50 ms with what it delivered (by sender, and
// frames whose payload starts with "attack" apart) and its refusal counters.
//
//   tls_test_node --id b [--cert F --key F --ca F | --insecure] [--peer ID:PORT]...
//                 [--send-to ID] --stats FILE [--handshake-timeout-ms N]
//
// Prints "READY <port>" once listening; SIGTERM or SIGINT: exit 0.

#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "troupe/cluster/transport.hpp"

namespace {

std::atomic<bool> g_stop{false};
void on_stop(int) { g_stop.store(true); }

std::string arg(int argc, char** argv, const char* name, const char* fallback = "") {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe::cluster;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }

  TransportSettings s;
  s.node_id = arg(argc, argv, "--id");
  s.reconnect_min = std::chrono::milliseconds(10);
  s.reconnect_max = std::chrono::milliseconds(200);
  bool insecure = false;
  for (int i = 1; i < argc; ++i) insecure = insecure || std::strcmp(argv[i], "--insecure") == 0;
  s.insecure = insecure;
  if (!insecure) s.tls = {arg(argc, argv, "--cert"), arg(argc, argv, "--key"), arg(argc, argv, "--ca")};
  if (auto hto = arg(argc, argv, "--handshake-timeout-ms"); !hto.empty())
    s.handshake_timeout = std::chrono::milliseconds(std::atoi(hto.c_str()));
  s.log = [id = s.node_id](std::string_view line) {
    std::fprintf(stderr, "tls_test_node %s: %.*s\n", id.c_str(), static_cast<int>(line.size()), line.data());
  };
  const std::string stats_path = arg(argc, argv, "--stats");
  const std::string send_to = arg(argc, argv, "--send-to");

  std::mutex mu;
  std::map<std::string, std::uint64_t> from;  // guarded by mu
  std::uint64_t attack = 0;                    // guarded by mu
  auto t = Transport::start(s, [&](std::string_view node, std::uint32_t, std::string_view payload) {
    std::lock_guard lk(mu);
    ++from[std::string(node)];
    if (payload.rfind("attack", 0) == 0) ++attack;
  });
  if (!t.ok()) {
    std::fprintf(stderr, "tls_test_node: %s\n", t.error().to_string().c_str());
    return 1;
  }
  Transport& tr = **t;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--peer") != 0) continue;
    const std::string p = argv[i + 1];
    const auto colon = p.rfind(':');
    tr.set_peer(p.substr(0, colon), "127.0.0.1", static_cast<std::uint16_t>(std::atoi(p.c_str() + colon + 1)));
  }
  std::printf("READY %u\n", static_cast<unsigned>(tr.port()));
  std::fflush(stdout);

  std::uint64_t seq = 0;
  auto next_stats = std::chrono::steady_clock::now();
  while (!g_stop.load()) {
    if (!send_to.empty() && tr.connected(send_to)) (void)tr.send(send_to, 1, "seq " + std::to_string(++seq));
    if (std::chrono::steady_clock::now() >= next_stats && !stats_path.empty()) {
      next_stats += std::chrono::milliseconds(50);
      const TransportStats st = tr.stats();
      const RefusedPeerCounts& r = st.refused_peers;
      std::ofstream out(stats_path + ".tmp", std::ios::trunc);
      {
        std::lock_guard lk(mu);
        std::uint64_t all = 0;
        for (const auto& [node, n] : from) {
          out << "delivered_from_" << node << " " << n << "\n";
          all += n;
        }
        out << "delivered " << all << "\nattack_delivered " << attack << "\n";
      }
      out << "refused_tls_handshake " << r.tls_handshake << "\nrefused_no_certificate " << r.no_certificate
          << "\nrefused_untrusted_certificate " << r.untrusted_certificate << "\nrefused_name_mismatch "
          << r.name_mismatch << "\nrefused_over_address_limit " << r.over_address_limit
          << "\nrefused_over_total_limit " << r.over_total_limit << "\nhandshake_timeouts "
          << st.closed_for_bad_input.handshake_timeout << "\nhandshakes " << st.handshakes << "\nconnections_closed "
          << st.connections_closed << "\nsent " << seq << "\n";
      for (const auto& p : tr.peers()) out << "connected_" << p.node_id << " " << (p.connected ? 1 : 0) << "\n";
      out.close();
      std::rename((stats_path + ".tmp").c_str(), stats_path.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  tr.stop();
  return 0;
}
