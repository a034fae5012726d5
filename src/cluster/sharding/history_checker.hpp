#pragma once
// The history checker of the multi-node tests (SPEC V1): reads what the
// clients saw, what each node process logged about its activations, and
// what the journal stored, and names every way the run broke single
// activation (E7) or a linearizable counter.
//
// Inputs (HistoryRecord):
//  - the client-side history: every Deposit (adds 1) or Credit (adds 1 once
//    per op) the driver asked, with the node it asked, its wall-clock
//    invocation and completion, and the answered balance or nothing (failed
//    or timed out: the outcome is unknown);
//  - the activation log each node process writes outside the journal: one
//    activation per incarnation of an entity, from its start to its stop
//    (no stop line: it ended when the driver SIGKILLed that process);
//  - the signals the driver sent to node processes (SIGKILL, SIGSTOP,
//    SIGCONT) with their wall-clock times;
//  - the events the nodes stored (one line per stored event, in the
//    journal) and the journal's highest sequence number per entity.
//
// Rules (each broken one is a violation, a sentence naming the entity):
//  - client: two writes of one entity never answer the same balance (a
//    Credit op answered more than once answers the same balance each time);
//    the answered balances are 1..n with at most as many missing as that
//    entity has writes of unknown outcome; a write answered before another
//    was asked answers the lower balance; the journal's highest sequence
//    number is at least the highest answered balance;
//  - activations: two activations of one entity in different processes are
//    never active at once for longer than the margin, where the time a
//    process spent frozen by SIGSTOP does not count as active;
//  - journal: no sequence number stored twice, and the numbers one
//    incarnation stored are not interleaved with another's.
//
// The checker returns violations instead of asserting, so a test can expect
// them too. Thread safety: the free functions are pure; ClientHistory is
// safe to use from any thread.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <istream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace troupe::cluster::proc {

// Microseconds since the Unix epoch (system clock): what every side of the
// history is stamped with, so the driver's and the nodes' times compare.
using WallUs = std::int64_t;
inline WallUs wall_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One ask of a write by the driver.
struct ClientOp {
  std::string entity;
  std::string via;  // the node asked
  std::string op;   // a Credit's op id; empty for a Deposit
  WallUs invoked = 0, completed = 0;
  std::optional<std::int64_t> balance;  // the answer; nullopt: failed or timed out, outcome unknown
};

// One incarnation of one entity in one node process.
struct Activation {
  std::string entity, node;
  long pid = 0;
  std::uint64_t incarnation = 0;
  WallUs started = 0;
  std::optional<WallUs> stopped;  // nullopt: no stop line (the process was killed)
};

// A signal the driver sent to a node process.
struct NodeSignal {
  enum class Kind { kill, pause, resume };
  Kind kind = Kind::kill;
  std::string node;
  long pid = 0;
  WallUs at = 0;
};

// One event the nodes stored ("<entity> <node> <incarnation> <seq> <amount>").
struct StoredEvent {
  std::string entity, node;
  std::uint64_t incarnation = 0, seq = 0;
  std::int64_t amount = 0;
};

struct HistoryRecord {
  std::vector<ClientOp> client;
  std::vector<Activation> activations;
  std::vector<NodeSignal> signals;
  std::vector<StoredEvent> stored;
  std::map<std::string, std::uint64_t> journal_highest;  // entity -> highest stored seq; entities absent are not checked
  WallUs taken = 0;  // when the record was taken: activations still running end here
};

