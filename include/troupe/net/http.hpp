#pragma once
// troupe's HTTP/1.1 server and client (Boost.Beast and Boost.Asio inside;
// nothing of them shows here).
//
// Built for request handlers that answer later, from any thread: a handler
// gets the Request and a Responder, may pass the Responder to an actor, and
// the actor's reply callback calls respond() from wherever it runs. Nothing
// blocks an io thread while it waits, so one io thread serves thousands of
// requests in flight.
//
//   troupe::http::Router router;
//   router.add("GET", "/entities/{type}/{id}", [](troupe::http::Request& req, troupe::http::Responder r) {
//     ask_entity(req.params["type"], req.params["id"], [r = std::move(r)](Reply rep) mutable {
//       r.respond(troupe::http::Response::json(200, rep.to_json()));   // any thread
//     });
//   });
//   auto server = troupe::http::Server::start({.port = 8080}, std::move(router));
//
// What the server guarantees:
//   - Responses on one keep-alive connection go out in request order even
//     when pipelined requests are answered out of order.
//   - Every request gets exactly one response: the first respond() wins; a
//     Responder destroyed without responding answers 500 (code "no_reply");
//     a handler that throws answers 500 (code "handler_failed").
//   - Bad input (SPEC X1) gets a 4xx with a JSON reason and then the
//     connection is closed; the server keeps serving every other connection:
//       400  bad request line, header syntax, Host, Content-Length, chunk syntax,
//            percent-encoding, Transfer-Encoding together with Content-Length
//       408  a request not complete within request_read_timeout, or a partial
//            request idle for idle_timeout
//       413  a body over max_body_bytes (refused from its Content-Length,
//            before the body is read; a chunked body as soon as it passes it)
//       414  a request line over max_header_bytes
//       417  an Expect other than 100-continue
//       431  a header block over max_header_bytes (or over 100 fields)
//       501  a Transfer-Encoding other than "chunked" (chunked is decoded)
//       505  an HTTP version other than 1.0 and 1.1
//     A connection past max_connections, or past max_connections_per_address
//     from its remote address, gets a 503 and is closed at once (on a TLS
//     port: closed at once).
//     A request without Content-Length or Transfer-Encoding has no body
//     (RFC 9112 6.3). HTTP/1.0 closes after the response unless it asks for
//     keep-alive; "Connection: close" is honoured both ways. A request with
//     "Expect: 100-continue" gets the interim 100 when its headers are in
//     (unless responses before it are still outstanding, in which case the
//     client sends the body after its own wait, as RFC 9110 10.1.1 allows).
//   - HEAD is served by the GET route when there is no HEAD route; the body
//     is not sent, its Content-Length is.
//
// The client keeps a bounded pool of keep-alive connections to one
// host:port and sends one request per connection at a time.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

namespace troupe::http {

namespace detail {
struct ServerLoop;
class ServerConnection;
}  // namespace detail

// --- messages --------------------------------------------------------------------
// Plain values: copy and move them freely; no thread safety of their own.

// One request as the server parsed it. A handler gets it by reference for the
// duration of the call: move out whatever it keeps for later.
struct Request {
  std::string method;  // as sent: "GET", "POST", ... (case-sensitive, RFC 9110 9.1)
  std::string target;  // the request target as sent, e.g. "/a%20b/c?x=1"
  std::string path;    // the target's path, percent-decoded: "/a b/c"
  std::string query;   // the target's query, not decoded: "x=1" (empty if none)
  std::vector<std::pair<std::string, std::string>> headers;  // in order, names as sent
  std::string body;                                          // decoded (de-chunked) body
  std::map<std::string, std::string> params;                 // route parameters, percent-decoded per segment

  // The first header of that name (ASCII case-insensitive), or empty.
  std::string_view header(std::string_view name) const noexcept;
  bool has_header(std::string_view name) const noexcept;
  // The first query parameter of that name, decoded ('+' is a space;
  // malformed escapes are kept as they are); nullopt if absent.
  std::optional<std::string> query_param(std::string_view name) const;
};

// A response, built by a handler or received by the Client.
struct Response {
  int status = 200;
  // Sent as Content-Type unless empty. On a received response: its
  // Content-Type (empty if none).
  std::string content_type = "application/json";
  std::string body;
  // Extra headers. The server writes Content-Length, Connection and Date
  // itself and refuses (500) a header whose name or value could break the
  // framing (CR, LF, NUL, an invalid name). On a received response: every
  // header as received.
  std::vector<std::pair<std::string, std::string>> headers;

