// Protection domains and memory regions.
#include <cerrno>
#include <new>

#include "usrc/usrc.h"

namespace usrc {

ibv_pd *alloc_pd(ibv_context *) {
  auto *pd = new (std::nothrow) Pd{};
  if (!pd) errno = ENOMEM;
  return pd ? &pd->pd : nullptr;
}

int dealloc_pd(ibv_pd *ibpd) {
  Pd *pd = to_pd(ibpd);
  if (pd->users.load()) return EBUSY;
  delete pd;
  return 0;
}

constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

ibv_mr *reg_mr(ibv_pd *ibpd, void *addr, size_t length, uint64_t iova, int access) {
  // Unsupported flags (on-demand paging, memory windows, ...) are refused,
  // not ignored.
  if (access & ~kMrAccess) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // IBA C10-...: remote write or atomic access requires local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  if (!addr && length) {
    errno = EINVAL;
    return nullptr;
  }
  if (iova + length < iova) {
    errno = EINVAL;
    return nullptr;
  }
  auto *mr = new (std::nothrow) Mr{};
  if (!mr) {
    errno = ENOMEM;
    return nullptr;
  }
  Pd *pd = to_pd(ibpd);
  mr->pd = pd;
  mr->addr = static_cast<uint8_t *>(addr);
  mr->iova = iova;
  mr->length = length;
  mr->access = static_cast<uint32_t>(access);
  mr->vmr.mr_type = IBV_MR_TYPE_MR;
  mr->vmr.access = access;
  Context &c = impl(ibpd->context);
  {
    std::lock_guard g(c.engine().mu);
    uint32_t key = c.add_mr(mr);
    mr->vmr.ibmr.lkey = mr->vmr.ibmr.rkey = key;
    mr->vmr.ibmr.handle = key;
  }
  pd->users++;
  return &mr->vmr.ibmr;
}

int dereg_mr(verbs_mr *vmr) {
  Mr *mr = reinterpret_cast<Mr *>(vmr);
  Context &c = impl(vmr->ibmr.context);
  {
    // After this no packet can reach the memory: the responder resolves
    // rkeys under the same lock.
    std::lock_guard g(c.engine().mu);
    c.remove_mr(vmr->ibmr.lkey);
  }
  mr->pd->users--;
  delete mr;
  return 0;
}

}  // namespace usrc