// The driver's record of its asks, kept by the test that asks; every ask
// is added once its outcome is known. Thread-safe: load threads add to it.
class ClientHistory {
 public:
  void add(ClientOp op) {
    std::lock_guard lk(mu_);
    ops_.push_back(std::move(op));
  }
  std::vector<ClientOp> ops() const {
    std::lock_guard lk(mu_);
    return ops_;
  }
  void clear() {
    std::lock_guard lk(mu_);
    ops_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<ClientOp> ops_;
};

namespace detail_history {

// One write: a Deposit ask, or every ask of one Credit op.
struct Write {
  std::string name;  // for messages
  WallUs first_invoked = 0;
  std::optional<WallUs> first_answered;
  std::optional<std::int64_t> balance;
};

inline std::string ms_text(WallUs us) { return std::to_string(us / 1000) + " ms"; }

}  // namespace detail_history

// The client-side rules, and the journal's highest seq against them.
inline std::vector<std::string> check_client(const std::vector<ClientOp>& ops,
                                             const std::map<std::string, std::uint64_t>& journal_highest) {
  using detail_history::Write;
  std::vector<std::string> out;
  std::map<std::string, std::vector<Write>> writes;                 // entity -> writes
  std::map<std::pair<std::string, std::string>, std::size_t> credit_at;  // (entity, op) -> index in writes
  for (const auto& o : ops) {
    auto& ws = writes[o.entity];
    Write* w = nullptr;
    if (o.op.empty()) {
      ws.push_back(Write{"deposit via " + o.via, o.invoked, {}, {}});
      w = &ws.back();
    } else {
      auto [it, fresh] = credit_at.try_emplace({o.entity, o.op}, ws.size());
      if (fresh) ws.push_back(Write{"credit " + o.op, o.invoked, {}, {}});
      w = &ws[it->second];
      w->first_invoked = std::min(w->first_invoked, o.invoked);
    }
    if (!o.balance) continue;
    if (w->balance && *w->balance != *o.balance) {
      out.push_back(o.entity + ": " + w->name + " answered balance " + std::to_string(*w->balance) + " and later " +
                    std::to_string(*o.balance));
      continue;
    }
    w->balance = o.balance;
    if (!w->first_answered || o.completed < *w->first_answered) w->first_answered = o.completed;
  }
  for (auto& [entity, ws] : writes) {
    std::map<std::int64_t, const Write*> by_balance;
    std::size_t unknown = 0;
    for (const auto& w : ws) {
      if (!w.balance) {
        ++unknown;
        continue;
      }
      auto [it, fresh] = by_balance.emplace(*w.balance, &w);
      if (!fresh)
        out.push_back(entity + ": balance " + std::to_string(*w.balance) + " answered twice (" + it->second->name +
                      ", " + w.name + "): two writers applied the same write");
    }
    if (by_balance.empty()) continue;
    const std::int64_t highest = by_balance.rbegin()->first;
    if (by_balance.begin()->first < 1)
      out.push_back(entity + ": balance " + std::to_string(by_balance.begin()->first) + " answered to a write");
    const std::int64_t missing = highest - static_cast<std::int64_t>(by_balance.size());
    if (missing > static_cast<std::int64_t>(unknown)) {
      std::string gaps;
      int listed = 0;
      for (std::int64_t b = 1; b <= highest && listed < 5; ++b)
        if (!by_balance.count(b)) gaps += (listed++ ? ", " : "") + std::to_string(b);
      out.push_back(entity + ": answered balances up to " + std::to_string(highest) + " miss " + std::to_string(missing) +
                    " (" + gaps + (missing > 5 ? ", ..." : "") + ") but only " + std::to_string(unknown) +
                    " writes have an unknown outcome: a write was lost or a balance skipped");
    }
    // Real-time order: a write answered before another was asked is below it.
    std::optional<std::pair<WallUs, const Write*>> earliest_above;  // among higher balances
    for (auto it = by_balance.rbegin(); it != by_balance.rend(); ++it) {
      const Write& w = *it->second;
      if (earliest_above && earliest_above->first < w.first_invoked)
        out.push_back(entity + ": " + earliest_above->second->name + " answered " +
                      std::to_string(*earliest_above->second->balance) + " before " + w.name +
                      " was asked, which answered the lower " + std::to_string(*w.balance) + ": not linearizable");
      if (w.first_answered && (!earliest_above || *w.first_answered < earliest_above->first))
        earliest_above = std::make_pair(*w.first_answered, &w);
    }
    if (auto j = journal_highest.find(entity); j != journal_highest.end() && static_cast<std::int64_t>(j->second) < highest)
      out.push_back(entity + ": balance " + std::to_string(highest) + " was acknowledged but the journal's highest seq is " +
                    std::to_string(j->second) + ": an acknowledged write is missing");
  }
  return out;
}

// The activation rule: no two processes' activations of one entity active
// at once for longer than `margin`, frozen time not counted.
inline std::vector<std::string> check_activations(const std::vector<Activation>& activations,
                                                  const std::vector<NodeSignal>& signals, WallUs taken,
                                                  std::chrono::milliseconds margin) {
  using Span = std::pair<WallUs, WallUs>;
  using Process = std::pair<std::string, long>;  // node id, pid
  std::map<Process, std::vector<WallUs>> kills;
  std::map<Process, std::vector<Span>> frozen;
  {
    std::map<Process, std::vector<NodeSignal>> by_process;
    for (const auto& s : signals) by_process[{s.node, s.pid}].push_back(s);
    for (auto& [p, ss] : by_process) {
      std::stable_sort(ss.begin(), ss.end(), [](const NodeSignal& a, const NodeSignal& b) { return a.at < b.at; });
      std::optional<WallUs> paused;
      for (const auto& s : ss) {
        if (s.kind == NodeSignal::Kind::kill) {
          kills[p].push_back(s.at);
          if (paused) frozen[p].push_back({*paused, s.at});
          paused.reset();
        } else if (s.kind == NodeSignal::Kind::pause) {
          if (!paused) paused = s.at;
        } else if (paused) {
          frozen[p].push_back({*paused, s.at});
          paused.reset();
        }
      }
      if (paused) frozen[p].push_back({*paused, taken});
    }
  }
  // Each activation as the spans it was active in.
  struct Active {
    const Activation* a;
    WallUs end;
    std::vector<Span> spans;
  };
  std::map<std::string, std::vector<Active>> by_entity;
  for (const auto& a : activations) {
    Process p{a.node, a.pid};
    WallUs end = taken;
    if (a.stopped) {
      end = *a.stopped;
    } else if (auto k = kills.find(p); k != kills.end()) {
      for (WallUs at : k->second)
        if (at >= a.started) {
          end = at;
          break;
        }
    }
    std::vector<Span> spans{{a.started, std::max(a.started, end)}};
    if (auto f = frozen.find(p); f != frozen.end()) {
      for (const auto& [from, to] : f->second) {
        std::vector<Span> next;
        for (const auto& [s, e] : spans) {
          if (to <= s || from >= e) {
            next.push_back({s, e});
            continue;
          }
          if (s < from) next.push_back({s, from});
          if (to < e) next.push_back({to, e});
        }
        spans = std::move(next);
      }
    }
    by_entity[a.entity].push_back(Active{&a, end, std::move(spans)});
  }
  const WallUs margin_us = std::chrono::duration_cast<std::chrono::microseconds>(margin).count();
  std::vector<std::string> out;
  for (auto& [entity, list] : by_entity) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      for (std::size_t j = i + 1; j < list.size(); ++j) {
        const Activation& x = *list[i].a;
        const Activation& y = *list[j].a;
        if (x.node == y.node && x.pid == y.pid) continue;
        if (list[i].end <= y.started || list[j].end <= x.started) continue;
        WallUs both = 0;
        for (const auto& [s1, e1] : list[i].spans)
          for (const auto& [s2, e2] : list[j].spans) both += std::max<WallUs>(0, std::min(e1, e2) - std::max(s1, s2));
        if (both <= margin_us) continue;
        auto describe = [&](const Active& act) {
          const Activation& a = *act.a;
          const char* how = a.stopped ? "stopped" : act.end == taken ? "still running" : "killed";
          return a.node + " (pid " + std::to_string(a.pid) + ", incarnation " + std::to_string(a.incarnation & 0xffffffffu) +
                 ", " + how + " " + detail_history::ms_text(act.end - a.started) + " after its start)";
        };
        out.push_back(entity + ": active on " + describe(list[i]) + " and on " + describe(list[j]) + " at once for " +
                      detail_history::ms_text(both) + " (margin " + detail_history::ms_text(margin_us) +
                      "): two live incarnations");
      }
    }
  }
  return out;
}