  static Response json(int status, std::string body);
  static Response text(int status, std::string body);
  // `{"error":{"code":"...","message":"..."}}`, escaped as JSON.
  static Response error(int status, std::string_view code, std::string_view message);

  // The first header of that name (ASCII case-insensitive), or empty.
  std::string_view header(std::string_view name) const noexcept;
};

// "OK", "Not Found", ...; "Unknown" for a code without a standard phrase.
std::string_view reason_phrase(int status) noexcept;

// --- responder -----------------------------------------------------------------------

// The one answer owed to one request. Move-only; owned by whoever holds it
// (the handler, then perhaps an actor's reply callback). Thread safety:
// respond() may be called from any thread, once; an instance itself is not
// shared between threads without synchronisation (like any value).
// Called on the connection's io thread (typically inside the handler), the
// response is queued at once; from another thread it is posted to that io
// thread. A Responder that outlives its connection or its server is
// harmless: respond() then does nothing.
class Responder {
 public:
  Responder() = default;  // answers nothing: for tests and for moved-from slots
  Responder(Responder&& other) noexcept;
  Responder& operator=(Responder&& other) noexcept;  // an unanswered target first answers 500
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();  // unanswered: 500 "no_reply"

  // Answers the request. Only the first call counts; later ones do nothing.
  void respond(Response response);
  // Not yet answered through this Responder (false for a default-constructed one).
  bool pending() const noexcept { return seq_ != 0; }

 private:
  friend class detail::ServerConnection;
  Responder(std::shared_ptr<detail::ServerLoop> loop, std::weak_ptr<detail::ServerConnection> conn,
            std::uint64_t seq) noexcept
      : loop_(std::move(loop)), conn_(std::move(conn)), seq_(seq) {}
  void drop() noexcept;

  std::shared_ptr<detail::ServerLoop> loop_;  // keeps the io_context alive for a late respond()
  std::weak_ptr<detail::ServerConnection> conn_;
  std::uint64_t seq_ = 0;  // 0: nothing owed
};

// --- router ------------------------------------------------------------------------

// Maps (method, path pattern) to handlers. Patterns are "/"-separated
// segments; a segment "{name}" matches any one non-empty segment and is
// given, percent-decoded, in Request::params. When several patterns match,
// the one with a literal segment at the first position where they differ
// wins ("/payments/stats" before "/payments/{id}"). Unknown path: 404;
// known path, other method: 405 with Allow.
// Ownership: a value; the Server keeps its own copy. Thread safety: build it
// on one thread; after Server::start() it is only read, by every io thread.
class Router {
 public:
  // Runs on an io thread. Must not block: hand slow work to an actor and
  // answer through the Responder later. An exception it throws becomes a 500.
  using Handler = std::function<void(Request&, Responder)>;

  // Adds a route. Throws std::invalid_argument for a pattern that does not
  // start with "/", has an empty or malformed "{...}" segment, repeats a
  // parameter name, or a (method, pattern) already added.
  Router& add(std::string method, std::string pattern, Handler handler);

  // Runs before each request is routed, unknown paths included: a Response
  // it returns is sent instead and no handler runs (a 401 for a request
  // without credentials, say); nullopt routes the request. One guard; a
  // later call replaces it. Runs on an io thread: must not block.
  using Guard = std::function<std::optional<Response>(const Request&)>;
  Router& guard(Guard check);

  // Routes one request (what the server does for each). Answers 404/405/400
  // itself when no handler applies.
  void dispatch(Request& request, Responder responder) const;

  // The methods served at `path` (a raw, undecoded path), HEAD included
  // when GET is; empty if no pattern matches.
  std::vector<std::string> allowed(std::string_view path) const;

