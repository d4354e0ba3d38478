// Protection domains and memory regions.
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "usrc/boundary.h"
#include "usrc/usrc.h"

namespace usrc {

ibv_pd *alloc_pd(ibv_context *ibctx) {
  auto *pd = new (std::nothrow) Pd{};
  int e = ENOMEM;
  if (!pd || !no_throw([&] { pd->pd.handle = impl(ibctx).add_handle(pd); }, &e)) {
    delete pd;
    errno = e;
    return nullptr;
  }
  return &pd->pd;
}

void unuse(Pd *pd) {
  if (pd->users.fetch_sub(1) == 1 && pd->imported) {
    unuse(pd->over);
    delete pd;
  }
}

// A parent domain's allocators (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS):
// the source of the arrays of the objects created on it, called in the
// thread that creates, resizes or destroys the object, never under the
// engine's lock:
//   a QP's send queue and receive queue WQE arrays (resource_type 1 and 2),
//   an SRQ's WQE array (3),
//   a CQ's completion array (4; CQs of ibv_create_cq_ex with
//   IBV_CQ_INIT_ATTR_MASK_PD),
// each with alignment 64 (rc/buffer.h). IBV_ALLOCATOR_USE_DEFAULT from
// alloc takes the heap for that array, and free is not called for it.
// Everything else (the objects themselves, AHs, MRs) is the provider's.
struct PdAllocators final : rc::BufferSource {
  ibv_pd *pd;
  void *pd_context;
  void *(*alloc_fn)(ibv_pd *, void *, size_t, size_t, uint64_t);
  void (*free_fn)(ibv_pd *, void *, void *, uint64_t);
  PdAllocators(ibv_pd *p, const ibv_parent_domain_init_attr &a)
      : pd(p), pd_context(a.pd_context), alloc_fn(a.alloc), free_fn(a.free) {}
  void *alloc(size_t size, size_t align, rc::BufferKind kind) override {
    void *p = alloc_fn(pd, pd_context, size, align, static_cast<uint64_t>(kind));
    return p == IBV_ALLOCATOR_USE_DEFAULT ? kUseHeap : p;
  }
  void free(void *p, rc::BufferKind kind) override { free_fn(pd, pd_context, p, static_cast<uint64_t>(kind)); }
};

rc::BufferSource *Pd::buffers() const { return allocators; }

// (A PD with parent domains or imports on it counts them as users.) An
// imported PD's deallocation ends its import only: the PD it names is its
// allocator's to deallocate (docs/design.md).
int dealloc_pd(ibv_pd *ibpd) {
  Pd *pd = to_pd(ibpd);
  if (pd->imported) {
    if (pd->users.load() > 1) return EBUSY;
    unuse(pd);
    return 0;
  }
  if (pd->parent()) {
    if (pd->users.load()) return EBUSY;
    unuse(pd->over);
    if (pd->td) pd->td->users--;
    delete pd->allocators;
  } else if (!impl(ibpd->context).remove_unused(pd)) {
    return EBUSY;
  }
  delete pd;
  return 0;
}

ibv_td *alloc_td(ibv_context *ibctx, ibv_td_init_attr *attr) {
  if (!attr || attr->comp_mask) {
    errno = EINVAL;
    return nullptr;
  }
  auto *td = new (std::nothrow) Td{};
  if (!td) {
    errno = ENOMEM;
    return nullptr;
  }
  td->td.context = ibctx;
  return &td->td;
}

int dealloc_td(ibv_td *ibtd) {
  Td *td = to_td(ibtd);
  if (td->users.load()) return EBUSY;   // a parent domain is on it
  delete td;
  return 0;
}

// A parent domain over attr->pd, a PD (not a parent domain; an imported
// one is a PD) of this context; a thread domain of this context, if any.
ibv_pd *alloc_parent_domain(ibv_context *ibctx, ibv_parent_domain_init_attr *attr) {
  constexpr uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  const bool with_alloc = attr && (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS);
  if (!attr || (attr->comp_mask & ~kKnown) || !attr->pd || attr->pd->context != ibctx ||
      to_pd(attr->pd)->parent() || (attr->td && attr->td->context != ibctx) ||
      (with_alloc && (!attr->alloc || !attr->free))) {
    errno = EINVAL;
    return nullptr;
  }
  auto *pd = new (std::nothrow) Pd{};
  if (!pd) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_parent_domain_init_attr a = *attr;
  if (!(a.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)) a.pd_context = nullptr;
  if (with_alloc && !(pd->allocators = new (std::nothrow) PdAllocators(&pd->pd, a))) {
    delete pd;
    errno = ENOMEM;
    return nullptr;
  }
  // (libibverbs' ibv_alloc_parent_domain fills nothing in.)
  pd->pd.context = ibctx;
  pd->pd.handle = attr->pd->handle;
  pd->over = to_pd(attr->pd);
  pd->base = pd->over->base;
  pd->over->users++;
  if (attr->td) {
    pd->td = to_td(attr->td);
    pd->td->users++;
  }
  return &pd->pd;
}

constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                          IBV_ACCESS_ON_DEMAND | IBV_ACCESS_MW_BIND;

uint8_t *Mr::mapped(uint8_t *p, uint64_t len) const {
  // The range must be mapped now (msync fails with ENOMEM on any hole):
  // memory unmapped while registered gives an access error, not a crash.
  // The check is made when an operation starts.
  const uintptr_t page = 4096, start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  if (msync(reinterpret_cast<void *>(start), reinterpret_cast<uintptr_t>(p) + len - start,
            MS_ASYNC) != 0)
    return nullptr;
  return p;
}

static ibv_mr *add_mr(ibv_pd *ibpd, uint8_t *addr, size_t length, uint64_t iova, int access) {
  // Remote write or atomic access requires local write (ibv_reg_mr(3)).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  auto *mr = new (std::nothrow) Mr{};
  if (!mr) {
    errno = ENOMEM;
    return nullptr;
  }
  Pd *pd = prot_pd(ibpd);
  mr->pd = pd;
  mr->on = to_pd(ibpd);
  mr->addr = addr;
  mr->iova = iova;
  mr->length = length;
  mr->access = static_cast<uint32_t>(access);
  mr->odp = access & IBV_ACCESS_ON_DEMAND;
  mr->vmr.mr_type = IBV_MR_TYPE_MR;
  mr->vmr.access = access;
  Context &c = impl(ibpd->context);
  {
    std::lock_guard g(c.engine().mu);
    uint32_t key = c.add_mr(mr);
    mr->vmr.ibmr.lkey = mr->vmr.ibmr.rkey = key;
    mr->vmr.ibmr.handle = key;
    // Same-host peers may write into it directly (net::LocalPeers::place; not
    // ODP memory, which may have holes: those take the responder's
    // checks). The domain is the PD, as the QPs' gates give it.
    if ((access & IBV_ACCESS_REMOTE_WRITE) && !mr->odp &&
        !c.engine().local_peers().expose(key, {reinterpret_cast<uint64_t>(pd), addr, iova, length}))
      c.engine().counters[uint32_t(Counter::direct_unlisted)]++;
  }
  mr->on->users++;
  return &mr->vmr.ibmr;
}

ibv_mr *reg_mr(ibv_pd *ibpd, void *addr, size_t length, uint64_t iova, int access) {
  // Unsupported flags (memory windows, relaxed ordering, ...) are refused,
  // not ignored.
  if (access & ~kMrAccess) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // Implicit ODP (ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND)): the whole
  // address space, iova = address.
  const bool implicit = !addr && length == SIZE_MAX && (access & IBV_ACCESS_ON_DEMAND);
  if ((!addr && length && !implicit) || (!implicit && iova + length < iova)) {
    errno = EINVAL;
    return nullptr;
  }
  if (implicit) iova = 0;
  return add_mr(ibpd, static_cast<uint8_t *>(addr), length, iova, access);
}

ibv_dm *alloc_dm(ibv_context *ibctx, ibv_alloc_dm_attr *attr) {
  if (attr->comp_mask) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->length == 0 || attr->length > kMaxDmSize || attr->log_align_req > 12) {
    errno = EINVAL;
    return nullptr;
  }
  auto *dm = new (std::nothrow) Dm{};
  void *mem = nullptr;
  if (!dm || posix_memalign(&mem, 4096, attr->length) != 0) {
    delete dm;
    errno = ENOMEM;
    return nullptr;
  }
  std::memset(mem, 0, attr->length);
  dm->mem = static_cast<uint8_t *>(mem);
  dm->length = attr->length;
  dm->dm.context = ibctx;
  int e = ENOMEM;
  if (!no_throw([&] { dm->dm.handle = impl(ibctx).add_handle(dm); }, &e)) {
    free(mem);
    delete dm;
    errno = e;
    return nullptr;
  }
  // Device memory is copied in 4-byte units, as the devices that have it
  // require: an offset or length not a multiple of 4 is EINVAL.
  dm->dm.memcpy_to_dm = [](ibv_dm *d, uint64_t off, const void *src, size_t len) {
    Dm *m = reinterpret_cast<Dm *>(d);
    if (off > m->length || len > m->length - off || off % 4 || len % 4) return EINVAL;
    std::memcpy(m->mem + off, src, len);
    return 0;
  };
  dm->dm.memcpy_from_dm = [](void *dst, ibv_dm *d, uint64_t off, size_t len) {
    Dm *m = reinterpret_cast<Dm *>(d);
    if (off > m->length || len > m->length - off || off % 4 || len % 4) return EINVAL;
    std::memcpy(dst, m->mem + off, len);
    return 0;
  };
  return &dm->dm;
}