// The journal-side rules over the stored events.
inline std::vector<std::string> check_stored(const std::vector<StoredEvent>& stored) {
  std::vector<std::string> out;
  std::map<std::string, std::vector<const StoredEvent*>> by_entity;
  for (const auto& h : stored) by_entity[h.entity].push_back(&h);
  for (auto& [entity, lines] : by_entity) {
    std::set<std::uint64_t> seqs;
    for (auto* l : lines)
      if (!seqs.insert(l->seq).second) out.push_back(entity + ": seq " + std::to_string(l->seq) + " stored twice");
    std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> range;  // incarnation -> [min, max]
    for (auto* l : lines) {
      auto [it, fresh] = range.try_emplace(l->incarnation, l->seq, l->seq);
      if (!fresh) {
        it->second.first = std::min(it->second.first, l->seq);
        it->second.second = std::max(it->second.second, l->seq);
      }
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
    for (auto& [inc, r] : range) spans.push_back(r);
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      if (spans[i].first <= spans[i - 1].second)
        out.push_back(entity + ": two incarnations stored interleaved seqs (" + std::to_string(spans[i - 1].first) + ".." +
                      std::to_string(spans[i - 1].second) + " and " + std::to_string(spans[i].first) + ".." +
                      std::to_string(spans[i].second) + ")");
  }
  return out;
}

// How many incarnations stored at least one event.
inline std::size_t stored_incarnations(const std::vector<StoredEvent>& stored) {
  std::set<std::pair<std::string, std::uint64_t>> seen;
  for (const auto& h : stored) seen.insert({h.entity, h.incarnation});
  return seen.size();
}

// Every rule over the whole record.
inline std::vector<std::string> check_history(const HistoryRecord& r, std::chrono::milliseconds margin) {
  auto out = check_client(r.client, r.journal_highest);
  for (auto& v : check_activations(r.activations, r.signals, r.taken, margin)) out.push_back(std::move(v));
  for (auto& v : check_stored(r.stored)) out.push_back(std::move(v));
  return out;
}

// --- reading the nodes' files -------------------------------------------------------

// Stored-event lines; lines that do not parse are skipped.
inline void read_stored(std::istream& in, std::vector<StoredEvent>& out) {
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    StoredEvent h;
    ss >> h.entity >> h.node >> h.incarnation >> h.seq >> h.amount;
    if (!ss.fail()) out.push_back(std::move(h));
  }
}

// Activation log lines, "start|stop <entity> <node> <pid> <incarnation>
// <wall us>": a start and its stop make one activation.
inline void read_activations(std::istream& in, std::vector<Activation>& out) {
  std::map<std::tuple<std::string, long, std::uint64_t>, std::size_t> at;  // (node, pid, incarnation) -> index
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string kind;
    Activation a;
    WallUs t = 0;
    ss >> kind >> a.entity >> a.node >> a.pid >> a.incarnation >> t;
    if (ss.fail()) continue;
    auto key = std::make_tuple(a.node, a.pid, a.incarnation);
    if (kind == "start") {
      a.started = t;
      at[key] = out.size();
      out.push_back(std::move(a));
    } else if (kind == "stop") {
      if (auto it = at.find(key); it != at.end()) out[it->second].stopped = t;
    }
  }
}

}  // namespace troupe::cluster::proc