 private:
  struct Route;
  struct Match;
  std::optional<Match> match(std::string_view raw_path, std::vector<std::string>& segments,
                             bool& bad_escape) const;
  std::vector<std::shared_ptr<const Route>> routes_;
  Guard guard_;
};

// --- server ------------------------------------------------------------------------
// Settings and counters are plain values: copy them freely.

// How a Server listens and what it accepts; read once by start().
struct ServerSettings {
  std::string host = "127.0.0.1";            // an address or a name; "0.0.0.0" for every interface
  std::uint16_t port = 0;                    // 0: any free port; Server::port() tells which
  int io_threads = 1;                        // each runs its own connections; the first also accepts
  std::size_t max_header_bytes = 16u << 10;  // request line + header fields
  std::size_t max_body_bytes = 1u << 20;
  // Connections past this get a 503 and are closed at once.
  std::size_t max_connections = 4096;
  // Connections open from one remote address; past it a new one from
  // there gets a 503 and is closed at once. 0: no limit of its own.
  std::size_t max_connections_per_address = 0;
  // A connection on which the server waits for the client (no request being
  // handled) and nothing arrives for this long is closed; a partial request
  // gets a 408 first. A response the client does not read for this long
  // also closes the connection.
  Duration idle_timeout = std::chrono::seconds(60);
  // A request must arrive whole within this from its first byte (slow
  // senders, byte-by-byte headers): otherwise 408 and close.
  Duration request_read_timeout = std::chrono::seconds(30);
  // Requests parsed on one connection and not yet answered; past it the
  // server stops reading that connection until answers go out.
  std::size_t max_pipelined = 64;
  // stop(): how long connections with unanswered requests may take to get
  // their answers out before they are aborted.
  Duration drain_timeout = std::chrono::seconds(2);
  // TLS: PEM files of the server's certificate chain and private key. Both
  // set: the port speaks HTTPS only (TLS 1.2 or newer), and the files are
  // read again when they change (looked at no more than once a second, as
  // connections arrive; one that does not load keeps the last). Both
  // empty: plain HTTP. One without the other is an error.
  std::string tls_cert_file;
  std::string tls_key_file;
  // A TLS handshake not done within this from the accept is closed.
  Duration tls_handshake_timeout = std::chrono::seconds(10);
  // Where the server's log lines go (bad input, handler exceptions, accept
  // failures), one line per call, from any io thread: must be thread-safe.
  // Default: the log facade (warn, component net, troupe/core/log.hpp).
  std::function<void(std::string_view)> log;
};

// A snapshot of the server's counters, all since start().
struct ServerStats {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_refused = 0;  // over max_connections: 503 and closed
  std::uint64_t connections_refused_per_address = 0;  // over max_connections_per_address: 503 and closed
  std::uint64_t connections_open = 0;     // now
  std::uint64_t requests = 0;             // handed to the router
  std::uint64_t responses = 0;            // handed to the socket in order, error responses included
  std::uint64_t bad_requests = 0;         // connections closed for bad input (4xx/5xx from the parser)
  std::uint64_t timeouts = 0;             // connections closed by idle_timeout, request_read_timeout or tls_handshake_timeout
  std::uint64_t tls_handshakes_failed = 0;  // TLS connections closed before their handshake was done (timeouts included)
  std::uint64_t handler_exceptions = 0;   // handlers that threw (answered 500)
  std::uint64_t responders_dropped = 0;   // responders destroyed unanswered (answered 500)
  std::uint64_t bytes_received = 0;
  std::uint64_t bytes_sent = 0;
};

// An HTTP/1.1 server (see the top of this file for what it guarantees).
// Ownership: owned by the caller of start(); owns its listener, connections
// and io threads. Thread safety: every member may be called from any thread
// except that stop() and the destructor must not run on one of the server's
// own io threads (inside a handler) — they join those threads.
class Server {
 public:
  // Listens and starts the io threads. Errors: invalid_argument for unusable
  // settings and for an address that cannot be listened on (in use, not
  // local, not resolvable), the message naming host:port.
  static Result<std::unique_ptr<Server>> start(ServerSettings settings, Router router);

  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::uint16_t port() const noexcept;
  ServerStats stats() const;