// An imported DM's free ends its import only (as dealloc_pd's).
int free_dm(ibv_dm *d) {
  Dm *dm = reinterpret_cast<Dm *>(d);
  if (dm->origin) {
    unimport_dm(d);
    return 0;
  }
  if (!impl(d->context).remove_unused(dm)) return EBUSY;
  free(dm->mem);
  delete dm;
  return 0;
}

// Device memory MRs are zero based (man ibv_reg_dm_mr): iova 0 is offset.
ibv_mr *reg_dm_mr(ibv_pd *ibpd, ibv_dm *d, uint64_t offset, size_t length, unsigned int access) {
  Dm *dm = reinterpret_cast<Dm *>(d);
  if (dm->origin) dm = dm->origin;   // (an import's MRs are its origin's)
  if (!(access & IBV_ACCESS_ZERO_BASED) || (access & IBV_ACCESS_ON_DEMAND)) {
    errno = EINVAL;
    return nullptr;
  }
  if ((access & ~IBV_ACCESS_ZERO_BASED) & ~kMrAccess) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (offset > dm->length || length > dm->length - offset) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_mr *mr = add_mr(ibpd, dm->mem + offset, length, 0, int(access & ~IBV_ACCESS_ZERO_BASED));
  if (mr) {
    to_mr(mr)->dm = dm;
    dm->mrs++;
    mr->context = ibpd->context;
    mr->pd = ibpd;
    mr->addr = nullptr;
    mr->length = length;
  }
  return mr;
}

