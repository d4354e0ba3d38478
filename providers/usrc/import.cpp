// Sharing a context's objects (ibv_import_device, ibv_import_pd/mr/dm).
//
// The kernel shares a context between the holders of its command fd (a
// dup, or one passed over a socket) and names its objects by handles. usrc
// has no kernel: a context and its objects live in the process that opened
// it, so an import can only be of a context of this process. The command
// fd is a read-only /dev/null (device.cpp), and every usrc context's fd is
// a different open of it: the context an fd belongs to is the one whose fd
// is the same open file (kcmp(2) KCMP_FILE). The imported ibv_context
// shares the original's Context (refcounted: either may be closed first);
// PD and DM handles are numbers of that Context's tables, an MR's its key.
//
// libibverbs' own ibv_import_device finds the device by the fd's device
// number, which is /dev/null's for every usrc device, and then asks the
// kernel for an async event fd, which usrc cannot give. So, as for the
// completion channels (channel.cpp), the preloaded provider exports
// ibv_import_device itself: a usrc context's fd is opened again through
// ibv_open_device on that context's device, and alloc_context
// (device.cpp) shares the context instead of opening one (importing()).
// Any other fd is passed on to libibverbs, whose call then ends in
// import_context below for a /dev/null that no usrc context holds: ENODEV.
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/kcmp.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "usrc/boundary.h"
#include "usrc/usrc.h"

namespace usrc {

namespace {

std::mutex g_mu;
// The live usrc contexts of this process (and the process that opened
// each: a child of fork has a copy of the list, and none of them).
std::vector<std::pair<VerbsContext *, pid_t>> g_contexts;

// The import in progress on this thread: the Context to share (a reference
// taken for it) and the fd the new context takes.
thread_local Context *t_from = nullptr;
thread_local int t_fd = -1;

// 0: the same open file; 1: another; -1: kcmp failed (errno).
long same_file(int a, int b) {
  const pid_t me = getpid();
  const long r = syscall(SYS_kcmp, me, me, KCMP_FILE, a, b);
  return r < 0 ? -1 : r != 0;
}

// The live context whose command fd is the open file fd is, or nullptr
// (*e: ENODEV, or EOPNOTSUPP where kcmp cannot tell). Under g_mu.
VerbsContext *owner_of(int fd, int *e) {
  *e = ENODEV;
  const pid_t me = getpid();
  for (auto [c, pid] : g_contexts) {
    if (pid != me) continue;
    const long r = same_file(c->vctx.context.cmd_fd, fd);
    if (r == 0) return c;
    if (r < 0 && errno != EBADF) *e = EOPNOTSUPP;   // (no kcmp here: seccomp, or a kernel without it)
  }
  return nullptr;
}

}  // namespace

void register_context(VerbsContext *c) {
  std::lock_guard g(g_mu);
  g_contexts.emplace_back(c, getpid());
}

void unregister_context(VerbsContext *c) {
  std::lock_guard g(g_mu);
  std::erase_if(g_contexts, [c](const auto &e) { return e.first == c; });
}

Context *importing(int *fd) {
  Context *c = t_from;
  *fd = t_fd;
  t_from = nullptr;   // (taken: the reference is the new context's)
  return c;
}

// libibverbs' import path (device ops' import_context), reached only when
// the provider is not preloaded or the fd is no usrc context's.
verbs_context *import_context(ibv_device *, int cmd_fd) {
  int e;
  std::lock_guard g(g_mu);
  // A usrc context's fd needs the preloaded ibv_import_device (libibverbs'
  // would fail at its async fd command anyway).
  errno = owner_of(cmd_fd, &e) ? EOPNOTSUPP : e;
  return nullptr;
}

// ---------------------------------------------------------------- objects

// An import's shape: a new T for the original O that find(T &) gives,
// found (and counted as imported) under its table's lock; nullptr: no such
// object, EINVAL.
template <class T, class O, class Find>
static std::pair<T *, O *> make_import(Find find) {
  auto *t = new (std::nothrow) T{};
  if (!t) {
    errno = ENOMEM;
    return {};
  }
  O *o = find(*t);
  if (!o) {
    delete t;
    errno = EINVAL;
    return {};
  }
  return {t, o};
}

// A PD's handle (ibv_pd.handle; ibv_alloc_pd's PD has a number of its
// own, a parent domain or an import its PD's) names a PD, never a parent
// domain or an import.
ibv_pd *import_pd(ibv_context *ibctx, uint32_t handle) {
  auto [pd, base] = make_import<Pd, Pd>([&](Pd &) {
    return impl(ibctx).with_pd(handle, [](Pd *p) {
      if (p) p->users++;   // (under the table's lock: dealloc_pd removes it first)
      return p;
    });
  });
  if (!pd) return nullptr;
  pd->pd.context = ibctx;
  pd->pd.handle = handle;
  pd->base = pd->over = base;
  pd->imported = true;
  pd->users = 1;   // the import
  return &pd->pd;
}

void unimport_pd(ibv_pd *ibpd) {
  if (ibpd && to_pd(ibpd)->imported) unuse(to_pd(ibpd));
}

// An MR of pd's protection domain, by its key; a memory window's key names
// no MR.
ibv_mr *import_mr(ibv_pd *ibpd, uint32_t handle) {
  Context &c = impl(ibpd->context);
  auto [mr, o] = make_import<Mr, Mr>([&](Mr &mr) {
    std::lock_guard g(c.engine().mu);
    Mr *o = c.lookup_mr(handle);
    if (!o || o->mw || o->origin || o->pd != prot_pd(ibpd)) return static_cast<Mr *>(nullptr);
    mr.pd = o->pd;
    mr.addr = o->addr;
    mr.iova = o->iova;
    mr.length = o->length;
    mr.access = o->access;
    mr.odp = o->odp;
    mr.vmr.mr_type = IBV_MR_TYPE_MR;
    mr.vmr.access = o->vmr.access;
    mr.vmr.ibmr.lkey = o->vmr.ibmr.lkey;
    mr.vmr.ibmr.rkey = o->vmr.ibmr.rkey;
    mr.vmr.ibmr.handle = handle;
    mr.vmr.ibmr.length = o->vmr.ibmr.length;
    o->imports++;
    return o;
  });
  if (!mr) return nullptr;
  mr->origin = o;
  mr->on = to_pd(ibpd);
  mr->on->users++;
  // (The address is the importer's to know: man ibv_import_mr.)
  mr->vmr.ibmr.context = ibpd->context;
  mr->vmr.ibmr.pd = ibpd;
  mr->vmr.ibmr.addr = nullptr;
  return &mr->vmr.ibmr;
}

void unimport_mr(ibv_mr *ibmr) {
  Mr *mr = ibmr ? to_mr(ibmr) : nullptr;
  if (!mr || !mr->origin) return;
  mr->origin->imports--;
  unuse(mr->on);
  delete mr;
}

ibv_dm *import_dm(ibv_context *ibctx, uint32_t handle) {
  auto [dm, o] = make_import<Dm, Dm>([&](Dm &) {
    return impl(ibctx).with_dm(handle, [](Dm *d) {
      if (d) d->imports++;   // (under the table's lock: free_dm removes it first)
      return d;
    });
  });
  if (!dm) return nullptr;
  dm->origin = o;
  dm->mem = o->mem;
  dm->length = o->length;
  dm->dm = o->dm;   // (the copy functions)
  dm->dm.context = ibctx;
  return &dm->dm;
}

void unimport_dm(ibv_dm *ibdm) {
  Dm *dm = ibdm ? reinterpret_cast<Dm *>(ibdm) : nullptr;
  if (!dm || !dm->origin) return;
  dm->origin->imports--;
  delete dm;
}

}  // namespace usrc

