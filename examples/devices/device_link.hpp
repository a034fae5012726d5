#pragma once
// The worker's side of a device connection (device_server_main.cpp has the
// protocol): connect, HELLO, count the readings, and on stop say BYE and
// wait for the device to let go. All links of a node share one Asio io
// thread (Links); a link reports to its worker through a callback.
//
// Ownership: Links owns the io thread and must outlive every link (the
// node program keeps it for its whole run). A DeviceLink is shared by its
// worker and the io thread. Thread safety: open() and a link's bye() and
// close() may be called from any thread; the callback runs on the io
// thread and must not block.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace devices {

enum class LinkEvent {
  attached,  // the device said OK
  gone,      // the device is not in the fleet (GONE); the link is closed
  closed,    // the link is closed: after BYE, close(), or a failure
};

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // Says BYE; `closed` follows once the device answered (or the
  // connection failed).
  virtual void bye() = 0;
  // Closes at once; `closed` follows.
  virtual void close() = 0;
};

class Links {
 public:
  // Device server at host:port.
  Links(std::string host, std::uint16_t port);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // Connects to `device` as `worker`; `on_event` hears attached / gone /
  // closed (a connection that fails is `closed` at once).
  std::shared_ptr<DeviceLink> open(std::string device, std::string worker, std::function<void(LinkEvent)> on_event);

  // Readings received by every link of this node.
  std::uint64_t readings() const noexcept { return readings_.load(std::memory_order_relaxed); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<std::uint64_t> readings_{0};
};

}  // namespace devices
