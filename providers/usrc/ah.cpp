// Address handles: a UD destination's address vector, checked and
// resolved to its IP and path once (qp.cpp's resolve_ip and path_of, as
// an RC QP's primary path is).
#include <cerrno>
#include <new>

#include "usrc/usrc.h"

namespace usrc {

ibv_ah *create_ah(ibv_pd *ibpd, ibv_ah_attr *attr) {
  Context &c = impl(ibpd->context);
  uint32_t ip;
  if (int e = resolve_ip(c.cfg(), *attr, &ip)) {
    errno = e;
    return nullptr;
  }
  auto *ah = new (std::nothrow) Ah{};
  if (!ah) {
    errno = ENOMEM;
    return nullptr;
  }
  rc::Engine::UdDest &d = ah->dest;
  d.peer.ip = ip;
  path_of(*attr, &d.tos, &d.ttl, &d.sport);
  {
    std::lock_guard g(c.engine().mu);
    d.same_host = c.engine().nic().same_host(d.peer);
  }
  to_pd(ibpd)->users++;
  return &ah->ah;
}

int destroy_ah(ibv_ah *ibah) {
  unuse(to_pd(ibah->pd));
  delete to_ah(ibah);
  return 0;
}

}  // namespace usrc
