// The Responder's moves and destructor, the same for every server
// implementation; respond() and drop() live with the implementation (see
// server_parts.hpp).

#include "troupe/net/http.hpp"

#include <utility>

namespace troupe::http {

Responder::Responder(Responder&& other) noexcept
    : loop_(std::move(other.loop_)), conn_(std::move(other.conn_)), seq_(std::exchange(other.seq_, 0)) {}

Responder& Responder::operator=(Responder&& other) noexcept {
  if (this != &other) {
    drop();
    loop_ = std::move(other.loop_);
    conn_ = std::move(other.conn_);
    seq_ = std::exchange(other.seq_, 0);
  }
  return *this;
}

Responder::~Responder() { drop(); }

}  // namespace troupe::http
