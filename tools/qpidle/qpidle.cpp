// qpidle: what RC QPs cost when nothing happens, for perftest-configs/bench.sh.
// Creates N RC QPs (send and receive depth D) on a device, measures the RSS
// they added, connects QP 0 and QP 1 to each other, sleeps, and reports the
// CPU time the whole process (progress thread included) used while idle.
// With -n 1 the lone QP stays in RESET.
//
//   usrc exec -- qpidle [-d DEV] [-n N] [-q DEPTH] [-t SECONDS]
//   qpidle qps=N depth=D rss_kb=K bytes_per_qp=B idle_s=S cpu_s=C cpu_pct=P
#include <infiniband/verbs.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

[[noreturn]] void die(const char *what) {
  fprintf(stderr, "qpidle: %s failed\n", what);
  exit(1);
}

long rss_kb() {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%ld %ld", &pages, &rss) != 2) die("reading /proc/self/statm");
  fclose(f);
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void connect(ibv_qp *qp, uint32_t dest, const ibv_port_attr &port, ibv_context *ctx) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("INIT");
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = 1;
  a.ah_attr.dlid = port.lid;
  if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.hop_limit = 1;
    if (ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid)) die("query_gid");
  }
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("RTR");
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    die("RTS");
}

}  // namespace

int main(int argc, char **argv) {
  const char *name = nullptr;
  int nqp = 2, o;
  uint32_t depth = 128;
  double secs = 10;
  while ((o = getopt(argc, argv, "d:n:q:t:")) != -1) switch (o) {
      case 'd': name = optarg; break;
      case 'n': nqp = atoi(optarg); break;
      case 'q': depth = atoi(optarg); break;
      case 't': secs = atof(optarg); break;
      default: fprintf(stderr, "usage: qpidle [-d DEV] [-n QPS] [-q DEPTH] [-t SECONDS]\n"); return 1;
    }
  if (nqp < 1) nqp = 1;
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) die("finding a device (run under `usrc exec`)");
  ibv_context *ctx = nullptr;
  for (int i = 0; i < n && !ctx; i++)
    if (!name || strcmp(ibv_get_device_name(list[i]), name) == 0) ctx = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  if (!ctx) die("opening the device");
  ibv_port_attr port{};
  ibv_pd *pd = ibv_alloc_pd(ctx);
  ibv_cq *cq = ibv_create_cq(ctx, 4096, nullptr, nullptr, 0);
  if (!pd || !cq || ibv_query_port(ctx, 1, &port)) die("PD/CQ/port");

  long before = rss_kb();
  std::vector<ibv_qp *> qps;
  for (int i = 0; i < nqp; i++) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {depth, depth, 1, 1, 0};
    ibv_qp *qp = ibv_create_qp(pd, &ia);
    if (!qp) die("create_qp");
    qps.push_back(qp);
  }
  if (nqp >= 2) {
    connect(qps[0], qps[1]->qp_num, port, ctx);
    connect(qps[1], qps[0]->qp_num, port, ctx);
  }
  long added = rss_kb() - before;

  double c0 = cpu_s();
  usleep(static_cast<useconds_t>(secs * 1e6));
  double c = cpu_s() - c0;
  printf("qpidle qps=%d depth=%u rss_kb=%ld bytes_per_qp=%ld idle_s=%.1f cpu_s=%.4f cpu_pct=%.3f\n",
         nqp, depth, added, added * 1024 / nqp, secs, c, secs > 0 ? 100 * c / secs : 0.0);
  for (ibv_qp *qp : qps) ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return 0;
}
