// Handler frames: the list of an actor's suspended coroutine handlers, and
// destroying them (troupe/core/detail/coroutine.hpp).

#include "troupe/core/detail/coroutine.hpp"

namespace troupe::detail {

void link_handler(HandlerFrame& f) {
  Extras& x = f.cell_->extras();
  f.prev_ = nullptr;
  f.next_ = x.handlers;
  if (x.handlers) x.handlers->prev_ = &f;
  x.handlers = &f;
}

void HandlerFrame::unlink() noexcept {
  Extras* x = cell_->extras_if();
  if (prev_) {
    prev_->next_ = next_;
  } else if (x && x->handlers == this) {
    x->handlers = next_;
  }
  if (next_) next_->prev_ = prev_;
  prev_ = next_ = nullptr;
}

void cancel_handler(HandlerFrame& f) noexcept {
  f.unlink();
  f.root_.destroy();
  f.dropped();
  delete &f;
}

void drop_handlers(Extras& x) noexcept {
  while (x.handlers) cancel_handler(*x.handlers);
}

}  // namespace troupe::detail