  // Closes the listener and stops reading; idle connections close at once,
  // others get their outstanding answers out (the last one with
  // "Connection: close") within drain_timeout, then whatever is left is
  // aborted and the io threads are joined. Idempotent. A Responder answered
  // after this does nothing.
  void stop();

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- client ------------------------------------------------------------------------
// Settings, counters and requests are plain values: copy them freely.

// What a Client connects to and how it bounds its work; read once by create().
struct ClientSettings {
  std::string host = "127.0.0.1";
  std::uint16_t port = 80;
  std::size_t max_connections = 64;  // open at once; one request in flight on each
  // Requests waiting for a connection; past it request() answers
  // buffer_overflow at once.
  std::size_t max_queued = 10000;
  Duration connect_timeout = std::chrono::seconds(2);
  // From request() to the whole response, queueing included; a request may
  // bring its own.
  Duration request_timeout = std::chrono::seconds(10);
  std::size_t max_response_header_bytes = 64u << 10;
  std::size_t max_response_body_bytes = 64u << 20;
  int io_threads = 1;
  // HTTPS: TLS 1.2 or newer; the server's certificate must chain to
  // tls_ca_file (PEM; empty: the system's trusted roots) and name `host`
  // (a DNS name in its subjectAltName, or the IP address when host is
  // one), or tls_server_name when that is set. The handshake counts
  // against connect_timeout.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_server_name;
};

// A snapshot of the client's counters, all since create().
struct ClientStats {
  std::uint64_t connections_opened = 0;  // TCP connections made
  std::uint64_t connect_failures = 0;
  std::uint64_t requests = 0;   // accepted by request()
  std::uint64_t responses = 0;  // complete responses handed to done
  std::uint64_t failures = 0;   // done called with an error, for any reason
  std::uint64_t timeouts = 0;
  std::uint64_t retries = 0;  // idempotent requests resent after a stale keep-alive connection
};

// One request the Client sends; `done` gets its outcome.
struct ClientRequest {
  std::string method = "GET";
  std::string target = "/";
  std::string body;
  std::string content_type;  // sent as Content-Type unless empty
  // Extra headers; Host and Content-Length are written for you.
  std::vector<std::pair<std::string, std::string>> headers;
  std::optional<Duration> timeout;  // default: ClientSettings::request_timeout
};

// An asynchronous keep-alive HTTP/1.1 client for one host:port.
// Requests beyond the open connections queue (bounded); responses are framed
// by Content-Length, chunked encoding or the connection's end. A connection
// whose request timed out is closed, never reused. A GET/HEAD sent on a
// reused connection that the server had meanwhile closed is retried once on
// a new one; other methods fail instead (they may have been executed).
// Errors handed to done: unreachable (connection refused, no connection
// within connect_timeout, a TLS handshake that failed, the server's
// certificate refused, connection lost before the response), timeout
// (request_timeout), protocol_error (a malformed response), buffer_overflow
// (queue full), invalid_argument (a method, target or header that is not
// valid HTTP), shutting_down (after close()).
// Ownership: owned by the caller of create(); owns its connections and io
// threads. Thread safety: request() from any thread, including from inside
// `done`; request_sync() from any thread but the client's own io threads;
// close() and the destructor not from inside `done`.
class Client {
 public:
  using Done = std::function<void(Result<Response>)>;

  // Resolves the host once, here, and starts the io threads. Errors:
  // invalid_argument for unusable settings or a host that does not resolve.
  static Result<std::unique_ptr<Client>> create(ClientSettings settings);

  ~Client();  // close()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends a request; `done` is called exactly once, on an io thread of this
  // client — except after close(), when it is called at once on the calling
  // thread with shutting_down. An exception `done` throws is swallowed.
  void request(ClientRequest request, Done done);
  void request(std::string method, std::string target, std::string body, std::string content_type, Done done,
               std::optional<Duration> timeout = {});

  // Sends a request and waits for its outcome. For command-line tools and
  // tests; invalid_argument when called on one of the client's io threads
  // (it would wait for itself).
  Result<Response> request_sync(ClientRequest request);
  Result<Response> request_sync(std::string method, std::string target, std::string body = {},
                                std::string content_type = {}, std::optional<Duration> timeout = {});

  ClientStats stats() const;

  // Fails every queued and in-flight request with shutting_down, closes the
  // connections and joins the io threads. Idempotent.
  void close();

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::http