// ibv_rereg_mr: a new PD, range or access for a registered MR, its keys
// kept. Under the engine's lock, as a deregistration: no packet sees the MR
// half changed, and a same-host peer's placement into the old range has
// ended (withdraw) before it changes. Errors leave the MR as it was and are
// returned (and set in errno).
int rereg_mr(verbs_mr *vmr, int flags, ibv_pd *ibpd, void *addr, size_t length, int access) {
  Mr *mr = reinterpret_cast<Mr *>(vmr);
  Context &c = impl(vmr->ibmr.context);
  const auto refuse = [](int e) { return errno = e; };
  const int new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : static_cast<int>(mr->access);
  Pd *new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? (ibpd ? to_pd(ibpd) : nullptr) : mr->on;
  if (mr->dm || mr->origin || !new_pd || ((flags & IBV_REREG_MR_CHANGE_PD) && ibpd->context != vmr->ibmr.context))
    return refuse(EINVAL);
  if (new_access & ~kMrAccess) return refuse(EOPNOTSUPP);
  if ((new_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(new_access & IBV_ACCESS_LOCAL_WRITE))
    return refuse(EINVAL);
  // An implicit ODP MR (the whole address space) is not given a range.
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (reinterpret_cast<uintptr_t>(addr) + length < length))
    return refuse(EINVAL);
  {
    std::lock_guard g(c.engine().mu);
    if (mr->windows) return refuse(EBUSY);   // (windows bound to its range)
    const uint32_t key = vmr->ibmr.lkey;
    c.engine().local_peers().withdraw(key);
    // WQEs posted before write through it no more (an lkey is checked
    // when used: the old range or access may be gone).
    c.engine().invalidate_lkey(key);
    if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
      mr->addr = static_cast<uint8_t *>(addr);
      mr->iova = reinterpret_cast<uintptr_t>(addr);
      mr->length = length;
    }
    mr->access = static_cast<uint32_t>(new_access);
    mr->odp = new_access & IBV_ACCESS_ON_DEMAND;
    vmr->access = new_access;
    if (new_pd != mr->on) {
      unuse(mr->on);
      new_pd->users++;
      mr->on = new_pd;
      mr->pd = new_pd->base;
    }
    if ((new_access & IBV_ACCESS_REMOTE_WRITE) && !mr->odp &&
        !c.engine().local_peers().expose(key, {reinterpret_cast<uint64_t>(mr->pd), mr->addr, mr->iova, mr->length}))
      c.engine().counters[uint32_t(Counter::direct_unlisted)]++;
  }
  return 0;
}