using namespace usrc;

extern "C" __attribute__((visibility("default"))) ibv_context *usrc_import_device(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_device *dev = nullptr;
  Context *from = nullptr;
  int e = ENODEV;
  {
    std::lock_guard g(g_mu);
    // The fd itself, not a dup (man ibv_import_device): two contexts
    // would close it.
    for (auto [c, pid] : g_contexts)
      if (c->vctx.context.cmd_fd == fd) {
        errno = EINVAL;
        return nullptr;
      }
    if (VerbsContext *o = owner_of(fd, &e)) {
      dev = o->vctx.context.device;
      from = o->impl;
      from->ref();
    }
  }
  if (!from) {
    if (e != ENODEV) {
      errno = e;
      return nullptr;
    }
    auto real = reinterpret_cast<ibv_context *(*)(int)>(dlvsym(RTLD_NEXT, "ibv_import_device", "IBVERBS_1.10"));
    if (!real) {
      errno = ENOSYS;
      return nullptr;
    }
    return real(fd);
  }
  auto open = reinterpret_cast<ibv_context *(*)(ibv_device *)>(dlvsym(RTLD_NEXT, "ibv_open_device", "IBVERBS_1.1"));
  if (!open) {
    Context::unref(from);
    errno = ENOSYS;
    return nullptr;
  }
  t_from = from;
  t_fd = fd;
  ibv_context *ctx = open(dev);
  e = errno;
  if (t_from) {   // (failed before alloc_context took it)
    t_from = nullptr;
    Context::unref(from);
  }
  errno = e;
  return ctx;
}

// Exported as ibv_import_device@IBVERBS_1.10 (see usrc.map), the version
// binaries link against, so a preloaded copy interposes.
__asm__(".symver usrc_import_device,ibv_import_device@@IBVERBS_1.10");
