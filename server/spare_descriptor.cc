#include "server/spare_descriptor.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace ps::server {

SpareDescriptor::SpareDescriptor() { Refill(); }

SpareDescriptor::~SpareDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

bool SpareDescriptor::OutOfDescriptors(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

bool SpareDescriptor::DropPending(int listen_fd) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  const int dropped = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (dropped >= 0) {
    // A reset, not a FIN: the client learns at once, and nothing lingers in TIME_WAIT.
    const linger l{1, 0};
    ::setsockopt(dropped, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(dropped);
  }
  Refill();
  return dropped >= 0;
}

void SpareDescriptor::Refill() {
  if (fd_ < 0) fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

}  // namespace ps::server