// An imported MR's deregistration ends its import only (as dealloc_pd's).
int dereg_mr(verbs_mr *vmr) {
  Mr *mr = reinterpret_cast<Mr *>(vmr);
  if (mr->origin) {
    unimport_mr(&vmr->ibmr);
    return 0;
  }
  Context &c = impl(vmr->ibmr.context);
  {
    // After this no packet can reach the memory: the responder resolves
    // rkeys under the same lock. Not while memory windows are bound to it
    // (man ibv_dereg_mr).
    std::lock_guard g(c.engine().mu);
    if (mr->windows || mr->imports.load()) return EBUSY;
    c.remove_mr(vmr->ibmr.lkey);
    c.engine().invalidate_lkey(vmr->ibmr.lkey);   // (posted WQEs must not write into it)
    c.engine().local_peers().withdraw(vmr->ibmr.lkey);   // (waits for a peer writing into it)
  }
  unuse(mr->on);
  if (mr->dm) mr->dm->mrs--;
  delete mr;
  return 0;
}

}  // namespace usrc

namespace usrc {

// ibv_advise_mr: prefetching (with or without write intent, with or
// without faulting pages in) has nothing to do here: nothing is pinned and
// every access reads or writes the memory in place, paging it in then. The
// SGEs are checked as a send's are: an lkey of this PD whose MR is on-demand
// and covers the range. IBV_ADVISE_MR_FLAG_FLUSH (wait until done) is met
// at once.
int advise_mr(ibv_pd *ibpd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge *sg, uint32_t num_sge) {
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if ((flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) || num_sge == 0 || num_sge > rc::kMaxSge) return EINVAL;
  Context &c = impl(ibpd->context);
  std::lock_guard g(c.engine().mu);   // (the MR table's lock)
  for (uint32_t i = 0; i < num_sge; i++) {
    const Mr *mr = c.find_mr(sg[i].lkey);
    if (!mr || mr->pd != prot_pd(ibpd) || !mr->odp || !mr->range(sg[i].addr, sg[i].length)) return EINVAL;
    if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE && !(mr->access & IBV_ACCESS_LOCAL_WRITE)) return EINVAL;
  }
  return 0;
}

}  // namespace usrc
